#!/bin/bash
# Reward 1 when the agent created /app/poem.txt holding "roses", else 0.
if [ "$(cat /app/poem.txt 2>/dev/null | tr -d '[:space:]')" = "roses" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "poem.txt missing or wrong: $(cat /app/poem.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
