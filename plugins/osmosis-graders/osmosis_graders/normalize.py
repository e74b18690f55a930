"""Answer normalisation and number parsing, shared by every grader.

Two things every reward port gets wrong by hand, done once:

* :func:`parse_number` reads one number the way people and models write it: ``-1,000.50``,
  ``−3`` (a unicode minus), ``$18``, ``1e-3``, ``2.5 \\times 10^{3}``, ``50%``, ``3/4``,
  ``\\frac{1}{2}``, ``-\\dfrac{3}{4}``, ``1{,}000`` and a trailing period. It returns the exact
  value (a :class:`~fractions.Fraction`) or None: never a float that lost digits.
* :func:`normalize_answer` maps an answer to the form two answers are compared in: case folded,
  whitespace collapsed, LaTeX wrappers (``$``, ``\\text{}``, ``\\boxed{}``) dropped, edge
  punctuation stripped, and every number written in one canonical way (``1,000.0`` -> ``1000``).
  It is idempotent: ``normalize_answer(normalize_answer(x)) == normalize_answer(x)``.

>>> parse_number("#### 1,000.".removeprefix("####")).value
Fraction(1000, 1)
>>> parse_number("\\\\frac{1}{2}").value == parse_number("0.5").value
True
>>> normalize_answer("  The Answer: $1,000.00. ")
'the answer: 1000'
>>> normalize_answer("\\\\text{(B)}")
'b'
"""

from __future__ import annotations

import re
import string
import unicodedata
from decimal import Context, Decimal, InvalidOperation
from fractions import Fraction
from typing import Final

import attrs

__all__ = [
    "MAX_NUMBER_CHARS",
    "Number",
    "canonical_number",
    "clean_latex",
    "normalize_answer",
    "numbers_equal",
    "parse_number",
]

MAX_NUMBER_CHARS: Final = 400
"""Longer text is never read as a number (a hostile ``1e99999999`` must not cost the loop a second)."""
_MAX_EXPONENT: Final = 400
"""A larger power of ten is not read as a number either (it goes to the CAS, which runs killable)."""

_MINUS_SIGNS: Final = str.maketrans(
    {**{c: "-" for c in "\u2212\u2012\u2013\u2014\ufe63\uff0d\u2010\u2011"}, "\u2044": "/", "\u2215": "/"}
)
"""Unicode minus, figure/en/em dashes, small and full-width hyphen-minus, hyphens: all read as ``-``;
the fraction and division slashes (``½`` is ``1⁄2`` once NFKC-normalised) as ``/``."""

_INT: Final = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_UNSIGNED: Final = rf"(?:{_INT}(?:\.\d+)?|\.\d+)"
_EXP: Final = r"(?:[eE](?P<e1>[-+]?\d+)|\s*(?:\\times|\\cdot|×|\*|x)\s*10\s*\^\s*\{?\s*(?P<e2>[-+]?\d+)\s*\}?)"
_NUMBER_RE: Final = re.compile(
    rf"""\s*(?P<sign>[-+]?)\s*(?:\\?\$|€|£|¥)?\s*(?P<sign2>[-+]?)\s*
    (?P<num>{_UNSIGNED})(?:{_EXP})?
    \s*(?P<pct>\\?%)?\s*\.?\s*""",
    re.VERBOSE,
)
_FRAC_RE: Final = re.compile(
    r"""\s*(?P<sign>[-+]?)\s*\\[dt]?frac\s*
    (?:\{\s*(?P<a>[-+]?\s*[\d.,]+)\s*\}|(?P<a1>\d))\s*
    (?:\{\s*(?P<b>[-+]?\s*[\d.,]+)\s*\}|(?P<b1>\d))\s*\.?\s*""",
    re.VERBOSE,
)
_SLASH_RE: Final = re.compile(rf"\s*(?P<a>[-+]?\s*{_UNSIGNED})\s*/\s*(?P<b>[-+]?\s*{_UNSIGNED})\s*\.?\s*")


@attrs.frozen
class Number:
    """A number read from text: its exact value and how it was written.

    :ivar value: the exact value (``0.1`` is ``Fraction(1, 10)``, not the float).
    :ivar decimal: written with a decimal point or an exponent (a rounded value, like a sympy Float).
    :ivar fraction: written as a fraction (``3/4``, ``\\frac{3}{4}``).
    :ivar percent: written with a trailing ``%``; ``value`` is the number before it (``50%`` -> 50).
    """

    value: Fraction
    decimal: bool = False
    fraction: bool = False
    percent: bool = False


def _plain(text: str) -> tuple[Fraction, bool] | None:
    """An unsigned or signed decimal literal (no exponent) as an exact value, and whether it had a point."""
    text = text.replace(" ", "").replace(",", "")
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if not text or text == ".":
        return None
    try:
        return sign * Fraction(Decimal(text)), "." in text
    except (InvalidOperation, ValueError):
        return None


def parse_number(text: str) -> Number | None:
    """The one number ``text`` holds, or None when it holds anything else.

    >>> parse_number("−1,234.50").value
    Fraction(-2469, 2)
    >>> parse_number("2.5 \\\\times 10^{3}").value
    Fraction(2500, 1)
    >>> parse_number("12 apples") is None
    True
    """
    if len(text) > MAX_NUMBER_CHARS:
        return None
    text = text.translate(_MINUS_SIGNS).replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    text = text.strip().strip("*$ \t\n").strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2]
    match = _NUMBER_RE.fullmatch(text)
    if match is not None:
        signs = match["sign"] + match["sign2"]
        if len(signs) > 1:
            return None
        parsed = _plain(match["num"])
        if parsed is None:
            return None
        value, point = parsed
        exponent = match["e1"] or match["e2"]
        if exponent is not None:
            power = int(exponent)
            if abs(power) > _MAX_EXPONENT:
                return None
            value *= Fraction(10) ** power
        if signs == "-":
            value = -value
        return Number(value, decimal=point or exponent is not None, percent=match["pct"] is not None)
    for pattern in (_FRAC_RE, _SLASH_RE):
        match = pattern.fullmatch(text)
        if match is None:
            continue
        groups = match.groupdict()
        top = _plain(groups.get("a") or groups.get("a1") or "")
        bottom = _plain(groups.get("b") or groups.get("b1") or "")
        if top is None or bottom is None or bottom[0] == 0:
            return None
        value = top[0] / bottom[0]
        if groups.get("sign") == "-":
            value = -value
        return Number(value, decimal=top[1] or bottom[1], fraction=True)
    return None


def numbers_equal(a: Number, b: Number, *, float_rounding: int = 6) -> bool:
    """Equal as math-verify would judge two plain numbers: exactly, or, when either was written
    with a decimal point, after rounding both to ``float_rounding`` places (so ``1/3`` equals
    ``0.333333``). ``50%`` equals ``50`` (and not ``0.5``).

    >>> numbers_equal(parse_number("1/3"), parse_number("0.333333"))
    True
    >>> numbers_equal(parse_number("1,000"), parse_number("1000.0"))
    True
    """
    if a.value == b.value:
        return True
    if a.decimal or b.decimal:
        return round(a.value, float_rounding) == round(b.value, float_rounding)
    return False


def canonical_number(value: Fraction) -> str:
    """One way to write a value: ``1000``, ``-0.5``, ``1/3`` (a fraction when no finite decimal is exact).

    >>> canonical_number(Fraction(1000)), canonical_number(Fraction(-1, 2)), canonical_number(Fraction(1, 3))
    ('1000', '-0.5', '1/3')
    """
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = value * 10**places
    digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
    text = (digits[:-places] + "." + digits[-places:]).rstrip("0").rstrip(".")
    return "-" + text if value < 0 else text


# -- normalisation -------------------------------------------------------------------------------

_WRAPPERS: Final = re.compile(
    r"\\(?:text|textbf|textit|texttt|textrm|mathrm|mathbf|mathit|mathsf|mathtt|operatorname|boxed|fbox|mbox)"
    r"\s*\{([^{}]*)\}"
)
_LATEX_SPACING: Final = re.compile(r"\\[,;:! ]|\\quad|\\qquad|\\left\b|\\right\b|~")
_DELIMITERS: Final = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$")
_SPACES: Final = re.compile(r"\s+")
_TOKEN: Final = re.compile(
    rf"(?<![\w.,+-])(?P<sign>[-+]?)(?P<num>{_INT}(?:\.\d+)?|\.\d+)(?:[eE](?P<exp>[-+]?\d+))?(?![\w]|[.,]\d)"
)
_LEAD: Final = " \t\"'`*:,;_"
_TRAIL: Final = " \t\"'`*:,;.!?_"
_ARTICLES: Final = re.compile(r"\b(?:a|an|the)\b")
_SINGLE_IN_PARENS: Final = re.compile(r"\(\s*(\w)\s*\)")
_PUNCTUATION: Final = frozenset(string.punctuation) - {"-", "."}


def clean_latex(text: str) -> str:
    """``text`` without math delimiters, spacing commands and text wrappers; ``\\dfrac`` is ``\\frac``.

    >>> clean_latex("$\\\\boxed{\\\\text{42}}$")
    '42'
    """
    text = _DELIMITERS.sub("", text.replace("\\$", "").replace("\\%", "%").replace("{,}", ","))
    text = _LATEX_SPACING.sub(" ", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    while True:
        unwrapped = _WRAPPERS.sub(r"\1", text)
        if unwrapped == text:
            return text
        text = unwrapped


_WIDE: Final = Context(prec=120)
"""Enough digits for any token :func:`_canonical_token` rewrites (the default context rounds at 28)."""


def _canonical_token(match: re.Match[str]) -> str:
    token, num, exp = match.group(0), match["num"], match["exp"]
    if exp is None and num.isdigit():  # the usual case, a plain integer: no Decimal needed
        text = num.lstrip("0") or "0"
    elif len(token) > 60 or (exp is not None and abs(int(exp)) > 30):
        return token
    else:
        value = Decimal(num.replace(",", ""))
        if exp is not None:
            value = value.scaleb(int(exp), _WIDE)
        text = format(value.normalize(_WIDE), "f")
    return "-" + text if match["sign"] == "-" and text != "0" else text


def _squash_punctuation(text: str) -> str:
    """Drop punctuation outside numbers (a ``-`` or ``.`` inside ``-3.5`` stays)."""
    out: list[str] = []
    last = 0
    for match in _TOKEN.finditer(text):
        out.append("".join(c for c in text[last : match.start()] if c not in _PUNCTUATION and c not in "-."))
        out.append(match.group(0))
        last = match.end()
    out.append("".join(c for c in text[last:] if c not in _PUNCTUATION and c not in "-."))
    return "".join(out)


def _once(text: str, case_sensitive: bool, punctuation: str, articles: bool, numbers: bool) -> str:
    text = unicodedata.normalize("NFKC", text)
    if not case_sensitive:
        text = unicodedata.normalize("NFKC", text.casefold())
    text = clean_latex(text.translate(_MINUS_SIGNS))
    text = _SPACES.sub(" ", text).strip()
    if numbers:
        text = _TOKEN.sub(_canonical_token, text)
    if punctuation == "all":
        text = _squash_punctuation(text)
    elif punctuation == "edges":
        text = text.lstrip(_LEAD).rstrip(_TRAIL)
        whole = _SINGLE_IN_PARENS.fullmatch(text)
        if whole is not None:
            text = whole.group(1)
    if articles:
        text = _ARTICLES.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


PUNCTUATION_MODES: Final = ("edges", "all", "keep")
"""``edges``: strip quotes, ``*``, ``.``, ``:`` ... at either end (and ``(b)`` -> ``b``); ``all``:
drop every punctuation mark outside numbers (SQuAD style); ``keep``: leave them."""


def normalize_answer(
    text: str,
    *,
    case_sensitive: bool = False,
    punctuation: str = "edges",
    articles: bool = False,
    numbers: bool = True,
) -> str:
    """``text`` in the form answers are compared in (see the module docstring). Idempotent.

    :param case_sensitive: keep letter case.
    :param punctuation: one of :data:`PUNCTUATION_MODES`.
    :param articles: drop the words a, an, the (SQuAD style).
    :param numbers: write every number one way (``1,000.0`` and ``1000`` are both ``1000``).

    >>> normalize_answer("The  Eiffel Tower!", punctuation="all", articles=True)
    'eiffel tower'
    >>> normalize_answer("−1,000.50 m")
    '-1000.5 m'
    """
    if punctuation not in PUNCTUATION_MODES:
        raise ValueError(f"punctuation must be one of {', '.join(PUNCTUATION_MODES)}, got {punctuation!r}")
    # Each step is idempotent on its own, but one step can expose work for an earlier one
    # (stripping a quote can leave a number at the edge): run to the fixed point (almost always 1-2 passes).
    for _ in range(8):
        again = _once(text, case_sensitive, punctuation, articles, numbers)
        if again == text:
            break
        text = again
    return text
