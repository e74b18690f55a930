#!/bin/bash
# Reward 1 when the agent's ticker is still ticking: /srv/app/tick changes while the verifier waits.
first=$(cat /srv/app/tick 2>/dev/null); sleep 0.6; second=$(cat /srv/app/tick 2>/dev/null)
if [ -n "$first" ] && [ -n "$second" ] && [ "$first" != "$second" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
