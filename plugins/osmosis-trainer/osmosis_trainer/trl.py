"""TRL: osmosis rollouts as the ``rollout_func`` of TRL's ``GRPOTrainer``, and their reward.

``GRPOTrainer(rollout_func=OsmosisRollout(...), reward_funcs=[osmosis_reward])`` makes every
generation step a batch of osmosis rollouts: each prompt row TRL hands over (each prompt
``num_generations`` times in a row) becomes one rollout run by ``osmosis serve --traces`` (or any
server speaking its protocol) against the policy being trained, and comes back as one training row
made of the exact tokens the inference server saw and generated:

* ``prompt_ids``: the first model call's prompt; ``completion_ids``: everything after it (the
  generated turns and the tool / user tokens between them, never re-tokenized);
* ``logprobs``: each generated token's sampling logprob (0.0 on the others);
* ``env_mask``: 1 on generated tokens, 0 on tool and user tokens (TRL's loss mask);
* ``osmosis_reward`` (the grader's reward) and per-row facts the reward function and the logs read:
  ``osmosis_rollout_id``, ``osmosis_mask_reason``, ``osmosis_mask_detail``, ``osmosis_complete``,
  ``osmosis_prefix_breaks``, ``osmosis_truncated``.

**A row that must not be trained on is masked, never silently trained on**: a failed rollout, an
incomplete trace (a model call failed or was not captured), a broken token prefix (the chat
template re-rendered history: no single sequence holds the rollout, TRL #4543), no tokens. Its
``env_mask`` is all 0 (no loss), its ``osmosis_reward`` None, so :func:`osmosis_reward` hands TRL
None and TRL leaves it out of its group's mean and standard deviation with advantage 0 (never a
reward of 0 that would hand its group-mates credit for a failure of the machinery). Each step logs
why (``osmosis/masked`` and friends, a warning naming the reasons), and :attr:`OsmosisRollout.stats`
counts them over the run.

**Labels and metadata.** TRL passes ``rollout_func`` the prompts only. The grader needs the row's
label and the workflow its metadata, so ``OsmosisRollout(dataset=train_dataset)`` indexes the
dataset once by prompt: each prompt TRL hands over is looked up there (exact match of its messages,
``None`` fields that Arrow adds left out), and its row gives ``label`` (column ``ground_truth``, or
``label``), ``metadata`` (every other column, or ``metadata_columns``) and ``row`` (its index, where
the rollout goes in the server's ``results.jsonl``). Two rows with the same prompt and different
labels or metadata are an error naming both. Without a dataset, rollouts carry no label (a
graded rollout needs one; a workflow may still set the reward itself).

**The policy.** With ``use_vllm=True, vllm_mode="server"`` (``trl vllm-serve``), the rollouts call
that vLLM's OpenAI endpoint (``<vllm_server_base_url>/v1``), which TRL keeps in sync with the
weights before each step; ``policy_url=`` names another (a
:class:`~osmosis_trainer.live_policy.LivePolicyServer` serving the trainer's model object, or a
router in front of several vLLMs). Colocated vLLM runs inside the trainer, where no rollout server
can reach it: refused.

**The trainer's sampling**, not the agent's (TRL #4159 temperature, #6789 top-p): every model call
of every rollout goes out with the trainer's ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty`` and a cap of ``max_completion_length`` tokens (``max_tokens=``), plus what
``generation_kwargs`` holds of vLLM's sampling fields; each request's ``policy_version`` is
``step-<global step>``, recorded on each traced call.

TRL marks ``rollout_func`` experimental; this was built against trl 1.16.0, whose ``_generate``
calls it with or without vLLM, requires ``prompt_ids``, ``completion_ids`` and ``logprobs``, uses
``env_mask`` as the loss mask, passes every other key to the reward functions, and treats a reward
of None as unscorable. Unsloth's patched ``GRPOTrainer`` ignored ``rollout_func`` (unsloth #3573)
and then ``env_mask`` (#5673): :func:`osmosis_reward` raises when the rows carry no osmosis fields,
and a warning names the second.

Nothing here imports TRL or torch: the trainer object is read by attribute.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import attrs

from osmosis_trainer.client import RolloutClient, RolloutRequest, RolloutResult
from osmosis_trainer.groups import order_results, prompt_groups
from osmosis_trainer.records import Message, TrainerError
from osmosis_trainer.rows import MASK_REASONS, SequenceRow, rollout_rows
from osmosis_trainer.sampling import SAMPLING_FIELDS, SamplingParams

__all__ = [
    "ROW_FIELDS",
    "OsmosisRollout",
    "RolloutConfigError",
    "RolloutStats",
    "StepRecord",
    "osmosis_reward",
    "trl_rows",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

ROW_FIELDS: Final = (
    "osmosis_reward",
    "osmosis_rollout_id",
    "osmosis_mask_reason",
    "osmosis_mask_detail",
    "osmosis_complete",
    "osmosis_prefix_breaks",
    "osmosis_truncated",
)
"""The per-row keys :class:`OsmosisRollout` returns beside TRL's own: TRL hands them to every reward
function as keyword arguments (one value per row)."""
LABEL_COLUMNS: Final = ("ground_truth", "label")
"""Where a row's label is read by default (osmosis's dataset names: ``label`` is the alias)."""
_DETAIL_CHARS: Final = 300


class RolloutConfigError(TrainerError):
    """The trainer and the rollouts are not set up to train together (the message says how to fix it)."""


@attrs.frozen
class StepRecord:
    """One ``rollout_func`` call: a generation step's rollouts."""

    step: int
    """The trainer's global step (optimizer steps done) when it ran."""
    policy_version: str
    rollouts: int
    masked: int
    mean_reward: float | None
    """The mean reward of the rows that are not masked (None: none has a reward)."""
    seconds: float
    """From the first submit to the last result."""
    mode: Literal["train", "eval"] = "train"


@attrs.define
class RolloutStats:
    """What :class:`OsmosisRollout` has run so far (its :attr:`~OsmosisRollout.stats`)."""

    rollouts: int = 0
    masked: Counter[str] = attrs.field(factory=Counter)
    """Masked rows by :data:`~osmosis_trainer.rows.MaskReason`."""
    failed: Counter[str] = attrs.field(factory=Counter)
    """Failed rollouts by error category."""
    incomplete_traces: int = 0
    prefix_breaks: int = 0
    """Summed over rollouts (a rollout may break its prefix more than once)."""
    truncated: int = 0
    """Rows cut to ``max_completion_length``."""
    steps: list[StepRecord] = attrs.field(factory=list)

    @property
    def masked_rows(self) -> int:
        """Rows not trained on, whatever the reason."""
        return sum(self.masked.values())


def trl_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """An osmosis dataset file as TRL's dataset rows: ``datasets.Dataset.from_list(trl_rows(path))``.

    The file is osmosis's JSONL (what ``osmosis run --dataset`` reads): each line an object with
    ``user_prompt`` (and ``system_prompt``) or a ``messages`` list, ``ground_truth`` (or ``label``),
    and any other keys (the workflow's metadata). Each becomes ``{"prompt": [messages],
    "ground_truth": label, **other keys}``, the columns :class:`OsmosisRollout` reads back.

    :raises ValueError: a line that is not such a row (the message names the file and line).
    """
    rows = []
    source = Path(path)
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not a JSON object")
        label = data.pop("ground_truth", data.pop("label", None))
        messages = data.pop("messages", None)
        system, user = data.pop("system_prompt", None), data.pop("user_prompt", None)
        if messages is None:
            if not isinstance(user, str):
                raise ValueError(f'{where}: no "user_prompt" (or "messages" list)')
            messages = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": user}]
        elif (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects')
        rows.append({"prompt": messages, "ground_truth": label, **data})
    return rows


def _clean(value: Any) -> Any:
    """``value`` without the None-valued keys (Arrow gives each message every field any message has)."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _prompt_key(prompt: Any) -> str:
    return json.dumps(_clean(prompt), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _messages(prompt: Any, where: str) -> list[Message]:
    """A TRL prompt as chat messages: conversational ones as they are, a plain string as one user turn."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    cleaned = _clean(prompt)
    if not isinstance(cleaned, list) or not cleaned or not all(isinstance(m, dict) and "role" in m for m in cleaned):
        raise RolloutConfigError(
            f"{where}: the prompt is neither a string nor a list of chat messages: {prompt!r:.200}"
        )
    return cleaned


@attrs.frozen
class _Row:
    index: int
    label: Any
    metadata: dict[str, Any] | None


class _DatasetIndex:
    """A dataset's rows by prompt (built once, on the first step)."""

    def __init__(
        self,
        dataset: Any,
        *,
        name: str,
        prompt_column: str,
        label_column: str | None,
        metadata_columns: Sequence[str] | None,
    ) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"{name}: an iterable dataset cannot be indexed by prompt; pass a map-style one "
                "(datasets.Dataset, a list of rows)"
            )
        self.rows: dict[str, _Row] = {}
        for index, row in enumerate(dataset):
            if not isinstance(row, Mapping):
                raise TypeError(f"{name} row {index}: not a mapping of columns ({type(row).__name__})")
            if prompt_column not in row:
                raise RolloutConfigError(
                    f"{name} row {index}: no {prompt_column!r} column (its columns: {sorted(row)})"
                )
            label_key = label_column or next((c for c in LABEL_COLUMNS if c in row), None)
            label = _clean(row.get(label_key)) if label_key is not None else None
            if metadata_columns is None:
                skip = {prompt_column, *LABEL_COLUMNS, *([label_column] if label_column else [])}
                metadata = {k: _clean(v) for k, v in row.items() if k not in skip}
            else:
                missing = [c for c in metadata_columns if c not in row]
                if missing:
                    raise RolloutConfigError(f"{name} row {index}: no column {missing[0]!r} (metadata_columns)")
                metadata = {k: _clean(row[k]) for k in metadata_columns}
            try:
                json.dumps([label, metadata])
            except (TypeError, ValueError) as exc:
                raise RolloutConfigError(
                    f"{name} row {index}: its label or metadata is not JSON ({exc}); name the columns to send "
                    "with metadata_columns="
                ) from None
            entry = _Row(index, label, metadata or None)
            key = _prompt_key(row[prompt_column])
            known = self.rows.setdefault(key, entry)
            if known is not entry and (known.label, known.metadata) != (entry.label, entry.metadata):
                raise RolloutConfigError(
                    f"{name} rows {known.index} and {index} have the same prompt and different labels or metadata: "
                    "TRL hands rollout_func the prompt only, so the rollout could not tell which row it is"
                )


def _run(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from synchronous code (TRL calls ``rollout_func`` so): on this thread
    when no event loop runs here (Ctrl-C cancels the rollouts in flight, on the server too), else
    (a notebook) on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="osmosis-rollouts", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _own_seed(sampling: SamplingParams, where: str) -> SamplingParams:
    """``sampling`` with a seed of the rollout's own when the trainer set one: the trainer's seed makes
    the run reproducible, but one seed on every rollout of a group would make them all the same
    sample (a group with no variance teaches nothing; TRL's own vLLM call asks ``n`` samples of one
    seeded request instead)."""
    if sampling.seed is None:
        return sampling
    return attrs.evolve(sampling, seed=zlib.crc32(f"{sampling.seed}-{where}".encode()) & 0x7FFFFFFF)


def _filler(trainer: Any) -> int:
    """A token id for a placeholder row (a rollout that gave no tokens): TRL needs one token at least."""
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


class OsmosisRollout:
    """TRL's ``rollout_func``: each prompt row an osmosis rollout, each rollout one training row.

    See the module docstring for what it returns and why. Use it with :func:`osmosis_reward`::

        rollout = OsmosisRollout("http://rollouts:8000", dataset=train_dataset)  # token: $OSMOSIS_SERVER_TOKEN
        trainer = GRPOTrainer(model=..., args=GRPOConfig(use_vllm=True, vllm_mode="server", ...),
                              train_dataset=train_dataset, reward_funcs=[osmosis_reward], rollout_func=rollout)

    :param server_url: the rollout server (``osmosis serve CONFIG --traces``).
    :param policy_url: the OpenAI base URL the rollouts call (default: TRL's vLLM server,
        ``<vllm_server_base_url>/v1``). Its weights must be the trainer's: TRL syncs its vLLM server;
        a :class:`~osmosis_trainer.live_policy.LivePolicyServer` serves the trainer's model object.
    :param token: the rollout server's bearer token (default ``$OSMOSIS_SERVER_TOKEN``).
    :param dataset: the trainer's ``train_dataset``, where each prompt's label and metadata are read.
    :param eval_dataset: the same for evaluation prompts.
    :param prompt_column: the datasets' prompt column (TRL's: ``prompt``).
    :param label_column: the label's column (default ``ground_truth``, else ``label``).
    :param metadata_columns: the columns sent as the rollout's metadata (default every other one).
    :param model: the model name the rollouts send (default: the one TRL's vLLM server serves, else
        the rollout server's ``[policy] model``).
    :param llm_api_key: the policy's bearer token, if it needs one.
    :param max_tokens: each model call's cap: ``"trainer"`` (the default) is ``max_completion_length``;
        a number; None leaves the agent's. The row is cut to ``max_completion_length`` either way.
    :param concurrency: rollouts in flight at once.
    :param run_id: the rollout ids' prefix (default ``trl-<8 hex digits>``, new per instance: a server
        refuses an id it has seen).
    :param agent_timeout_sec: the workflow's timeout per rollout (default the server's).
    :param grader_timeout_sec: the grader's.
    :param truncated: a row cut to ``max_completion_length``: ``"mask"`` (the default: the turns that
        earned its reward may be gone) or ``"keep"`` (train on what is left).
    :param max_masked_steps: stop with :class:`RolloutConfigError` after this many steps in a row
        whose every row was masked (a setup that trains on nothing; the first step's failures stop
        it at once when all are failures); None never stops.
    """

    def __init__(
        self,
        server_url: str,
        *,
        policy_url: str | None = None,
        token: str | None = None,
        dataset: Any = None,
        eval_dataset: Any = None,
        prompt_column: str = "prompt",
        label_column: str | None = None,
        metadata_columns: Sequence[str] | None = None,
        model: str | None = None,
        llm_api_key: str | None = None,
        max_tokens: int | Literal["trainer"] | None = "trainer",
        concurrency: int = 64,
        run_id: str | None = None,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        truncated: Literal["mask", "keep"] = "mask",
        max_masked_steps: int | None = 3,
    ) -> None:
        if truncated not in ("mask", "keep"):
            raise ValueError(f"truncated must be 'mask' or 'keep', got {truncated!r}")
        if max_masked_steps is not None and max_masked_steps < 1:
            raise ValueError(f"max_masked_steps must be >= 1 or None, got {max_masked_steps}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_tokens != "trainer" and max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be 'trainer', None or a number >= 1, got {max_tokens!r}")
        self.server_url = server_url
        self.policy_url = policy_url
        self.model = model
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.run_id = run_id or f"trl-{secrets.token_hex(4)}"
        self.agent_timeout_sec = agent_timeout_sec
        self.grader_timeout_sec = grader_timeout_sec
        self.truncated = truncated
        self.max_masked_steps = max_masked_steps
        self.stats = RolloutStats()
        self.last_results: list[RolloutResult] = []
        """The latest step's results, in the rows' order (their traces included)."""
        self.last_rows: list[SequenceRow] = []
        """The latest step's training rows, in the rows' order."""
        self._token = token
        self._llm_api_key = llm_api_key
        self._datasets = {"train": dataset, "eval": eval_dataset}
        self._columns = (prompt_column, label_column, metadata_columns)
        self._indexes: dict[str, _DatasetIndex | None] = {}
        self._calls = 0
        self._checked = False
        self._masked_steps = 0  # steps in a row whose every row was masked
        self._model_name: str | None = None  # the name a non-main process learnt from the main one

    def __repr__(self) -> str:
        return f"OsmosisRollout({self.server_url!r}, run_id={self.run_id!r})"

    # -- what each step sends ------------------------------------------------------------------------

    def sampling_params(self, trainer: Any) -> SamplingParams:
        """The trainer's sampling settings, as every model call of its rollouts gets them."""
        args = trainer.args
        settings: dict[str, Any] = {
            "temperature": float(args.temperature),
            "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
            "top_k": int(getattr(args, "top_k", 0) or 0) or -1,  # TRL's 0 is "off": -1, which vLLM and SGLang read so
            "min_p": float(getattr(args, "min_p", None) or 0.0),
            "repetition_penalty": float(getattr(args, "repetition_penalty", 1.0) or 1.0),
        }
        if self.max_tokens == "trainer":
            if getattr(args, "max_completion_length", None):
                settings["max_tokens"] = int(args.max_completion_length)
        elif self.max_tokens is not None:
            settings["max_tokens"] = self.max_tokens
        extra = getattr(args, "generation_kwargs", None) or {}
        if isinstance(extra, str):  # TRL takes it as a JSON string on the command line
            extra = json.loads(extra)
        ignored = sorted(k for k in extra if k not in SAMPLING_FIELDS)
        if ignored and not self._checked:
            logger.warning("osmosis: generation_kwargs %s do not reach the rollouts (not sampling settings)", ignored)
        settings.update({k: v for k, v in extra.items() if k in SAMPLING_FIELDS and v is not None})
        return SamplingParams.from_json(settings)

    def _policy(self, trainer: Any) -> tuple[str, str | None]:
        """(the rollouts' policy URL, the model name they send)."""
        args = trainer.args
        if getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "server") != "server":
            raise RolloutConfigError(
                f"vllm_mode={args.vllm_mode!r} runs vLLM inside the trainer, where the rollout server cannot call it: "
                "use vllm_mode='server' (trl vllm-serve), or serve the policy yourself and pass policy_url="
            )
        if self.policy_url is not None:
            return self.policy_url, self.model
        if not getattr(args, "use_vllm", False):
            raise RolloutConfigError(
                "no policy for the rollouts to call: train with use_vllm=True, vllm_mode='server' (TRL keeps that "
                "vLLM in sync with the weights), or pass policy_url= (a LivePolicyServer serving the trainer's "
                "model, or an inference server you keep in sync)"
            )
        base = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        base = base.replace("//0.0.0.0:", "//127.0.0.1:").rstrip("/")
        model = self.model or self._model_name
        if model is None:
            client = getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)
            model = getattr(client, "model", None) or getattr(
                getattr(trainer.model, "config", None), "_name_or_path", None
            )
            accelerator = getattr(trainer, "accelerator", None)
            if int(getattr(accelerator, "num_processes", 1)) > 1:
                # only the main process holds TRL's vLLM client, which knows the name vLLM serves
                from accelerate.utils import broadcast_object_list

                model = broadcast_object_list([model], from_process=0)[0]
            self._model_name = model
        return f"{base}/v1", model

    def _check(self, trainer: Any) -> None:
        """What makes the trainer and the rollouts disagree, refused before the first rollout."""
        if getattr(trainer, "tools", None):
            raise RolloutConfigError(
                "GRPOTrainer(tools=...) runs TRL's own tool loop over what rollout_func returns (and ignores "
                "env_mask): give the tools to the rollout's workflow instead"
            )
        kind = type(trainer)
        if kind.__module__.split(".")[0].startswith("unsloth") or "Unsloth" in kind.__name__:
            logger.warning(
                "osmosis: %s is Unsloth's patched trainer, which ignored env_mask before unsloth #5673 was fixed: "
                "check that yours applies it, or tool tokens are trained on",
                kind.__name__,
            )

    def _index(self, mode: str) -> _DatasetIndex | None:
        if mode not in self._indexes:
            dataset = self._datasets[mode] if self._datasets[mode] is not None else self._datasets["train"]
            prompt_column, label_column, metadata_columns = self._columns
            self._indexes[mode] = (
                None
                if dataset is None
                else _DatasetIndex(
                    dataset,
                    name="eval_dataset" if dataset is self._datasets["eval"] else "dataset",
                    prompt_column=prompt_column,
                    label_column=label_column,
                    metadata_columns=metadata_columns,
                )
            )
        return self._indexes[mode]

    def requests(self, prompts: Sequence[Any], trainer: Any) -> list[RolloutRequest]:
        """The rollouts of one step: one per prompt row, in the rows' order (what :meth:`__call__` sends)."""
        mode = "train" if getattr(trainer.model, "training", True) else "eval"
        group_size = trainer.num_generations if mode == "train" else getattr(trainer, "num_generations_eval", None)
        accelerator = getattr(trainer, "accelerator", None)
        processes = int(getattr(accelerator, "num_processes", 1))
        process_index = int(getattr(accelerator, "process_index", 0))
        # with several processes each holds a slice of the step's rows (process i: rows i*n to (i+1)*n),
        # so a group may span two processes: its rows are numbered where they stand in the whole batch
        offset = process_index * len(prompts) if processes > 1 else 0
        slots = prompt_groups(prompts, int(group_size or trainer.num_generations), offset=offset)
        index = self._index(mode)
        policy_url, model = self._policy(trainer)
        sampling = self.sampling_params(trainer)
        step = int(trainer.state.global_step)
        version = f"step-{step}"
        process = f"-p{process_index}" if processes > 1 else ""
        call = f"{self.run_id}-{step:06d}-c{self._calls}{process}"
        requests = []
        for position, (group, sample) in enumerate(slots):
            prompt = prompts[position]
            where = f"prompt {position} of step {step}"
            row = None
            if index is not None:
                row = index.rows.get(_prompt_key(prompt))
                if row is None:
                    raise RolloutConfigError(
                        f"{where} is not in the dataset given to OsmosisRollout (no row has this prompt): "
                        f"{_prompt_key(prompt)[:200]}"
                    )
            requests.append(
                RolloutRequest(
                    rollout_id=f"{call}-g{group}-s{sample}",
                    initial_messages=_messages(prompt, where),
                    chat_completions_url=policy_url,
                    llm_api_key=self._llm_api_key,
                    label=row.label if row is not None else None,
                    metadata=row.metadata if row is not None else None,
                    agent_timeout_sec=self.agent_timeout_sec,
                    grader_timeout_sec=self.grader_timeout_sec,
                    model=model,
                    row=row.index if row is not None else None,
                    sample_index=sample,
                    sampling_params=_own_seed(sampling, f"{step}-{group}-{sample}"),
                    policy_version=version,
                )
            )
        return requests

    # -- one step --------------------------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Run one rollout per prompt row; return TRL's rows (see the module docstring).

        :raises RolloutConfigError: a setup that cannot train (the message says why), among them a
            server that records no token traces (``osmosis serve ... --traces`` with a policy that
            returns token ids).
        """
        if not self._checked:
            self._check(trainer)
        accelerator: Any = getattr(trainer, "accelerator", None)
        if int(getattr(accelerator, "num_processes", 1)) > 1:
            # the main process pushes the new weights to vLLM before this call; the others must not
            # start their rollouts against weights still being loaded
            accelerator.wait_for_everyone()
        requests = self.requests(prompts, trainer)
        self._checked = True
        self._calls += 1
        started = time.monotonic()

        async def collect() -> list[RolloutResult]:
            async with RolloutClient(self.server_url, token=self._token) as client:
                return [result async for result in client.run_many(requests, concurrency=self.concurrency)]

        results = order_results(requests, _run(collect))
        seconds = time.monotonic() - started
        self._no_traces(results)
        limit = getattr(trainer.args, "max_completion_length", None)
        masks = {"mask_truncated": self.truncated == "mask", "mask_no_reward": True}
        rows = [rollout_rows(r, sequences="last", max_completion_tokens=limit, **masks)[0] for r in results]
        self.last_results, self.last_rows = results, rows
        self._record(trainer, requests[0].policy_version or "", results, rows, seconds)
        self._stop_if_nothing_trains(results, rows)
        return self._output(rows, _filler(trainer))

    def _stop_if_nothing_trains(self, results: Sequence[RolloutResult], rows: Sequence[SequenceRow]) -> None:
        """A run that trains on nothing is a setup error, not a run: refused once every rollout of the
        first step failed, or after ``max_masked_steps`` steps in a row with every row masked."""
        if self.max_masked_steps is None:
            return
        if not all(row.masked for row in rows):
            self._masked_steps = 0
            return
        self._masked_steps += 1
        first = next((r for r in results if r.error is not None), None)
        why = f"e.g. {first.rollout_id}: {first.error}" if first is not None else f"e.g. {rows[0].mask_detail}"
        why = why[:_DETAIL_CHARS]
        if len(self.stats.steps) == 1 and all(not r.ok for r in results):
            raise RolloutConfigError(
                f"every rollout of the first step failed ({why}): fix the setup (the policy URL, the rollout "
                "server's config, the sampling settings the policy refuses) before training"
            )
        if self._masked_steps >= self.max_masked_steps:
            reasons = ", ".join(sorted({row.mask_reason or "" for row in rows}))
            raise RolloutConfigError(
                f"{self._masked_steps} steps in a row trained on nothing: every row masked ({reasons}; {why}); "
                "pass max_masked_steps=None to go on regardless"
            )

    @staticmethod
    def _no_traces(results: Sequence[RolloutResult]) -> None:
        """A step whose every successful rollout came back without token ids is a setup error, not bad luck."""
        succeeded = [r for r in results if r.ok]
        if not succeeded:
            return
        if all(r.trace is None for r in succeeded):
            raise RolloutConfigError(
                "the rollout server sent no traces: start it with `osmosis serve CONFIG --traces` (osmosis-gateway) "
                "so each rollout comes back with its token ids and logprobs"
            )
        if all(r.trace is not None and r.trace.get("capture", "tokens") != "tokens" for r in succeeded):
            raise RolloutConfigError(
                "the traces hold text only: the rollout server's gateway needs a policy that returns token ids "
                '([traces] adapter = "vllm" or "sglang"; an OpenAI upstream gives none)'
            )

    @staticmethod
    def _output(rows: Sequence[SequenceRow], filler: int) -> dict[str, list[Any]]:
        output: dict[str, list[Any]] = {
            key: [] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", *ROW_FIELDS)
        }
        for row in rows:
            prompt, completion = row.prompt_ids or [filler], row.completion_ids
            mask, logprobs = row.completion_mask, row.completion_logprobs
            if not completion:  # nothing generated (a failure before the first call): a one-token placeholder
                completion, mask, logprobs = [filler], [0], [0.0]
            output["prompt_ids"].append(prompt)
            output["completion_ids"].append(completion)
            output["logprobs"].append(logprobs)
            output["env_mask"].append(mask)
            output["osmosis_reward"].append(None if row.masked else row.reward)
            output["osmosis_rollout_id"].append(row.rollout_id)
            output["osmosis_mask_reason"].append(row.mask_reason)
            output["osmosis_mask_detail"].append(row.mask_detail[:_DETAIL_CHARS] if row.mask_detail else None)
            output["osmosis_complete"].append(row.complete)
            output["osmosis_prefix_breaks"].append(row.prefix_breaks)
            output["osmosis_truncated"].append(row.truncated)
        return output

    def _record(
        self,
        trainer: Any,
        version: str,
        results: Sequence[RolloutResult],
        rows: Sequence[SequenceRow],
        seconds: float,
    ) -> None:
        stats = self.stats
        masked = Counter(row.mask_reason for row in rows if row.mask_reason is not None)
        stats.rollouts += len(rows)
        stats.masked.update(masked)
        stats.failed.update(str(r.error.category) for r in results if not r.ok and r.error is not None)
        stats.incomplete_traces += sum(1 for row in rows if row.mask_reason == "incomplete_trace")
        stats.prefix_breaks += sum(row.prefix_breaks for row in rows)
        stats.truncated += sum(row.truncated for row in rows)
        rewards = [row.reward for row in rows if not row.masked and row.reward is not None]
        mean = math.fsum(rewards) / len(rewards) if rewards else None
        mode: Literal["train", "eval"] = "train" if getattr(trainer.model, "training", True) else "eval"
        step = int(trainer.state.global_step)
        stats.steps.append(StepRecord(step, version, len(rows), sum(masked.values()), mean, seconds, mode))
        shown = "none" if mean is None else f"{mean:.3f}"
        logger.info(
            "osmosis: %s step %d: %d rollouts in %.1fs, mean reward %s, %d masked",
            mode,
            step,
            len(rows),
            seconds,
            shown,
            sum(masked.values()),
        )
        if masked:
            first = next(row for row in rows if row.masked)
            reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(masked.items()))
            logger.warning(
                "osmosis: step %d: %d of %d rows masked, not trained on (%s); e.g. %s: %s",
                step,
                sum(masked.values()),
                len(rows),
                reasons,
                first.rollout_id,
                (first.mask_detail or first.mask_reason or "")[:_DETAIL_CHARS],
            )


def _share(values: Iterable[bool], total: int) -> float:
    return sum(values) / total if total else 0.0


def osmosis_reward(
    completions: Sequence[Any],
    osmosis_reward: Sequence[float | None] | None = None,
    osmosis_mask_reason: Sequence[str | None] | None = None,
    osmosis_prefix_breaks: Sequence[int] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    log_extra: Callable[[str, list[Any]], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL's reward function for :class:`OsmosisRollout`'s rows: each row's osmosis reward (the
    grader's), None for a masked row (TRL then leaves it out of its group, with advantage 0).

    It also logs, per step, the share of rows masked (``osmosis/masked``, and per reason
    ``osmosis/masked_<reason>``: ``osmosis/masked_incomplete_trace`` for incomplete traces) and of
    rows that broke their token prefix (``osmosis/prefix_breaks``), and the mask reason of each row as a column
    of TRL's completions table (``osmosis_mask_reason``).

    Another reward function beside it must return None for a row whose ``osmosis_mask_reason`` is
    set: TRL treats a row as unscorable only when every function returns None.

    :raises RolloutConfigError: the rows carry no osmosis fields (``rollout_func`` is not an
        :class:`OsmosisRollout`, or the trainer ignored it: Unsloth's did, unsloth #3573).
    """
    if osmosis_reward is None or osmosis_mask_reason is None:
        raise RolloutConfigError(
            "osmosis_reward: the rows carry no osmosis reward: pass rollout_func=OsmosisRollout(...) to the "
            "GRPOTrainer (a trainer that ignores rollout_func, as Unsloth's patched one did, unsloth #3573, "
            "generates the completions itself)"
        )
    total = len(completions)
    reasons = list(osmosis_mask_reason)
    if log_metric is not None:
        log_metric("osmosis/masked", _share((r is not None for r in reasons), total))
        for reason in MASK_REASONS:
            log_metric(f"osmosis/masked_{reason}", _share((r == reason for r in reasons), total))
        log_metric("osmosis/prefix_breaks", _share((b > 0 for b in osmosis_prefix_breaks or ()), total))
    if log_extra is not None:
        log_extra("osmosis_mask_reason", [r or "" for r in reasons])
    return [None if reason is not None else reward for reward, reason in zip(osmosis_reward, reasons, strict=True)]
