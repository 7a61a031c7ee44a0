"""Idempotency-Key over REST: replays where the Python API keeps receipts, refusal where
it keeps none, and the natural retry answers of the other routes."""

from __future__ import annotations

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


@pytest.mark.parametrize("route", ["renew", "transfer", "force-release", "release"])
def test_key_refused_where_no_receipt_is_kept(
    client: TestClient, make_key: MakeKey, ledger_url: str, route: str
) -> None:
    """Idempotency-Key on a route without receipts is 400 and writes nothing."""
    h = make_key(role="owner")
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    hk = {**h, "Idempotency-Key": "k"}
    before = row_counts(ledger_url)
    if route == "release":
        r = client.delete(f"/v1/leases/{lid}", headers=hk)
    else:
        body = {"to_principal": "agent-b", "new_execution_key": "e", "ttl_seconds": 60}
        r = client.post(
            f"/v1/leases/{lid}/{route}", json=body if route == "transfer" else None, headers=hk
        )
    error(r, 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before


def test_resolve_refuses_key(client: TestClient, make_key: MakeKey) -> None:
    """Idempotency-Key on resolve is 400; the handoff stays pending."""
    a, b = make_key("agent-a"), make_key("agent-b")
    hand = {"to_principal": "agent-b", "subject_id": "s"}
    hid = data(client.post("/v1/handoffs", json=hand, headers=a))["handoff_id"]
    r = client.post(
        f"/v1/handoffs/{hid}/resolve",
        json={"status": "accepted"},
        headers={**b, "Idempotency-Key": "k"},
    )
    error(r, 400, "VALIDATION_ERROR")
    assert data(client.get(f"/v1/handoffs/{hid}", headers=b))["status"] == "pending"


def test_retried_transfer_is_lease_lost(client: TestClient, make_key: MakeKey) -> None:
    """A retried transfer of a lease already handed over is 409 LEASE_LOST."""
    h = make_key()
    lid = data(client.post("/v1/leases", json=LEASE, headers=h))["lease_id"]
    body = {"to_principal": "agent-b", "new_execution_key": "e", "ttl_seconds": 60}
    assert client.post(f"/v1/leases/{lid}/transfer", json=body, headers=h).status_code == 200
    error(client.post(f"/v1/leases/{lid}/transfer", json=body, headers=h), 409, "LEASE_LOST")
