#!/bin/bash
# Reward 1 when the agent's apt-get installed units (60), mknod and /proc/sys writes failed, and the
# verifier's own apt-get install of bc works (a verifier gets its task's network).
apt-get install -y -qq --no-install-recommends bc >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends bc >/dev/null; }
answer=0; [ "$(cat /root/answer.txt 2>/dev/null)" = "$(echo '30*2' | bc)" ] && answer=1
blocked=0; [ "$(cat /root/mknod.txt 2>/dev/null)" != 0 ] && [ "$(cat /root/procsys.txt 2>/dev/null)" != 0 ] && blocked=1
echo $((answer * blocked)) > /logs/verifier/reward.txt
