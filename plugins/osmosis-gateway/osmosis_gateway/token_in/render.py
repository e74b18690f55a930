"""The policy's chat template, rendered the way Hugging Face renders it, and its tokenizer.

A tokenizer folder as ``save_pretrained`` writes it: ``tokenizer.json`` (read by ``tokenizers``, the
Rust library transformers' fast tokenizers wrap) and ``tokenizer_config.json`` (its
``chat_template``, a string or a list of named templates, and ``bos_token``/``eos_token``), or a
``chat_template.jinja`` beside them (newer ``save_pretrained``). The template runs in jinja2's
sandbox with the options and helpers transformers gives it (``trim_blocks``, ``lstrip_blocks``,
loop controls, ``tojson`` without ASCII escaping, ``raise_exception``, ``strftime_now``), so a
model's template renders the same text here as in ``apply_chat_template``.

Why not transformers itself: importing its tokenizer takes 0.6-0.7 s (it pulls in torch where it is
installed), ``tokenizers`` and jinja2 0.14 s, and rendering is the same template either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import jinja2
    import jinja2.ext
    import tokenizers

__all__ = ["ChatRenderer", "CloseMismatch", "TemplateError", "TokenizerFolderError"]

_SENTINEL: Final = "OSMOSIS-END-OF-ASSISTANT-7f3a"
"""The content of the base conversation's assistant message: where it ends in the rendered text,
the template's close of an assistant turn begins, then the new messages."""
_BASE: Final[tuple[dict[str, Any], ...]] = (
    {"role": "user", "content": "OSMOSIS-BASE-USER"},
    {"role": "assistant", "content": _SENTINEL},
)
"""The fixed conversation new messages are rendered after (the text up to its assistant content is cut off)."""


class TemplateError(ValueError):
    """The chat template refused the conversation (its ``raise_exception``) or failed to render it."""


class CloseMismatch(ValueError):
    """An answer did not end the way the template closes an assistant turn (it stopped on another
    special token, or on a stop string): the ids after it cannot be appended without a guess."""


class TokenizerFolderError(ValueError):
    """A tokenizer folder that cannot serve: a file missing or unreadable, no chat template."""


def _config_token(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string, or an added-token object's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _generation_extension() -> type[jinja2.ext.Extension]:
    """``{% generation %}...{% endgeneration %}`` (TRL's ``*_training.jinja``, transformers'
    ``AssistantTracker``): the body rendered as it is, in a scope of its own as transformers renders
    it; the marks only tell transformers which characters the assistant wrote, which the gateway
    knows from the ids it sent and got."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            text: str = caller()
            return text

    return Generation


def _environment() -> jinja2.Environment:
    """transformers' template environment (``_compile_jinja_template``): sandboxed, trimmed blocks,
    loop controls, ``{% generation %}`` marks, its ``tojson`` and its two globals."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_extension()]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class ChatRenderer:
    """One policy's tokenizer and chat template.

    :param folder: the tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``).
    :param chat_template: a ``.jinja`` file whose template replaces the folder's.
    :raises TokenizerFolderError: a file missing or unreadable, or no chat template anywhere.
    """

    def __init__(self, folder: str | Path, chat_template: str | Path | None = None) -> None:
        import tokenizers

        folder = Path(folder)
        if not folder.is_dir():
            raise TokenizerFolderError(f"no such folder: {folder}")
        try:
            self.tokenizer: tokenizers.Tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # (tokenizers raises its own Exception subclass for a bad or missing file)
            raise TokenizerFolderError(f"{folder / 'tokenizer.json'} cannot be read: {exc}") from None
        config: dict[str, Any] = {}
        config_file = folder / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TokenizerFolderError(f"{config_file} cannot be read: {exc}") from None
        templates: dict[str, str] = {}
        found = config.get("chat_template")
        if isinstance(found, str):
            templates["default"] = found
        elif isinstance(found, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            templates.update({t["name"]: t["template"] for t in found if isinstance(t, dict) and "name" in t})
        jinja_file = folder / "chat_template.jinja"
        if "default" not in templates and jinja_file.is_file():
            templates["default"] = jinja_file.read_text(encoding="utf-8")
        if chat_template is not None:
            try:
                templates = {"default": Path(chat_template).read_text(encoding="utf-8")}
            except OSError as exc:
                raise TokenizerFolderError(f"the chat template {chat_template} cannot be read: {exc}") from None
        if not templates:
            raise TokenizerFolderError(
                f"{folder} has no chat template (tokenizer_config.json chat_template, chat_template.jinja); "
                "give one with chat_template"
            )
        env = _environment()
        try:
            self._templates = {name: env.from_string(text) for name, text in templates.items()}
        except Exception as exc:  # (jinja2's TemplateSyntaxError, with its line)
            raise TokenizerFolderError(f"the chat template does not compile: {exc}") from None
        self.special_tokens = {
            name: token
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (token := _config_token(config.get(name))) is not None
        }
        """What a template may name (``bos_token``, ``eos_token``...), as transformers passes them."""
        stop = set()
        eos = self.special_tokens.get("eos_token")
        if eos is not None and (eos_id := self.tokenizer.token_to_id(eos)) is not None:
            stop.add(eos_id)
        generation = folder / "generation_config.json"
        if generation.is_file():
            try:
                ids = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
            except (OSError, ValueError):
                ids = None
            stop.update(i for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int))
        self.stop_ids: frozenset[int] = frozenset(stop)
        """Ids that end a turn (the config's ``eos_token``, ``generation_config.json``'s ``eos_token_id``)."""
        self.special_ids: frozenset[int] = frozenset(
            i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special
        )
        """The tokenizer's special tokens (``<|endoftext|>``, ``<|eom_id|>``, ``<end_of_turn>``): one
        that ends a generation the engine says stopped is the stop, not text."""

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """The template's text for ``messages`` (and ``tools``), as ``apply_chat_template(tokenize=False)``;
        ``options`` are the template's own switches (``enable_thinking``), as its keyword arguments.

        :raises TemplateError: the template refused them or failed.
        """
        import jinja2

        template = self._templates.get("tool_use") if tools else None
        template = template or self._templates.get("default") or next(iter(self._templates.values()))
        try:
            return template.render(
                messages=list(messages), tools=tools or None, add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **(options or {})},
            )  # fmt: skip
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateError(f"the chat template refused the conversation: {exc}") from None
        except Exception as exc:  # (a template's own bug: a missing key, a bad filter argument)
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, no special tokens added (the template writes its own), as transformers does."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def stop_id(self, ids: Sequence[int], finish_reason: str, matched: int | None = None) -> int | None:
        """The id that ended a generation of ``ids`` (not text), or None: its last id when it is one of
        :attr:`stop_ids`, or when the engine says it stopped (``finish_reason`` ``stop``) and that id
        is a special token of the tokenizer or the one the engine says it ``matched`` (SGLang's
        ``finish_reason.matched``). A model may stop on another special token than the config's
        ``eos_token`` (Qwen's ``<|endoftext|>``, Llama 3.1's ``<|eom_id|>``, Gemma's ``<end_of_turn>``,
        Phi-3's ``<|end|>``) when the engine's stop ids say so."""
        if not ids:
            return None
        last = ids[-1]
        if last in self.stop_ids or (finish_reason == "stop" and (last in self.special_ids or last == matched)):
            return last
        return None

    def decode(self, ids: Sequence[int], stop_id: int | None = None) -> str:
        """The text of generated ids, special tokens kept (``[TOOL_CALLS]`` is one), without the id
        that ended the generation (``stop_id``, :meth:`stop_id`: None when none did)."""
        if stop_id is not None:
            ids = ids[:-1]
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return text

    def prompt_ids(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The whole conversation rendered with the generation prompt, as ids."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True, options=options))

    def continuation(
        self,
        stop_id: int | None,
        finish_reason: str,
        new: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The ids that follow an assistant turn when ``new`` messages (a tool's answers, a user's next
        words) come after it: the close of the assistant turn the engine did not generate (``\\n``
        after Qwen's ``<|im_end|>``; all of it after a turn cut by length), then the rendering of
        ``new`` alone with the generation prompt.

        The turn ended with ``stop_id`` (:meth:`stop_id`; None when none) and ``finish_reason``: a
        turn that stopped on the token the template's close begins with is extended after it; one
        cut by length gets the whole close; any other end (another special token, a stop string) is
        refused with :class:`CloseMismatch`, never appended to.

        ``new`` is rendered after a fixed base conversation ending in an assistant message, and all
        up to that message's content cut off (as verl's and slime's agent loops cut a base's
        rendering), so the earlier messages are never rendered again; consecutive tool answers are
        rendered together, as the template groups them. What the template writes before the base's
        assistant content (a Qwen3 ``<think>`` block on the last assistant turn) does not matter.

        :raises TemplateError: the template refused, or does not write the base's assistant content
            as it is (the turn's end cannot be found); :class:`CloseMismatch`: the turn did not end
            as the template closes one.
        """
        whole = self.render([*_BASE, *new], tools or None, add_generation_prompt=True, options=options)
        at = whole.find(_SENTINEL)
        if at < 0 or whole.find(_SENTINEL, at + 1) >= 0:
            raise TemplateError("the template does not write an earlier assistant message's content as it is")
        after = self.encode(whole[at + len(_SENTINEL) :])
        close = self.tokenizer.id_to_token(after[0]) if after else None
        if stop_id is not None:
            if after[:1] == [stop_id]:  # the close's first id the engine generated is not sent again
                return after[1:]
            raise CloseMismatch(
                f"it ended with {self.tokenizer.id_to_token(stop_id)!r}, not {close!r}, which begins the "
                "template's close of an assistant turn"
            )
        if finish_reason != "length":
            raise CloseMismatch(
                f"it stopped without a stop token at its end (a stop string?), not on {close!r}, which begins "
                "the template's close of an assistant turn"
            )
        return after
