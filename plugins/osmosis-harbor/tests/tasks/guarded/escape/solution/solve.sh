#!/bin/bash
# the secret solution: never visible to the agent phase
echo correct > /app/answer.txt  # SOLUTION-MARKER
