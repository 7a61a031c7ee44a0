"""Redis losing its data while a transition is between Redis and the ledger (found by a
fault trial on PostgreSQL):

- A rebuild never overtakes a drain that is still committing grants it read from the
  journal before the loss. Before the fix the rebuild read the ledger while the grant was on
  its way, granted the resource again with a higher epoch, and the late commit brought the
  lower fencing token back as the current one. Here the drain is held after it read the
  journal and before it commits (an in-process hook on the reconciler's batch write, on both
  ledgers); Redis is killed and started empty; another client's acquire rebuilds. It must
  wait for the drain's commit and then find the resource held: ``CONFLICT``, the first
  holder's lease and fence still good, the history clean.
- A handoff accept whose transfer is lost with Redis before its drain is answered
  ``UNAVAILABLE``, not with a pending handoff and a lease that no longer exists (which an
  idempotency receipt would then have replayed for good); a retry accepts it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from prefect_baton import Baton, ConflictError, StaleFenceError, UnavailableError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton.audit import audit_ledger
from tests.conftest import PG_URL, store_for

from .conftest import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest) -> LedgerStore:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return store_for(str(url))


@pytest.fixture
def authorities(redis_server: RedisServer, ledger: LedgerStore) -> Iterator[list[RedisAuthority]]:
    """Two clients (two authorities, as two processes would have) of the test's Redis and
    the ledger; ``ack="redis"`` and no drain thread (the test drains, or a call that
    needs the ledger in step does)."""
    made = [
        RedisAuthority(
            connect(redis_server.url, socket_timeout=2.0),
            ledger,
            owns_client=True,
            ack="redis",
            reconcile_in_client=False,
        )
        for _ in range(2)
    ]
    yield made
    for auth in made:
        auth.close()


def _advisory_waiters(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_rebuild_waits_for_a_drain_in_flight(
    redis_server: RedisServer, ledger: LedgerStore, authorities: list[RedisAuthority]
) -> None:
    org = f"org-{uuid.uuid4().hex[:12]}"
    auth_a, auth_b = authorities
    a = Baton(org=org, principal="a", store=ledger, lease_authority=auth_a)
    b = Baton(org=org, principal="b", store=ledger, lease_authority=auth_b)
    a.leases.release(a.leases.acquire("res", "warm", ttl_seconds=60))
    auth_a.reconciler.drain(org)

    held = a.leases.acquire("res", "x", ttl_seconds=600)  # in Redis and its journal only

    read, go = threading.Event(), threading.Event()
    rec = auth_a.reconciler
    flush = rec._flush

    def held_flush(*args: Any, **kwargs: Any) -> Any:
        read.set()  # the grant was read from the journal; its batch is not committed
        assert go.wait(60)
        return flush(*args, **kwargs)

    rec._flush = held_flush  # type: ignore[method-assign]
    drained: list[BaseException | int] = []

    def drain() -> None:
        try:
            drained.append(rec.drain(org))
        except BaseException as exc:  # reported below
            drained.append(exc)

    drainer = threading.Thread(target=drain)
    drainer.start()
    try:
        assert read.wait(30), "the drain did not read the journal"
        redis_server.kill()  # Redis loses everything, the journal entry included
        redis_server.start()

        outcome: list[Any] = []

        def acquire_b() -> None:
            try:
                outcome.append(b.leases.acquire("res", "x", ttl_seconds=60))
            except BaseException as exc:
                outcome.append(exc)

        taker = threading.Thread(target=acquire_b)
        taker.start()
        if not ledger.engines.is_sqlite:  # PostgreSQL: see the rebuild queue behind the drain
            deadline = time.monotonic() + 30
            while not outcome and not _advisory_waiters(PG_URL):
                assert time.monotonic() < deadline, "neither waiting nor done"
                time.sleep(0.02)
        else:  # SQLite: the drain's BEGIN IMMEDIATE holds the database; give B time to try
            taker.join(1.0)
    finally:
        go.set()
        drainer.join(60)
    taker.join(60)
    rec._flush = flush  # type: ignore[method-assign]

    assert drained == [1], drained
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], ConflictError), outcome
    # the first holder still holds, at its epoch, and its fence still writes
    info = b.leases.inspect("res", "x")
    assert info.held
    assert info.epoch == held.epoch
    a.checkpoints.save("subject-x", "k", {"who": "a"}, fence=held)
    a.leases.renew(held, ttl_seconds=60)
    # after the holder lets go, the next grant's epoch is above every earlier one
    a.leases.release(held)
    after = b.leases.acquire("res", "x", ttl_seconds=60)
    assert after.epoch > held.epoch
    with pytest.raises(StaleFenceError):
        a.checkpoints.save("subject-x", "k", {"who": "a, late"}, fence=held)
    auth_b.reconciler.drain(org)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations


def test_an_accept_whose_transfer_is_lost_is_unavailable_then_retried(
    redis_server: RedisServer, ledger: LedgerStore, authorities: list[RedisAuthority]
) -> None:
    org = f"org-{uuid.uuid4().hex[:12]}"
    auth_s, auth_r = authorities
    sender = Baton(org=org, principal="sender", store=ledger, lease_authority=auth_s)
    recipient = Baton(org=org, principal="recipient", store=ledger, lease_authority=auth_r)
    carried = sender.leases.acquire("res", "z", ttl_seconds=600)
    handoff = sender.handoffs.create("recipient", "subject-z", lease=carried)
    auth_s.reconciler.drain(org)

    rec = auth_r.reconciler
    drain = rec.drain
    lost: list[str] = []

    def losing_drain(org_: str, **kwargs: Any) -> int:
        if kwargs.get("until") is not None and not lost:  # the accept's own drain
            lost.append(str(kwargs["until"]))
            redis_server.kill()  # the transfer and its journal entry are gone
            redis_server.start()
        return drain(org_, **kwargs)

    rec.drain = losing_drain  # type: ignore[method-assign]
    try:
        with pytest.raises(UnavailableError, match="lost with Redis"):
            recipient.handoffs.resolve(handoff.handoff_id, "accepted", idempotency_key="acc")
    finally:
        rec.drain = drain  # type: ignore[method-assign]
    assert lost
    assert recipient.handoffs.get(handoff.handoff_id).status == "pending"
    # the sender holds again (rebuilt from the ledger), at its epoch
    assert sender.leases.inspect("res", "z").epoch == carried.epoch
    # the same key was not answered for good: the retry accepts
    accepted = recipient.handoffs.resolve(handoff.handoff_id, "accepted", idempotency_key="acc")
    assert accepted.status == "accepted"
    assert not accepted.replayed
    assert accepted.lease is not None
    assert accepted.lease.owner == "recipient"
    assert accepted.lease.epoch > carried.epoch
    recipient.checkpoints.save("subject-z", "k", {"who": "recipient"}, fence=accepted.lease)
    with pytest.raises(StaleFenceError):
        sender.checkpoints.save("subject-z", "k", {"who": "sender"}, fence=carried)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations


@pytest.mark.parametrize("evicted", ["heads", "lid", "own", "sl"])
def test_a_key_evicted_during_a_rebuild_makes_it_start_again(
    redis_server: RedisServer,
    ledger: LedgerStore,
    authorities: list[RedisAuthority],
    evicted: str,
) -> None:
    """A key of the org evicted between the rebuild's load of the ledger's leases and its
    marker (a Redis with an allkeys-* policy) must not leave held resources looking free:
    the marker is refused (``UNAVAILABLE``, nothing granted), and the next call rebuilds
    again and finds the resource held."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    auth_a, auth_b = authorities
    a = Baton(org=org, principal="a", store=ledger, lease_authority=auth_a)
    b = Baton(org=org, principal="b", store=ledger, lease_authority=auth_b)
    held = a.leases.acquire("res", "x", ttl_seconds=600, scopes=["db/*"])
    auth_a.reconciler.drain(org)
    redis_server.kill()
    redis_server.start()

    keys = org_keys(org)
    install = auth_b.scripts["install"]

    def evicting_install(*, keys: list[str], args: list[Any]) -> Any:
        auth_b.client.delete(f"{org_keys(org).prefix}{evicted}")
        return install(keys=keys, args=args)

    scripts = auth_b.scripts._by_name
    scripts["install"] = evicting_install  # type: ignore[assignment]
    try:
        with pytest.raises(UnavailableError, match="rebuild"):
            b.leases.acquire("res", "x", ttl_seconds=60)
    finally:
        scripts["install"] = install
    assert not auth_b.client.exists(keys.base.inc)
    with pytest.raises(ConflictError):
        b.leases.acquire("res", "x", ttl_seconds=60)
    info = b.leases.inspect("res", "x")
    assert info.held
    assert info.epoch == held.epoch
    a.checkpoints.save("db/one", "k", {"who": "a"}, fence=held)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations
