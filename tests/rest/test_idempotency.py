"""Idempotency-Key over REST: replays on every mutating route, refusal on report-expired
(which keeps no receipt), and the natural retry answers without a key."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def test_handoff_and_outcome_replay(client: TestClient, make_key: MakeKey) -> None:
    """Handoff create and outcome record replay under the same key (meta.replayed)."""
    h = {**make_key(), "Idempotency-Key": "job-7"}
    hand = {"to_principal": "agent-b", "subject_id": "s"}
    first = client.post("/v1/handoffs", json=hand, headers=h)
    again = client.post("/v1/handoffs", json=hand, headers=h)
    assert data(again)["handoff_id"] == data(first)["handoff_id"]
    assert again.json()["meta"]["replayed"] is True
    h2 = {**h, "Idempotency-Key": "job-8"}
    out = {"subject_id": "s", "status": "failed", "evidence": []}
    o1 = client.post("/v1/outcomes", json=out, headers=h2)
    o2 = client.post("/v1/outcomes", json=out, headers=h2)
    assert data(o2)["outcome_id"] == data(o1)["outcome_id"]
    assert o2.json()["meta"]["replayed"] is True
    assert "replayed" not in data(o2)


ROUTES = ["delete", "release", "renew", "transfer", "force-release"]


def _lease_call(client: TestClient, route: str, lid: str, headers: dict[str, str]) -> Any:
    """Call the lease route ``route`` on lease ``lid``."""
    if route == "delete":
        return client.delete(f"/v1/leases/{lid}", headers=headers)
    body = {"to_principal": "agent-b", "new_execution_key": "e", "ttl_seconds": 60}
    return client.post(
        f"/v1/leases/{lid}/{route}", json=body if route == "transfer" else None, headers=headers
    )


@pytest.mark.parametrize("route", ROUTES)
def test_lease_routes_replay_under_key(
    client: TestClient, make_key: MakeKey, ledger_url: str, route: str
) -> None:
    """Idempotency-Key on DELETE /v1/leases/{id}, release, renew, transfer and force-release:
    the retry replays the same answer with meta.replayed true and writes nothing more."""
    h = make_key(role="owner")
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    hk = {**h, "Idempotency-Key": "k"}
    first = _lease_call(client, route, lid, hk)
    assert first.status_code == 200, first.json()
    assert first.json()["meta"]["replayed"] is False
    before = row_counts(ledger_url)
    again = _lease_call(client, route, lid, hk)
    assert again.status_code == 200, again.json()
    assert again.json()["meta"]["replayed"] is True
    assert data(again) == data(first)
    assert "replayed" not in data(again)
    assert row_counts(ledger_url) == before


@pytest.mark.parametrize("route", ROUTES)
def test_lease_routes_key_reuse_is_mismatch(
    client: TestClient, make_key: MakeKey, ledger_url: str, route: str
) -> None:
    """The key used for another request on these routes is 409 IDEMPOTENCY_MISMATCH and
    writes nothing."""
    h = make_key(role="owner")
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    other = {**LEASE, "resource_id": "other"}
    lid2 = data(client.post("/v1/leases", json=other, headers=h))["lease_id"]
    hk = {**h, "Idempotency-Key": "k"}
    assert _lease_call(client, route, lid, hk).status_code == 200
    before = row_counts(ledger_url)
    if route in ("delete", "force-release"):
        r = _lease_call(client, route, lid2, hk)  # the lease id is the request
    elif route == "transfer":
        body = {"to_principal": "agent-c", "new_execution_key": "e", "ttl_seconds": 60}
        r = client.post(f"/v1/leases/{lid}/transfer", json=body, headers=hk)
    elif route == "renew":
        r = client.post(f"/v1/leases/{lid}/renew", json={"ttl_seconds": 90}, headers=hk)
    else:
        r = client.post(f"/v1/leases/{lid}/release", json={"expected_version": 2}, headers=hk)
    error(r, 409, "IDEMPOTENCY_MISMATCH")
    assert row_counts(ledger_url) == before


def test_resolve_replays_under_key(client: TestClient, make_key: MakeKey) -> None:
    """Idempotency-Key on resolve: the retry replays (meta.replayed), another status under
    the key is 409 IDEMPOTENCY_MISMATCH, a retry without the key is 404."""
    a, b = make_key("agent-a"), make_key("agent-b")
    hand = {"to_principal": "agent-b", "subject_id": "s"}
    hid = data(client.post("/v1/handoffs", json=hand, headers=a))["handoff_id"]
    bk = {**b, "Idempotency-Key": "k"}
    url = f"/v1/handoffs/{hid}/resolve"
    first = client.post(url, json={"status": "accepted"}, headers=bk)
    assert first.status_code == 200
    again = client.post(url, json={"status": "accepted"}, headers=bk)
    assert again.json()["meta"]["replayed"] is True
    assert data(again) == data(first)
    error(client.post(url, json={"status": "rejected"}, headers=bk), 409, "IDEMPOTENCY_MISMATCH")
    error(client.post(url, json={"status": "accepted"}, headers=b), 404, "NOT_FOUND")
    assert data(client.get(f"/v1/handoffs/{hid}", headers=b))["status"] == "accepted"


def test_report_expired_refuses_key(client: TestClient, make_key: MakeKey) -> None:
    """report-expired keeps no receipt: Idempotency-Key there is 400 (not ignored)."""
    h = {**make_key(), "Idempotency-Key": "k"}
    error(client.post("/v1/leases/report-expired", headers=h), 400, "VALIDATION_ERROR")


def test_retried_transfer_is_lease_lost(client: TestClient, make_key: MakeKey) -> None:
    """A retried transfer of a lease already handed over is 409 LEASE_LOST."""
    h = make_key()
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    body = {"to_principal": "agent-b", "new_execution_key": "e", "ttl_seconds": 60}
    assert client.post(f"/v1/leases/{lid}/transfer", json=body, headers=h).status_code == 200
    error(client.post(f"/v1/leases/{lid}/transfer", json=body, headers=h), 409, "LEASE_LOST")
