"""The REST API with Redis as the lease authority (the server on 127.0.0.1:6379)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from prefect_baton.rest import create_app
from tests.conftest import REDIS_URL, require_redis

from .conftest import MakeKey, data, error

LEASE = {"resource_type": "deploy", "resource_id": "checkout", "ttl_seconds": 60}


@pytest.fixture
def redis_client(ledger_url: str) -> Iterator[TestClient]:
    """The app with ``redis_url`` set, in a TestClient."""
    require_redis()
    with TestClient(create_app(ledger_url, REDIS_URL), raise_server_exceptions=False) as c:
        yield c


def test_leases_on_redis(redis_client: TestClient, make_key: MakeKey) -> None:
    """Acquire, conflict, a loser's 404 release, a fenced save and the holder's release."""
    a, b = make_key("agent-a"), make_key("agent-b")
    r = redis_client.post("/v1/leases", json=LEASE, headers=a)
    assert r.status_code == 201
    lid = data(r)["lease_id"]
    err = error(redis_client.post("/v1/leases", json=LEASE, headers=b), 409, "CONFLICT")
    assert "expires_at" in err
    error(redis_client.delete(f"/v1/leases/{lid}", headers=b), 404, "NOT_FOUND")
    body = {"subject_id": "s", "kind": "k", "state": {"n": 1}, "fence_lease_id": lid}
    assert redis_client.put("/v1/checkpoints", json=body, headers=a).status_code == 200
    renewed = redis_client.post(f"/v1/leases/{lid}/renew", json={"ttl_seconds": 90}, headers=a)
    assert data(renewed)["ttl_seconds"] == 90
    assert redis_client.delete(f"/v1/leases/{lid}", headers=a).status_code == 200
    error(redis_client.put("/v1/checkpoints", json=body, headers=a), 409, "STALE_FENCE")


def test_reconciler_lag_on_redis(redis_client: TestClient, make_key: MakeKey) -> None:
    """With Redis as the authority the lag names it, with the org's journal entries not
    yet in the ledger and the age of the oldest."""
    got = data(redis_client.get("/v1/reconciler/lag", headers=make_key("agent-a")))
    assert got["authority"] == "redis"
    assert isinstance(got["entries"], int)
    assert isinstance(got["seconds"], float)


def test_reconciler_lag_without_redis_in_a_redis_decided_org(
    redis_client: TestClient, ledger_url: str, make_key: MakeKey
) -> None:
    """A server without a Redis URL on the same ledger cannot see the journal of an org
    whose leases Redis decides: its lag read is 403 FORBIDDEN naming the remedy, as its
    lease writes are, not a
    false ``ledger`` with 0 entries; an org Redis never used still reads ``ledger``."""
    key = make_key("agent-a")
    assert redis_client.post("/v1/leases", json=LEASE, headers=key).status_code == 201
    with TestClient(create_app(ledger_url, None), raise_server_exceptions=False) as plain:
        err = error(plain.get("/v1/reconciler/lag", headers=key), 403, "FORBIDDEN")
        assert "decided by Redis" in err["message"]
        assert "BATON_REDIS_URL" in err["message"]
        refused = plain.post("/v1/leases", json={**LEASE, "resource_id": "x"}, headers=key)
        assert error(refused, 403, "FORBIDDEN")["message"] == err["message"]
        other = make_key("agent-b", org_="never-redis")
        got = data(plain.get("/v1/reconciler/lag", headers=other))
        assert got == {"authority": "ledger", "entries": 0, "seconds": 0.0}
