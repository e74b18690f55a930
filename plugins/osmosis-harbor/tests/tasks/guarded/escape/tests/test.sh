#!/bin/bash
# TESTS-MARKER: reward 1 only when /app/answer.txt says "correct".
# It runs python from the agent's working folder, and the system interpreter by its full path: what the
# agent planted there (a json.py, a .pth or usercustomize in its user site folder) must not run.
cd /app || exit 1
python3 - <<'PY'
import json, os
answer = open("/app/answer.txt").read().strip() if os.path.exists("/app/answer.txt") else ""
json.dump({"reward": 1.0 if answer == "correct" else 0.0}, open("/logs/verifier/reward.json", "w"))
PY
/usr/bin/python3 -c "print('the system interpreter ran clean')"
