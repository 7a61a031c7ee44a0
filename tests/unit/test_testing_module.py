"""``prefect_baton.testing`` as a user's own tests use it: an in-memory ledger whose clock
the test moves (no sleeping), isolated per call, freed on close."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from prefect_baton import (
    AsyncBaton,
    Baton,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
    ValidationError,
)
from prefect_baton.testing import ManualClock, clock_of, memory_baton

START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def baton(clock: ManualClock) -> Iterator[Baton]:
    with memory_baton(org="test", principal="worker-1", clock=clock) as b:
        yield b


def test_takeover_after_ttl_without_sleeping(baton: Baton, clock: ManualClock) -> None:
    """Advancing the clock past the TTL lets another principal take over with a higher
    epoch; the old holder's fence is STALE_FENCE and its lease is lost."""
    started = time.monotonic()
    old = baton.leases.acquire("deploy", "svc", ttl_seconds=60)
    assert old.expires_at == START + timedelta(seconds=60)
    other = baton.as_principal("worker-2")
    clock.advance(59.999)
    assert baton.leases.inspect("deploy", "svc").held  # not yet: time stood still
    clock.advance(0.001)
    assert not baton.leases.inspect("deploy", "svc").held  # expired at exactly the TTL
    new = other.leases.acquire("deploy", "svc", ttl_seconds=60)
    assert new.owner == "worker-2"
    assert new.epoch == old.epoch + 1
    assert new.acquired_at == START + timedelta(seconds=60)
    with pytest.raises(StaleFenceError) as err:
        baton.checkpoints.save("svc", "progress", {"step": 3}, fence=old)
    assert err.value.code == "STALE_FENCE"
    with pytest.raises(LeaseLostError):
        baton.leases.renew(old)
    assert other.checkpoints.save("svc", "progress", {"step": 3}, fence=new).version == 1
    assert time.monotonic() - started < 10  # nothing waited for the 60 s


def test_stopped_clock_does_not_move_with_real_time(baton: Baton, clock: ManualClock) -> None:
    """A stopped clock does not move with real time: every time the ledger records is the
    clock's, however long the test runs."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=10)
    time.sleep(0.05)
    assert baton.leases.renew(lease).expires_at == START + timedelta(seconds=10)
    assert [e.occurred_at for e in baton.events.list()] == [START, START]


def test_checkpoint_and_handoff_expiry_follow_the_clock(baton: Baton, clock: ManualClock) -> None:
    """Checkpoint TTLs and handoff expiries run on the same clock."""
    baton.checkpoints.save("svc", "progress", {"n": 1}, ttl_seconds=30)
    h = baton.handoffs.create("worker-2", "svc", expires_in_seconds=30)
    clock.advance(31)
    assert baton.checkpoints.get("svc", "progress") is None
    assert baton.handoffs.get(h.handoff_id).status == "expired"
    with pytest.raises(NotFoundError):
        baton.as_principal("worker-2").handoffs.resolve(h.handoff_id, "accepted")


def test_two_memory_batons_are_isolated() -> None:
    """Two memory_baton() calls are two ledgers: same org and names, nothing shared."""
    with memory_baton() as one, memory_baton() as two:
        assert (one.org, one.principal) == (two.org, two.principal)
        lease = one.leases.acquire("deploy", "svc", ttl_seconds=60)
        one.checkpoints.save("svc", "progress", {"n": 1})
        assert not two.leases.inspect("deploy", "svc").held
        assert two.checkpoints.get("svc", "progress") is None
        assert two.events.list() == []
        theirs = two.leases.acquire("deploy", "svc", ttl_seconds=60)
        assert theirs.epoch == lease.epoch == 1
        assert clock_of(one) is not clock_of(two)


def test_default_clock_is_a_stopped_manual_clock() -> None:
    """Without clock=, the ledger gets its own stopped ManualClock at the current time."""
    before = datetime.now(UTC)
    with memory_baton() as b:
        clock = clock_of(b)
        assert not clock.ticking
        assert before - timedelta(seconds=1) <= clock.now() <= datetime.now(UTC)
        lease = b.leases.acquire("deploy", "svc", ttl_seconds=10)
        clock.advance(10)
        assert b.as_principal("other").leases.acquire("deploy", "svc", ttl_seconds=10).epoch == (
            lease.epoch + 1
        )


def test_other_principals_share_the_ledger_and_clock(baton: Baton, clock: ManualClock) -> None:
    """as_principal (and an AsyncBaton over it) see the same ledger and clock."""
    boss = baton.as_principal("boss", role="owner")
    assert clock_of(boss) is clock
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=60)
    assert [x.lease_id for x in boss.leases.list(owner="*")] == [lease.lease_id]
    ab = AsyncBaton(sync=baton.as_principal("worker-2"))

    async def peek() -> bool:
        return bool((await ab.leases.inspect("deploy", "svc")).held)

    assert asyncio.run(peek())
    clock.advance(60)
    assert not asyncio.run(peek())


def test_threads_share_the_ledger(baton: Baton) -> None:
    """Every thread sees the one in-memory ledger; concurrent acquires grant one holder."""
    winners: list[str] = []
    errors: list[BaseException] = []

    def race(name: str) -> None:
        try:
            baton.as_principal(name).leases.acquire("deploy", "svc", ttl_seconds=60)
            winners.append(name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert len(errors) == 7
    assert all(getattr(e, "code", None) == "CONFLICT" for e in errors)
    info = baton.as_principal(winners[0]).leases.inspect("deploy", "svc")
    assert info.lease is not None
    assert info.lease.owner == winners[0]


def test_close_frees_the_ledger() -> None:
    """close() closes the database's one connection; later operations are UNAVAILABLE."""
    b = memory_baton()
    other = b.as_principal("worker-2")
    b.leases.acquire("deploy", "svc", ttl_seconds=60)
    with b.store.engines.write.connect() as conn:
        raw = conn.connection.dbapi_connection
    assert raw is not None
    b.close()
    with pytest.raises(Exception, match="closed database"):
        raw.execute("SELECT 1")
    with pytest.raises(UnavailableError):
        b.leases.inspect("deploy", "svc")
    with pytest.raises(UnavailableError):
        other.leases.acquire("deploy", "svc", ttl_seconds=60)
    b.close()  # closing again is harmless


def test_bad_identity_is_validation_error() -> None:
    """A bad org, principal or role is VALIDATION_ERROR, as for any Baton."""
    bad: list[dict[str, Any]] = [{"org": "a\x00b"}, {"principal": ""}, {"role": "root"}]
    for kwargs in bad:
        with pytest.raises(ValidationError):
            memory_baton(**kwargs)


def test_environment_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """BATON_* variables (a Redis URL, a REST API, even a bad value) do not reach it."""
    monkeypatch.setenv("BATON_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("BATON_API_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("BATON_API_KEY", "bk_nope")
    monkeypatch.setenv("BATON_STATE_MAX_BYTES", "not a number")
    with memory_baton(org="acme", principal="p") as b:
        assert b.leases.acquire("deploy", "svc", ttl_seconds=10).owner == "p"
        assert b.as_principal("q").org == "acme"


def test_any_callable_clock(tmp_path: Path) -> None:
    """clock= takes any callable returning epoch milliseconds; clock_of then refuses, as it
    does for a file ledger."""
    now = [1_900_000_000_000]
    with memory_baton(clock=lambda: now[0]) as b:
        lease = b.leases.acquire("deploy", "svc", ttl_seconds=10)
        assert lease.expires_at.timestamp() * 1000 == now[0] + 10_000
        now[0] += 10_000
        assert not b.leases.inspect("deploy", "svc").held
        with pytest.raises(ValueError):
            clock_of(b)
    f = Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", org="o", principal="p")
    with f, pytest.raises(ValueError):
        clock_of(f)


# ------------------------------------------------------------------------------ ManualClock


def test_manual_clock_moves_only_when_told() -> None:
    """now_ms/now/() agree; advance and set move it; it does not move by itself."""
    c = ManualClock(1_000_000)
    assert c.now_ms() == c() == 1_000_000
    time.sleep(0.02)
    assert c.now_ms() == 1_000_000
    assert c.advance(1.5) == 1_001_500
    assert c.advance(0) == 1_001_500
    c.set(START)
    assert c.now() == START
    assert c.now().tzinfo is not None
    c.set(5)
    assert c.now_ms() == 5
    assert "stopped" in repr(c)


def test_ticking_clock_runs_with_real_time_and_jumps() -> None:
    """ticking=True: real time passes on it too; advance adds a jump."""
    c = ManualClock(START, ticking=True)
    assert c.ticking
    time.sleep(0.05)
    assert c.now_ms() >= round(START.timestamp() * 1000) + 50
    before = c.now_ms()
    assert c.advance(3600) >= before + 3_600_000
    c.set(START)
    assert round(START.timestamp() * 1000) <= c.now_ms() < round(START.timestamp() * 1000) + 5000


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf")])
def test_manual_clock_refuses_bad_advance(seconds: float) -> None:
    """advance() takes finite seconds >= 0 only (set() goes back)."""
    c = ManualClock(0)
    with pytest.raises(ValueError):
        c.advance(seconds)
    assert c.now_ms() == 0


@pytest.mark.parametrize(
    ("when", "error"),
    [
        (datetime(2030, 1, 1), ValueError),  # naive
        (-1, ValueError),
        (1.5, TypeError),
        (True, TypeError),
        ("2030-01-01", TypeError),
    ],
)
def test_manual_clock_refuses_bad_times(when: object, error: type[Exception]) -> None:
    """Start and set() take an aware datetime or epoch milliseconds >= 0."""
    with pytest.raises(error):
        ManualClock(when)  # type: ignore[arg-type]
    c = ManualClock(0)
    with pytest.raises(error):
        c.set(when)  # type: ignore[arg-type]
    assert c.now_ms() == 0
