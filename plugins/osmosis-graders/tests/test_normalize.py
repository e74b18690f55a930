"""Number parsing and answer normalisation: tables of the ugly cases, and hypothesis properties."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from osmosis_graders import normalize_answer, parse_number
from osmosis_graders.normalize import canonical_number, clean_latex, numbers_equal

NUMBERS = [
    # (text, exact value or None)
    ("42", Fraction(42)),
    ("-42", Fraction(-42)),
    ("−42", Fraction(-42)),  # unicode minus
    ("+7", Fraction(7)),
    ("1,000", Fraction(1000)),
    ("1,000.", Fraction(1000)),  # a trailing period is punctuation
    ("1,000.0", Fraction(1000)),
    ("1,234,567.25", Fraction(123456725, 100)),
    ("0.5", Fraction(1, 2)),
    (".5", Fraction(1, 2)),
    ("$18", Fraction(18)),
    ("-$5", Fraction(-5)),
    ("$-5", Fraction(-5)),
    ("\\$5", Fraction(5)),
    ("1e3", Fraction(1000)),
    ("2.5E-2", Fraction(1, 40)),
    ("2.5 \\times 10^{3}", Fraction(2500)),
    ("3 × 10^2", Fraction(300)),
    ("50%", Fraction(50)),
    ("50\\%", Fraction(50)),
    ("3/4", Fraction(3, 4)),
    ("-3/4", Fraction(-3, 4)),
    ("\\frac{1}{2}", Fraction(1, 2)),
    ("\\dfrac{3}{4}", Fraction(3, 4)),
    ("-\\frac{1}{2}", Fraction(-1, 2)),
    ("\\frac{-1}{2}", Fraction(-1, 2)),
    ("\\frac12", Fraction(1, 2)),
    ("$\\frac{1}{2}$", Fraction(1, 2)),
    ("1{,}000", Fraction(1000)),
    ("1\\,000", Fraction(1000)),
    ("  12  ", Fraction(12)),
    # not one number
    ("", None),
    ("-", None),
    ("1,2", None),
    ("1,00", None),
    ("12 apples", None),
    ("1/0", None),
    ("--5", None),
    ("x", None),
    ("1e999999999", None),  # a hostile exponent is not computed on the loop
    ("9" * 500, None),  # nor a hostile length
    ("1.2.3", None),
]


@pytest.mark.parametrize(("text", "value"), NUMBERS)
def test_parse_number(text, value):
    number = parse_number(text)
    assert (number.value if number is not None else None) == value


def test_how_a_number_was_written_is_kept():
    assert parse_number("3.0").decimal
    assert not parse_number("3").decimal
    assert parse_number("3/4").fraction
    assert parse_number("\\frac{3}{4}").fraction
    assert parse_number("50%").percent
    assert not parse_number("50").percent


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("1/3", "0.333333", True),  # rounded to 6 places when one side is a decimal (math-verify's rule)
        ("1/3", "0.33", False),
        ("1/3", "1/3.0", True),
        ("2", "2.0000001", True),
        ("2", "3", False),
        ("1000", "1e3", True),
        ("0.5", "\\frac{1}{2}", True),
        ("-0", "0", True),
    ],
)
def test_numbers_equal(a, b, equal):
    assert numbers_equal(parse_number(a), parse_number(b)) is equal


NORMALIZED = [
    ("#### 1,000.", "#### 1000"),
    ("1,000", "1000"),
    ("1000.0", "1000"),
    ("1000.00", "1000"),
    ("−7", "-7"),
    ("+7", "7"),
    ("-0.0", "0"),
    ("0.50", "0.5"),
    ("007", "7"),
    ("1e3", "1000"),
    ("$18", "18"),
    ("  The  Answer \n is   Paris. ", "the answer is paris"),
    ('"Paris"', "paris"),
    ("**42**", "42"),
    ("(B)", "b"),
    ("\\text{(B)}", "b"),
    ("\\boxed{\\text{yes}}", "yes"),
    ("$x$", "x"),
    ("\\left( 1, 2 \\right)", "( 1, 2 )"),
    ("1,2,3", "1,2,3"),
    ("v1.2.3", "v1.2.3"),
    ("ＡＢＣ１２", "abc12"),  # full-width (NFKC)
    ("½", "1/2"),
    ("", ""),
    ("...", ""),
]


@pytest.mark.parametrize(("text", "expected"), NORMALIZED)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_options():
    assert normalize_answer("The Eiffel-Tower!", punctuation="all", articles=True) == "eiffeltower"
    assert normalize_answer("-3.5 is it.", punctuation="all") == "-3.5 is it"
    assert normalize_answer("Paris.", punctuation="keep") == "paris."
    assert normalize_answer("Paris", case_sensitive=True) == "Paris"
    assert normalize_answer("1,000", numbers=False) == "1,000"
    with pytest.raises(ValueError, match="punctuation must be one of"):
        normalize_answer("x", punctuation="some")


def test_clean_latex_unwraps_nested_wrappers():
    assert clean_latex("\\boxed{\\text{\\textbf{A}}}") == "A"
    assert clean_latex("\\dfrac{1}{2}") == "\\frac{1}{2}"


def test_canonical_number():
    assert [canonical_number(Fraction(x)) for x in ("1000", "-0.5", "1/3", "0.001", "-12.50")] == [
        "1000",
        "-0.5",
        "1/3",
        "0.001",
        "-12.5",
    ]


# -- properties ----------------------------------------------------------------------------------

answers = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789,.-+ $%eE()[]{}\\/abcxyz*'\"\n\t−½", max_size=30),
    st.from_regex(r"[-+]?\$?\d{1,3}(,\d{3})*(\.\d+)?[.%]?", fullmatch=True),
)
options = st.fixed_dictionaries(
    {
        "case_sensitive": st.booleans(),
        "punctuation": st.sampled_from(["edges", "all", "keep"]),
        "articles": st.booleans(),
        "numbers": st.booleans(),
    }
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers, options)
@example("'1,000'", {"case_sensitive": False, "punctuation": "edges", "articles": False, "numbers": True})
@example("a .5", {"case_sensitive": False, "punctuation": "all", "articles": True, "numbers": True})
@example("ǰ", {"case_sensitive": False, "punctuation": "keep", "articles": False, "numbers": True})
def test_normalisation_is_idempotent(text, opts):
    once = normalize_answer(text, **opts)
    assert normalize_answer(once, **opts) == once


def _variants(value: Decimal) -> list[str]:
    """Ways people write ``value``."""
    plain = format(value, "f")
    sign, digits = ("-", plain[1:]) if plain.startswith("-") else ("", plain)
    whole, _, frac = digits.partition(".")
    grouped = f"{int(whole):,}" + (f".{frac}" if frac else "")
    out = [plain, f"{sign}{grouped}", f"{sign}{grouped}.", f"{plain}0" if frac else f"{plain}.0", f"{plain}."]
    out += [
        f"\u2212{digits}" if sign else f"+{digits}",
        f"{sign}${grouped}",
        f" {plain} ",
        f"{plain}e0",
        f"**{plain}**",
    ]
    return out


numbers = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15).map(Decimal),
    st.decimals(min_value=-(10**9), max_value=10**9, places=4, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=300, deadline=None)
@given(numbers)
def test_a_number_equals_its_own_formatted_variants(value):
    base = normalize_answer(format(value, "f"))
    exact = Fraction(value)
    for variant in _variants(value):
        assert normalize_answer(variant) == base, variant
        parsed = parse_number(variant)
        assert parsed is not None, variant
        assert parsed.value == exact, variant


@settings(max_examples=300, deadline=None)
@given(st.fractions(max_denominator=10**6).filter(lambda f: abs(f) < 10**12))
def test_canonical_numbers_parse_back_to_themselves(value):
    text = canonical_number(value)
    assert parse_number(text).value == value
    assert normalize_answer(text) == text
