"""The lag limit (``max_lag_entries``, ``BATON_REDIS_MAX_LAG_ENTRIES``): with ``ack="redis"``,
an acquire made while more journal entries than the limit wait for the ledger drains them
first (down to the limit), fails closed with ``UNAVAILABLE`` before granting anything when
the ledger cannot be written, and never holds back renewals or releases. On fakeredis and on
the real server, over a SQLite ledger."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest

from prefect_baton import Baton, UnavailableError, ValidationError
from prefect_baton._settings import load_settings
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.base import LAG_CHECK_SECONDS
from prefect_baton._stores.redis.keys import org_keys
from tests.conftest import REDIS_URL, require_redis

from ._util import kinds_of

PAIRS = 30
"""Acquire+release pairs written before the limited client acts: 60 journal entries."""


@pytest.fixture(params=["fakeredis", "redis"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fakeredis client, or one on the server at ``BATON_TEST_REDIS_URL``."""
    if request.param == "fakeredis":
        yield fakeredis.FakeRedis(server=fakeredis.FakeServer())
        return
    require_redis()
    c = connect(REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def make(client: Any, ledger: LedgerStore) -> Iterator[Callable[..., RedisAuthority]]:
    """``make(**kwargs)``: an ``ack="redis"`` authority without a drain thread on the test's
    client and ledger (no reconciler runs unless the test drains)."""
    made: list[RedisAuthority] = []

    def build(**kwargs: Any) -> RedisAuthority:
        kwargs.setdefault("reconcile_in_client", False)
        auth = RedisAuthority(client, ledger, ack="redis", **kwargs)
        made.append(auth)
        return auth

    yield build
    for auth in made:
        auth.close()


def _baton(auth: RedisAuthority, org: str) -> Baton:
    return Baton(org=org, principal="agent-a", store=auth.store, lease_authority=auth)


def _backlog(make: Callable[..., RedisAuthority]) -> tuple[Baton, str]:
    """An org whose journal holds ``2 * PAIRS`` entries that the ledger has not seen,
    written by a client without a limit."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    b = _baton(make(max_lag_entries=0), org)
    for i in range(PAIRS):
        b.leases.release(b.leases.acquire("res", f"p{i}", ttl_seconds=30))
    return b, org_keys(org).base.journal


def test_over_the_limit_an_acquire_drains_first(
    make: Callable[..., RedisAuthority], client: Any, ledger: LedgerStore
) -> None:
    """60 entries waiting, limit 20: the next acquire applies them to the ledger before its
    own grant, so the journal then holds only that grant."""
    filler, journal = _backlog(make)
    assert client.xlen(journal) == 2 * PAIRS
    assert kinds_of(ledger, filler) == []
    limited = _baton(make(max_lag_entries=20), filler.org)
    lease = limited.leases.acquire("res", "new", ttl_seconds=30)
    assert client.xlen(journal) == 1
    kinds = kinds_of(ledger, filler)
    assert kinds.count("lease.acquired") == PAIRS
    assert kinds.count("lease.released") == PAIRS
    assert limited.leases.inspect("res", "new").lease.lease_id == lease.lease_id


def test_drains_in_batches_down_to_the_limit(
    make: Callable[..., RedisAuthority], client: Any, ledger: LedgerStore
) -> None:
    """With batches of 10, the acquire drains 60 -> 50 -> 40 -> 30 -> 20 and stops at the
    limit, then adds its own entry; acquire_many is held back the same way."""
    filler, journal = _backlog(make)
    limited = _baton(make(max_lag_entries=20, batch_size=10), filler.org)
    limited.leases.acquire_many([("res", "m1"), ("res", "m2")], ttl_seconds=30)
    assert client.xlen(journal) == 21
    assert len(kinds_of(ledger, filler)) == 40


def test_under_the_limit_nothing_is_drained(
    make: Callable[..., RedisAuthority], client: Any, ledger: LedgerStore
) -> None:
    filler, journal = _backlog(make)
    limited = _baton(make(max_lag_entries=2 * PAIRS), filler.org)
    limited.leases.acquire("res", "new", ttl_seconds=30)
    assert client.xlen(journal) == 2 * PAIRS + 1
    assert kinds_of(ledger, filler) == []


def test_limit_zero_turns_it_off(
    make: Callable[..., RedisAuthority], client: Any, ledger: LedgerStore
) -> None:
    filler, journal = _backlog(make)
    off = _baton(make(max_lag_entries=0), filler.org)
    for i in range(5):
        off.leases.acquire("res", f"off{i}", ttl_seconds=30)
    assert client.xlen(journal) == 2 * PAIRS + 5
    assert kinds_of(ledger, filler) == []


def test_ledger_down_over_the_limit_fails_closed(
    make: Callable[..., RedisAuthority], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger cannot be written or read (its drain raises UNAVAILABLE): acquire and
    acquire_many fail before granting anything (the resource stays free, the journal
    unchanged), each time and not only when the length is due to be read again; renew and
    release of a lease already held still work. Once the ledger is back, the next acquire
    drains and is granted."""
    filler, journal = _backlog(make)
    held = filler.leases.acquire("res", "held", ttl_seconds=30)
    auth = make(max_lag_entries=20)
    limited = _baton(auth, filler.org)

    def ledger_down(*_a: Any, **_k: Any) -> int:
        raise UnavailableError("ledger database unavailable: connection refused")

    monkeypatch.setattr(auth.reconciler, "drain", ledger_down)
    # nor read: the handoffs carrying a lease cannot be asked for before a renew
    monkeypatch.setattr(auth.store, "lease_carriers", ledger_down)
    before = client.xlen(journal)
    with pytest.raises(UnavailableError, match="max_lag_entries") as err:
        limited.leases.acquire("res", "blocked", ttl_seconds=30)
    assert err.value.code == "UNAVAILABLE"
    with pytest.raises(UnavailableError, match="max_lag_entries"):
        limited.leases.acquire_many([("res", "b1"), ("res", "b2")], ttl_seconds=30)
    assert client.xlen(journal) == before
    for rid in ("blocked", "b1", "b2"):
        assert limited.leases.inspect("res", rid).lease is None
    renewed = limited.leases.renew(held)
    assert (renewed.lease_id, renewed.epoch) == (held.lease_id, held.epoch)
    assert renewed.version > held.version
    assert limited.leases.release(renewed).status == "released"
    assert client.xlen(journal) == before + 2
    # The ledger is back: the next acquire drains everything first, then grants.
    monkeypatch.undo()
    limited.leases.acquire("res", "blocked", ttl_seconds=30)
    assert client.xlen(journal) == 1


def test_length_is_read_at_most_every_interval(
    make: Callable[..., RedisAuthority], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acquires do not pay an extra round trip each: the journal's length is read at most
    once per LAG_CHECK_SECONDS per org."""
    auth = make(max_lag_entries=1000)
    b = _baton(auth, f"org-{uuid.uuid4().hex[:12]}")
    reads: list[float] = []
    real = client.xlen

    def counting(*a: Any, **k: Any) -> Any:
        reads.append(time.monotonic())
        return real(*a, **k)

    monkeypatch.setattr(client, "xlen", counting)
    t0 = time.monotonic()
    for i in range(200):
        b.leases.release(b.leases.acquire("res", f"r{i % 7}", ttl_seconds=30))
    elapsed = time.monotonic() - t0
    assert 1 <= len(reads) <= 1 + elapsed / LAG_CHECK_SECONDS + 1
    gaps = [later - earlier for earlier, later in itertools.pairwise(reads)]
    assert all(g >= LAG_CHECK_SECONDS * 0.99 for g in gaps)


def _count_xlen(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real = client.xlen

    def counting(*a: Any, **k: Any) -> Any:
        reads.append(1)
        return real(*a, **k)

    monkeypatch.setattr(client, "xlen", counting)
    return reads


def test_a_drain_that_caught_up_stands_for_the_length_read(
    make: Callable[..., RedisAuthority], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain of this client that found the journal under a batch (its drain thread's round,
    say) is as good as a length read for LAG_CHECK_SECONDS: the acquires right after it
    read no XLEN (the clock is held still, so the interval cannot pass meanwhile); once
    the interval passed, the length is read again."""
    filler, _journal = _backlog(make)
    auth = make(max_lag_entries=1000)
    b = _baton(auth, filler.org)
    now = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    reads = _count_xlen(client, monkeypatch)
    assert auth.reconciler.drain(filler.org) == 2 * PAIRS
    for i in range(5):
        b.leases.release(b.leases.acquire("res", f"c{i}", ttl_seconds=30))
    assert reads == []
    now[0] += LAG_CHECK_SECONDS
    b.leases.release(b.leases.acquire("res", "after", ttl_seconds=30))
    assert reads == [1]


def test_a_drain_that_did_not_catch_up_does_not_stand_for_it(
    make: Callable[..., RedisAuthority], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain that stopped after a full batch (more may wait) leaves the length read to
    the acquire, which then drains down to the limit itself."""
    filler, journal = _backlog(make)
    auth = make(max_lag_entries=10, batch_size=10)
    b = _baton(auth, filler.org)
    reads = _count_xlen(client, monkeypatch)
    assert auth.reconciler.drain(filler.org, max_batches=1) == 10
    b.leases.acquire("res", "next", ttl_seconds=30)
    assert reads
    assert client.xlen(journal) <= 11


@pytest.mark.parametrize("bad", [-1, "10", 1.5, True, None])
def test_bad_limit_is_a_validation_error(client: Any, ledger: LedgerStore, bad: Any) -> None:
    with pytest.raises(ValidationError, match="max_lag_entries") as err:
        RedisAuthority(client, ledger, max_lag_entries=bad)
    assert err.value.code == "VALIDATION_ERROR"


def test_setting_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, client: Any
) -> None:
    """BATON_REDIS_MAX_LAG_ENTRIES reaches the authority a Baton builds; a negative or
    non-numeric value is a VALIDATION_ERROR naming the variable."""
    monkeypatch.setenv("BATON_REDIS_MAX_LAG_ENTRIES", "-5")
    with pytest.raises(ValidationError, match="BATON_REDIS_MAX_LAG_ENTRIES"):
        load_settings()
    monkeypatch.setenv("BATON_REDIS_MAX_LAG_ENTRIES", "lots")
    with pytest.raises(ValidationError, match="BATON_REDIS_MAX_LAG_ENTRIES"):
        load_settings()
    monkeypatch.setenv("BATON_REDIS_MAX_LAG_ENTRIES", "7")
    assert load_settings().redis_max_lag_entries == 7
    if isinstance(client, fakeredis.FakeRedis):
        return
    b = Baton(
        org=f"org-{uuid.uuid4().hex[:12]}",
        principal="agent-a",
        ledger_url=f"sqlite:///{tmp_path / 'env.db'}",
        redis_url=REDIS_URL,
    )
    try:
        assert isinstance(b.authority, RedisAuthority)
        assert b.authority.max_lag_entries == 7
    finally:
        b.close()


@pytest.mark.parametrize("ledger_kind", ["sqlite", "postgresql"])
def test_a_stuck_drainer_holding_the_journal_lock_bounds_the_wait(
    request: pytest.FixtureRequest, client: Any, tmp_path: Any, ledger_kind: str
) -> None:
    """Another process holds the org's journal lock and does not let go (a drainer stopped
    mid-batch): an acquire over the limit gives up after the lock timeout with UNAVAILABLE,
    granting nothing, instead of waiting for ever; it succeeds once the lock is free. On
    PostgreSQL the lock is the ``journal:<org>`` advisory lock, on SQLite the write lock."""
    import sqlite3

    import psycopg

    from tests.conftest import store_for

    if ledger_kind == "sqlite":
        store = LedgerStore(f"sqlite:///{tmp_path / 'stuck.db'}")
    else:
        store = store_for(str(request.getfixturevalue("pg_url")))
    org = f"org-{uuid.uuid4().hex[:12]}"
    filler = _baton(
        RedisAuthority(client, store, ack="redis", reconcile_in_client=False, max_lag_entries=0),
        org,
    )
    for i in range(PAIRS):
        filler.leases.release(filler.leases.acquire("res", f"p{i}", ttl_seconds=30))
    auth = RedisAuthority(client, store, ack="redis", reconcile_in_client=False, max_lag_entries=20)
    auth.reconciler.lock_timeout_seconds = 0.5
    limited = _baton(auth, org)
    journal = org_keys(org).base.journal
    holder: Any
    if ledger_kind == "sqlite":
        holder = sqlite3.connect(str(tmp_path / "stuck.db"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("PRAGMA busy_timeout = 0")
        # SQLite waits its own busy timeout (30 s); shorten it for this engine's new
        # connections by disposing the pool and setting the pragma on connect
        from sqlalchemy import event

        store.engines.write.dispose()
        event.listen(
            store.engines.write,
            "connect",
            lambda c, _r: c.execute("PRAGMA busy_timeout = 500"),
        )
    else:
        holder = psycopg.connect(str(request.getfixturevalue("pg_url")), autocommit=True)
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"journal:{org}",))
    try:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="max_lag_entries"):
            limited.leases.acquire("res", "stuck", ttl_seconds=30)
        assert time.monotonic() - t0 < 15
        assert client.xlen(journal) == 2 * PAIRS
        assert limited.leases.inspect("res", "stuck").lease is None
    finally:
        if ledger_kind == "sqlite":
            holder.execute("ROLLBACK")
        holder.close()
    limited.leases.acquire("res", "stuck", ttl_seconds=30)
    assert client.xlen(journal) == 1
    auth.close()
    if ledger_kind == "sqlite":
        store.close()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BATON_REDIS_ACK", "bogus"),
        ("BATON_REDIS_POST_LOSS", "never"),
    ],
)
def test_bad_redis_options_are_refused_before_the_ledger_is_created(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, variable: str, value: str
) -> None:
    """A Baton and a server backend refuse a bad Redis option with VALIDATION_ERROR naming
    the variable, before they create (or migrate) the SQLite ledger file; no connection to
    Redis is needed."""
    from prefect_baton._stores.factory import open_stores

    monkeypatch.setenv(variable, value)
    path = tmp_path / "never.db"
    with pytest.raises(ValidationError, match=f"^bad setting: {variable} must be "):
        Baton(
            org="o",
            principal="p",
            ledger_url=f"sqlite:///{path}",
            redis_url="redis://127.0.0.1:1/0",
        )
    with pytest.raises(ValidationError):
        open_stores(f"sqlite:///{path}", "redis://127.0.0.1:1/0")
    assert not path.exists()


def test_an_idle_drain_opens_no_ledger_transaction(
    make: Callable[..., RedisAuthority], ledger: LedgerStore
) -> None:
    """Once the journal is applied (and trimmed), a drain round finds it empty with one
    Redis read and opens no ledger write transaction (a drain thread's idle rounds no
    longer take SQLite's write lock every 50 ms); it still counts as caught up for the lag
    limit, and the next entry is applied as before."""
    from sqlalchemy import event

    auth = make()
    b = _baton(auth, f"org-{uuid.uuid4().hex[:12]}")
    b.leases.release(b.leases.acquire("res", "r0", ttl_seconds=30))
    reconciler = auth.reconciler
    assert reconciler.drain(b.org) == 2
    begins: list[int] = []

    def began(_conn: Any) -> None:
        begins.append(1)

    event.listen(ledger.engines.write, "begin", began)
    try:
        before = reconciler.caught_up_at[b.org]
        assert reconciler.drain(b.org) == 0
        assert begins == []
        assert reconciler.caught_up_at[b.org] > before
        b.leases.acquire("res", "r1", ttl_seconds=30)
        assert reconciler.drain(b.org) == 1
        assert begins
    finally:
        event.remove(ledger.engines.write, "begin", began)
