"""slime's custom generate function: each sample one rollout of ``osmosis serve --traces``.

``--custom-generate-function-path osmosis_trainer.slime.generate`` makes slime's
``generate_and_rm`` await :func:`generate` for every sample: the sample's prompt (its messages, or
its text as one user message) goes to an osmosis rollout server as one rollout request, with the
sample's label and metadata and slime's sampling settings (SGLang's names: ``max_new_tokens`` per
call, ``sampling_seed``...), and the rollouts' policy is slime's SGLang router itself
(``http://{sglang_router_ip}:{sglang_router_port}``): the rollout server's token-in gateway
(``[traces] adapter = "sglang-generate"``) calls its ``/generate`` in token ids, so no bridge is
needed. The result always comes back as a ``list[Sample]``: the sample filled (a list of one), or
one sample per sequence sharing one ``rollout_id`` when the rollout forked
(:func:`osmosis_trainer.slime.samples_of`), as slime's own ``examples/coding_agent_rl`` returns
(slime's ``RolloutManager`` flattens a batch by ``isinstance(data[0], list)``, which a plain
``Sample`` mixed with a forked rollout's list breaks), its ``reward`` set (slime then skips its
reward model). slime's dynamic-sampling filters (``--dynamic-sampling-filter-path``) then see each
group's entries as lists.

Configured by the environment (slime's command line has no room for it), read at each call:

``OSMOSIS_SERVER_URL``
    the rollout server (required);
``OSMOSIS_SERVER_TOKEN``
    its bearer token (unset: none);
``OSMOSIS_POLICY_URL``
    the policy the rollouts call instead of slime's router (e.g. a router in front of it);
``OSMOSIS_AGENT_TIMEOUT_SEC``
    each rollout's workflow timeout (default the server's);
``OSMOSIS_MASK_TRUNCATED``
    ``1``: a sample cut to ``rollout_max_context_len`` is removed from training.

Run slime without ``--apply-chat-template`` (the gateway renders the template: a prompt slime
rendered to text is refused), with ``--input-key`` naming a column of messages (or of text),
without ``--rollout-top-p`` below 1.0 (slime then needs each call's top-p token sets, which a
rollout does not record: refused up front, :func:`check_args`) and without ``--group-rm`` (slime's
``generate_and_rm_group`` then recomputes every group's reward with its reward model and overwrites
the one osmosis set). Nothing here imports slime.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any, Final

from osmosis_trainer.client import RolloutClient, RolloutRequest
from osmosis_trainer.records import Message, jsonable
from osmosis_trainer.sglang import sampling_from_sglang
from osmosis_trainer.slime.convert import samples_of
from osmosis_trainer.wire import DEFAULT_TOKEN_ENV

__all__ = ["ROLLOUT_ID_PREFIX", "check_args", "generate", "prompt_messages"]

logger = logging.getLogger("osmosis_trainer.slime")

ROLLOUT_ID_PREFIX: Final = f"slime-{uuid.uuid4().hex[:8]}"
"""This process's rollout ids' prefix: two trainers never collide on a rollout server's run folder."""
_warned: set[tuple[str, ...]] = set()


def prompt_messages(prompt: Any, *, apply_chat_template: bool = False) -> list[Message]:
    """A slime sample's prompt as chat messages: its messages, or its text as one user message.

    :raises ValueError: slime rendered the chat template itself (``--apply-chat-template``), or the
        prompt is neither.
    """
    if apply_chat_template:
        raise ValueError(
            "slime ran with --apply-chat-template: the prompt is already rendered text. Drop the flag: "
            "osmosis serve's gateway renders the template with the policy's tokenizer"
        )
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt):
        return [jsonable(m) for m in prompt]
    raise ValueError(f"a sample's prompt must be messages or text, got {type(prompt).__name__}")


def check_args(args: Any) -> None:
    """Refuse the slime settings an osmosis rollout cannot serve, naming the flag.

    ``--rollout-top-p`` below 1.0: slime's ``_convert_samples_to_train_data`` then asserts that each
    sample carries ``rollout_top_p_token_ids``/``rollout_top_p_token_offsets`` (the top-p token sets
    of every generated token, for its top-p logprob correction), which the rollout's trace does not
    record; the rollouts' ``top_p`` would also disagree with the loss's.

    >>> from types import SimpleNamespace
    >>> check_args(SimpleNamespace(rollout_top_p=1.0))
    >>> check_args(SimpleNamespace(rollout_top_p=0.9))
    Traceback (most recent call last):
    ...
    ValueError: slime ran with --rollout-top-p 0.9: ...
    """
    top_p = getattr(args, "rollout_top_p", None)
    if isinstance(top_p, (int, float)) and top_p < 1.0:
        raise ValueError(
            f"slime ran with --rollout-top-p {top_p}: slime's training then needs each sample's "
            "rollout_top_p_token_ids/rollout_top_p_token_offsets, which an osmosis rollout does not record. "
            "Run with --rollout-top-p 1.0 (the default)"
        )


def _policy_url(args: Any) -> str:
    configured = os.environ.get("OSMOSIS_POLICY_URL")
    if configured:
        return configured
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> list[Any]:
    """One rollout of ``osmosis serve`` for ``sample`` (see the module docstring): always a
    ``list[Sample]``, ``[sample]`` filled, or one per sequence sharing its ``rollout_id``. A failed
    rollout (any per-rollout client error included) is never raised: its sample is ``FAILED`` and
    ``remove_sample``, the reason in its metadata; a setup refusal (401, 422) is.

    :raises ValueError: ``OSMOSIS_SERVER_URL`` unset, or a slime setting it cannot serve (:func:`check_args`).
    """
    server_url = os.environ.get("OSMOSIS_SERVER_URL")
    if not server_url:
        raise ValueError("OSMOSIS_SERVER_URL is not set: the URL of `osmosis serve CONFIG --traces`")
    check_args(args)
    messages = prompt_messages(sample.prompt, apply_chat_template=bool(getattr(args, "apply_chat_template", False)))
    sampling, dropped = sampling_from_sglang(sampling_params)
    if dropped and dropped not in _warned:
        _warned.add(dropped)
        logger.warning("sampling_params osmosis serve cannot apply, left out: %s", ", ".join(dropped))
    timeout = os.environ.get("OSMOSIS_AGENT_TIMEOUT_SEC")
    group = sample.group_index if isinstance(sample.group_index, int) else None
    index = sample.index if isinstance(sample.index, int) else None
    rollout_id = f"{ROLLOUT_ID_PREFIX}-g{group}-i{index}-{uuid.uuid4().hex[:8]}"
    request = RolloutRequest(
        rollout_id=rollout_id,
        initial_messages=messages,
        chat_completions_url=_policy_url(args),
        label=jsonable(sample.label),
        metadata=jsonable(sample.metadata) if isinstance(sample.metadata, Mapping) and sample.metadata else None,
        row=group,
        sample_index=index,
        sampling_params=sampling,
        agent_timeout_sec=float(timeout) if timeout else None,
    )
    client = RolloutClient(server_url, token=os.environ.get(DEFAULT_TOKEN_ENV, ""))
    result = await client.run_to_result(request)
    context = getattr(args, "eval_max_context_len" if evaluation else "rollout_max_context_len", None)
    samples = samples_of(
        result,
        sample,
        max_context_tokens=int(context) if context else None,
        mask_truncated=os.environ.get("OSMOSIS_MASK_TRUNCATED", "") in ("1", "true", "yes"),
    )
    reason = samples[0].metadata.get("osmosis_mask_reason")
    if reason is not None:
        detail = samples[0].metadata.get("osmosis_mask_detail")
        logger.warning("rollout %s removed from training (%s): %s", rollout_id, reason, detail)
    return samples
