#!/bin/bash
# Reward 1 when the agent ran as the image's USER in its WORKDIR, and so does the verifier.
if [ "$(cat who.txt 2>/dev/null)" = "$(printf 'player\n/home/player')" ] && [ "$(id -un)" = player ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
