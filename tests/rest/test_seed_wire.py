"""What the seed service's clients send and expect (its documents, files ``000_*`` and
``003_*`` of the seeds): ``POST`` and ``DELETE`` of checkpoints, ``meta.request_id`` in
error bodies, the seed's refusal of a non-target resolve, ``forced: true``, ``limit`` /
``cursor`` paging of the lease, handoff and event lists, and millisecond ``Z``
timestamps."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from prefect_baton.rest import MAX_BODY_BYTES

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}
#: The seed's time form: ``2026-07-30T10:58:13.829Z``.
WIRE_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _times(value: Any, key: str = "") -> list[tuple[str, str]]:
    """Every ``(field, value)`` of a time field (``*_at``) in a JSON value."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _times(v, k)]
    if isinstance(value, list):
        return [t for v in value for t in _times(v, key)]
    return [(key, value)] if key.endswith("_at") and value is not None else []


def test_post_saves_a_checkpoint_as_put_does(client: TestClient, make_key: MakeKey) -> None:
    """``POST /v1/checkpoints`` (the seed's method) saves as ``PUT`` does: version +1,
    and the same idempotency key replays."""
    h = make_key("agent-a")
    body = {"subject_id": "user_rama", "kind": "task_state", "state": {"step": 1}}
    first = data(client.post("/v1/checkpoints", json=body, headers=h))
    assert first["version"] == 1
    second = data(client.put("/v1/checkpoints", json={**body, "state": {"step": 2}}, headers=h))
    assert (second["checkpoint_id"], second["version"]) == (first["checkpoint_id"], 2)
    keyed = {**h, "Idempotency-Key": "save-3"}
    third = client.post("/v1/checkpoints", json={**body, "state": {"step": 3}}, headers=keyed)
    again = client.post("/v1/checkpoints", json={**body, "state": {"step": 3}}, headers=keyed)
    assert data(third)["version"] == 3
    assert again.json()["meta"]["replayed"] is True
    assert data(again)["version"] == 3


def test_delete_own_checkpoint(client: TestClient, make_key: MakeKey, ledger_url: str) -> None:
    """``DELETE /v1/checkpoints/{id}``: 403 for another principal, 409 CONFLICT while a
    pending handoff carries it, then 200 with the checkpoint; a second delete is 404 and
    reading it is 404."""
    a, b = make_key("agent-a"), make_key("agent-b")
    body = {"subject_id": "s", "kind": "k", "state": {"n": 1}}
    ck = data(client.post("/v1/checkpoints", json=body, headers=a))
    path = f"/v1/checkpoints/{ck['checkpoint_id']}"
    error(client.delete(path, headers=b), 403, "FORBIDDEN")
    offer = {"to_principal": "agent-b", "subject_id": "s", "checkpoint_id": ck["checkpoint_id"]}
    hid = data(client.post("/v1/handoffs", json=offer, headers=a))["handoff_id"]
    before = row_counts(ledger_url)
    err = error(client.delete(path, headers=a), 409, "CONFLICT")
    assert hid in err["message"]
    assert row_counts(ledger_url) == before
    client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "rejected"}, headers=b)
    gone = data(client.delete(path, headers=a))
    assert gone["checkpoint_id"] == ck["checkpoint_id"]
    error(client.delete(path, headers=a), 404, "NOT_FOUND")
    error(client.get(path, headers=a), 404, "NOT_FOUND")
    params = {"subject_id": "s", "kind": "k"}
    history = data(client.get("/v1/checkpoints/history", params=params, headers=a))
    assert [c["version"] for c in history["checkpoints"]] == [1]


def test_error_bodies_carry_the_request_id(client: TestClient, make_key: MakeKey) -> None:
    """Every error body, from the key check (401, 403), the body limit (413), validation
    (400), a route (404, 409) or an unknown path, has ``meta.request_id`` equal to the
    ``X-Request-ID`` header (``error`` checks it)."""
    h = make_key("agent-a")
    error(client.get("/v1/leases"), 401, "UNAUTHENTICATED")
    error(client.get("/v1/events", headers=make_key("x", scopes=["leases:read"])), 403, "FORBIDDEN")
    error(
        client.post("/v1/leases", json={**LEASE, "ttl_seconds": 5}, headers=h),
        400,
        "VALIDATION_ERROR",
    )
    error(client.get("/v1/leases/lease_nope", headers=h), 404, "NOT_FOUND")
    error(client.get("/v1/nowhere", headers=h), 404, "NOT_FOUND")
    big = b"{" + b" " * MAX_BODY_BYTES + b"}"
    error(client.post("/v1/leases", content=big, headers=h), 413, "PAYLOAD_TOO_LARGE")
    client.post("/v1/leases", json=LEASE, headers=h)
    r = client.post("/v1/leases", json=LEASE, headers=make_key("agent-b"))
    conflict = error(r, 409, "CONFLICT")
    ids = {
        r.json()["meta"]["request_id"],
        client.get("/v1/leases", headers=h).headers["x-request-id"],
    }
    assert len(ids) == 2
    assert WIRE_TIME.fullmatch(conflict["expires_at"])


def test_non_target_resolve_is_the_seeds_validation_error(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """The sender, a third agent and an owner resolving get the seed's 400
    ``VALIDATION_ERROR`` "Only the target principal can resolve a handoff." and change
    nothing."""
    a = make_key("agent-a")
    hid = data(
        client.post("/v1/handoffs", json={"to_principal": "agent-b", "subject_id": "s"}, headers=a)
    )["handoff_id"]
    before = row_counts(ledger_url)
    for who in (a, make_key("agent-c"), make_key("boss", role="owner")):
        r = client.post(f"/v1/handoffs/{hid}/resolve", json={"status": "accepted"}, headers=who)
        err = error(r, 400, "VALIDATION_ERROR")
        assert err["message"] == "Only the target principal can resolve a handoff."
    assert row_counts(ledger_url) == before


def test_force_release_says_forced(client: TestClient, make_key: MakeKey) -> None:
    """An owner's force release answers ``forced: true``; a holder's release does not."""
    a, boss = make_key("agent-a"), make_key("boss", role="owner")
    lease = data(client.post("/v1/leases", json=LEASE, headers=a))
    forced = data(client.post(f"/v1/leases/{lease['lease_id']}/force-release", headers=boss))
    assert forced["forced"] is True
    assert forced["lease"]["status"] == "revoked"
    again = data(client.post("/v1/leases", json=LEASE, headers=a))
    own = data(client.post(f"/v1/leases/{again['lease_id']}/release", headers=a))
    assert own["forced"] is False


def _all(client: TestClient, path: str, h: dict[str, str], key: str, **params: Any) -> list[Any]:
    items: list[Any] = []
    cursor = None
    for _ in range(20):
        q = dict(params, **({"cursor": cursor} if cursor else {}))
        page = data(client.get(path, params=q, headers=h))
        assert set(page) == {key, "next_cursor"}
        items += page[key]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("paging did not end")


def test_lists_page_by_limit_and_cursor(client: TestClient, make_key: MakeKey) -> None:
    """Lease, handoff and event lists page by ``limit`` and ``next_cursor``: every item
    once, in order; a bad or foreign cursor is 400 VALIDATION_ERROR."""
    a, b = make_key("agent-a"), make_key("agent-b")
    batch = {"resources": [{"resource_type": "deploy", "resource_id": x} for x in "abcde"]}
    made = data(client.post("/v1/leases/batch", json={**batch, "ttl_seconds": 60}, headers=a))
    leases = _all(client, "/v1/leases", a, "leases", limit=2)
    assert sorted(x["lease_id"] for x in leases) == sorted(x["lease_id"] for x in made["leases"])
    for i in range(3):
        offer = {"to_principal": "agent-b", "subject_id": f"s{i}"}
        client.post("/v1/handoffs", json=offer, headers=a)
    inbox = _all(client, "/v1/handoffs", b, "handoffs", limit=2)
    assert [h["subject_id"] for h in inbox] == ["s0", "s1", "s2"]
    events = _all(client, "/v1/events", a, "events", limit=3)
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    assert len(events) == 5 + 3
    lease_cursor = data(client.get("/v1/leases", params={"limit": 1}, headers=a))["next_cursor"]
    event_cursor = data(client.get("/v1/events", params={"limit": 1}, headers=a))["next_cursor"]
    bad = {
        "/v1/leases": event_cursor,  # another list's
        "/v1/handoffs": lease_cursor,
        "/v1/events": lease_cursor,
    }
    for path, foreign in bad.items():
        for cursor in ("bogus", "c1.%%%", "c1.WyJ4Il0", foreign):
            error(client.get(path, params={"cursor": cursor}, headers=a), 400, "VALIDATION_ERROR")
    both = client.get("/v1/events", params={"after": 2, "cursor": event_cursor}, headers=a)
    error(both, 400, "VALIDATION_ERROR")


@pytest.mark.parametrize("route", ["lease", "handoff", "checkpoint", "outcome", "event"])
def test_timestamps_are_milliseconds_z(client: TestClient, make_key: MakeKey, route: str) -> None:
    """Every time field of every record is written ``YYYY-MM-DDTHH:MM:SS.sssZ``."""
    a = make_key("agent-a")
    if route == "lease":
        lease = data(client.post("/v1/leases", json=LEASE, headers=a))
        released = data(client.delete(f"/v1/leases/{lease['lease_id']}", headers=a))
        body: Any = [lease, released]
    elif route == "handoff":
        offer = {"to_principal": "agent-b", "subject_id": "s", "expires_in_seconds": 60}
        body = data(client.post("/v1/handoffs", json=offer, headers=a))
    elif route == "checkpoint":
        ck = {"subject_id": "s", "kind": "k", "state": {}, "ttl_seconds": 60}
        body = data(client.put("/v1/checkpoints", json=ck, headers=a))
    elif route == "outcome":
        out = {"subject_id": "s", "status": "failed"}
        body = data(client.post("/v1/outcomes", json=out, headers=a))
    else:
        client.post("/v1/leases", json=LEASE, headers=a)
        body = data(client.get("/v1/events", headers=a))
    times = _times(body)
    assert times
    for field, value in times:
        assert WIRE_TIME.fullmatch(value), (field, value)
