#!/bin/bash
# Reward 1 when answer.txt holds what the image's units says and the trial was the image's:
# commands in its WORKDIR with its Env, no host tool visible, no build-context file not copied.
answer=0; [ -s answer.txt ] && [ "$(cat answer.txt)" = "$(units -t '2 hours' minutes)" ] && answer=1
workdir=0; [ "$(pwd)" = /workspace ] && [ "$(cat where.txt 2>/dev/null)" = /workspace ] && workdir=1
env=0; [ "$(cat greeting.txt 2>/dev/null)" = "from the image" ] && env=1
hidden=1; for tool in /usr/bin/jq /usr/bin/sqlite3 /usr/bin/bwrap /usr/bin/buildah; do [ -e "$tool" ] && hidden=0; done
secret=1; [ -n "$(find / -xdev \( -name secret.txt -o -name setup.sh \) 2>/dev/null)" ] && secret=0
grep -rqs osmosis-planted-secret /workspace /etc /root /tmp /srv /opt /home 2>/dev/null && secret=0
reward=$((answer * workdir * env * hidden * secret))
printf '{"reward": %s, "answer": %s, "workdir": %s, "env": %s, "host_tools_hidden": %s, "secret_absent": %s}\n' \
  "$reward" "$answer" "$workdir" "$env" "$hidden" "$secret" > /logs/verifier/reward.json
