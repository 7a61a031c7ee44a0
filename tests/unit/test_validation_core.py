"""Input validation of the decision core: TTLs, identifiers, scopes, checkpoint state and
canonical JSON (the hash that tells readers a checkpoint moved)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_baton._rules.core import (
    MAX_ID_LENGTH,
    MAX_SCOPE_LENGTH,
    MAX_SCOPES,
    canonical_json,
    request_digest,
    validate_id,
    validate_principal,
    validate_scopes,
    validate_state,
    validate_ttl,
    validate_version,
)
from prefect_baton._rules.validation import validate_lifetime
from prefect_baton.errors import ValidationError

# --------------------------------------------------------------------------- TTL


@pytest.mark.parametrize(
    ("ttl", "ms"),
    [(10, 10_000), (11, 11_000), (3600, 3_600_000), (86_400, 86_400_000)],
)
def test_ttl_accepted(ttl: object, ms: int) -> None:
    """Whole seconds from 10 to 86,400 are accepted and converted to milliseconds."""
    assert validate_ttl(ttl) == ms


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        9,
        -10,
        86_401,
        10**12,
        9.0,
        60.0,
        10.5,
        math.nan,
        math.inf,
        -math.inf,
        True,
        False,
        "10",
        None,
        [10],
        b"10",
    ],
)
def test_ttl_rejected(ttl: object) -> None:
    """A TTL outside 10..86,400, or not an ``int`` (a float, even a whole one, or a bool),
    is a validation error."""
    with pytest.raises(ValidationError) as ei:
        validate_ttl(ttl)
    assert ei.value.code == "VALIDATION_ERROR"
    assert "ttl_seconds" in str(ei.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: validate_ttl(1.5),
            r"^ttl_seconds must be an integer number of seconds from 10 "
            r"to 86400, got float$",
        ),
        (lambda: validate_ttl(5), r"^ttl_seconds must be from 10 to 86400 seconds, got 5$"),
        (
            lambda: validate_lifetime(99_999_999_999, "expires_in_seconds"),
            r"^expires_in_seconds must be an integer from 1 to 31622400 seconds, got 99999999999$",
        ),
        (lambda: validate_lifetime(0, "expires_in_seconds"), r"from 1 to 31622400 seconds, got 0$"),
        (
            lambda: validate_lifetime(True, "checkpoint ttl_seconds"),
            r"^checkpoint ttl_seconds must be an integer from 1 to 31622400 seconds, got bool$",
        ),
        (
            lambda: validate_version("expected_version", "1"),
            rf"^expected_version must be an integer from 0 to {2**53 - 1}$",
        ),
        (
            lambda: validate_version("expected_version", -1),
            rf"^expected_version must be from 0 to {2**53 - 1}$",
        ),
    ],
)
def test_an_integer_limit_message_gives_the_range(call: Any, message: str) -> None:
    """Every refused integer limit states its legal range, as the CLI help, REST API and
    docs do (a handoff's lifetime used to say only "must be a positive integer")."""
    with pytest.raises(ValidationError, match=message):
        call()


# --------------------------------------------------------------------------- identifiers


@pytest.mark.parametrize(
    "value",
    ["a", "checkout-service", "deploy/prod:eu-1", "équipe", "a b", "x" * MAX_ID_LENGTH, "日本"],
)
def test_id_accepted(value: str) -> None:
    """Ordinary identifiers up to 256 characters pass through unchanged."""
    assert validate_id("resource_id", value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "\t\n",
        "x" * (MAX_ID_LENGTH + 1),
        "x" * 10_000,
        "a\nb",
        "a\x00b",
        "a\x1fb",
        "a\x7fb",
        None,
        5,
        b"abc",
        ["abc"],
    ],
)
def test_id_rejected(value: object) -> None:
    """Empty, over-long, control-character or non-string ids are validation errors naming
    the argument."""
    with pytest.raises(ValidationError) as ei:
        validate_id("resource_id", value)
    assert "resource_id" in str(ei.value)


@pytest.mark.parametrize(
    "char",
    [
        "\u200b",
        "\u200d",
        "\ufeff",
        "\u00ad",
        "\u2060",
        "\u202e",
        "\u061c",
        "\U000e0001",
        "\U000e007f",
    ],
    ids=lambda c: f"U+{ord(c):04X}",
)
def test_ids_with_format_characters_are_rejected(char: str) -> None:
    """An id holding a format character (Unicode category Cf: zero-width, soft hyphen, byte
    order mark, word joiner, bidirectional controls, tag characters), anywhere in it, is a
    VALIDATION_ERROR naming the argument and the character; so is a principal."""
    for value in (f"{char}deploy", f"de{char}ploy", f"deploy{char}", f"é{char}"):
        with pytest.raises(ValidationError) as ei:
            validate_id("resource_id", value)
        assert ei.value.code == "VALIDATION_ERROR"
        assert str(ei.value) == (
            "resource_id must not contain invisible format characters (Unicode category Cf), "
            f"found U+{ord(char):04X}"
        )
    with pytest.raises(ValidationError, match="to_principal must not contain invisible"):
        validate_principal("to_principal", f"bob{char}")


@pytest.mark.parametrize("char", ["\x80", "\x85", "\x9f", "\u2028", "\u2029"], ids=ascii)
def test_ids_with_c1_controls_or_line_separators_are_rejected(char: str) -> None:
    """A C1 control character (NEL U+0085 ...) or U+2028/U+2029 in an id is a
    VALIDATION_ERROR naming the character: they break lines in logs and terminals."""
    for value in (char, f"{char}deploy", f"de{char}ploy", f"é{char}"):  # alone: not "empty"
        with pytest.raises(ValidationError) as ei:
            validate_id("resource_id", value)
        assert str(ei.value) == (
            "resource_id must not contain control characters or line breaks, "
            f"found U+{ord(char):04X}"
        )
    assert validate_id("resource_id", "déploy\u00a0ü") == "déploy\u00a0ü"  # other text is fine


# --------------------------------------------------------------------------- scopes


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        (None, ()),
        ([], ()),
        ((), ()),
        (["src/**"], ("src/**",)),
        (["src/**", "./src/**", "src/**/"], ("src/**",)),
        (["tests/*.py", "docs/**", "src/app/*.py"], ("docs/**", "src/app/*.py", "tests/*.py")),
        ((s for s in ["b", "a"]), ("a", "b")),
        (frozenset({"x/*"}), ("x/*",)),
        ([f"d{i}/**" for i in range(MAX_SCOPES)], tuple(sorted(f"d{i}/**" for i in range(64)))),
        (["a" * MAX_SCOPE_LENGTH], ("a" * MAX_SCOPE_LENGTH,)),
    ],
)
def test_scopes_accepted(scopes: object, expected: tuple[str, ...]) -> None:
    """Scopes are normalised, de-duplicated and sorted; any iterable of strings works."""
    assert validate_scopes(scopes) == expected


@pytest.mark.parametrize(
    "scopes",
    [
        "src/**",
        b"src/**",
        5,
        [5],
        [None],
        [""],
        ["/"],
        ["./"],
        ["src/\n"],
        ["a" * (MAX_SCOPE_LENGTH + 1)],
        [f"d{i}/**" for i in range(MAX_SCOPES + 1)],
    ],
)
def test_scopes_rejected(scopes: object) -> None:
    """A bare string, non-strings, empty or over-long scopes and too many scopes are rejected."""
    with pytest.raises(ValidationError):
        validate_scopes(scopes)


def test_bare_string_scope_message_explains_the_mistake() -> None:
    """``scopes="src/**"`` is refused with a hint to pass a list."""
    with pytest.raises(ValidationError, match="list"):
        validate_scopes("src/**")


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"a": 1},
        {"nested": {"deep": {"list": [1, 2.5, "x", None, True, {"k": []}]}}},
        {"unicode": "é日本", "empty": ""},
        {"big": 2**53, "neg": -1.5e-9},
    ],
)
def test_state_accepted(state: dict[str, Any]) -> None:
    """Any JSON object (nesting allowed) is valid state; its hash is SHA-256 of canonical JSON."""
    parsed, text, digest = validate_state(state)
    assert parsed == state
    assert text == canonical_json(state)
    assert json.loads(text) == state
    assert digest == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize(
    "state",
    [
        {1, 2},
        {"s": {1, 2}},
        {"n": math.nan},
        {"n": [math.inf]},
        {"b": b"bytes"},
        {"o": object()},
        {(1, 2): "tuple key"},
        [1, 2],
        "text",
        None,
        42,
        '{"a": 1}',
    ],
)
def test_state_rejected(state: object) -> None:
    """Non-objects, sets, NaN/Infinity and other non-JSON values are validation errors."""
    with pytest.raises(ValidationError):
        validate_state(state)


def test_state_size_limit_counts_utf8_bytes_of_canonical_json() -> None:
    """State up to the byte limit is accepted; one byte more is rejected."""
    base = len(canonical_json({"k": ""}).encode())
    limit = base + 10
    validate_state({"k": "x" * 10}, max_bytes=limit)
    with pytest.raises(ValidationError, match="bytes"):
        validate_state({"k": "x" * 11}, max_bytes=limit)
    validate_state({"k": "é" * 5}, max_bytes=limit)  # 2 bytes each in UTF-8
    with pytest.raises(ValidationError):
        validate_state({"k": "é" * 6}, max_bytes=limit)


def test_state_default_limit_is_one_mebibyte() -> None:
    """The default cap is 1 MiB of canonical JSON."""
    overhead = len(canonical_json({"k": ""}))
    validate_state({"k": "x" * (1024 * 1024 - overhead)})
    with pytest.raises(ValidationError):
        validate_state({"k": "x" * (1024 * 1024 - overhead + 1)})


# --------------------------------------------------------------------------- canonical JSON


def test_canonical_json_examples() -> None:
    """Canonical JSON sorts keys at every level, has no spaces and keeps UTF-8 as is."""
    assert canonical_json({"b": 1, "a": {"d": 2, "c": [3, {"f": 4, "e": 5}]}}) == (
        '{"a":{"c":[3,{"e":5,"f":4}],"d":2},"b":1}'
    )
    assert canonical_json({"k": "é"}) == '{"k":"é"}'
    with pytest.raises(ValidationError):
        canonical_json({"k": math.nan})


def _shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=4), json_values, max_size=6), st.randoms())
def test_canonical_hash_independent_of_key_order(state: dict[str, Any], rnd: random.Random) -> None:
    """The same state written with keys in any order gets the same text and state hash."""
    other = _shuffled(state, rnd)
    assert canonical_json(other) == canonical_json(state)
    assert validate_state(other)[2] == validate_state(state)[2]
    assert request_digest("acquire", other) == request_digest("acquire", state)


def test_different_state_different_hash() -> None:
    """A changed value changes the state hash (readers can tell the checkpoint moved)."""
    assert validate_state({"a": 1})[2] != validate_state({"a": 2})[2]
    assert validate_state({"a": [1, 2]})[2] != validate_state({"a": [2, 1]})[2]


@pytest.mark.parametrize("value", ["agent-a", "**", "a*", "%", "ann lee"])
def test_a_principal_is_any_id_but_star(value: str) -> None:
    """Any identifier names a principal, wildcard-looking ones included, except ``*``."""
    assert validate_principal("principal", value) == value


@pytest.mark.parametrize("value", ["*", "", "a\x00", 7, None, "ann ", " ann", "ann\u00a0"])
def test_star_and_bad_ids_are_not_principals(value: object) -> None:
    """``*`` (every principal, in a listing) and anything ``validate_id`` refuses are
    VALIDATION_ERROR."""
    with pytest.raises(ValidationError) as ei:
        validate_principal("to_principal", value)
    assert ei.value.code == "VALIDATION_ERROR"
    assert "to_principal" in str(ei.value)


@pytest.mark.parametrize("value", ["bob ", " bob", "\u3000bob", "bob\u00a0", "run-1 "])
def test_ids_with_white_space_at_either_end_are_refused(value: str) -> None:
    """An id with white space at either end is VALIDATION_ERROR (naming the argument and
    showing the value): invisible when printed, ``bob `` would be another principal than
    ``bob``, and a handoff to it would never reach bob's inbox; inner spaces are fine."""
    with pytest.raises(ValidationError, match="to_principal must not start or end with white"):
        validate_id("to_principal", value)
    assert validate_id("to_principal", "bob smith") == "bob smith"
