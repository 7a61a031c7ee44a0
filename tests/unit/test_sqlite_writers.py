"""Writers of one process on a SQLite ledger take turns on the write engine's single
connection (in arrival order, woken when it is returned) instead of polling in SQLite's busy
handler; a turn that never comes is UNAVAILABLE, with nothing written."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from sqlalchemy import event

import redis
from prefect_baton import Baton, UnavailableError
from prefect_baton._stores.ledger import base, engine
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority
from tests.conftest import REDIS_URL, require_redis


def test_threads_writing_at_once_share_one_write_connection(tmp_path: Path) -> None:
    """Eight threads acquiring and releasing at once (each on a resource of its own) all
    succeed, each resource's fencing tokens rise by one per lease, and the write engine
    never lends more than one connection at a time."""
    b = Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", org="o", principal="a")
    store = b.store
    assert isinstance(store, LedgerStore)
    pool = store.engines.write.pool
    out = 0
    most = 0
    count = threading.Lock()

    def on_checkout(*_args: object) -> None:
        nonlocal out, most
        with count:
            out += 1
            most = max(most, out)

    def on_checkin(*_args: object) -> None:
        nonlocal out
        with count:
            out -= 1

    event.listen(pool, "checkout", on_checkout)
    event.listen(pool, "checkin", on_checkin)
    epochs: dict[int, list[int]] = {i: [] for i in range(8)}
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(15):
                lease = b.leases.acquire("r", f"x{i}", ttl_seconds=30)
                epochs[i].append(lease.epoch)
                b.leases.release(lease)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    b.close()
    assert not failures
    assert all(e == list(range(1, 16)) for e in epochs.values()), epochs
    assert most == 1


def test_a_turn_that_never_comes_is_unavailable_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While something in this process holds the write connection past the wait limit (here
    shortened to 0.3 s), an acquire raises UNAVAILABLE; no lease was written, and the next
    acquire once the connection is free succeeds."""
    b = Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", org="o", principal="a")
    b.leases.acquire("r", "warm", ttl_seconds=30)  # registers the caller first
    store = b.store
    assert isinstance(store, LedgerStore)
    pool = store.engines.write.pool
    monkeypatch.setattr(pool, "_timeout", 0.3)
    held = store.engines.write.connect()
    try:
        with pytest.raises(UnavailableError):
            b.leases.acquire("r", "x", ttl_seconds=30)
    finally:
        held.close()
    assert not b.leases.inspect("r", "x").held
    lease = b.leases.acquire("r", "x", ttl_seconds=30)
    assert lease.epoch == 1
    b.close()


def test_a_lock_held_past_the_busy_timeout_is_waited_for_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process's connection holds the database's write lock past the busy
    timeout (here shortened to 0.3 s), a write is UNAVAILABLE after one wait of the busy
    timeout, as the writes queued behind it for the connection are, instead of beginning
    again eight times; nothing is written."""
    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 300)
    monkeypatch.setattr(base, "SQLITE_BUSY_TIMEOUT_MS", 300)
    db = tmp_path / "l.db"
    b = Baton(ledger_url=f"sqlite:///{db}", org="o", principal="a")
    b.leases.acquire("r", "warm", ttl_seconds=30)  # registers the caller first
    store = b.store
    assert isinstance(store, LedgerStore)
    begins: list[str] = []

    def on_execute(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.startswith("BEGIN"):
            begins.append(statement)

    event.listen(store.engines.write, "before_cursor_execute", on_execute)
    hog = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    hog.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(UnavailableError, match="stayed locked"):
            b.leases.acquire("r", "x", ttl_seconds=30)
    finally:
        hog.execute("ROLLBACK")
        hog.close()
    assert len(begins) == 1
    assert not b.leases.inspect("r", "x").held
    b.close()


@pytest.mark.parametrize("server", ["fakeredis", "redis"])
def test_the_redis_drain_reports_a_turn_that_never_comes_as_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    """With Redis as the lease authority and ``ack="ledger"``, a drain into the SQLite
    ledger that cannot get the process's write connection (held past the wait limit, here
    0.3 s) makes the acquire UNAVAILABLE with the ledger's own message, not the pool's."""
    ledger = LedgerStore(f"sqlite:///{tmp_path / 'l.db'}")
    client: Any
    if server == "redis":
        require_redis()
        client = redis.Redis.from_url(REDIS_URL)
    else:
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    auth = RedisAuthority(client, ledger, ack="ledger")
    org = f"o-{uuid.uuid4().hex[:12]}"
    b = Baton(org=org, principal="a", store=ledger, lease_authority=auth)
    b.leases.release(b.leases.acquire("r", "warm", ttl_seconds=30))
    monkeypatch.setattr(ledger.engines.write.pool, "_timeout", 0.3)
    held = ledger.engines.write.connect()
    try:
        with pytest.raises(UnavailableError, match="write connection") as err:
            b.leases.acquire("r", "x", ttl_seconds=30)
        assert "QueuePool" not in str(err.value)
    finally:
        held.close()
    b.close()
    auth.close()
    ledger.close()
