"""The OpenAPI document states what the app really does: every /v1 operation declares its
success envelope with the real model's schema, real responses validate against it, and
schemathesis' generated requests (in-process, a few operations) never get a 5xx or a
response outside the document."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from prefect_baton.rest import MAX_BODY_BYTES, create_app, create_key
from prefect_baton.rest._responses import DATA_BY_OPERATION

from .conftest import MakeKey, data, error, row_counts

CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]
LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        if path.startswith("/v1/")
        for method, op in item.items()
    ]


def test_every_v1_operation_declares_its_success_envelope(client: TestClient) -> None:
    """Each /v1 operation's 2xx is {"data": <its model>, "meta": {request_id, replayed}},
    its errors are the error envelope, and it needs a bearer key."""
    doc = client.app.openapi()
    components = doc["components"]["schemas"]
    ops = _operations(doc)
    assert len(ops) >= 18
    for method, path, op in ops:
        assert (method, path) in DATA_BY_OPERATION, f"{method} {path} has no success schema"
        ok = [s for s in op["responses"] if s.startswith("2")]
        assert len(ok) == 1, (method, path, ok)
        schema = op["responses"][ok[0]]["content"]["application/json"]["schema"]
        assert schema["required"] == ["data", "meta"], (method, path)
        data_ref = schema["properties"]["data"]["$ref"].rsplit("/", 1)[-1]
        assert data_ref == DATA_BY_OPERATION[(method, path)].__name__
        assert data_ref in components
        meta = components[schema["properties"]["meta"]["$ref"].rsplit("/", 1)[-1]]
        assert meta["required"] == ["request_id", "replayed"]
        assert {"400", "401", "403", "404", "409", "413", "503"} <= set(op["responses"])
        too_large = op["responses"]["413"]["description"]
        assert f"body over {MAX_BODY_BYTES:,} bytes" in too_large, too_large
        assert "422" not in op["responses"]
        assert op["security"] == [{"bearer": []}]
    assert "replayed" not in components["Lease"]["properties"]


def test_the_document_states_the_servers_body_limit(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 413 of an app whose state cap is 3 MiB states its own limit (9 MiB + 64 KiB) and
    the rule."""
    monkeypatch.setenv("BATON_STATE_MAX_BYTES", str(3 * 1024 * 1024))
    app = create_app(ledger_url)
    try:
        doc = app.openapi()
    finally:
        app.state.close_stores()
    text = doc["paths"]["/v1/checkpoints"]["put"]["responses"]["413"]["description"]
    assert "body over 9,502,720 bytes: the larger of 2 MiB and 3 times" in text, text


def test_real_responses_match_the_document(client: TestClient, make_key: MakeKey) -> None:
    """Responses of a whole coordination loop validate against their operations' schemas."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    a, b = make_key("agent-a"), make_key("agent-b")

    def check(method: str, path: str, resp: Any) -> Any:
        assert resp.status_code < 300, resp.text
        schema[path][method].validate_response(resp)
        return data(resp)

    lease = check("POST", "/v1/leases", client.post("/v1/leases", json=LEASE, headers=a))
    lid = lease["lease_id"]
    check("GET", "/v1/leases", client.get("/v1/leases", headers=a))
    inspect = client.get(
        "/v1/leases/inspect",
        params={k: LEASE[k] for k in ("resource_type", "resource_id")},
        headers=b,
    )
    check("GET", "/v1/leases/inspect", inspect)
    check("POST", "/v1/leases/{lease_id}/renew", client.post(f"/v1/leases/{lid}/renew", headers=a))
    body = {"subject_id": "s", "kind": "k", "state": {"step": 1}, "fence_lease_id": lid}
    ck = check("PUT", "/v1/checkpoints", client.put("/v1/checkpoints", json=body, headers=a))
    q = {"subject_id": "s", "kind": "k"}
    check("GET", "/v1/checkpoints", client.get("/v1/checkpoints", params=q, headers=a))
    check(
        "GET", "/v1/checkpoints/history", client.get("/v1/checkpoints/history", params=q, headers=a)
    )
    by_id = client.get(f"/v1/checkpoints/{ck['checkpoint_id']}", headers=a)
    check("GET", "/v1/checkpoints/{checkpoint_id}", by_id)
    hand = {
        "to_principal": "agent-b",
        "subject_id": "s",
        "checkpoint_id": ck["checkpoint_id"],
        "lease_id": lid,
    }
    hid = check("POST", "/v1/handoffs", client.post("/v1/handoffs", json=hand, headers=a))[
        "handoff_id"
    ]
    check("GET", "/v1/handoffs", client.get("/v1/handoffs", headers=b))
    check("GET", "/v1/handoffs/{handoff_id}", client.get(f"/v1/handoffs/{hid}", headers=b))
    resolved = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=b)
    moved = check("POST", "/v1/handoffs/{handoff_id}/resolve", resolved)["lease"]
    outcome = {
        "subject_id": "s",
        "status": "succeeded",
        "evidence": [{"kind": "log", "uri": "file:///x"}],
        "fence_lease_id": moved["lease_id"],
    }
    check("POST", "/v1/outcomes", client.post("/v1/outcomes", json=outcome, headers=b))
    check("GET", "/v1/outcomes", client.get("/v1/outcomes", headers=b))
    check("GET", "/v1/events", client.get("/v1/events", headers=a))
    mid = moved["lease_id"]
    check("DELETE", "/v1/leases/{lease_id}", client.delete(f"/v1/leases/{mid}", headers=b))
    again = client.post("/v1/leases", json=LEASE, headers=a)
    owner = make_key("boss", role="owner")
    forced = client.post(f"/v1/leases/{data(again)['lease_id']}/force-release", headers=owner)
    check("POST", "/v1/leases/{lease_id}/force-release", forced)
    batch = {"resources": [{"resource_type": "file", "resource_id": "a.py"}], "ttl_seconds": 30}
    check("POST", "/v1/leases/batch", client.post("/v1/leases/batch", json=batch, headers=a))
    check("GET", "/v1/me", client.get("/v1/me", headers=a))
    took = client.post("/v1/leases", json=LEASE, headers=a)
    body = {"to_principal": "agent-b", "new_execution_key": "exec-b", "ttl_seconds": 60}
    moved_to = client.post(f"/v1/leases/{data(took)['lease_id']}/transfer", json=body, headers=a)
    check("POST", "/v1/leases/{lease_id}/transfer", moved_to)


#: A few operations fuzzed in-process by every `make test` (the whole API is fuzzed over
#: HTTP by .ci/schemathesis).
FUZZED = [
    ("POST", "/v1/leases"),
    ("POST", "/v1/leases/batch"),
    ("GET", "/v1/leases/inspect"),
    ("DELETE", "/v1/leases/{lease_id}"),
    ("PUT", "/v1/checkpoints"),
    ("POST", "/v1/handoffs"),
    ("POST", "/v1/handoffs/{handoff_id}/resolve"),
    ("POST", "/v1/outcomes"),
    ("GET", "/v1/events"),
]


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[FastAPI, dict[str, str]]:
    """One app over a fresh ledger and an owner's key, shared by the fuzz cases."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'ledger.db'}"
    app = create_app(url)
    secret, _ = create_key(url, org="fuzz", principal="fuzzer", role="owner")
    return app, {"Authorization": f"Bearer {secret}"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("method", "path"), FUZZED, ids=[f"{m} {p}" for m, p in FUZZED])
def test_schemathesis_finds_no_5xx_and_no_schema_violation(
    fuzz_target: tuple[FastAPI, dict[str, str]], method: str, path: str, mode: GenerationMode
) -> None:
    """Generated valid and invalid requests get documented statuses, content types and
    bodies that match their schemas, never a 5xx."""
    app, auth = fuzz_target
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)[path][method]

    @settings(
        max_examples=25,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        case.call_and_validate(headers=auth, checks=CHECKS)

    run()


def test_parameter_bounds_in_the_document_hold(client: TestClient, make_key: MakeKey) -> None:
    """Each stated ``limit`` maximum is accepted and one more is 400 (the operation's other
    required query parameters given as ``x``); an empty id parameter (below the stated
    minLength) is 400."""
    h = make_key("agent-a", role="owner")
    doc = client.app.openapi()
    checked = 0
    for method, path, op in _operations(doc):
        params = op.get("parameters", [])
        required = {p["name"]: "x" for p in params if p["in"] == "query" and p.get("required")}
        for param in params:
            if param["name"] != "limit":
                continue
            top = param["schema"]["maximum"]
            ok = client.request(method, path, params={**required, "limit": top}, headers=h)
            assert ok.status_code < 300, (method, path, ok.text)
            over = client.request(method, path, params={**required, "limit": top + 1}, headers=h)
            error(over, 400, "VALIDATION_ERROR")
            checked += 1
    assert checked >= 5
    params = {"resource_type": "", "resource_id": "x"}
    error(client.get("/v1/leases/inspect", params=params, headers=h), 400, "VALIDATION_ERROR")


def test_idempotency_key_is_documented_only_where_it_is_honoured(
    client: TestClient, make_key: MakeKey
) -> None:
    """Every mutating route declares Idempotency-Key; report-expired (no receipt) does not,
    and refuses it."""
    doc = client.app.openapi()
    declared = {
        (method, path)
        for method, path, op in _operations(doc)
        if any(p["name"] == "Idempotency-Key" for p in op.get("parameters", []))
    }
    assert {
        ("POST", "/v1/leases"),
        ("POST", "/v1/handoffs"),
        ("PUT", "/v1/checkpoints"),
        ("POST", "/v1/outcomes"),
        ("DELETE", "/v1/leases/{lease_id}"),
        ("POST", "/v1/leases/{lease_id}/release"),
        ("POST", "/v1/leases/{lease_id}/renew"),
        ("POST", "/v1/leases/{lease_id}/transfer"),
        ("POST", "/v1/leases/{lease_id}/force-release"),
        ("POST", "/v1/handoffs/{handoff_id}/resolve"),
    } <= declared
    assert ("POST", "/v1/leases/report-expired") not in declared
    h = make_key()
    r = client.post("/v1/leases/report-expired", headers={**h, "Idempotency-Key": "k"})
    error(r, 400, "VALIDATION_ERROR")


def test_method_not_allowed_lists_the_allowed_methods(
    client: TestClient, make_key: MakeKey
) -> None:
    """A known path with another method is 405 with an Allow header of the path's methods."""
    h = make_key()
    r = client.request("PATCH", "/v1/leases", headers=h)
    error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, HEAD, POST"
    r = client.request("PUT", "/v1/leases/lease_x", headers=h)
    assert r.headers["allow"] == "DELETE, GET, HEAD"
    r = client.request("HEAD", "/v1/leases/lease_x/renew", headers=h)
    assert (r.status_code, r.headers["allow"]) == (405, "POST")


def test_allow_lists_exactly_the_methods_not_answered_405(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """On every path of the document (ids as ``x``), the ``Allow`` of a ``405`` lists
    exactly the methods the path is not answered ``405`` with, ``HEAD`` exactly where
    ``GET`` is: ``/v1/leases/batch`` also matches ``/v1/leases/{lease_id}``, whose ``GET``
    and ``DELETE`` answer ``404`` for a lease ``batch`` (before, its ``Allow`` was ``POST``
    alone)."""
    import re

    h = make_key(role="owner")
    before = row_counts(ledger_url)
    paths = {re.sub(r"\{[^}]+\}", "x", p) for p in client.get("/openapi.json").json()["paths"]}
    assert "/v1/leases/batch" in paths
    methods = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")
    for path in sorted(paths):
        r = client.request("PATCH", path, headers=h)
        error(r, 405, "METHOD_NOT_ALLOWED")
        allow = set(r.headers["allow"].split(", "))
        served = {m for m in methods if client.request(m, path, headers=h).status_code != 405}
        assert allow == served, (path, allow, served)
        assert ("HEAD" in allow) == ("GET" in allow), path
    r = client.request("PATCH", "/v1/leases/batch", headers=h)
    assert r.headers["allow"] == "DELETE, GET, HEAD, POST"
    assert client.head("/v1/leases/batch", headers=h).status_code == 404
    error(client.get("/v1/leases/batch", headers=h), 404, "NOT_FOUND")
    assert row_counts(ledger_url) == before


@pytest.mark.parametrize(
    ("method", "path", "body", "allow"),
    [
        ("PUT", "/v1/leases/batch", b"{}", "DELETE, GET, HEAD, POST"),
        ("PATCH", "/v1/leases?foo=1", b"", "GET, HEAD, POST"),
        ("PUT", "/v1/me?x=1", b"", "GET, HEAD"),
        ("DELETE", "/v1/me", b"{}", "GET, HEAD"),
        ("POST", "/v1/leases/x?x=1", b"", "DELETE, GET, HEAD"),
        ("PATCH", "/v1/leases/inspect", b'{"a": 1}', "DELETE, GET, HEAD"),
    ],
)
def test_a_method_not_allowed_is_405_whatever_the_query_or_the_body(
    client: TestClient, make_key: MakeKey, method: str, path: str, body: bytes, allow: str
) -> None:
    """A method the path does not take is ``405`` with the path's ``Allow``, also with a
    body or a query parameter the route would refuse (before: ``400`` "... takes no request
    body" or "unknown query parameter")."""
    h = {**make_key(), "content-type": "application/json"}
    r = client.request(method, path, content=body, headers=h)
    error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == allow


def test_durations_are_integers_without_a_fraction(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """A duration in seconds (a lease's ``ttl_seconds``, a checkpoint's ``ttl_seconds``, a
    handoff's ``expires_in_seconds``, an accept's ``ttl_seconds``) is an integer as the
    document says: ``60`` is taken; ``60.0``, ``60.5``, ``"60"`` and ``true`` are 400
    VALIDATION_ERROR (as the Python API and the CLI refuse them) and write nothing."""
    h = {**make_key(), "content-type": "application/json"}
    ok = b'{"resource_type": "deploy", "resource_id": "a", "ttl_seconds": 60}'
    r = client.post("/v1/leases", content=ok, headers=h)
    assert r.status_code == 201, r.text
    assert data(r)["ttl_seconds"] == 60
    made = client.post("/v1/handoffs", json={"to_principal": "bob", "subject_id": "s"}, headers=h)
    assert made.status_code == 201, made.text
    resolve = f"/v1/handoffs/{data(made)['handoff_id']}/resolve"
    before = row_counts(ledger_url)
    for bad in (b"60.0", b"60.5", b'"60"', b"true"):
        bodies = [
            ("POST", "/v1/leases", b'{"resource_type": "deploy", "resource_id": "b", '),
            ("PUT", "/v1/checkpoints", b'{"subject_id": "s", "kind": "k", "state": {}, '),
            ("POST", "/v1/handoffs", b'{"to_principal": "bob", "subject_id": "s", '),
            ("POST", resolve, b'{"status": "accepted", '),
        ]
        for (method, path, head), field in zip(
            bodies, ["ttl_seconds", "ttl_seconds", "expires_in_seconds", "ttl_seconds"], strict=True
        ):
            raw = head + b'"' + field.encode() + b'": ' + bad + b"}"
            r = client.request(method, path, content=raw, headers=h)
            error(r, 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before


#: GET paths of every kind: API routes, the metrics, the UI, the document and its pages.
GET_PATHS = ["/v1/leases", "/v1/handoffs", "/v1/events", "/v1/me", "/metrics", "/ui"]
DOC_PATHS = ["/openapi.json", "/docs", "/redoc"]


@pytest.mark.parametrize("path", GET_PATHS + DOC_PATHS)
def test_head_is_get_without_the_body_on_every_get_route(
    client: TestClient, make_key: MakeKey, path: str
) -> None:
    """``HEAD`` of any ``GET`` route answers as the ``GET`` does (status, content type,
    length, request id) with no body: before, the API routes were ``405`` while the
    document and its pages (FastAPI's own routes) answered ``200``."""
    h = make_key()
    got = client.get(path, headers=h)
    head = client.head(path, headers=h)
    assert got.status_code == head.status_code == 200, (path, head.status_code)
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if path == "/openapi.json":  # the same document, so the same length
        assert head.headers["content-length"] == got.headers["content-length"]
    assert head.headers["x-request-id"].startswith("req_")
    if path.startswith("/v1/"):  # authenticated as the GET is
        assert client.head(path).status_code == 401


@pytest.mark.parametrize("path", GET_PATHS + DOC_PATHS)
def test_unknown_query_parameter_is_refused_on_every_get_route(
    client: TestClient, make_key: MakeKey, path: str
) -> None:
    """An unknown query parameter is ``400 VALIDATION_ERROR`` naming it on every route, the
    OpenAPI document and its pages included (before: ``GET /openapi.json?x=1`` was ``200``
    while every API route refused it)."""
    r = client.get(path, params={"x": "1"}, headers=make_key())
    assert "unknown query parameter 'x'" in error(r, 400, "VALIDATION_ERROR")["message"]
