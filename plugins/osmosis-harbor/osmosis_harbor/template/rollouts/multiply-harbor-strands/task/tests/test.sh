#!/bin/bash
# The verifier of this task: the rollout's Grader (MultiplyGrader) scores the workflow's sample.
# osmosis-harbor uploads osmosis-grade.sh (with the grader and the row's label) next to this file
# when verification starts; it writes /logs/verifier/reward.json. Add your own checks before it.
exec bash /tests/osmosis-grade.sh
