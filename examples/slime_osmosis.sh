#!/usr/bin/env bash
# slime with osmosis rollouts: every sample one rollout of `osmosis serve --traces`, whose model calls go
# to slime's own SGLang router in token ids (the rollout server's token-in gateway calls its /generate).
#
# 1. The rollout server (Python 3.12+), with the token-in gateway: a config such as
#    configs/training/multiply-plain.toml plus
#
#        [traces]
#        adapter = "sglang-generate"          # render the chat template, call <policy>/generate in token ids
#        tokenizer = "/models/Qwen3-4B"       # the policy's tokenizer folder (--hf-checkpoint below)
#        tool_parser = "hermes"               # how tool calls are read out of the generated text
#
#        OSMOSIS_SERVER_TOKEN=... osmosis serve configs/training/multiply-plain.toml --traces --host 0.0.0.0 --port 8100
#
#    It must reach slime's router (--sglang-router-ip/--sglang-router-port, or OSMOSIS_POLICY_URL).
#
# 2. slime (pip install osmosis-trainer, beside slime): the flags below, next to slime's own model,
#    training and cluster flags. The osmosis settings come from the environment (read at each sample):
#    OSMOSIS_SERVER_URL, OSMOSIS_SERVER_TOKEN, and optionally OSMOSIS_POLICY_URL, OSMOSIS_AGENT_TIMEOUT_SEC,
#    OSMOSIS_MASK_TRUNCATED=1. The generate function returns a list[Sample] for every sample (a list of one
#    unless the rollout forked): a --dynamic-sampling-filter-path filter sees each group's entries as lists.
set -euo pipefail

export OSMOSIS_SERVER_URL=${OSMOSIS_SERVER_URL:-http://rollouts:8100}
: "${OSMOSIS_SERVER_TOKEN:?set OSMOSIS_SERVER_TOKEN to the rollout server's token}"

ROLLOUT_ARGS=(
  --prompt-data /data/multiply.jsonl       # one JSON object a line
  --input-key messages                     # a column of chat messages (or of text: one user message)
  --label-key label                        # the grader's ground truth (Sample.label)
  --metadata-key metadata                  # handed to the rollout as its metadata
  # no --apply-chat-template: osmosis serve's gateway renders the template itself
  --custom-generate-function-path osmosis_trainer.slime.generate
  --rollout-batch-size 32
  --n-samples-per-prompt 8
  --rollout-max-response-len 1024          # max_new_tokens: each model call's budget
  --rollout-max-context-len 8192           # each sample's tokens are cut to this (status TRUNCATED)
  --rollout-temperature 1.0
  --rollout-top-p 1.0                      # must stay 1.0: below it slime's training needs each call's top-p
                                           # token sets (rollout_top_p_token_ids), which a rollout does not
                                           # record; osmosis_trainer.slime.generate refuses it
  # no --group-rm: slime's generate_and_rm_group would recompute each group's reward with its reward
  # model and overwrite the one osmosis set
)

python train.py \
  --hf-checkpoint /models/Qwen3-4B \
  "${ROLLOUT_ARGS[@]}" \
  "$@"                                      # slime's own model, training, and cluster flags
