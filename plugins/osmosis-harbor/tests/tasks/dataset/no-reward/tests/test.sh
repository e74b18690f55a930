#!/bin/bash
# A broken verifier: it checks nothing and writes no reward file.
echo "checking nothing"
