"""Malformed parts of a lease proof or fence are bad input (``400 VALIDATION_ERROR``, nothing
written), as every other id and number of a body is, and as the MCP tools have it: not a
``409`` that reads as if the lease had moved on. An ``Idempotency-Key`` header that is not
UTF-8 is refused rather than read as Latin-1 (which would make two different keys one)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from prefect_baton.rest import create_app

from .conftest import MakeKey, data, error, row_counts

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


def _lease(client: TestClient, auth: dict[str, str]) -> dict[str, Any]:
    resp = client.post("/v1/leases", json=LEASE, headers=auth)
    assert resp.status_code == 201, resp.text
    return dict(data(resp))


@pytest.mark.parametrize(
    "execution_key",
    ["", "k\x00", "k\x1b", "k" * 257, "\u0085", "k\u2028", "k\u200b", " "],
    ids=["empty", "nul", "control", "too-long", "c1-alone", "line-separator", "format", "blank"],
)
@pytest.mark.parametrize("route", ["renew", "release", "transfer"])
def test_a_malformed_proof_execution_key_is_400(
    client: TestClient, make_key: MakeKey, ledger_url: str, route: str, execution_key: str
) -> None:
    """``execution_key`` on renew, release and transfer follows the rules of an execution
    key (1..256 characters, no control, line-separator or format characters, not blank):
    400, not a LEASE_LOST decided on it, and nothing is written."""
    auth = make_key()
    lease = _lease(client, auth)
    body: dict[str, Any] = {"execution_key": execution_key}
    if route == "transfer":
        body |= {"to_principal": "agent-b", "new_execution_key": "exec-b", "ttl_seconds": 60}
    before = row_counts(ledger_url)
    resp = client.post(f"/v1/leases/{lease['lease_id']}/{route}", json=body, headers=auth)
    error(resp, 400, "VALIDATION_ERROR")
    assert "execution_key" in resp.json()["error"]["message"]
    assert row_counts(ledger_url) == before


def test_a_malformed_handoff_lease_execution_key_is_400(
    client: TestClient, make_key: MakeKey, ledger_url: str
) -> None:
    """``lease_execution_key`` next to a handoff's ``lease_id`` is checked the same way."""
    auth = make_key()
    lease = _lease(client, auth)
    body = {
        "to_principal": "agent-b",
        "subject_id": "checkout",
        "lease_id": lease["lease_id"],
        "lease_execution_key": "k\x00",
    }
    before = row_counts(ledger_url)
    resp = client.post("/v1/handoffs", json=body, headers=auth)
    error(resp, 400, "VALIDATION_ERROR")
    assert row_counts(ledger_url) == before


@pytest.mark.parametrize(
    "epoch", [-1, 2**53, 10**30, True], ids=["negative", "2**53", "huge", "bool"]
)
@pytest.mark.parametrize("route", ["checkpoint", "outcome"])
def test_a_fence_epoch_out_of_range_is_400(
    client: TestClient, make_key: MakeKey, ledger_url: str, route: str, epoch: Any
) -> None:
    """``fence_epoch`` is an epoch (0..2**53 - 1), as the MCP tools' ``epoch`` is: 400, not
    ``409 STALE_FENCE``, and nothing is written."""
    auth = make_key()
    lease = _lease(client, auth)
    fence = {"fence_lease_id": lease["lease_id"], "fence_epoch": epoch}
    before = row_counts(ledger_url)
    if route == "checkpoint":
        body = {"subject_id": "checkout", "kind": "k", "state": {"a": 1}, **fence}
        resp = client.put("/v1/checkpoints", json=body, headers=auth)
    else:
        body = {"subject_id": "checkout", "status": "failed", "evidence": [], **fence}
        resp = client.post("/v1/outcomes", json=body, headers=auth)
    err = error(resp, 400, "VALIDATION_ERROR")
    assert "fence_epoch" in err["message"]
    assert row_counts(ledger_url) == before


def test_a_fence_epoch_in_range_is_still_judged_by_the_ledger(
    client: TestClient, make_key: MakeKey
) -> None:
    """A well-formed but wrong epoch stays ``409 STALE_FENCE``; the right one is written."""
    auth = make_key()
    lease = _lease(client, auth)
    body = {"subject_id": "checkout", "kind": "k", "state": {"a": 1}}
    fence = {"fence_lease_id": lease["lease_id"]}
    wrong = client.put("/v1/checkpoints", json={**body, **fence, "fence_epoch": 7}, headers=auth)
    error(wrong, 409, "STALE_FENCE")
    right = client.put(
        "/v1/checkpoints", json={**body, **fence, "fence_epoch": lease["epoch"]}, headers=auth
    )
    assert right.status_code == 200, right.text


def test_an_idempotency_key_that_is_not_utf8_is_400(ledger_url: str, make_key: MakeKey) -> None:
    """Header bytes that are not UTF-8 are refused; a UTF-8 key outside ASCII works. (The
    ASGI transport sends header bytes as given; TestClient would re-encode them.)"""
    auth = make_key()
    app = create_app(ledger_url)

    async def send(key: bytes) -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://baton") as http:
            headers = [
                (b"Authorization", auth["Authorization"].encode()),
                (b"Idempotency-Key", key),
            ]
            return await http.post("/v1/leases", json=LEASE, headers=headers)

    try:
        before = row_counts(ledger_url)
        bad = anyio.run(send, b"k\xff")
        err = error(bad, 400, "VALIDATION_ERROR")
        assert "UTF-8" in err["message"]
        assert row_counts(ledger_url) == before
        good = anyio.run(send, "ключ".encode())
        assert good.status_code == 201, good.text
        assert data(good)["execution_key"] == "ключ"
    finally:
        app.state.store.close()
