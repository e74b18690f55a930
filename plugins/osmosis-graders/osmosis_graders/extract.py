"""Answer extraction: find the answer in a reply, the way GSM8K / MATH / tool-use recipes write it.

Extractors, by the name a config gives them (``extract = "boxed"`` or a list tried in order,
``extract = ["hash", "last-number"]``):

============== ==================================================================================
``hash``       the text after the last ``####`` on its line (GSM8K): ``#### 1,000.`` -> ``1,000.``
``boxed``      the content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces
               and all: ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``
``answer-line`` what follows the last ``answer:`` / ``final answer:`` / ``the answer is`` on its line
``last-number`` the last number in the text (``-1,234.5``, ``−3``, ``$18``, ``3/4``)
``json``       a JSON value: the whole reply, else the last fenced ```` ```json ```` block, else the
               last ``{...}`` that parses; with ``json_field = "a.b.0"`` that field of it
``tag``        the content of the last ``<answer>...</answer>`` (the tag is ``tag = "answer"``)
``final``      the whole final message, stripped
============== ==================================================================================

>>> extract_answer("Work... \\\\boxed{1} then \\\\boxed{\\\\frac{1}{2}}.", ["boxed"])
Extraction(text='\\\\frac{1}{2}', extractor='boxed', value=None)
>>> extract_answer("so 3 + 4 = 7\\n#### 7", ["hash"]).text
'7'
>>> extract_answer("no marker here", ["hash"]) is None
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import attrs

from osmosis_core import Message, RolloutSample, message_text

__all__ = [
    "EXTRACTORS",
    "Extraction",
    "answer_start_before",
    "extract_answer",
    "final_text",
    "find_boxed",
    "find_json",
    "first_number",
    "json_field",
]


@attrs.frozen
class Extraction:
    """What an extractor found: the answer as text, which extractor found it, and (``json``) the value."""

    text: str
    extractor: str
    value: Any = None


_HASH: Final = "####"
_ANSWER_LINE: Final = re.compile(
    r"(?im)(?:\bfinal\s+answer|\banswer)\s*(?:\*\*)?\s*(?::|：|\bis\b)\s*(?:\*\*)?[ \t]*(?P<answer>[^\n]*?)[ \t]*$"
)
_NUMBER_TOKEN: Final = re.compile(
    r"(?<![\w.])[-+\u2212]?\s?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?(?!\w)"
)
_FENCE: Final = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(?P<body>.*?)```", re.DOTALL)
_MAX_JSON_TRIES: Final = 20
"""``{`` positions tried from the end of a reply before the ``json`` extractor gives up."""


def _hash(text: str, **_: Any) -> str | None:
    at = text.rfind(_HASH)
    if at < 0:
        return None
    line = text[at + len(_HASH) :].split("\n", 1)[0]
    answer = line.strip().lstrip("#").strip()
    return answer or None


_BRACE: Final = re.compile(r"(?<!\\)[{}]")
_BOXED: Final = re.compile(r"\\(?:boxed|fbox)")


def _closing(text: str, opening: int) -> int | None:
    """Where the ``{`` at ``opening`` closes (escaped braces ``\\{`` do not count), or None."""
    depth = 0
    for match in _BRACE.finditer(text, opening):
        depth += 1 if match.group(0) == "{" else -1
        if depth == 0:
            return match.start()
    return None


def _all_closings(text: str) -> dict[int, int]:
    """Every balanced ``{`` -> its ``}``, in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for match in _BRACE.finditer(text):
        if match.group(0) == "{":
            stack.append(match.start())
        elif stack:
            pairs[stack.pop()] = match.start()
    return pairs


def find_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` (``\\boxed 5`` too), or None.

    Linear in the text, however many unclosed ``\\boxed{`` a hostile reply holds.

    >>> find_boxed("\\\\boxed{\\\\frac{1}{2}} and later \\\\boxed{x^{2}}")
    'x^{2}'
    >>> find_boxed("\\\\boxed{unclosed") is None
    True
    """
    candidates = [m.end() for m in _BOXED.finditer(text)]
    pairs: dict[int, int] | None = None
    for k, start in enumerate(reversed(candidates)):
        i = start
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            if k == 0:
                close = _closing(text, i)  # the usual case: the last one is complete
            else:
                if pairs is None:
                    pairs = _all_closings(text)
                close = pairs.get(i)
            if close is not None:
                return text[i + 1 : close].strip()
            continue  # unbalanced: try the one before
        if start < i < len(text):  # `\boxed 5`: one token after a space
            token = re.match(r"[^\s$]+", text[i:])
            if token is not None:
                return token.group(0).rstrip(".,;")
    return None


def _boxed(text: str, **_: Any) -> str | None:
    return find_boxed(text)


def _answer_line(text: str, **_: Any) -> str | None:
    found = None
    for match in _ANSWER_LINE.finditer(text):
        answer = match["answer"].strip().strip("*").strip()
        if not answer:  # "Final answer:" alone on its line: the answer is the next line
            rest = text[match.end() :].lstrip()
            answer = rest.split("\n", 1)[0].strip().strip("*").strip()
        if answer:
            found = answer
    return found


def _last_number(text: str, **_: Any) -> str | None:
    found = None
    for match in _NUMBER_TOKEN.finditer(text):
        found = match.group(0)
    return found.strip() if found is not None else None


def first_number(text: str) -> str | None:
    """The first number in ``text`` as written (``"$1,000 total"`` -> ``"$1,000"``), or None."""
    match = _NUMBER_TOKEN.search(text)
    return match.group(0).strip() if match is not None else None


def find_json(text: str) -> tuple[bool, Any]:
    """``(True, value)`` for the JSON in ``text`` (see the module docstring), else ``(False, None)``.

    >>> find_json('Here: {"a": {"b": [1, 2]}} done')
    (True, {'a': {'b': [1, 2]}})
    """
    stripped = text.strip()
    if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null") or stripped[:1].isdigit():
        try:
            return True, json.loads(stripped)
        except ValueError:
            pass
    for match in reversed(list(_FENCE.finditer(text))):
        try:
            return True, json.loads(match["body"])
        except ValueError:
            continue
    # the last {...} that parses, widened to the object that encloses it ({"a": {"b": 2}}, not {"b": 2})
    decoder = json.JSONDecoder()
    best: tuple[int, Any] | None = None  # (where it stops, the value)
    end = len(text)
    for _ in range(_MAX_JSON_TRIES):
        at = text.rfind("{", 0, end)
        if at < 0:
            break
        end = at
        try:
            value, stop = decoder.raw_decode(text, at)
        except ValueError:
            continue
        if best is not None and stop < best[0]:
            break  # a complete object before the best one: the best one is the last
        best = (stop, value)
    return (True, best[1]) if best is not None else (False, None)


_MISSING: Final = object()


def json_field(value: Any, path: str) -> Any:
    """The field ``path`` (``a.b.0.c``: keys and list indexes) of ``value``, or raises KeyError.

    >>> json_field({"a": [{"b": 3}]}, "a.0.b")
    3
    """
    current = value
    for part in path.split(".") if path else ():
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit() and -len(current) <= int(part) < len(current):
            current = current[int(part)]
        else:
            raise KeyError(path)
    return current


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _tag(text: str, *, tag: str = "answer", **_: Any) -> str | None:
    close = f"</{tag}>"
    end = text.rfind(close)
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    if start < 0:
        return None
    return text[start + len(tag) + 2 : end].strip()


def _final(text: str, **_: Any) -> str | None:
    return text.strip() or None


EXTRACTORS: Final[dict[str, Callable[..., str | None]]] = {
    "hash": _hash,
    "boxed": _boxed,
    "answer-line": _answer_line,
    "last-number": _last_number,
    "json": _final,  # handled in extract_answer (it carries a value)
    "tag": _tag,
    "final": _final,
}
"""Extractor name -> function (text -> answer or None)."""

ALIASES: Final = {"gsm8k": "hash", "####": "hash", "answer": "answer-line", "number": "last-number", "whole": "final"}


def extract_answer(
    text: str, extractors: Sequence[str], *, json_path: str | None = None, tag: str = "answer"
) -> Extraction | None:
    """The first answer one of ``extractors`` finds in ``text`` (tried in order), or None.

    :param json_path: for ``json``: the field to take (``a.b.0``); the whole value when None.
    :param tag: for ``tag``: the tag name (``answer`` reads ``<answer>...</answer>``).
    :raises ValueError: an unknown extractor name.
    """
    for name in extractors:
        name = ALIASES.get(name, name)
        if name == "json":
            found, value = find_json(text)
            if not found:
                continue
            if json_path:
                try:
                    value = json_field(value, json_path)
                except KeyError:
                    continue
            return Extraction(_json_text(value), "json", value)
        function = EXTRACTORS.get(name)
        if function is None:
            raise ValueError(f"unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
        answer = function(text, tag=tag)
        if answer is not None:
            return Extraction(answer, name)
    return None


_ANSWER_WORD: Final = re.compile(r"(?i)\banswer\s*(?:\*\*)?\s*(?::|：|\bis\b)")


def _last_match(pattern: re.Pattern[str], text: str) -> int:
    found = -1
    for match in pattern.finditer(text):
        found = match.start()
    return found


_MARKERS: Final[dict[str, tuple[str, Callable[[str, str], int]]]] = {
    "boxed": ("\\boxed{", lambda text, tag: _last_match(_BOXED, text)),
    "hash": (_HASH, lambda text, tag: text.rfind(_HASH)),
    "answer-line": ("answer:", lambda text, tag: _last_match(_ANSWER_WORD, text)),
    "tag": ("<answer>", lambda text, tag: text.rfind(f"<{tag}>")),
    "json": ("{", lambda text, tag: text.rfind("{")),
}
"""Extractor -> (how its answer starts, shown; where the last such start is in a text, or -1)."""


def answer_start_before(
    text: str, end: int, extractors: Sequence[str], *, tag: str = "answer"
) -> tuple[str, int] | None:
    """Where the last answer that one of ``extractors`` would read starts in ``text[:end]``: ``(marker, index)``.

    For a reply longer than the part read: tells an answer too large to read from no answer at all.

    >>> answer_start_before("Work. \\\\boxed{" + "1" * 50, 8, ["boxed", "hash"])
    ('\\\\boxed{', 6)
    """
    best: tuple[str, int] | None = None
    head = text[: end + len(tag) + 16]  # a marker cut in two by ``end`` starts before it too
    for name in extractors:
        marker = _MARKERS.get(ALIASES.get(name, name))
        if marker is None:
            continue
        at = marker[1](head, tag)
        if 0 <= at < end and (best is None or at > best[1]):
            best = (marker[0].replace("answer>", f"{tag}>"), at)
    return best


def final_text(sample: RolloutSample) -> str:
    """The text of the sample's final assistant message (its last message when none is an assistant's).

    Reads the chat-shaped history when the agent integration kept one (``chat_messages``).
    """
    messages: Iterable[Message] = reversed(sample.readable_messages())
    for message in messages:
        if message.get("role") == "assistant":
            return message_text(message)
    return sample.last_text()
