"""Error statuses and bodies of the REST API, and bad requests that must write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from prefect_baton import errors
from prefect_baton._client.sync import LeaseAPI
from prefect_baton.rest import MAX_BODY_BYTES, STATUS_BY_CODE

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def test_every_design_code_has_a_fixed_status() -> None:
    """Each error code of the design maps to its documented HTTP status."""
    expected = {
        "VALIDATION_ERROR": 400,
        "FORBIDDEN": 403,
        "NOT_FOUND": 404,
        "CONFLICT": 409,
        "VERSION_CONFLICT": 409,
        "IDEMPOTENCY_MISMATCH": 409,
        "IDEMPOTENCY_IN_FLIGHT": 409,
        "LEASE_LOST": 409,
        "STALE_FENCE": 409,
        "UNAVAILABLE": 503,
    }
    assert {c: STATUS_BY_CODE[c] for c in errors.ERROR_CODES} == expected


def _raise(exc: Exception) -> Any:
    def fake(*_a: Any, **_k: Any) -> Any:
        raise exc

    return fake


@pytest.mark.parametrize("code", errors.ERROR_CODES)
def test_each_error_class_reaches_the_client(
    client: TestClient, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """An error raised by the Python API comes back with its code, message and status;
    the message of UNAVAILABLE and INTERNAL (server detail) only names the request id."""
    exc = errors.error_for_code(code, f"boom {code}", current_version=3, expected_version=2)
    monkeypatch.setattr(LeaseAPI, "acquire", _raise(exc))
    r = client.post("/v1/leases", json=LEASE, headers=make_key())
    err = error(r, STATUS_BY_CODE[code], code)
    if code in ("UNAVAILABLE", "INTERNAL_ERROR"):
        assert "boom" not in err["message"]
        assert r.headers["x-request-id"] in err["message"]
    else:
        assert err["message"] == f"boom {code}"
    if code == "VERSION_CONFLICT":
        assert (err["current_version"], err["expected_version"]) == (3, 2)


def test_driver_detail_stays_in_the_server_log(
    client: TestClient,
    make_key: MakeKey,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A database driver's error (host, port, role, database) is UNAVAILABLE with only the
    request id for the client; the server log keeps the detail under that id."""
    detail = (
        'ledger database unavailable: connection to server at "db.internal" (10.1.2.3), '
        'port 6543 failed: FATAL: role "baton_rw" does not exist; database "prod_ledger"'
    )
    monkeypatch.setattr(LeaseAPI, "acquire", _raise(errors.UnavailableError(detail)))
    with caplog.at_level("WARNING", logger="prefect_baton.rest"):
        r = client.post("/v1/leases", json=LEASE, headers=make_key())
    err = error(r, 503, "UNAVAILABLE")
    rid = r.headers["x-request-id"]
    assert err["message"] == f"the service is unavailable; retry later (request {rid})"
    for secret in ("db.internal", "10.1.2.3", "6543", "baton_rw", "prod_ledger"):
        assert secret not in r.text
    assert any(rid in rec.getMessage() and detail in rec.getMessage() for rec in caplog.records)


def test_internal_error_names_only_the_request_id(
    client: TestClient,
    make_key: MakeKey,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unexpected failure (a bug) is 500 INTERNAL_ERROR whose message is ``internal
    error`` and the request id, with no advice to retry; the server log keeps the detail
    under that id."""
    monkeypatch.setattr(LeaseAPI, "acquire", _raise(ValueError("secret detail")))
    with caplog.at_level("WARNING", logger="prefect_baton.rest"):
        r = client.post("/v1/leases", json=LEASE, headers=make_key())
    err = error(r, 500, "INTERNAL_ERROR")  # X-Request-ID names the request, as on any answer
    rid = r.headers["x-request-id"]
    assert err["message"] == f"internal error (request {rid})"
    assert "secret detail" not in r.text
    assert any(
        rid in rec.getMessage() and "secret detail" in rec.getMessage() for rec in caplog.records
    )


@pytest.fixture
def two(client: TestClient, make_key: MakeKey) -> Iterator[tuple[dict[str, str], ...]]:
    """Headers of agent-a and agent-b of one org."""
    return make_key("agent-a"), make_key("agent-b")


def test_conflict_gives_only_the_expiry(
    client: TestClient, two: tuple[dict[str, str], ...]
) -> None:
    """A held lease answers 409 CONFLICT with expires_at and no holder or purpose."""
    a, b = two
    won = data(client.post("/v1/leases", json={**LEASE, "purpose": "secret-plan"}, headers=a))
    err = error(client.post("/v1/leases", json=LEASE, headers=b), 409, "CONFLICT")
    assert err["expires_at"][:19] == won["expires_at"][:19]
    assert "agent-a" not in err["message"]
    assert "secret-plan" not in err["message"]


def test_version_conflict(client: TestClient, make_key: MakeKey) -> None:
    """A stale expected_version is 409 VERSION_CONFLICT with both versions."""
    h = make_key()
    r = client.post("/v1/leases", json={**LEASE, "expected_version": 5}, headers=h)
    err = error(r, 409, "VERSION_CONFLICT")
    assert (err["current_version"], err["expected_version"]) == (0, 5)


def test_idempotency_mismatch(client: TestClient, make_key: MakeKey) -> None:
    """Reusing an Idempotency-Key for another body is 409 IDEMPOTENCY_MISMATCH."""
    h = {**make_key(), "Idempotency-Key": "k1"}
    body = {"subject_id": "s", "kind": "k", "state": {"a": 1}}
    assert client.put("/v1/checkpoints", json=body, headers=h).status_code == 200
    r = client.put("/v1/checkpoints", json={**body, "state": {"a": 2}}, headers=h)
    error(r, 409, "IDEMPOTENCY_MISMATCH")


def test_lease_lost_on_renew_after_release(client: TestClient, make_key: MakeKey) -> None:
    """Renewing a released lease is 409 LEASE_LOST."""
    h = make_key()
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    client.delete(f"/v1/leases/{lease['lease_id']}", headers=h)
    error(client.post(f"/v1/leases/{lease['lease_id']}/renew", headers=h), 409, "LEASE_LOST")


def test_stale_fence(client: TestClient, make_key: MakeKey) -> None:
    """A checkpoint fenced by a released lease is 409 STALE_FENCE and writes nothing."""
    h = make_key()
    lease = data(client.post("/v1/leases", json=LEASE, headers=h))
    client.delete(f"/v1/leases/{lease['lease_id']}", headers=h)
    body = {"subject_id": "s", "kind": "k", "state": {}, "fence_lease_id": lease["lease_id"]}
    r = client.put("/v1/checkpoints", json=body, headers=h)
    error(r, 409, "STALE_FENCE")
    params = {"subject_id": "s", "kind": "k"}
    error(client.get("/v1/checkpoints", params=params, headers=h), 404, "NOT_FOUND")


def test_a_fence_of_another_principals_lease_is_stale_and_recorded(
    client: TestClient, make_key: MakeKey
) -> None:
    """An owner presenting another principal's lease as a fence gets 409 STALE_FENCE, as in
    Python, and the refusal is recorded as a ``fence.rejected`` event of that resource; an
    agent, who cannot read that lease, gets STALE_FENCE too."""
    alice = make_key("alice")
    boss, bob = make_key("boss", role="owner"), make_key("bob")
    lease = data(client.post("/v1/leases", json=LEASE, headers=alice))
    for who in (boss, bob):
        body = {"subject_id": "s", "kind": "k", "state": {}, "fence_lease_id": lease["lease_id"]}
        error(client.put("/v1/checkpoints", json=body, headers=who), 409, "STALE_FENCE")
    events = data(client.get("/v1/events", headers=boss))["events"]
    rejected = [e for e in events if e["kind"] == "fence.rejected"]
    assert [(e["principal"], e["payload"]["lease_id"]) for e in rejected] == [
        ("boss", lease["lease_id"])
    ]


def test_forbidden_role_and_recipient(client: TestClient, two: tuple[dict[str, str], ...]) -> None:
    """An agent's force-release is 403 FORBIDDEN; a non-recipient's resolve is the seed's
    400 VALIDATION_ERROR "Only the target principal can resolve a handoff."."""
    a, b = two
    lease = data(client.post("/v1/leases", json=LEASE, headers=a))
    error(client.post(f"/v1/leases/{lease['lease_id']}/force-release", headers=b), 403, "FORBIDDEN")
    body = {"to_principal": "agent-b", "subject_id": "s"}
    hid = data(client.post("/v1/handoffs", json=body, headers=a))["handoff_id"]
    r = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=a)
    error(r, 400, "VALIDATION_ERROR")
    assert r.json()["error"]["message"] == "Only the target principal can resolve a handoff."


def test_not_found(client: TestClient, make_key: MakeKey) -> None:
    """Unknown ids, a second resolve and unknown routes are 404 NOT_FOUND."""
    a, b = make_key("agent-a"), make_key("agent-b")
    error(client.delete("/v1/leases/lease_nope", headers=a), 404, "NOT_FOUND")
    error(client.get("/v1/handoffs/hoff_nope", headers=a), 404, "NOT_FOUND")
    error(client.get("/v1/checkpoints/ckpt_nope", headers=a), 404, "NOT_FOUND")
    hid = data(
        client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=a)
    )["handoff_id"]
    ok = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=b)
    assert ok.status_code == 200
    again = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "rejected"}, headers=b)
    error(again, 404, "NOT_FOUND")
    error(client.get("/nowhere"), 404, "NOT_FOUND")


def test_another_orgs_ids_are_not_found(client: TestClient, make_key: MakeKey) -> None:
    """Ids of another org are 404 for every route that takes one, and nothing changes."""
    mine = make_key("agent-a")
    other = make_key("agent-a", role="admin", org_="other-org")
    lease = data(client.post("/v1/leases", json=LEASE, headers=mine))
    ck = data(
        client.put(
            "/v1/checkpoints", json={"subject_id": "s", "kind": "k", "state": {}}, headers=mine
        )
    )
    body = {"to_principal": "agent-a", "subject_id": "s"}
    hid = data(client.post("/v1/handoffs", json=body, headers=make_key("agent-b")))["handoff_id"]
    lid = lease["lease_id"]
    before = row_counts(client.app.state.store.url)
    error(client.delete(f"/v1/leases/{lid}", headers=other), 404, "NOT_FOUND")
    error(client.post(f"/v1/leases/{lid}/renew", headers=other), 404, "NOT_FOUND")
    error(client.post(f"/v1/leases/{lid}/force-release", headers=other), 404, "NOT_FOUND")
    error(client.get(f"/v1/checkpoints/{ck['checkpoint_id']}", headers=other), 404, "NOT_FOUND")
    error(client.get(f"/v1/handoffs/{hid}", headers=other), 404, "NOT_FOUND")
    r = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=other)
    error(r, 404, "NOT_FOUND")
    assert row_counts(client.app.state.store.url) == before


BAD_BODIES: list[tuple[str, bytes]] = [
    ("malformed json", b'{"resource_type": "deploy",'),
    ("not an object", b"[1, 2]"),
    ("wrong type", b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": "60"}'),
    ("unknown field", b'{"resource_type": "d", "resource_id": "x", "ttl_seconds": 60, "who": 1}'),
    ("missing field", b'{"resource_type": "deploy", "ttl_seconds": 60}'),
    ("ttl out of range", b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": 5}'),
    ("empty id", b'{"resource_type": "", "resource_id": "x", "ttl_seconds": 60}'),
    ("empty body", b""),
]


@pytest.mark.parametrize(("label", "raw"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_are_400_and_write_nothing(
    client: TestClient, make_key: MakeKey, ledger_url: str, label: str, raw: bytes
) -> None:
    """Malformed JSON, wrong types, unknown or missing fields are 400 and write nothing."""
    h = {**make_key(), "content-type": "application/json"}
    before = row_counts(ledger_url)
    error(client.post("/v1/leases", content=raw, headers=h), 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before, label


def test_bad_query_parameters_are_400(client: TestClient, make_key: MakeKey) -> None:
    """A non-integer or out-of-range query parameter is 400 VALIDATION_ERROR."""
    h = make_key()
    many = error(
        client.get("/v1/events", params={"limit": "many"}, headers=h), 400, "VALIDATION_ERROR"
    )
    zero = error(client.get("/v1/events", params={"limit": 0}, headers=h), 400, "VALIDATION_ERROR")
    assert many["message"] == zero["message"] == "limit must be an integer from 1 to 1000"
    for path in ("/v1/leases", "/v1/handoffs", "/v1/outcomes"):
        abc = error(client.get(path, params={"limit": "abc"}, headers=h), 400, "VALIDATION_ERROR")
        assert abc["message"].startswith("limit must be an integer from 1 to "), (path, abc)
    assert client.get("/v1/events", params={"limit": "5"}, headers=h).status_code == 200
    error(client.get("/v1/events", params={"after": -1}, headers=h), 400, "VALIDATION_ERROR")
    bad_kind = error(
        client.get("/v1/events", params={"kind": "nope"}, headers=h), 400, "VALIDATION_ERROR"
    )
    assert "unknown event kind 'nope'" in bad_kind["message"]
    error(client.get("/v1/leases/inspect", headers=h), 400, "VALIDATION_ERROR")


def test_bad_nested_and_checkpoint_bodies(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """Unknown fields in evidence, a non-object state and a bad status write nothing."""
    h = make_key()
    before = row_counts(ledger_url)
    ev = {"subject_id": "s", "status": "succeeded", "evidence": [{"kind": "k", "uri": "u", "x": 1}]}
    err = error(client.post("/v1/outcomes", json=ev, headers=h), 400, "VALIDATION_ERROR")
    assert err["message"] == "evidence.0.x: Extra inputs are not permitted", err
    bad_status = {"subject_id": "s", "status": "done", "evidence": []}
    error(client.post("/v1/outcomes", json=bad_status, headers=h), 400, "VALIDATION_ERROR")
    state = {"subject_id": "s", "kind": "k", "state": [1]}
    error(client.put("/v1/checkpoints", json=state, headers=h), 400, "VALIDATION_ERROR")
    hand = {"to_principal": "agent-a", "subject_id": "s"}
    error(client.post("/v1/handoffs", json=hand, headers=h), 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before


def test_oversized_body_is_413(client: TestClient, make_key: MakeKey, ledger_url: str) -> None:
    """A body over MAX_BODY_BYTES is 413, by Content-Length or streamed, and writes nothing."""
    h = {**make_key(), "content-type": "application/json"}
    before = row_counts(ledger_url)
    big = b'{"subject_id": "s", "kind": "k", "state": {"x": "' + b"a" * MAX_BODY_BYTES + b'"}}'
    error(client.put("/v1/checkpoints", content=big, headers=h), 413, "PAYLOAD_TOO_LARGE")

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = client.put("/v1/checkpoints", content=chunks(), headers=h)
    error(r, 413, "PAYLOAD_TOO_LARGE")
    assert row_counts(ledger_url) == before


def test_unavailable_while_authenticating_is_503(
    client: TestClient, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger that cannot be reached while the key is checked is 503 UNAVAILABLE."""
    h = make_key()
    down = errors.UnavailableError("ledger database unavailable")
    monkeypatch.setattr("prefect_baton.rest._http.authenticate", _raise(down))
    error(client.get("/v1/leases", headers=h), 503, "UNAVAILABLE")


def _json(h: dict[str, str]) -> dict[str, str]:
    return {**h, "content-type": "application/json"}


def test_body_limit_boundary(client: TestClient, make_key: MakeKey, ledger_url: str) -> None:
    """A body of exactly MAX_BODY_BYTES reaches the route (here: 400, the state is over its
    own 1 MiB limit); one byte more is 413 on every body route; nothing is written."""
    h = _json(make_key())
    before = row_counts(ledger_url)
    head, tail = b'{"subject_id": "s", "kind": "k", "state": {"x": "', b'"}}'
    exact = head + b"a" * (MAX_BODY_BYTES - len(head) - len(tail)) + tail
    assert len(exact) == MAX_BODY_BYTES
    error(client.put("/v1/checkpoints", content=exact, headers=h), 400, "VALIDATION_ERROR")
    over = exact[: -len(tail)] + b"a" + tail
    for method, path in [
        ("PUT", "/v1/checkpoints"),
        ("POST", "/v1/leases"),
        ("POST", "/v1/handoffs"),
        ("POST", "/v1/outcomes"),
        ("POST", "/v1/leases/lease_x/renew"),
        ("POST", "/v1/handoffs/hoff_x/resolve"),
    ]:
        r = client.request(method, path, content=over, headers=h)
        err = error(r, 413, "PAYLOAD_TOO_LARGE")
        assert str(MAX_BODY_BYTES) in err["message"]
    assert row_counts(ledger_url) == before


def test_oversized_body_without_a_key_is_401(client: TestClient, ledger_url: str) -> None:
    """The key is checked before the body: no key and a body over the limit is 401."""
    before = row_counts(ledger_url)
    big = b"{" + b" " * MAX_BODY_BYTES + b"}"
    h = {"content-type": "application/json"}
    error(client.put("/v1/checkpoints", content=big, headers=h), 401, "UNAUTHENTICATED")
    assert row_counts(ledger_url) == before


def test_unknown_fields_on_every_body_route(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """An unknown field is 400 VALIDATION_ERROR on every route with a body, even next to
    otherwise valid fields and real ids, and writes nothing."""
    a, b = make_key("agent-a"), make_key("agent-b")
    lid = data(client.post("/v1/leases", json=LEASE, headers=a))["lease_id"]
    hand = {"to_principal": "agent-b", "subject_id": "s"}
    hid = data(client.post("/v1/handoffs", json=hand, headers=a))["handoff_id"]
    before = row_counts(ledger_url)
    cases: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
        ("POST", "/v1/leases", {**LEASE, "resource_id": "other", "holder": "x"}, a),
        ("POST", f"/v1/leases/{lid}/renew", {"ttl_seconds": 60, "force": True}, a),
        (
            "POST",
            f"/v1/leases/{lid}/transfer",
            {"to_principal": "agent-b", "new_execution_key": "e", "ttl_seconds": 60, "x": 1},
            a,
        ),
        ("POST", "/v1/handoffs", {**hand, "priority": 1}, a),
        ("POST", f"/v1/handoffs/{hid}/resolve", {"status": "accepted", "as": "agent-a"}, b),
        ("PUT", "/v1/checkpoints", {"subject_id": "s", "kind": "k", "state": {}, "v": 2}, a),
        ("POST", "/v1/outcomes", {"subject_id": "s", "status": "failed", "principal": "z"}, a),
    ]
    for method, path, body, h in cases:
        r = client.request(method, path, json=body, headers=h)
        err = error(r, 400, "VALIDATION_ERROR")
        assert "xtra" in err["message"] or "not permitted" in err["message"], (path, err)
    assert row_counts(ledger_url) == before


@pytest.mark.parametrize(
    ("label", "content_type", "raw"),
    [
        (
            "text/plain",
            "text/plain",
            b'{"resource_type": "d", "resource_id": "x", "ttl_seconds": 60}',
        ),
        ("not utf-8", "application/json", b'{"resource_type": "\xff", "resource_id": "x"}'),
        ("integer too long", "application/json", b'{"ttl_seconds": 1' + b"0" * 5000 + b"}"),
        ("nested too deep", "application/json", b"[" * 100_000 + b"]" * 100_000),
    ],
)
def test_unparseable_bodies_are_400(
    client: TestClient,
    make_key: MakeKey,
    ledger_url: str,
    label: str,
    content_type: str,
    raw: bytes,
) -> None:
    """A non-JSON content type, invalid UTF-8, an absurd integer or absurd nesting is 400
    VALIDATION_ERROR (never 5xx) and writes nothing."""
    h = {**make_key(), "content-type": content_type}
    before = row_counts(ledger_url)
    error(client.post("/v1/leases", content=raw, headers=h), 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before, label


def test_malformed_json_names_the_byte_and_the_reason(
    client: TestClient, make_key: MakeKey
) -> None:
    """A body that is not JSON is 400 VALIDATION_ERROR whose message says so, with the
    byte offset of the fault in the body (UTF-8 bytes, not characters) and the parser's
    reason, not FastAPI's bare ``18: JSON decode error``."""
    h = {**make_key(), "content-type": "application/json"}
    err = error(
        client.post("/v1/leases", content=b'{"resource_type": x}', headers=h),
        400,
        "VALIDATION_ERROR",
    )
    assert err["message"] == "body: invalid JSON at byte 18 (Expecting value)"
    missing_name = b'{"resource_type": "d",}'
    err = error(client.post("/v1/leases", content=missing_name, headers=h), 400, "VALIDATION_ERROR")
    assert err["message"] == (
        "body: invalid JSON at byte 22 (Expecting property name enclosed in double quotes)"
    )
    accented = '{"resource_type": "caf\u00e9", x}'.encode()  # é is 2 bytes, 1 character
    err = error(client.post("/v1/leases", content=accented, headers=h), 400, "VALIDATION_ERROR")
    assert err["message"].startswith("body: invalid JSON at byte 27 (")


def test_revoked_key_is_401_on_every_route(
    client: TestClient, make_key: MakeKey, ledger_url: str, org: str
) -> None:
    """Once revoked, a key gets 401 on reads and writes of every area; nothing is written."""
    from prefect_baton.rest import create_key, revoke_key

    secret, key = create_key(ledger_url, org=org, principal="agent-a")
    h = {"Authorization": f"Bearer {secret}"}
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    revoke_key(ledger_url, key_id=key.key_id)
    before = row_counts(ledger_url)
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/v1/leases", {**LEASE, "resource_id": "other"}),
        ("DELETE", f"/v1/leases/{lid}", None),
        ("POST", f"/v1/leases/{lid}/renew", None),
        ("POST", "/v1/handoffs", {"to_principal": "agent-b", "subject_id": "s"}),
        ("PUT", "/v1/checkpoints", {"subject_id": "s", "kind": "k", "state": {}}),
        ("POST", "/v1/outcomes", {"subject_id": "s", "status": "failed"}),
        ("GET", "/v1/leases", None),
        ("GET", "/v1/events", None),
    ]
    for method, path, body in calls:
        r = client.request(method, path, json=body, headers=h)
        error(r, 401, "UNAUTHENTICATED")
    assert row_counts(ledger_url) == before
    active = make_key("agent-a")
    assert data(client.get("/v1/leases", headers=active))["leases"][0]["lease_id"] == lid


def test_another_orgs_key_sees_and_replays_nothing_of_this_org(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """A key of another org (same principal name, same Idempotency-Key) gets its own lease,
    never this org's receipt, and lists none of this org's leases, handoffs or events."""
    mine = {**make_key("agent-a"), "Idempotency-Key": "run-1"}
    theirs = {**make_key("agent-a", org_="other-org"), "Idempotency-Key": "run-1"}
    first = client.post("/v1/leases", json=LEASE, headers=mine)
    assert first.status_code == 201
    client.post("/v1/handoffs", json={"to_principal": "agent-a", "subject_id": "s"}, headers=mine)
    other = client.post("/v1/leases", json=LEASE, headers=theirs)
    assert other.status_code == 201
    assert other.json()["meta"]["replayed"] is False
    assert data(other)["lease_id"] != data(first)["lease_id"]
    plain = {"Authorization": theirs["Authorization"]}
    leases = data(client.get("/v1/leases", headers=plain))["leases"]
    assert [x["lease_id"] for x in leases] == [data(other)["lease_id"]]
    assert data(client.get("/v1/handoffs", headers=plain))["handoffs"] == []
    events = data(client.get("/v1/events", headers=plain))["events"]
    assert {e["payload"].get("lease_id") for e in events} == {data(other)["lease_id"]}
    before = row_counts(ledger_url)
    lid = data(first)["lease_id"]
    error(client.delete(f"/v1/leases/{lid}", headers=plain), 404, "NOT_FOUND")
    assert row_counts(ledger_url) == before


@pytest.mark.parametrize(
    ("content_type", "got"),
    [
        (None, "no Content-Type"),  # a client that sends none
        ("application/x-www-form-urlencoded", "Content-Type: application/x-www-form-urlencoded"),
        ("text/plain; charset=utf-8", "Content-Type: text/plain"),
    ],
)
def test_json_body_without_a_json_content_type_says_so(
    client: TestClient, make_key: MakeKey, ledger_url: str, content_type: str | None, got: str
) -> None:
    """A JSON object sent without ``Content-Type: application/json`` (``curl -d`` sends
    ``application/x-www-form-urlencoded``) is 400 VALIDATION_ERROR naming the header to send
    (not pydantic's "Input should be a valid dictionary"), and writes nothing; on a records
    route as on a lease route."""
    h = make_key()
    if content_type is not None:
        h["content-type"] = content_type
    before = row_counts(ledger_url)
    lease = b'{"resource_type": "deploy", "resource_id": "x", "ttl_seconds": 60}'
    outcome = b'{"subject_id": "s", "status": "failed"}'
    malformed = b'{"resource_type": "deploy", "resource_type": "x"'  # not read as JSON either
    for path, raw in (("/v1/leases", lease), ("/v1/outcomes", outcome), ("/v1/leases", malformed)):
        err = error(client.post(path, content=raw, headers=h), 400, "VALIDATION_ERROR")
        assert err["message"] == (
            f"body: the body must be JSON with Content-Type: application/json (got {got})"
        )
    assert row_counts(ledger_url) == before
    sent = client.post(
        "/v1/leases", content=lease, headers={**h, "content-type": "application/json"}
    )
    assert sent.status_code == 201, sent.text


def test_every_lease_proof_refuses_a_wrong_lease_id_and_a_wrong_key(
    client: TestClient, make_key: MakeKey
) -> None:
    """Each route that takes a lease proof (renew, transfer, release by proof, handoff
    create with ``lease_id``) is 404 NOT_FOUND for an unknown lease id and 409 LEASE_LOST
    for another execution's key (never corrected); an absent key is the lease's own (one
    proof for all, as the CLI builds it: ``_client.leases.proof_by_id``)."""
    h = make_key("agent-a")
    lease = data(client.post("/v1/leases", json=LEASE, headers={**h, "Idempotency-Key": "run-1"}))
    assert lease["execution_key"] == "run-1"
    lid = lease["lease_id"]
    transfer = {"to_principal": "agent-b", "new_execution_key": "run-2", "ttl_seconds": 60}
    handoff = {"to_principal": "agent-b", "subject_id": "s"}

    def calls(lease_id: str, key: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (f"/v1/leases/{lease_id}/renew", {"execution_key": key}),
            (f"/v1/leases/{lease_id}/transfer", {**transfer, "execution_key": key}),
            (f"/v1/leases/{lease_id}/release", {"execution_key": key}),
            ("/v1/handoffs", {**handoff, "lease_id": lease_id, "lease_execution_key": key}),
        ]

    for path, body in calls("lease_nope", "run-1"):
        error(client.post(path, json=body, headers=h), 404, "NOT_FOUND")
    for path, body in calls(lid, "other"):
        error(client.post(path, json=body, headers=h), 409, "LEASE_LOST")
    assert data(client.get(f"/v1/leases/{lid}", headers=h))["status"] == "active"
    renewed = data(client.post(f"/v1/leases/{lid}/renew", headers=h))
    assert (renewed["lease_id"], renewed["execution_key"]) == (lid, "run-1")
    made = data(client.post("/v1/handoffs", json={**handoff, "lease_id": lid}, headers=h))
    assert made["lease_id"] == lid
