"""A request body holding more JSON objects and arrays than
:func:`~prefect_baton._rules.validation.request_container_limit` is refused ``413
PAYLOAD_TOO_LARGE`` before it is parsed (a parse builds one Python object per container
while holding the GIL, so every other request of the process would wait); the largest
legitimate bodies (a state at the cap holding as many containers as it can, ``acquire_many``
at its maximum, an outcome with all its evidence) are still served."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from prefect_baton._rules.validation import (
    DEFAULT_STATE_MAX_BYTES,
    MAX_JSON_DEPTH,
    REQUEST_BODY_MARGIN_BYTES,
    canonical_json,
    request_container_limit,
    validate_state,
)
from prefect_baton._stores.protocol import MAX_MANY
from prefect_baton.errors import ValidationError
from prefect_baton.rest._http import MAX_BODY_CONTAINERS
from prefect_baton.rest._json_body import too_many_containers

from .conftest import MakeKey, data, error, row_counts

LIMIT = MAX_BODY_CONTAINERS
JSON = {"Content-Type": "application/json"}


def _arrays(n: int) -> bytes:
    """``[[],[],...]``: one array holding ``n - 1`` empty ones (``n`` containers)."""
    return b"[" + b",".join([b"[]"] * (n - 1)) + b"]"


def _chains(n: int) -> bytes:
    """One array of chains of arrays nested 99 deep (``n`` containers or a few more)."""
    chain = b"[" * 99 + b"]" * 99
    return b"[" + b",".join([chain] * -(-(n - 1) // 99)) + b"]"


def _objects(n: int) -> bytes:
    """``[{"a":{}},{"a":{}},...]``: ``n`` containers or one more."""
    return b"[" + b",".join([b'{"a":{}}'] * (n // 2)) + b"]"


OVER: list[tuple[str, bytes]] = [
    ("arrays", _arrays(LIMIT + 1)),
    ("chains", _chains(LIMIT + 1)),
    ("objects", _objects(LIMIT + 1)),
    ("checkpoint", b'{"subject_id":"s","kind":"k","state":{"x":' + _arrays(LIMIT) + b"}}"),
]


def test_the_limit() -> None:
    """Half of the larger of the state cap and the default cap (a handoff's
    ``parameters``), plus half the 64 KiB margin: 557,056 by default."""
    assert request_container_limit(DEFAULT_STATE_MAX_BYTES) == LIMIT == 557_056
    assert request_container_limit(1000) == LIMIT
    three = 3 * DEFAULT_STATE_MAX_BYTES
    assert request_container_limit(three) == (three + REQUEST_BODY_MARGIN_BYTES) // 2
    for bad in (0, True, 1.5):
        with pytest.raises(ValidationError, match="state_max_bytes must be"):
            request_container_limit(bad)  # type: ignore[arg-type]


def test_containers_are_counted_outside_strings() -> None:
    """Brackets inside strings (escaped quotes and backslashes among them) are not
    containers."""
    assert not too_many_containers(b'["[[[[", "{{{{"]', 1)
    assert too_many_containers(b'["[[[[", {}]', 1)
    assert not too_many_containers(b'["\\"[[[[\\\\", "[[\\\\\\"{{"]', 1)
    assert too_many_containers(b'["\\\\", [], "\\\\"]', 1)
    assert not too_many_containers(_arrays(5), 5)
    assert too_many_containers(_arrays(6), 5)
    # text that is not UTF-8 (UTF-16 here) is not counted: the parser refuses it
    assert not too_many_containers(_arrays(6).decode().encode("utf-16-le"), 5)


@pytest.mark.parametrize(("label", "raw"), OVER, ids=[o[0] for o in OVER])
@pytest.mark.parametrize("path", ["/v1/leases", "/v1/checkpoints"])
def test_a_body_of_too_many_containers_is_413(
    client: TestClient, make_key: MakeKey, ledger_url: str, label: str, raw: bytes, path: str
) -> None:
    """A body holding one object or array more than the limit is ``413
    PAYLOAD_TOO_LARGE`` naming the limit (a body of the same shape within it reaches the
    route and its ``400``), nothing is written, and the server answers the next request."""
    h = {**make_key(), **JSON}
    before = row_counts(ledger_url)
    method = "PUT" if path == "/v1/checkpoints" else "POST"
    resp = client.request(method, path, content=raw, headers=h)
    err = error(resp, 413, "PAYLOAD_TOO_LARGE")
    assert err["message"] == (
        f"request body holds more than {LIMIT} JSON objects and arrays (the limit of this server)"
    )
    assert row_counts(ledger_url) == before
    assert data(client.get("/v1/me", headers=h))["principal"] == "agent-a"


def test_a_body_within_the_limit_reaches_the_route(client: TestClient, make_key: MakeKey) -> None:
    """A body of exactly the limit's containers is parsed and gets the route's own
    answer (here ``400``: an array is not a lease request)."""
    h = {**make_key(), **JSON}
    resp = client.post("/v1/leases", content=_arrays(LIMIT), headers=h)
    error(resp, 400, "VALIDATION_ERROR")


def _densest_state(cap: int) -> dict[str, Any]:
    """A state of exactly ``cap`` bytes of canonical JSON holding as many objects and
    arrays as the nesting limit lets it: chains of arrays nested to the deepest level
    allowed, then ``[]`` and ASCII padding to the byte."""
    chain = "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2)
    room = cap - len('{"x":[],"y":""}')
    text = ",".join([chain] * (room // (len(chain) + 1)))
    left = room - len(text) - 1
    text += ",[]" * (left // 3)
    state: dict[str, Any] = {"x": json.loads("[" + text + "]"), "y": "a" * (left % 3 + 1)}
    assert len(canonical_json(state).encode()) == cap
    validate_state(state, cap)
    return state


def _containers(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(v) for v in value)
    return 0


def test_the_densest_state_at_the_cap_is_saved(client: TestClient, make_key: MakeKey) -> None:
    """A state of exactly the default cap holding as many containers as it can (chains
    nested to the depth limit, about half a container per byte) is within the limit and
    saved (200), sent with spaces after each comma as Python's ``json.dumps`` writes it."""
    state = _densest_state(DEFAULT_STATE_MAX_BYTES)
    assert _containers(state) > DEFAULT_STATE_MAX_BYTES * 49 // 100
    h = {**make_key(), **JSON}
    body = json.dumps({"subject_id": "s", "kind": "k", "state": state}).encode()
    resp = client.put("/v1/checkpoints", content=body, headers=h)
    assert data(resp)["version"] == 1


def test_acquire_many_and_evidence_at_their_maximum_are_served(
    client: TestClient, make_key: MakeKey
) -> None:
    """``POST /v1/leases/batch`` with 1,000 resources, each with its own scope list, and
    an outcome with 1,000 evidence items are within the limit."""
    h = make_key()
    resources = [
        {"resource_type": "deploy", "resource_id": f"r{i}", "scopes": [f"s{i}"]}
        for i in range(MAX_MANY)
    ]
    resp = client.post(
        "/v1/leases/batch", json={"resources": resources, "ttl_seconds": 60}, headers=h
    )
    assert len(data(resp)["leases"]) == MAX_MANY
    evidence = [{"kind": "file", "uri": f"file:///e/{i}"} for i in range(1000)]
    body = {"subject_id": "s", "status": "succeeded", "evidence": evidence}
    resp = client.post("/v1/outcomes", json=body, headers=h)
    assert len(data(resp)["evidence"]) == 1000


def test_brackets_in_strings_are_no_containers(client: TestClient, make_key: MakeKey) -> None:
    """A state whose strings hold more ``[`` and ``{`` than the limit (escaped quotes
    among them) holds three containers, and is saved."""
    h = {**make_key(), **JSON}
    state = {"x": "[" * (LIMIT + 1), "y": ['{"' * (LIMIT // 4), "\\"]}
    body = json.dumps({"subject_id": "s", "kind": "k", "state": state}).encode()
    assert body.count(b"[") + body.count(b"{") > LIMIT
    resp = client.put("/v1/checkpoints", content=body, headers=h)
    assert data(resp)["state"] == state
