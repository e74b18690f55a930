"""``llm-judge``: an LLM scores the answer against the label with a rubric.

The judge is an OpenAI-compatible chat-completions endpoint named in the grader config, never
the policy's: a config without ``base_url`` and ``model`` is refused, and nothing falls back to
the rollout's endpoint. The key is read from the environment variable ``api_key_env`` names.

The rubric is a template; ``{{prompt}}`` (the last user message of the rollout's prompt),
``{{answer}}`` (the extracted answer: by default the whole final message), ``{{conversation}}``
(the whole sample, one ``role: text`` line per message), ``{{label}}``, ``{{min_score}}`` and
``{{max_score}}`` are filled in. The judge must reply with a JSON object holding a number
``score`` in ``[min_score, max_score]`` (and, optionally, a ``reason``); the reply is parsed
strictly (only a leading ``<think>...</think>`` block and one enclosing code fence are allowed
around it), and the reward is the score scaled to ``[0, 1]``. With ``n > 1`` it asks ``n``
times and takes the ``mean`` or the ``majority`` score (a tie goes to the lower score).

Failures are never a silent 0.0: an unreachable judge, an HTTP error, a malformed completion,
or a judgement that is not such an object (or is out of range) fails the grading as a
``policy_error`` whose message names the judge endpoint and the status, never the key. Each
judgement is one POST, never retried. ``max_concurrent_requests`` bounds the requests in flight
to one judge endpoint from one event loop.

In a run config::

    [rollout]
    grader = "llm-judge"

    [rollout.grader_config]
    base_url = "https://api.openai.com/v1"
    model = "gpt-4o-mini"
    api_key_env = "JUDGE_API_KEY"
    min_score = 0
    max_score = 10
    n = 3
    aggregate = "majority"
    temperature = 0.7
    rubric = \"\"\"Question: {{prompt}}
    Reference: {{label}}
    Answer: {{answer}}
    Score the answer from {{min_score}} to {{max_score}}. Reply with JSON: {"reason": "...", "score": N}\"\"\"

From code::

    from osmosis_graders import JudgeConfig, LLMJudgeGrader
    grader = LLMJudgeGrader(JudgeConfig(base_url="http://127.0.0.1:8001/v1", model="judge"))
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import statistics
import weakref
from collections import Counter
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit, urlunsplit

import attrs

from osmosis_core import GraderConfig, GraderContext, PolicyError, RolloutSample, message_text
from osmosis_core.http import http_request, read_limited
from osmosis_core.plugin import clip
from osmosis_graders.base import (
    AnswerConfig,
    AnswerGrader,
    ExtractorChain,
    Verdict,
    check_extractors,
    config_problem,
    extractor_chain,
    positive_int,
    shown,
)
from osmosis_graders.extract import Extraction

__all__ = ["DEFAULT_RUBRIC", "JudgeConfig", "LLMJudgeGrader", "parse_judgement"]

DEFAULT_RUBRIC: Final = """You are grading an answer to a question against a reference answer.

Question:
{{prompt}}

Reference answer:
{{label}}

Answer to grade:
{{answer}}

Score how correct the answer is, from {{min_score}} (wrong) to {{max_score}} (fully correct and \
equivalent to the reference). Reply with only a JSON object: {"reason": "<one sentence>", "score": <number>}"""
"""The rubric used when the config gives none."""

PLACEHOLDERS: Final = ("prompt", "answer", "conversation", "label", "min_score", "max_score")
_PLACEHOLDER: Final = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
_AGGREGATES: Final = ("mean", "majority")
_FORMATS: Final = ("json_schema", "json_object", "none")
_RESERVED: Final = ("model", "messages", "n", "stream")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_THINK: Final = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
_FENCE: Final = re.compile(r"\A```(?:json|JSON)?[ \t]*\n?(.*?)\n?```\Z", re.DOTALL)
_SCHEMA: Final = {
    "type": "object",
    "properties": {"reason": {"type": "string"}, "score": {"type": "number"}},
    "required": ["reason", "score"],
    "additionalProperties": False,
}


def _choice(options: tuple[str, ...]) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in options:
            raise config_problem(attribute.name, f"must be one of {', '.join(options)}, got {value!r}")

    return check


def _finite(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise config_problem(attribute.name, f"must be a finite number, got {value!r}")


@attrs.define(kw_only=True)
class JudgeConfig(AnswerConfig):
    """Settings of ``llm-judge`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar base_url: the judge's API root (``http://127.0.0.1:8001/v1``); required.
    :ivar model: the judge model's name; required.
    :ivar api_key_env: the environment variable holding the judge's key (none: no key sent).
    :ivar rubric: the prompt template (:data:`DEFAULT_RUBRIC`; placeholders in the module docstring).
    :ivar system_prompt: an optional system message before the rubric.
    :ivar min_score: the lowest score the rubric asks for (scaled to 0.0).
    :ivar max_score: the highest (scaled to 1.0).
    :ivar n: judgements per grading.
    :ivar aggregate: ``mean`` or ``majority`` of the ``n`` scores.
    :ivar temperature: the judge's sampling temperature (raise it with ``n > 1``).
    :ivar max_tokens: the judge's reply limit.
    :ivar response_format: ``json_schema`` (default), ``json_object``, or ``none`` (no structured output).
    :ivar params: more request fields (``top_p``, ``seed``, ...).
    :ivar max_concurrent_requests: requests in flight to this judge from one event loop.
    :ivar max_response_mb: a larger response body fails the grading.
    :ivar extract: default ``"final"`` (the judge sees the whole final message as ``{{answer}}``).
    """

    extract: ExtractorChain = attrs.field(default=("final",), converter=extractor_chain, validator=check_extractors)
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    rubric: str = DEFAULT_RUBRIC
    system_prompt: str | None = None
    min_score: float = attrs.field(default=0.0, validator=_finite)
    max_score: float = attrs.field(default=10.0, validator=_finite)
    n: int = attrs.field(default=1, validator=positive_int)
    aggregate: str = attrs.field(default="mean", validator=_choice(_AGGREGATES))
    temperature: float = attrs.field(default=0.0, validator=_finite)
    max_tokens: int = attrs.field(default=1024, validator=positive_int)
    response_format: str = attrs.field(default="json_schema", validator=_choice(_FORMATS))
    params: dict[str, Any] = attrs.field(factory=dict)
    max_concurrent_requests: int = attrs.field(default=8, validator=positive_int)
    max_response_mb: float = attrs.field(default=8.0, validator=_finite)

    def __attrs_post_init__(self) -> None:
        if self.base_url is not None:
            if urlsplit(self.base_url).scheme not in ("http", "https"):
                raise config_problem("base_url", f"must be an http(s) URL, got {_display(self.base_url)!r}")
            if not self.model:
                raise config_problem("model", "the judge model's name is required")
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            raise config_problem("api_key_env", f"must name an environment variable, got {self.api_key_env!r}")
        unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(self.rubric)} - set(PLACEHOLDERS))
        if unknown:
            raise config_problem(
                "rubric", f"unknown placeholder(s) {', '.join(unknown)} (known: {', '.join(PLACEHOLDERS)})"
            )
        if not self.min_score < self.max_score:
            raise config_problem("max_score", f"must be above min_score ({self.min_score:g}), got {self.max_score:g}")
        reserved = sorted(set(self.params) & set(_RESERVED))
        if reserved:
            raise config_problem("params", f"may not set {', '.join(reserved)} (the grader sets them)")
        if self.max_response_mb <= 0:
            raise config_problem("max_response_mb", f"must be positive, got {self.max_response_mb:g}")
        # The default config (what the loader makes before reading [rollout.grader_config]) has no
        # endpoint; any config that sets something must name one: there is no fallback to the policy.
        if self.base_url is None and self._settings():
            raise config_problem("base_url", "the judge's endpoint is required (it is never the policy's)")

    def _settings(self) -> list[str]:
        """The fields set to something else than their default (``base_url`` aside)."""
        changed = []
        for field in attrs.fields(type(self)):
            if not field.init or field.name == "base_url":
                continue
            default = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default  # type: ignore[arg-type]
            if field.converter is not None and default is not attrs.NOTHING:
                default = field.converter(default)
            if getattr(self, field.name) != default:
                changed.append(field.name)
        return changed

    @property
    def url(self) -> str:
        """The judge's chat-completions URL."""
        return (self.base_url or "").rstrip("/") + "/chat/completions"


def _display(url: str) -> str:
    """``url`` without a user or password in it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class JudgementError(ValueError):
    """The judge's reply is not a valid judgement (turned into a :class:`PolicyError` naming the judge)."""


def parse_judgement(content: str, min_score: float, max_score: float) -> tuple[float, str | None]:
    """The score and the reason in a judge's reply, parsed strictly.

    >>> parse_judgement('{"reason": "right", "score": 8}', 0, 10)
    (8, 'right')
    >>> parse_judgement("<think>hmm</think>```json\\n{\\"score\\": 1}\\n```", 0, 1)
    (1, None)

    :raises JudgementError: not a JSON object with a finite number ``score`` in range.
    """
    text = _THINK.sub("", content, count=1).strip()
    fenced = _FENCE.fullmatch(text)
    if fenced is not None:
        text = fenced.group(1).strip()
    try:
        doc = json.loads(text)
    except ValueError:
        raise JudgementError("the judgement is not JSON") from None
    if not isinstance(doc, dict) or "score" not in doc:
        raise JudgementError("the judgement is not a JSON object with a score")
    score = doc["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise JudgementError(f"the judgement's score is not a number: {score!r}")
    if not min_score <= score <= max_score:
        raise JudgementError(f"the judgement's score {score:g} is outside [{min_score:g}, {max_score:g}]")
    reason = doc.get("reason")
    return score, reason if isinstance(reason, str) else None


def _majority(scores: list[float]) -> float:
    counts = Counter(scores)
    top = max(counts.values())
    return min(s for s, c in counts.items() if c == top)


_limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _limit(url: str, size: int) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    per_loop = _limits.get(loop)
    if per_loop is None:
        per_loop = _limits[loop] = {}
    semaphore = per_loop.get((url, size))
    if semaphore is None:
        semaphore = per_loop[(url, size)] = asyncio.Semaphore(size)
    return semaphore


def _render(template: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def conversation_text(sample: RolloutSample) -> str:
    """The sample as text, one ``role: text`` block per message (tool calls as ``name(arguments)``)."""
    lines = []
    for message in sample.readable_messages():
        role = str(message.get("role", "?"))
        text = message_text(message)
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n[calls {function.get('name', '?')}({function.get('arguments', '')})]"
        lines.append(f"{role}: {text.strip()}")
    if sample.system_prompt:
        lines.insert(0, f"system: {sample.system_prompt}")
    return "\n\n".join(lines)


class LLMJudgeGrader(AnswerGrader[JudgeConfig]):
    """An LLM judge's score, scaled to [0, 1] (see the module docstring)."""

    name: ClassVar[str] = "llm-judge"
    alternatives: ClassVar[bool] = False
    config_type: ClassVar[type[GraderConfig]] = JudgeConfig

    def _key(self) -> str | None:
        var = self.config.api_key_env
        if var is None:
            return None
        key = os.environ.get(var)
        if not key:
            raise ValueError(f"llm-judge: the environment variable {var} (api_key_env) is not set")
        return key

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[JudgeConfig]) -> Verdict:
        config = self.config
        if config.base_url is None or config.model is None:
            raise ValueError(
                "llm-judge needs base_url and model in [rollout.grader_config] "
                "(the judge's endpoint; the policy's is never used)"
            )
        key = self._key()
        prompt = next((message_text(m) for m in reversed(ctx.prompt) if m.get("role") == "user"), "")
        values = {
            "prompt": prompt,
            "answer": answer.text,
            "conversation": conversation_text(ctx.sample),
            "label": labels[0] if labels else "",
            "min_score": f"{config.min_score:g}",
            "max_score": f"{config.max_score:g}",
        }
        messages = [{"role": "user", "content": _render(config.rubric, values)}]
        if config.system_prompt:
            messages.insert(0, {"role": "system", "content": config.system_prompt})
        body: dict[str, Any] = {
            "model": config.model,
            "messages": messages,
            "temperature": config.temperature,
            "max_tokens": config.max_tokens,
            **config.params,
        }
        if config.response_format == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": _SCHEMA, "strict": True},
            }
        elif config.response_format == "json_object":
            body["response_format"] = {"type": "json_object"}
        try:
            data = json.dumps(body).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"llm-judge: the request cannot be sent as JSON: {exc}") from None
        try:  # the n judgements at once; the first failure cancels the others
            async with asyncio.TaskGroup() as group:
                asks = [group.create_task(self._ask(data, key)) for _ in range(config.n)]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        judgements = [ask.result() for ask in asks]
        raw = [score for score, _reason in judgements]
        chosen = statistics.fmean(raw) if config.aggregate == "mean" else _majority(raw)
        scaled = (chosen - config.min_score) / (config.max_score - config.min_score)
        reason = next((r for _s, r in judgements if r), None)
        metrics: dict[str, Any] = {"raw_scores": raw}
        if reason is not None:
            metrics["judge_reason"] = shown(reason)
        return Verdict(scaled, metrics=metrics)

    async def _ask(self, data: bytes, key: str | None) -> tuple[float, str | None]:
        """One judgement: one POST. :raises PolicyError: any failure, naming the judge and the status."""
        config = self.config
        url = config.url
        shown_url = _display(url)
        secrets = [key, *_url_secrets(url)]
        where = f"judge {shown_url} (model {config.model})"
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        limit = int(config.max_response_mb * 1024 * 1024)
        status: int | None = None
        try:
            async with (
                _limit(url, config.max_concurrent_requests),
                http_request("POST", url, data=data, headers=headers) as response,
            ):
                status = response.status
                content = await read_limited(response, limit)
        except Exception as exc:  # unreachable, reset, too large, a socket timeout: all the judge's failure
            what = f"{type(exc).__name__}: {exc}".rstrip(": ")
            answered = f" after status {status}" if status is not None else ""
            raise PolicyError(
                clip(f"{where} failed{answered}: {what}", secrets, 500), status=status, endpoint=shown_url
            ) from None
        if status >= 400:
            raise PolicyError(
                clip(f"{where} answered {status}: {_detail(content)}", secrets, 500), status=status, endpoint=shown_url
            )
        try:
            reply = json.loads(content)
            text = reply["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not text")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PolicyError(
                clip(f"{where} sent a malformed completion ({type(exc).__name__}): {_body(content)}", secrets, 500),
                status=status,
                endpoint=shown_url,
            ) from None
        try:
            return parse_judgement(text, config.min_score, config.max_score)
        except JudgementError as exc:
            raise PolicyError(
                clip(f"{where} answered {status} with a bad judgement: {exc}: {text!r}", secrets, 500),
                status=status,
                endpoint=shown_url,
            ) from None


def _url_secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    return [s for s in (parts.password,) if s]


def _body(content: bytes) -> str:
    return content[:2048].decode("utf-8", "replace").strip() or "(empty body)"


def _detail(content: bytes) -> str:
    try:
        doc = json.loads(content[:65536])
    except ValueError:
        return _body(content)
    error = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
