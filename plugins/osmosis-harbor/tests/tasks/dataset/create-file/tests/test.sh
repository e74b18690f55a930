#!/bin/bash
# Reward 1 when the agent created /app/greeting.txt holding "hello", else 0.
if [ "$(cat /app/greeting.txt 2>/dev/null | tr -d '[:space:]')" = "hello" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "greeting.txt missing or wrong: $(cat /app/greeting.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
