#!/bin/bash
# Reward 1 when both attempts failed (non-zero exits recorded).
if [ -s loopback.txt ] && [ "$(cat loopback.txt)" != 0 ] && [ -s outside.txt ] && [ "$(cat outside.txt)" != 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
