#!/bin/sh
# a setup script the Dockerfile does not copy
echo osmosis-planted-secret-5d1c
