"""Validates documents with osmosis-ai 0.3.8's own models (run by its Python); prints what each became.

argv: a JSON file holding {"results": [...], "admissions": [...]}.
"""

import json
import sys

from osmosis_ai.rollout.types import RolloutInitResponse, RolloutResultResponse

with open(sys.argv[1]) as handle:
    documents = json.load(handle)
out = {
    "results": [RolloutResultResponse.model_validate(d).model_dump(mode="json") for d in documents["results"]],
    "admissions": [RolloutInitResponse.model_validate(d).model_dump(mode="json") for d in documents["admissions"]],
}
print(json.dumps(out))
