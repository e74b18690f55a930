"""``OsmosisAgentLoop``: a verl agent loop whose rollouts ``osmosis serve --traces`` runs.

verl's ``AgentLoopWorker`` builds one agent loop per sample (``hydra.utils.instantiate`` of the
entry its ``agent_name`` names) and awaits ``run(sampling_params, **row)``. This one hands the row
to an osmosis rollout server as one rollout request (the row's ``raw_prompt`` as the prompt, its
label, verl's sampling settings) whose policy is verl's own engine, reached through a
:class:`~osmosis_trainer.bridge.TokenBridge` the worker serves: the rollout server's token-in
gateway (``[traces] adapter = "sglang-generate"``) renders the chat template, sends token ids to
the bridge, and the bridge awaits ``self.server_manager.generate(rollout_id, prompt_ids=...,
sampling_params=...)`` (verl's sticky routing: one rollout, one replica). The result's trace and
reward become the ``AgentLoopOutput`` (:func:`osmosis_trainer.verl.agent_loop_fields`).

One bridge per worker process and event loop (every agent loop of a worker shares its
``server_manager``), started by the first rollout and kept for the worker's life
(:func:`close_bridges` stops them). Its address and token come from the agent loop's config entry
(``bridge_host``, ``bridge_port``, ``bridge_advertise_host``, ``bridge_token_env``): the rollout server
must reach it.

Configured through verl's ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (a YAML list of
``{name, _target_, <init kwargs>}``; see osmosis-trainer's README, "verl"), with the dataset's
``agent_name`` column (or ``agent.default_agent_loop``) naming the entry. Needs verl installed
(``pip install verl``); the rest of osmosis-trainer does not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from osmosis_trainer.bridge import TokenBridge
from osmosis_trainer.client import RolloutClient, RolloutRequest
from osmosis_trainer.records import jsonable
from osmosis_trainer.sampling import SamplingParams
from osmosis_trainer.verl.convert import agent_loop_fields, row_label, sampling_from_verl
from osmosis_trainer.wire import DEFAULT_TOKEN_ENV

__all__ = ["OsmosisAgentLoop", "VerlEngine", "close_bridges"]

logger = logging.getLogger("osmosis_trainer.verl")

SERVER_URL_ENV = "OSMOSIS_SERVER_URL"
"""Where ``server_url`` is read from when the config entry does not set it."""


@attrs.define
class _Extras:
    """What a rollout's engine calls said beyond their tokens: the weights' steps, preemptions."""

    min_step: int | None = None
    max_step: int | None = None
    preempted: int | None = None


class VerlEngine:
    """The bridge's :data:`~osmosis_trainer.bridge.GenerateFn` over verl's ``LLMServerClient``.

    verl's vLLM server reports ``"completed"`` for both a stop and a length cut, and lowers a call's
    ``max_tokens`` to the room its context leaves; the finish reason is ``"length"`` when the
    generation filled its budget (:meth:`budget`) without ending on an end-of-sequence token,
    ``"abort"`` for verl's ``"aborted"``, else ``"stop"``.

    :param max_model_len: the engine's context (verl's ``rollout.max_model_len``, or when unset the
        model's ``max_position_embeddings``, as verl's servers default it); None: not known, so no
        generation is taken for a cut by the context.
    :param engine: ``vllm`` or ``sglang``: verl's SGLang server leaves one token more of the context
        unused (``max_model_len - len(prompt) - 1``).
    """

    def __init__(
        self,
        server_manager: Any,
        *,
        prompt_length: int,
        response_length: int,
        eos_ids: Sequence[int],
        max_model_len: int | None = None,
        engine: str = "vllm",
    ) -> None:
        self.server_manager = server_manager
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.max_model_len = max_model_len
        self._unused = 1 if engine == "sglang" else 0
        self.eos_ids = frozenset(eos_ids)
        self._extras: dict[str, _Extras] = {}

    def budget(self, prompt_tokens: int, requested: int | None) -> int:
        """The most tokens a call of ``prompt_tokens`` can generate on verl's engine: its
        ``max_tokens`` (None: ``response_length``, verl's default), within the room the model's
        context leaves (``max_model_len - prompt_tokens``, one fewer on SGLang, as verl's servers
        lower it; no limit when the context is not known); at least 1.

        >>> engine = VerlEngine(None, prompt_length=512, response_length=512, eos_ids=[2], max_model_len=1024)
        >>> engine.budget(300, 4096), engine.budget(300, 64), engine.budget(10, None), engine.budget(2000, 8)
        (724, 64, 512, 1)
        >>> VerlEngine(None, prompt_length=512, response_length=512, eos_ids=[2], max_model_len=1024,
        ...            engine="sglang").budget(300, 4096)
        723
        """
        wanted = requested if requested is not None else self.response_length
        if self.max_model_len is None:
            return max(1, wanted)
        return max(1, min(wanted, self.max_model_len - prompt_tokens - self._unused))

    def pop_extras(self, request_id: str) -> _Extras:
        return self._extras.pop(request_id, None) or _Extras()

    def _finish(self, stop_reason: Any, tokens: list[int], budget: int) -> str:
        if isinstance(stop_reason, Mapping):
            stop_reason = stop_reason.get("type")
        if stop_reason in ("aborted", "abort"):
            return "abort"
        if stop_reason == "length":
            return "length"
        if len(tokens) >= budget and (not tokens or tokens[-1] not in self.eos_ids):
            return "length"
        return "stop"

    async def __call__(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float] | None, str]:
        requested = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        budget = self.budget(len(prompt_ids), int(requested) if isinstance(requested, int) else None)
        output = await self.server_manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        tokens = [int(t) for t in output.token_ids]
        logprobs = None if output.log_probs is None else [float(lp) for lp in output.log_probs]
        extras = self._extras.setdefault(request_id, _Extras())
        step = (getattr(output, "extra_fields", None) or {}).get("global_steps")
        if isinstance(step, int):
            extras.min_step = step if extras.min_step is None else min(extras.min_step, step)
            extras.max_step = step if extras.max_step is None else max(extras.max_step, step)
        preempted = getattr(output, "num_preempted", None)
        if isinstance(preempted, int) and preempted >= 0:
            extras.preempted = (extras.preempted or 0) + preempted
        return tokens, logprobs, self._finish(getattr(output, "stop_reason", None), tokens, budget)


@attrs.define
class _Shared:
    bridge: TokenBridge
    engine: VerlEngine


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _Shared]] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def close_bridges() -> None:
    """Stop the running loop's bridges (a worker's last act; the tests' cleanup)."""
    loop = asyncio.get_running_loop()
    for shared in list(_bridges.pop(loop, {}).values()):
        await shared.bridge.close()


@register("osmosis")
class OsmosisAgentLoop(AgentLoopBase):  # type: ignore[misc]  # verl's classes are untyped
    """A verl agent loop whose samples are rollouts of ``osmosis serve --traces`` (see the module docstring).

    Registered as ``osmosis``; a config entry (``agent_loop_config_path``) sets these keywords:

    :param server_url: the rollout server (default ``$OSMOSIS_SERVER_URL``).
    :param token_env: the variable holding its bearer token (unset: none).
    :param bridge_host: the address the bridge listens on (loopback by default; another needs a token).
    :param bridge_port: its port (0: a free one).
    :param bridge_advertise_host: the host name the rollout server reaches the bridge by (default: the
        address it listens on; for ``0.0.0.0``, this node's address as Ray knows it).
    :param bridge_token_env: the variable holding the bridge's bearer token (required beyond loopback).
    :param policy_url: send the rollouts' model calls there instead of to verl's engine (no bridge):
        for a rollout server whose policy is reached over HTTP anyway; the rollouts then do not
        sample the weights verl trains.
    :param policy_model: the model name the rollouts send (default the rollout server's).
    :param mask_truncated: mask a sample whose response was cut to ``response_length``.
    :param agent_timeout_sec: each rollout's workflow timeout (default the server's).
    :param rollout_id_prefix: the rollout ids' prefix (default ``verl-`` and 8 random hex digits).
    :param label: a row's label (default :func:`~osmosis_trainer.verl.row_label`).
    """

    _warned: set[tuple[str, ...]] = set()
    _prefix: str = f"verl-{uuid.uuid4().hex[:8]}"

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        *,
        server_url: str | None = None,
        token_env: str = DEFAULT_TOKEN_ENV,
        bridge_host: str = "127.0.0.1",
        bridge_port: int = 0,
        bridge_advertise_host: str | None = None,
        bridge_token_env: str | None = None,
        policy_url: str | None = None,
        policy_model: str | None = None,
        mask_truncated: bool = False,
        agent_timeout_sec: float | None = None,
        rollout_id_prefix: str | None = None,
        label: Callable[[Mapping[str, Any]], Any] = row_label,
        **kwargs: Any,
    ) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **kwargs)
        url = server_url or os.environ.get(SERVER_URL_ENV)
        if not url:
            raise ValueError(
                "the osmosis agent loop has no server_url: set it in its agent_loop_config_path entry "
                f"or ${SERVER_URL_ENV}"
            )
        self.server_url = url
        self.token_env = token_env
        self.bridge_host = bridge_host
        self.bridge_port = int(bridge_port)
        self.bridge_advertise_host = bridge_advertise_host
        self.bridge_token_env = bridge_token_env
        self.policy_url = policy_url
        self.policy_model = policy_model
        self.mask_truncated = bool(mask_truncated)
        self.agent_timeout_sec = agent_timeout_sec
        self.rollout_id_prefix = rollout_id_prefix or OsmosisAgentLoop._prefix
        self.label = label

    # -- the bridge --------------------------------------------------------------------------------

    def _engine_names(self) -> Any:
        return "sglang" if str(self.rollout_config.get("name", "vllm")) == "sglang" else "vllm"

    def _advertised(self) -> str | None:
        """The host the rollout server reaches the bridge by: ``bridge_advertise_host``, else, for a
        bridge on every address, this node's address (Ray's, as verl's workers know it)."""
        if self.bridge_advertise_host or self.bridge_host not in ("0.0.0.0", "::", ""):
            return self.bridge_advertise_host
        try:
            import ray.util

            node_address: Callable[[], object] = ray.util.get_node_ip_address  # (untyped in Ray)
            return str(node_address())
        except Exception:  # no Ray here: the name this machine resolves itself to
            return socket.gethostbyname(socket.gethostname())

    def _context_length(self) -> int | None:
        """verl's engine context: ``rollout.max_model_len``, else what verl's servers default it to,
        the model's ``max_position_embeddings`` (its ``config.json``, read from a local model folder or
        by transformers from its cache); None when it cannot be read."""
        configured = self.rollout_config.get("max_model_len")
        if configured:
            return int(configured)
        model = self.config.actor_rollout_ref.get("model") or {}
        path = str(model.get("path") or "")
        try:
            if os.path.isdir(path):
                with open(os.path.join(path, "config.json"), encoding="utf-8") as file:
                    hf_config: Any = json.load(file)
            else:
                from transformers import AutoConfig

                remote = bool(model.get("trust_remote_code", False))
                # (its cache only: verl has fetched the model by now, and a hub call could stall offline)
                hf_config = AutoConfig.from_pretrained(path, trust_remote_code=remote, local_files_only=True).to_dict()
        except Exception:  # (no folder, no cached config: the context is not known)
            return None
        found = hf_config.get("max_position_embeddings") or (hf_config.get("text_config") or {}).get(
            "max_position_embeddings"
        )
        return found if isinstance(found, int) else None

    def _eos_ids(self) -> list[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return [eos] if isinstance(eos, int) else [i for i in (eos or ()) if isinstance(i, int)]

    async def _shared(self) -> _Shared:
        """This worker's bridge in front of ``server_manager`` (started by the first rollout)."""
        loop = asyncio.get_running_loop()
        lock = _locks.setdefault(loop, asyncio.Lock())
        async with lock:
            found = _bridges.setdefault(loop, {}).get(id(self.server_manager))
            if found is not None and found.engine.server_manager is self.server_manager:
                return found
            api_key = os.environ.get(self.bridge_token_env) if self.bridge_token_env else None
            if self.bridge_token_env and not api_key:
                raise ValueError(f"bridge_token_env names ${self.bridge_token_env}, which is unset or empty")
            engine = VerlEngine(
                self.server_manager,
                prompt_length=int(self.rollout_config.prompt_length),
                response_length=int(self.rollout_config.response_length),
                eos_ids=self._eos_ids(),
                max_model_len=self._context_length(),
                engine=self._engine_names(),
            )
            tokenizer = self.tokenizer

            def decode(ids: list[int], skip_special_tokens: bool) -> str:
                return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

            bridge = TokenBridge(
                engine,
                names=self._engine_names(),
                host=self.bridge_host,
                port=self.bridge_port,
                api_key=api_key,
                advertise_host=self._advertised(),
                decode=decode,
            )
            await bridge.start()
            logger.info("osmosis agent loop: the token-in bridge listens at %s", bridge.url)
            shared = _bridges[loop][id(self.server_manager)] = _Shared(bridge, engine)
            return shared

    # -- a sample --------------------------------------------------------------------------------

    def _with_turn_budget(self, sampling: SamplingParams | None) -> SamplingParams:
        """verl's sampling with a call's token budget: its own ``max_tokens`` when it set one, else
        ``response_length`` (verl's sampling dict carries none; its tool agent loop bounds a turn by
        the response length, and its engine lowers that to the context's room), so neither the
        gateway's default nor the agent's value replaces verl's."""
        sampling = sampling or SamplingParams()
        if sampling.max_tokens is not None:
            return sampling
        return attrs.evolve(sampling, max_tokens=int(self.rollout_config.response_length))

    def _request(self, rollout_id: str, sampling_params: Mapping[str, Any], row: Mapping[str, Any]) -> RolloutRequest:
        raw_prompt = row.get("raw_prompt")
        if raw_prompt is None:
            raise ValueError("the row has no raw_prompt: set data.return_raw_chat=True (its rollout needs messages)")
        messages = jsonable(list(raw_prompt))
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError(f"the row's raw_prompt is not a list of messages: {type(raw_prompt).__name__}")
        sampling, dropped = sampling_from_verl(sampling_params)
        if dropped and dropped not in OsmosisAgentLoop._warned:
            OsmosisAgentLoop._warned.add(dropped)
            logger.warning("sampling_params osmosis serve cannot apply, left out: %s", ", ".join(dropped))
        sampling = self._with_turn_budget(sampling)
        extra_info = jsonable(row.get("extra_info"))
        index = jsonable(row.get("index"))
        return RolloutRequest(
            rollout_id=rollout_id,
            initial_messages=messages,
            chat_completions_url=self.policy_url or "",
            label=jsonable(self.label(row)),
            metadata=extra_info if isinstance(extra_info, dict) else None,
            model=self.policy_model,
            row=int(index) if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else None,
            sampling_params=sampling,
            agent_timeout_sec=self.agent_timeout_sec,
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One rollout of ``osmosis serve`` for this row, as verl's ``AgentLoopOutput`` (never raised
        for a failed rollout: a masked output says why in ``extra_fields``)."""
        started = time.perf_counter()
        rollout_id = f"{self.rollout_id_prefix}-{uuid.uuid4().hex[:16]}"
        request = self._request(rollout_id, sampling_params, kwargs)
        shared = None
        if self.policy_url is None:
            shared = await self._shared()
            request = attrs.evolve(request, chat_completions_url=shared.bridge.url, llm_api_key=shared.bridge.api_key)
        client = RolloutClient(self.server_url, token=os.environ.get(self.token_env, ""))
        try:
            result = await client.run_to_result(request)
        finally:
            usage = shared.bridge.pop_usage(rollout_id) if shared is not None else None
            extras = shared.engine.pop_extras(rollout_id) if shared is not None else None
        wall = time.perf_counter() - started
        fields = agent_loop_fields(
            result,
            prompt_length=int(self.rollout_config.prompt_length),
            response_length=int(self.rollout_config.response_length),
            mask_truncated=self.mask_truncated,
            pad_token_id=int(getattr(self.tokenizer, "pad_token_id", None) or 0),
        )
        generating = 0.0
        preempted = -1
        if usage is not None and extras is not None:
            generating = usage.seconds
            preempted = extras.preempted if extras.preempted is not None else -1
            if extras.min_step is not None:
                fields["extra_fields"]["min_global_steps"] = extras.min_step
                fields["extra_fields"]["max_global_steps"] = extras.max_step
        if fields["extra_fields"]["osmosis_masked"]:
            logger.warning(
                "rollout %s masked (%s): %s",
                rollout_id,
                fields["extra_fields"]["osmosis_mask_reason"],
                fields["extra_fields"]["osmosis_mask_detail"],
            )
        metrics = AgentLoopMetrics(
            generate_sequences=generating, tool_calls=max(0.0, wall - generating), num_preempted=preempted
        )
        return AgentLoopOutput(**fields, metrics=metrics)
