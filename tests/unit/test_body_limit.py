"""The HTTP body limit of the REST API and the MCP server over HTTP
(:func:`~prefect_baton._rules.validation.request_body_limit`): every checkpoint-save body whose
state is within the cap fits, whatever JSON encoding the client chose (ASCII escapes, spaces)
and however large the other fields the schemas allow."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from prefect_baton._rules.validation import (
    DEFAULT_STATE_MAX_BYTES,
    MAX_REQUEST_BODY_BYTES,
    REQUEST_BODY_MARGIN_BYTES,
    canonical_json,
    request_body_limit,
    validate_state,
)
from prefect_baton.errors import ValidationError
from prefect_baton.mcp._inputs import CheckpointSaveIn
from prefect_baton.rest import MAX_BODY_BYTES
from prefect_baton.rest._routes_records import FencedCheckpointIn

MIB = 1024 * 1024
#: A character outside the BMP: 4 bytes of UTF-8, 12 bytes ASCII-escaped (a surrogate pair).
WIDE = "\U0001f600"


def state_at(cap: int, char: str) -> dict[str, Any]:
    """A state of exactly ``cap`` bytes of canonical JSON: ``{"x": char * n}``, padded with
    ASCII to the byte."""
    width = len(canonical_json(char).encode()) - 2  # "é": 2 bytes; "\n": 2; "\x01": 6
    n, pad = divmod(cap - len('{"x":""}'), width)
    state = {"x": "a" * pad + char * n}
    assert len(canonical_json(state).encode()) == cap
    return state


def test_the_limit() -> None:
    """2 MiB for a small cap (the floor, the limit of every route before), 3 times the cap
    + 64 KiB above; MAX_BODY_BYTES is the default cap's."""
    assert request_body_limit(1024) == MAX_REQUEST_BODY_BYTES == 2 * MIB
    assert request_body_limit(DEFAULT_STATE_MAX_BYTES) == 3 * MIB + 64 * 1024 == 3_211_264
    assert request_body_limit(DEFAULT_STATE_MAX_BYTES) == MAX_BODY_BYTES
    assert request_body_limit(4 * MIB) == 12 * MIB + REQUEST_BODY_MARGIN_BYTES
    floor_cap = (2 * MIB - REQUEST_BODY_MARGIN_BYTES) // 3
    assert request_body_limit(floor_cap) == 2 * MIB
    assert request_body_limit(floor_cap + 1) == 3 * (floor_cap + 1) + REQUEST_BODY_MARGIN_BYTES


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1048576", None])
def test_a_bad_cap_is_refused(bad: object) -> None:
    """A cap that is not a positive integer is VALIDATION_ERROR."""
    with pytest.raises(ValidationError) as info:
        request_body_limit(bad)  # type: ignore[arg-type]
    assert info.value.code == "VALIDATION_ERROR"
    assert "state_max_bytes" in info.value.message


def _largest(value_schema: dict[str, Any], name: str) -> Any:
    """The largest JSON value the schema of one field allows, ASCII-escaped the longest:
    a string of ``maxLength`` characters outside the BMP, an integer at ``maximum``."""
    branches = [b for b in value_schema.get("anyOf", [value_schema]) if b.get("type") != "null"]
    assert len(branches) == 1, (name, value_schema)
    branch = branches[0]
    if branch.get("type") == "string":
        assert "maxLength" in branch, f"{name} has no maxLength: the margin cannot bound it"
        return WIDE * int(branch["maxLength"])
    if branch.get("type") == "integer":
        assert "maximum" in branch, f"{name} has no maximum: the margin cannot bound it"
        return int(branch["maximum"])
    raise AssertionError(f"{name}: a field of type {branch.get('type')} is not bounded")


def largest_other_fields(model: type[BaseModel]) -> dict[str, Any]:
    """Every field of a checkpoint-save model but ``state`` at its largest."""
    schema = model.model_json_schema()
    props = schema["properties"]
    assert "state" in props
    return {k: _largest(v, k) for k, v in props.items() if k != "state"}


def _rest_body(state: dict[str, Any]) -> bytes:
    body = {**largest_other_fields(FencedCheckpointIn), "state": state}
    FencedCheckpointIn.model_validate(body)  # a body the route accepts
    return json.dumps(body).encode()  # ASCII escapes and spaces: json.dumps' default


def _mcp_body(state: dict[str, Any]) -> bytes:
    arguments = {**largest_other_fields(CheckpointSaveIn), "state": state}
    CheckpointSaveIn.model_validate(arguments)
    message = {
        "jsonrpc": "2.0",
        "id": 2**53 - 1,
        "method": "tools/call",
        "params": {
            "name": "baton_checkpoint_save",
            "arguments": arguments,
            "_meta": {"progressToken": 2**53 - 1},
        },
    }
    return json.dumps(message).encode()


@pytest.mark.parametrize("cap", [1024, 600_000, DEFAULT_STATE_MAX_BYTES, 3 * MIB])
@pytest.mark.parametrize("char", ["a", "\u00e9", "\u20ac", WIDE, "\n", "\x01"])
def test_a_state_at_the_cap_fits_escaped(cap: int, char: str) -> None:
    """A checkpoint-save body, REST or MCP, with every other field at its largest (ids of
    256 characters outside the BMP, integers at their maximum) and a state at the cap made
    of one kind of character, sent with ASCII escapes, is within the limit."""
    state = state_at(cap, char)
    validate_state(state, cap)
    limit = request_body_limit(cap)
    assert len(_rest_body(state)) <= limit
    assert len(_mcp_body(state)) <= limit


def test_the_margin_is_four_times_the_other_fields() -> None:
    """The margin holds the largest other fields of either body at least four times over
    (the rest is room for a client's JSON-RPC id and _meta)."""
    empty: dict[str, Any] = {}
    rest = len(_rest_body(empty)) - len(json.dumps(empty))
    mcp = len(_mcp_body(empty)) - len(json.dumps(empty))
    assert max(rest, mcp) < 13 * 1024
    assert 4 * max(rest, mcp) <= REQUEST_BODY_MARGIN_BYTES


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"])), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(st.characters(exclude_categories=["Cs"])), _JSON, max_size=6))
def test_escapes_and_spaces_at_most_triple_a_state(state: dict[str, Any]) -> None:
    """Any state, written with ASCII escapes and a space after every ``:`` and ``,``
    (``json.dumps``' default, ``requests``' ``json=``), is at most 3 times its canonical
    JSON's bytes: the factor of the limit."""
    canonical = len(canonical_json(state).encode())
    assert len(json.dumps(state).encode()) <= 3 * canonical
    assert len(json.dumps(state, separators=(",", ":")).encode()) <= 3 * canonical
