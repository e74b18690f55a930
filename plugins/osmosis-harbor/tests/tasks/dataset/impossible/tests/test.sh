#!/bin/bash
# Reward 1 only when /app/answer.txt says 42.
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
