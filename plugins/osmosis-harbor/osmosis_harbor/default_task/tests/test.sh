#!/bin/bash
# The verifier of an osmosis template-mode task: the rollout's Grader scores the workflow's sample.
# osmosis-harbor uploads osmosis-grade.sh (with the grader and the row's label) next to this file
# when verification starts; it writes /logs/verifier/reward.json. Add your own checks before it.
exec bash /tests/osmosis-grade.sh
