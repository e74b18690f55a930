"""One model call through the gateway: the request a rollout sent, the call upstream, the answer the
rollout gets, and the :class:`~osmosis_gateway.trace.TraceCall` that records it.

A call is recorded once, when its outcome is known, and never as ``ok`` before its answer is
whole: a whole answer once its body is read (``Content-Length`` or the last chunk), a stream once
its ``[DONE]`` event came (what the upstream sends after it, or when it closes the connection,
changes nothing). Until then its status is ``pending``; a call that ends any other way says how:

* ``upstream_error``: the upstream answered an error status or a redirect (passed on to the rollout,
  redacted; a redirect is not followed), sent an error event in its stream, could not be reached
  (or not connected to in time), or its answer was over ``max_response_bytes`` (502);
* ``no_answer``: nothing came from the upstream for ``read_timeout_sec`` (504);
* ``unreadable``: the upstream's answer (or one event of its stream) is not a chat completion, or
  not even HTTP (502);
* ``cut``: the upstream's connection broke off, its answer stalled for ``read_timeout_sec`` after
  its head, or its stream ended without ``[DONE]`` (the rollout sees the same: its connection is
  dropped or its stream cut);
* ``client_gone``: the rollout hung up before the end (the upstream call is cancelled: its
  connection is closed, which vLLM and SGLang take as an abort);
* ``cancelled``: the rollout's trace was taken, or the gateway stopped, while the call was in flight
  (:meth:`PolicyGateway.pop_trace` and ``aclose`` record it, then cancel the call);
* ``capture_failed``: the rollout got its answer, the tokens could not be captured;
* ``bad_request``: what the rollout sent is not a chat-completions request (400).

What the gateway hands back from the upstream has the upstream's key and extra header values taken
out. An error (a status of 300 or more, an error event in a stream) gets the core's rule
(:func:`osmosis_core.plugin.redact`: the value, and any run of 8 of its characters, as a provider
echoes a masked key), read as JSON where it is JSON (so an escaped key is found too). An answer, the
policy's own output, gets only whole values taken out: the 8-character rule would rewrite ordinary
words a header value shares (a referer's host, ``sk-proj-``), and the rollout would act on text the
policy never wrote; when a whole value is taken out, the call is ``capture_failed`` (its tokens no
longer say what the rollout read).
"""

from __future__ import annotations

import json
import time
from array import array
from typing import TYPE_CHECKING, Any, Final

import msgspec
from aiohttp import (
    ClientConnectorError,
    ClientError,
    ClientResponse,
    ClientResponseError,
    ConnectionTimeoutError,
    web,
)

from osmosis_core.frontend import finite_json
from osmosis_core.http import ResponseTooLarge, cut_response, drop_connection, read_limited
from osmosis_core.plugin import clip, redact, redact_data
from osmosis_core.sampling import SAMPLING_PARAMS, agent_distribution, apply_sampling
from osmosis_gateway.adapters import (
    CallCapture,
    completion_events,
    json_bytes,
    json_bytes_kept,
    json_read,
    prepare_request,
)
from osmosis_trainer.trace import CallStatus, RolloutTrace, TraceCall

if TYPE_CHECKING:
    from osmosis_gateway.gateway import Upstream
    from osmosis_gateway.token_in import Conversation

__all__ = ["POLICY_VERSION_FIELD", "POLICY_VERSION_HEADER", "ModelCall", "error_response"]

POLICY_VERSION_FIELD: Final = "osmosis_policy_version"
"""A request field that tags a call with a policy version (taken out before the request goes upstream)."""
POLICY_VERSION_HEADER: Final = "X-Osmosis-Policy-Version"
"""On a call, the policy version a trainer tags it with; on the upstream's answer, the version whose
weights answered (it wins: recorded per call)."""
_ERROR_CHARS: Final = 500
_EVENT_STREAM: Final = "text/event-stream; charset=utf-8"
_DONE: Final = b"data: [DONE]\n\n"
_LIST_START: Final = ord("[")
_REQUEST: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_READ_FIELDS: Final = (
    "model",
    "stream",
    "stream_options",
    "n",
    "return_token_ids",
    "logprobs",
    "return_tokens_as_token_ids",
    POLICY_VERSION_FIELD,
    *SAMPLING_PARAMS,  # (the trainer's rule and a token-in call read them: a null is then unset)
    "max_completion_tokens",
)
"""The request fields the gateway reads (the adapters' too); the rest (``messages``, ``tools``) stays JSON text."""


def error_response(status: int, message: str, **headers: str) -> web.Response:
    """An OpenAI-shaped error answer."""
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "server_error"
    body = json_bytes({"error": {"message": message, "type": kind, "param": None, "code": status}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers or None)


def read_request(raw: bytes) -> tuple[dict[str, Any], bool]:
    """A chat-completions request and whether json read it. msgspec reads its fields as JSON text
    and decodes only :data:`_READ_FIELDS` (the messages go on, and into the trace, as the text they
    are); json reads what msgspec refuses (NaN, Infinity), whole.

    :raises ValueError: not JSON, not an object, or no ``messages`` array.
    """
    try:
        body: dict[str, Any] = _REQUEST.decode(raw)
    except msgspec.DecodeError:  # not an object of JSON fields, or JSON msgspec refuses: json decides
        body, by_json = json.loads(raw), True
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ValueError("expected a JSON object with a 'messages' array") from None
        return body, by_json
    messages = body.get("messages")
    if messages is None or memoryview(messages)[0] != _LIST_START:
        raise ValueError("expected a JSON object with a 'messages' array")
    for key in _READ_FIELDS:
        value = body.get(key)
        if value is not None:
            body[key] = json_read(value)
    return body, False


def _loads(raw: bytes) -> Any:
    """A JSON document: msgspec reads what a server sends, json what msgspec refuses (NaN, Infinity).

    :raises ValueError: not JSON.
    """
    try:
        return json_read(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def _detail(content: bytes) -> str:
    """What an upstream error body says (its ``error.message`` when it is OpenAI-shaped)."""
    try:
        data = json.loads(content[:65536])
    except ValueError:
        return content[:2000].decode("utf-8", "replace").strip() or "(empty body)"
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class ModelCall:
    """One call of one rollout, from its request to its recorded outcome (see the module's docstring).

    The gateway makes one per model call once the caller is authorized and the body is read;
    :meth:`answer` gives the rollout's answer and records the call; :meth:`finish` records an
    outcome decided from outside (the rollout hung up, its trace was taken).
    """

    __slots__ = (
        "altered",
        "answered",
        "capture",
        "conversation",
        "include_usage",
        "record",
        "request",
        "rollout_open",
        "sampling",
        "sent",
        "started",
        "trace",
        "upstream",
    )

    def __init__(
        self,
        upstream: Upstream,
        request: web.BaseRequest,
        trace: RolloutTrace,
        record: TraceCall,
        sampling: dict[str, Any] | None = None,
        conversation: Conversation | None = None,
    ) -> None:
        self.upstream = upstream
        self.conversation = conversation
        """The rollout's answered calls, on a token-in upstream (the next prompt extends them)."""
        self.request = request
        self.trace = trace
        self.record = record
        self.sampling = sampling
        """The trainer's sampling settings, set over the request's before it goes upstream."""
        self.started = time.perf_counter()
        self.capture: CallCapture | None = None
        self.include_usage = False
        self.rollout_open = True
        """False once the rollout's trace was taken (nothing may change the record then)."""
        self.sent = False
        """Whether the call went upstream (a failure after it is the answer's, before it the request's)."""
        self.answered = False
        """Whether the upstream's answer began (its status and headers came)."""
        self.altered = False
        """Whether a whole secret was taken out of the answer the rollout got."""

    # -- the outcome -------------------------------------------------------------------------------

    def finish(self, status: CallStatus, error: str | None, http_status: int | None, *, late: bool = False) -> None:
        """Record how the call ended: once (a later outcome is ignored), except ``late``: the rollout
        hung up on the answer's last write, which turns an ``ok`` into ``client_gone`` while its
        trace is still in the gateway."""
        record = self.record
        if record.status != "pending" and not (late and self.rollout_open):
            return
        record.status = status
        record.error = error
        record.http_status = http_status
        record.latency_sec = time.perf_counter() - self.started
        if status != "ok":
            self.trace.mark_incomplete(f"call {record.index} {status.replace('_', ' ')}: {error}")

    def _complete(self, status: int) -> None:
        """The answer is whole: what it carried, recorded."""
        capture = self.capture
        assert capture is not None
        record = self.record
        message = capture.message()
        record.response = self._clean(message)
        record.finish_reason = capture.finish_reason
        record.usage = capture.usage
        if capture.malformed is not None:
            self.finish(
                "upstream_error" if capture.sent_error else "unreadable", self.message(capture.malformed), status
            )
        elif not capture.token_level:
            self.finish("ok" if capture.problem is None else "capture_failed", capture.problem, status)
        elif (tokens := capture.tokens()) is None:
            self.finish("capture_failed", capture.problem, status)
        else:
            record.prompt_token_ids, record.completion_token_ids, record.logprobs = tokens
            self.finish("ok", None, status)
        if (
            self.altered and record.status == "ok"
        ):  # (the tokens say what the policy wrote; the rollout read other text)
            problem = "the answer held the upstream's key or a header value, taken out: the rollout read other text"
            self.finish("capture_failed", problem, status, late=True)

    def _clean(self, message: dict[str, Any]) -> dict[str, Any]:
        """The recorded message as the rollout got it: whole secrets taken out."""
        secrets = self.upstream.secrets
        if not secrets:
            return message
        cleaned: dict[str, Any] = _without(message, secrets)
        return cleaned

    def _redact(self, data: bytes) -> bytes:
        """An answer (or a stream's events) without a whole secret of the upstream's (the same object
        when it holds none); :attr:`altered` says one was there."""
        secrets = self.upstream.secrets
        if not secrets:
            return data
        clean = data
        for secret in self.upstream.secret_bytes:
            if secret in clean:
                clean = clean.replace(secret, b"***")
        if clean is not data:
            self.altered = True
        return clean

    def _redact_error(self, data: bytes) -> bytes:
        """An error (a body, or a stream's error event) with the core's rule: a JSON document is
        redacted as the values it holds (an escaped key is found too, and the document stays JSON)."""
        secrets = self.upstream.secrets
        if not secrets:
            return data
        try:
            doc = _loads(data)
        except (ValueError, RecursionError):
            text = data.decode("utf-8", "surrogateescape")
            clean = redact(text, secrets)
            return data if clean is text else clean.encode("utf-8", "surrogateescape")
        cleaned = redact_data(doc, secrets)
        return data if cleaned == doc else json_bytes(cleaned)

    def message(self, text: str) -> str:
        """``text`` as one line for a record or a log, without the upstream's secrets."""
        return clip(text, self.upstream.secrets, _ERROR_CHARS)

    # -- the call ----------------------------------------------------------------------------------

    async def answer(self, body: bytes) -> web.StreamResponse:
        """Send the call upstream and give the rollout its answer, recording the call."""
        record = self.record
        try:
            request, by_json = read_request(body)
        except ValueError as exc:
            message = f"not a chat-completions request: {exc}"
            self.finish("bad_request", message, 400)
            return error_response(400, message)
        version = request.pop(POLICY_VERSION_FIELD, None)
        version = self.request.headers.get(POLICY_VERSION_HEADER) or version or record.policy_version
        record.policy_version = None if version is None else str(version)
        sent = {k: v for k, v in request.items() if k not in ("model", "stream")}
        if by_json:  # (what msgspec refused: a NaN or an Infinity, written as its spelling, or no UTF-8)
            try:
                json_bytes_kept(request)
            except UnicodeEncodeError as exc:
                message = f"not a chat-completions request: its text is not UTF-8 ({exc.reason})"
                self.finish("bad_request", message, 400)
                return error_response(400, message)
            record.request = finite_json(sent)
        else:
            record.request = json_bytes(sent)  # (JSON text, read when the trace is)
        if self.sampling is not None:  # the trainer's over the rollout's (the trace keeps what it sent)
            record.sampling_dropped = agent_distribution(request, self.sampling) or None
            record.sampling = apply_sampling(request, self.sampling)  # (on both paths: chat and token-in)
        model = request.get("model")
        record.model = model if isinstance(model, str) else None
        record.stream = request.get("stream") is True
        options = request.get("stream_options")
        self.include_usage = isinstance(options, dict) and options.get("include_usage") is True
        if self.upstream.token_in is not None:
            return await self._token_in(request)
        self.capture = prepare_request(request, self.upstream.adapter)  # (may ask for a whole answer instead)
        upstream_streams = request.get("stream") is True
        data = json_bytes_kept(request) if by_json else json_bytes(request)
        got = await self._post(data, relay=upstream_streams)
        if isinstance(got, web.StreamResponse):
            return got
        status, kind, content = got
        if record.stream and status == 200:  # asked for whole, or answered so: streamed as asked
            return await self._stream_whole(content)
        return self._whole(status, kind, content)

    async def _token_in(self, request: dict[str, Any]) -> web.StreamResponse:
        """A call to a token-in engine: the conversation rendered to ids (incrementally), sent to
        the engine's token route, its generated ids read back as a chat completion (tool calls
        parsed), streamed or not as the rollout asked; the trace holds the ids the engine saw."""
        from osmosis_gateway.token_in import ContextFull, Conversation, TemplateError

        token_in = self.upstream.token_in
        assert token_in is not None
        record = self.record
        conversation = self.conversation if self.conversation is not None else Conversation()
        for key in ("messages", "tools", "tool_choice", "chat_template_kwargs"):
            if isinstance(request.get(key), msgspec.Raw):
                request[key] = json_read(request[key])
        request_id = f"{self.trace.rollout_id}-{record.index}"
        model = record.model or self.upstream.model
        try:
            prepared = token_in.prepare(conversation, request, request_id, model)
        except (ValueError, RecursionError) as exc:
            kind = (
                "the chat template refused it" if isinstance(exc, TemplateError)
                else "its prompt is too long" if isinstance(exc, ContextFull)
                else "it cannot be rendered"
            )  # fmt: skip
            message = self.message(f"not a request for the token-in policy ({kind}): {exc}")
            self.finish("bad_request", message, 400)
            return error_response(400, message)
        rendered = prepared.rendered
        details: dict[str, Any] = {"engine": token_in.engine, "render": rendered.mode}
        if rendered.reason is not None:
            details["render_reason"] = rendered.reason
        if rendered.extends is not None:
            details["extends"] = rendered.extends
        if rendered.note is not None:
            details["render_note"] = rendered.note
        if prepared.capped is not None:
            asked_cap, sent_cap = prepared.capped
            details["max_tokens_clamped"] = {"asked": asked_cap, "sent": sent_cap}
        record.token_in = details
        got = await self._post(json_bytes(prepared.body), relay=False)
        if isinstance(got, web.StreamResponse):
            return got
        status, kind, content = got
        if status >= 300:
            self.finish("upstream_error", self.message(f"the engine answered {status}: {_detail(content)}"), status)
            content_type = kind.split(";", 1)[0].strip() or "application/octet-stream"
            return web.Response(status=status, body=self._redact_error(content), content_type=content_type)
        try:
            reply = token_in.reply(_loads(content), request)
        except (ValueError, RecursionError) as exc:
            message = self.message(f"the engine's answer ({len(content)} bytes) cannot be read: {exc}")
            self.finish("unreadable", message, 502)
            return error_response(502, message)
        answer, parsed = reply.answer, reply.parsed
        prompt_ids = rendered.prompt_ids
        asked = request.get("logprobs") is True
        doc = token_in.completion(
            answer, parsed, prompt_tokens=len(prompt_ids), model=model, request_id=request_id, logprobs=asked
        )
        message = doc["choices"][0]["message"]
        body = self._redact(self._events_of(doc) if record.stream else json_bytes(doc))  # (whole secrets out)
        record.response = self._clean(message)
        record.finish_reason = doc["choices"][0]["finish_reason"]
        record.usage = doc["usage"]
        details["tool_calls"] = len(parsed.tool_calls)
        details.update(reply.notes)
        if parsed.malformed is not None:
            details["tool_parse_error"] = parsed.malformed
        record.prompt_token_ids = array("i", prompt_ids)
        record.completion_token_ids = array("i", answer.token_ids)
        record.logprobs = array("d", answer.logprobs)
        if answer.prompt_ids is not None and answer.prompt_ids != prompt_ids:
            self.finish("capture_failed", "the engine echoed other prompt ids than the gateway sent", status)
        elif self.altered:  # (the ids say what the policy wrote; the rollout read other text)
            problem = "the answer held the upstream's key or a header value, taken out: the rollout read other text"
            self.finish("capture_failed", problem, status)
        else:
            self.finish("ok", None, status)
            conversation.answered(
                prepared.seen, prepared.tools_key, message, record.prompt_token_ids, record.completion_token_ids,
                record.index, finish_reason=answer.finish_reason, stop_id=reply.stop_id,
            )  # fmt: skip
        if not record.stream:
            return web.Response(status=200, body=body, content_type="application/json")
        return await self._write_stream(body)

    async def _post(self, data: bytes, *, relay: bool) -> web.StreamResponse | tuple[int, str, bytes]:
        """Send ``data`` upstream: its answer's status, content type and whole body, or the answer the
        rollout gets when the call failed (recorded) or, with ``relay``, was streamed through."""
        self.sent = True
        try:
            answer = await self._send(data)
            self.answered = True
            served = answer.headers.get(POLICY_VERSION_HEADER)
            if served:  # the version whose weights answered, said by the upstream (a weight-sync wrapper)
                self.record.policy_version = served[:256]
            try:
                status = answer.status
                kind = answer.headers.get("Content-Type", "")
                if relay and status == 200 and kind.startswith("text/event-stream"):
                    return await self._relay(answer)
                content = await read_limited(answer, self.upstream.max_response_bytes)
            finally:
                answer.release()  # (closes the connection when the answer was not read to its end)
        except ClientConnectorError as exc:
            message = self.message(f"the gateway cannot reach the upstream: {exc}")
            self.finish("upstream_error", message, 502)
            return error_response(502, message)
        except ResponseTooLarge as exc:
            message = f"the upstream's answer is too large: {exc}"
            self.finish("upstream_error", message, 502)
            return error_response(502, message)
        except ConnectionTimeoutError as exc:
            message = self.message(f"the gateway cannot reach the upstream: {exc}")
            self.finish("upstream_error", message, 502)
            return error_response(502, message)
        except TimeoutError:
            if self.answered:  # its head came, then its body stalled
                message = f"the upstream's answer stalled for {self.upstream.read_timeout_sec:g} s"
                self.finish("cut", message, None)
                return _drop(self.request)
            message = f"the upstream sent nothing for {self.upstream.read_timeout_sec:g} s"
            self.finish("no_answer", message, 504)
            return error_response(504, message)
        except ClientResponseError as exc:  # (raise_for_status is off: what aiohttp could not read as HTTP)
            message = self.message(f"the upstream's answer is not HTTP: {exc.message}")
            self.finish("unreadable", message, 502)
            return error_response(502, message)
        except (ClientError, OSError) as exc:  # the upstream dropped the call: so does the gateway
            self.finish("cut", self.message(f"the upstream dropped the call: {type(exc).__name__}: {exc}"), None)
            return _drop(self.request)
        return status, kind, content

    async def _send(self, data: bytes) -> ClientResponse:
        """The upstream's answer, its head read. A call is sent once: a connection that closes before
        the answer fails it (``cut``), as aiohttp never sends a POST twice; the pool closes a
        connection idle for 4 s, before uvicorn (vLLM, SGLang) does after 5 s, so a call does not go
        out on a connection the upstream is closing."""
        upstream = self.upstream
        headers = {**upstream.headers, "X-Osmosis-Rollout-Id": self.trace.rollout_id}
        return await upstream.session.post(upstream.url, data=data, headers=headers, **upstream.options)

    def _whole(self, status: int, kind: str, content: bytes) -> web.Response:
        """A whole answer: recorded, then handed to the rollout."""
        content_type = kind.split(";", 1)[0].strip() or "application/octet-stream"
        if status >= 300:  # (an error, or a redirect: not followed, it would take the headers elsewhere)
            self.finish("upstream_error", self.message(f"the upstream answered {status}: {_detail(content)}"), status)
            return web.Response(status=status, body=self._redact_error(content), content_type=content_type)
        capture = self.capture
        assert capture is not None
        try:
            stripped = capture.feed_bytes(content, chunk=False)
        except ValueError:
            problem = f"the upstream's answer ({content_type}, {len(content)} bytes) is not valid JSON"
            self.finish("unreadable", problem, status)
            return web.Response(status=status, body=self._redact_error(content), content_type=content_type)
        body = self._redact(content if stripped is None else stripped)
        self._complete(status)
        return web.Response(status=status, body=body, content_type=content_type)

    async def _stream_whole(self, content: bytes) -> web.StreamResponse:
        """A whole answer streamed to a rollout that asked for a stream (an upstream that gives no ids
        in one was asked for the whole answer)."""
        capture = self.capture
        assert capture is not None
        try:
            doc = _loads(content)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
        except ValueError:
            self.finish("unreadable", f"the upstream's answer ({len(content)} bytes) is not a JSON completion", 200)
            return web.Response(status=200, body=self._redact_error(content), content_type="application/json")
        capture.feed(doc, chunk=False)
        body = self._redact(self._events_of(doc))
        self._complete(200)
        return await self._write_stream(body)

    def _events_of(self, doc: dict[str, Any]) -> bytes:
        """A whole chat completion as the event stream a rollout that asked for one reads."""
        events = completion_events(doc, include_usage=self.include_usage)
        return b"".join(b"data: " + json_bytes(event) + b"\n\n" for event in events) + _DONE

    async def _write_stream(self, body: bytes) -> web.StreamResponse:
        """Stream a recorded answer's events (``body``) to the rollout."""
        response = web.StreamResponse(status=200, headers=_stream_headers())
        try:
            await response.prepare(self.request)
            await response.write(body)
        except (ConnectionError, RuntimeError):
            self.finish("client_gone", "the rollout hung up before the answer", 200, late=True)
            return response
        return await _end(response)

    async def _relay(self, answer: ClientResponse) -> web.StreamResponse:
        """Pass an event stream through as it comes, each event read and stripped; recorded at its
        ``[DONE]`` (what follows it is not waited for), bounded like a whole answer."""
        response = web.StreamResponse(status=200, headers=_stream_headers())
        try:
            await response.prepare(self.request)
        except (ConnectionError, RuntimeError):
            self.finish("client_gone", "the rollout hung up before the answer", 200)
            return response
        limit = self.upstream.max_response_bytes
        pending = bytearray()  # (a line not yet ended: copied once, when its end comes)
        size = 0
        try:
            async for data in answer.content.iter_any():
                size += len(data)
                if size > limit:
                    self.finish("upstream_error", f"the upstream's stream is over the {limit}-byte limit", 200)
                    return _cut(self.request, response)
                end = data.rfind(b"\n")
                if end < 0:
                    pending += data
                    continue
                lines = (bytes(pending) + data[:end]).split(b"\n")
                pending = bytearray(data[end + 1 :])
                done = self._events(lines)
                if done is not None:
                    return await self._done(response, lines[:done])
                if lines:
                    try:
                        await response.write(self._redact(b"\n".join(lines) + b"\n"))
                    except (ConnectionError, RuntimeError):
                        self.finish("client_gone", "the rollout hung up mid-stream", 200)
                        return response
        except TimeoutError:
            message = f"the upstream's stream stalled for {self.upstream.read_timeout_sec:g} s"
            self.finish("cut", message, 200)
            return _cut(self.request, response)
        except (ClientError, OSError) as exc:
            self.finish("cut", self.message(f"the upstream's stream broke off: {type(exc).__name__}: {exc}"), 200)
            return _cut(self.request, response)
        lines = [bytes(pending)] if pending else []
        done = self._events(lines)  # (a last line without its line break)
        if done is not None:
            return await self._done(response, lines[:done])
        self.finish("cut", "the upstream's stream ended without [DONE]", 200)
        try:
            if pending:
                await response.write(self._redact(bytes(pending)))
        except (ConnectionError, RuntimeError):
            return response
        return await _end(response)

    async def _done(self, response: web.StreamResponse, lines: list[bytes]) -> web.StreamResponse:
        """The stream's ``[DONE]`` came after ``lines``: the answer is whole, recorded now; then the
        lines and the ``[DONE]`` are written and the stream ended (the upstream's rest is not awaited)."""
        self._complete(200)
        try:
            await response.write(self._redact(b"\n".join([*lines, b""]) + _DONE))
        except (ConnectionError, RuntimeError):
            self.finish("client_gone", "the rollout hung up before the stream's end", 200, late=True)
            return response
        return await _end(response)

    def _events(self, lines: list[bytes]) -> int | None:
        """Read the events of whole ``lines`` into the capture, each rewritten in place when the
        gateway took something out of it; the index of the ``[DONE]`` line, if one came."""
        capture = self.capture
        assert capture is not None
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return i
                if payload:
                    errors = capture.malformed
                    try:
                        stripped = capture.feed_bytes(payload, chunk=True)
                    except (ValueError, RecursionError):
                        capture.bad_answer("an event of the stream is not valid JSON")
                        lines[i] = b"data: " + self._redact_error(payload)
                    else:
                        if capture.sent_error and errors is None:  # this event is the upstream's error
                            lines[i] = b"data: " + self._redact_error(payload)
                        elif stripped is not None:
                            lines[i] = b"data: " + stripped
        return None


def _without(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (JSON-like) with every whole ``secret`` taken out of its strings."""
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, "***")
        return value
    if isinstance(value, dict):
        return {k: _without(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_without(v, secrets) for v in value]
    return value


def _stream_headers() -> dict[str, str]:
    return {"Content-Type": _EVENT_STREAM, "Cache-Control": "no-cache"}


async def _end(response: web.StreamResponse) -> web.StreamResponse:
    """End an answer whose last bytes were written (a rollout that hangs up now had it all)."""
    try:
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return response


_drop: Final = drop_connection
_cut: Final = cut_response
