"""The shared core of ``@leased`` (:class:`LeaseScope`), driven step by step as a
``with lease(...)`` context manager would drive it, and its ``cancel_on_loss`` guards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from prefect_baton import Baton, ConflictError, IdempotencyInFlightError, LeaseLostError
from prefect_baton.prefect import current_lease
from prefect_baton.prefect._interrupt import AsyncInterrupt, LeaseInterrupt, SyncInterrupt
from prefect_baton.prefect._options import LeaseOptions
from prefect_baton.prefect._plan import Sleep
from prefect_baton.prefect._scope import LeaseScope

MakeBaton = Callable[..., Baton]


def test_steps_hold_release_and_reraise(make_baton: MakeBaton) -> None:
    """Entered, the lease is current; a body failure is raised by ``finish`` after the
    keeper released the lease, and the previous current lease is restored."""
    b = make_baton("agent-a")
    opts = LeaseOptions("file", "a.txt", ttl_seconds=10, baton=b)
    scope = LeaseScope(opts, "block", SyncInterrupt)
    keeper = scope.attempt()
    assert keeper is not None
    keeper.start()
    with scope.holding(keeper) as held, scope.guarded(held):
        assert current_lease() is keeper
        raise KeyError("boom")
    assert current_lease() is None
    assert isinstance(held.failure, KeyError)
    keeper.stop(held.failure)
    with pytest.raises(KeyError):
        scope.finish(held)
    assert keeper.receipt_status == "released"


def test_skip_ends_the_attempts(make_baton: MakeBaton) -> None:
    """``on_conflict="skip"``: after the conflict there is no further attempt."""
    make_baton("agent-b").leases.acquire("file", "b.txt", ttl_seconds=10)
    b = make_baton("agent-a")
    opts = LeaseOptions("file", "b.txt", ttl_seconds=10, on_conflict="skip", baton=b)
    scope = LeaseScope(opts, "f", SyncInterrupt)
    keeper = scope.attempt()
    assert keeper is not None
    with pytest.raises(ConflictError) as info:
        keeper.start()
    assert scope.acquire_failed(info.value) is None
    assert scope.attempt() is None
    assert scope.skipped() is None


def test_interrupted_body_raises_lease_lost(make_baton: MakeBaton) -> None:
    """A body ended by the guard's interruption is reported as :class:`LeaseLostError`."""
    opts = LeaseOptions("file", "c.txt", ttl_seconds=10, cancel_on_loss=True, baton=make_baton("a"))
    scope = LeaseScope(opts, "block", SyncInterrupt)
    keeper = scope.attempt()
    assert keeper is not None
    keeper.start()
    with scope.holding(keeper) as held, scope.guarded(held):
        raise LeaseInterrupt()
    keeper.stop(held.failure)
    with pytest.raises(LeaseLostError, match="interrupted"):
        scope.finish(held)


class _Task:
    """Counts cancellation requests as ``asyncio.Task`` does."""

    def __init__(self, requests: int) -> None:
        self.requests = requests

    def cancelling(self) -> int:
        return self.requests

    def uncancel(self) -> int:
        self.requests -= 1
        return self.requests


def test_async_disarm_uncancels_once() -> None:
    """Disarming twice (the core does, in case an interruption landed while disarming)
    takes back only the guard's own cancellation, not someone else's."""
    guard = AsyncInterrupt()

    async def arm() -> None:
        guard.arm(lambda: False)

    asyncio.run(arm())
    task = _Task(requests=2)  # someone else's cancellation and the guard's
    guard._task = task  # type: ignore[assignment]
    guard.fired = True
    guard.disarm()
    guard.disarm()
    assert task.cancelling() == 1


@pytest.mark.parametrize("on_conflict", ["raise", "skip", "wait"])
def test_another_attempt_holding_the_execution_is_a_conflict(
    make_baton: MakeBaton, on_conflict: str
) -> None:
    """When another process's attempt of the same execution holds the lease, the scope's
    acquire is refused IDEMPOTENCY_IN_FLIGHT, and ``on_conflict`` raises, skips or waits as
    on a conflict."""
    b = make_baton("agent-a")
    opts = LeaseOptions("file", "d.txt", ttl_seconds=10, on_conflict=on_conflict, baton=b)  # type: ignore[arg-type]
    scope = LeaseScope(opts, "f", SyncInterrupt)
    b.leases.acquire(
        "file", "d.txt", ttl_seconds=10, idempotency_key=scope.call.key, attempt="elsewhere"
    )
    keeper = scope.attempt()
    assert keeper is not None
    with pytest.raises(IdempotencyInFlightError) as info:
        keeper.start()
    if on_conflict == "raise":
        with pytest.raises(IdempotencyInFlightError):
            scope.acquire_failed(info.value)
    elif on_conflict == "skip":
        assert scope.acquire_failed(info.value) is None
        assert scope.attempt() is None
    else:
        assert isinstance(scope.acquire_failed(info.value), Sleep)
