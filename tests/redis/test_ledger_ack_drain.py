"""``ack="ledger"``: when the ledger cannot take a transition, the call fails with
``UNAVAILABLE`` and, once the ledger is back, the journal is drained in the background,
without waiting for the client's next call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from prefect_baton import Baton, UnavailableError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.queries import LeaseQuery
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.keys import org_keys
from tests.conftest import REDIS_URL, require_redis


@pytest.fixture(params=["fakeredis", "redis"])
def authority(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisAuthority]:
    """A Redis authority with ``ack="ledger"`` on fakeredis and on the real server."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'l.db'}")
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        auth = RedisAuthority(client, store, ack="ledger", owns_client=True, functions=False)
    else:
        require_redis()
        auth = RedisAuthority(connect(REDIS_URL), store, ack="ledger", owns_client=True)
    yield auth
    auth.close()
    store.close()


def test_journal_drained_in_background_after_ledger_outage(
    authority: RedisAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = f"org-{uuid.uuid4().hex[:12]}"
    b = Baton(org=org, principal="a", store=authority.store, lease_authority=authority)
    down = True
    real = authority.reconciler.drain_once

    def drain_once(org_: str) -> tuple[int, str | None]:
        if down:
            raise UnavailableError("ledger database unavailable: (outage)")
        return real(org_)

    b.leases.acquire("svc", "before", ttl_seconds=60)  # the org's Redis state exists
    monkeypatch.setattr(authority.reconciler, "drain_once", drain_once)
    with pytest.raises(UnavailableError):
        b.leases.acquire("svc", "x", ttl_seconds=60)  # granted in Redis, not in the ledger
    journal = org_keys(org).base.journal
    assert authority.client.xlen(journal) == 1
    down = False  # the ledger is back; the client makes no further call
    deadline = time.monotonic() + 20
    while authority.client.xlen(journal) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert authority.client.xlen(journal) == 0
    rows = authority.store.ledger_list_leases(b.caller, LeaseQuery(limit=10))  # the copy
    assert sorted(lease.resource_id for lease in rows) == ["before", "x"]


@pytest.mark.parametrize("arm", ["fakeredis", "redis"])
def test_drain_paused_holds_the_drain_thread(arm: str, tmp_path: Path) -> None:
    """``drain_paused()`` waits for a drain in progress and starts none until it ends (so a
    process stopped inside it holds no ledger transaction); afterwards the journal drains."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'l.db'}")
    if arm == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        auth = RedisAuthority(
            client,
            store,
            ack="redis",
            owns_client=True,
            functions=False,
            reconcile_interval_seconds=0.01,
        )
    else:
        require_redis()
        auth = RedisAuthority(
            connect(REDIS_URL),
            store,
            ack="redis",
            owns_client=True,
            reconcile_interval_seconds=0.01,
        )
    try:
        org = f"org-{uuid.uuid4().hex[:12]}"
        b = Baton(org=org, principal="a", store=store, lease_authority=auth)
        journal = org_keys(org).base.journal
        b.leases.acquire("svc", "first", ttl_seconds=60)
        deadline = time.monotonic() + 20
        while auth.client.xlen(journal) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert auth.client.xlen(journal) == 0
        with auth.drain_paused():
            b.leases.acquire("svc", "second", ttl_seconds=60)
            time.sleep(0.5)
            assert auth.client.xlen(journal) == 1
        deadline = time.monotonic() + 20
        while auth.client.xlen(journal) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert auth.client.xlen(journal) == 0
    finally:
        auth.close()
        store.close()
