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
    import tokenizers

__all__ = ["ChatRenderer", "TemplateError", "TokenizerFolderError"]

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


class TokenizerFolderError(ValueError):
    """A tokenizer folder that cannot serve: a file missing or unreadable, no chat template."""


def _config_token(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string, or an added-token object's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _environment() -> jinja2.Environment:
    """transformers' template environment (``_compile_jinja_template``): sandboxed, trimmed blocks,
    loop controls, its ``tojson`` and its two globals."""
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

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
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

    def decode(self, ids: Sequence[int]) -> str:
        """The text of generated ids, special tokens kept (``[TOOL_CALLS]`` is one) but a final stop id."""
        if ids and ids[-1] in self.stop_ids:
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
        generated: Sequence[int],
        new: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The ids that follow an assistant turn of ``generated`` ids when ``new`` messages (a tool's
        answers, a user's next words) come after it: the close of the assistant turn the engine did
        not generate (``\\n`` after Qwen's ``<|im_end|>``; all of it after a turn cut by length), then
        the rendering of ``new`` alone with the generation prompt.

        ``new`` is rendered after a fixed base conversation ending in an assistant message, and all
        up to that message's content cut off (as verl's and slime's agent loops cut a base's
        rendering), so the earlier messages are never rendered again; consecutive tool answers are
        rendered together, as the template groups them. What the template writes before the base's
        assistant content (a Qwen3 ``<think>`` block on the last assistant turn) does not matter.

        :raises TemplateError: the template refused, or does not write the base's assistant content
            as it is (the turn's end cannot be found).
        """
        whole = self.render([*_BASE, *new], tools or None, add_generation_prompt=True, options=options)
        at = whole.find(_SENTINEL)
        if at < 0 or whole.find(_SENTINEL, at + 1) >= 0:
            raise TemplateError("the template does not write an earlier assistant message's content as it is")
        after = self.encode(whole[at + len(_SENTINEL) :])
        # the part of the turn's close the engine generated (its stop token) is not sent again
        done = next((k for k in range(min(len(after), len(generated)), 0, -1) if list(generated[-k:]) == after[:k]), 0)
        return after[done:]
