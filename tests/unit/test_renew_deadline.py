"""The renew deadline (``_rules/keeping.py``) and the keeper's timer that enforces it while a
renewal is blocked."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from prefect_baton import LeaseKeeper, LeaseLostError, ValidationError
from prefect_baton._rules.keeping import heartbeat_call_timeout, keep_times
from prefect_baton.models import Lease


def test_defaults_are_a_third_and_two_thirds_of_the_ttl() -> None:
    t = keep_times(30)
    assert (t.ttl, t.renew_every, t.renew_deadline, t.max_hold) == (30.0, 10.0, 20.0, None)
    assert t.deadline(100.0) == 120.0
    assert heartbeat_call_timeout(t.ttl) < t.renew_deadline - t.renew_every


def test_options_are_checked() -> None:
    assert keep_times(30, renew_deadline_seconds=6).renew_every == 3.0  # half the deadline
    assert keep_times(30, renew_every_seconds=600).renew_every == 600.0  # lost at the deadline
    for bad in (
        {"renew_deadline_seconds": 30},
        {"renew_deadline_seconds": 0},
        {"renew_deadline_seconds": True},
        {"renew_deadline_seconds": "5"},
        {"max_hold_seconds": 0},
        {"max_hold_seconds": float("inf")},
    ):
        with pytest.raises(ValidationError):
            keep_times(30, **bad)
    with pytest.raises(ValidationError):
        keep_times(5)


def test_max_hold() -> None:
    t = keep_times(30, max_hold_seconds=60)
    assert t.may_renew(0.0, 59.9)
    assert not t.may_renew(0.0, 60.0)
    assert keep_times(30).may_renew(0.0, 1e9)


class _BlockedAPI:
    """A lease API whose renewals block until released (a black-holed network)."""

    def __init__(self) -> None:
        self.unblock = threading.Event()
        self.renewing = threading.Event()
        now = datetime.now(UTC)
        self.lease = Lease(
            lease_id="lease_1",
            resource_type="r",
            resource_id="x",
            owner="a",
            execution_key=None,
            version=1,
            epoch=1,
            acquired_at=now,
            expires_at=now,
            ttl_seconds=10,
        )

    def acquire(self, **_: Any) -> Lease:
        return self.lease

    def renew(self, lease: Lease, **_: Any) -> Lease:
        self.renewing.set()
        self.unblock.wait(30)
        raise OSError("connection reset")

    def release(self, lease: Lease) -> Any:
        raise AssertionError("a block whose renewal is still stuck is not released")


def test_deadline_fires_while_a_renewal_is_blocked() -> None:
    """``on_lost`` runs at the renew deadline although the renewal call never returns."""
    api = _BlockedAPI()
    lost_at: list[float] = []
    keeper = LeaseKeeper(
        api,  # type: ignore[arg-type]
        {"resource_type": "r", "resource_id": "x", "ttl_seconds": 10},
        renew_every_seconds=0.05,
        renew_deadline_seconds=0.5,
        on_lost=lambda _: lost_at.append(time.monotonic()),
    )
    keeper.start()
    assert api.renewing.wait(10)
    give_up = time.monotonic() + 10
    while not lost_at and time.monotonic() < give_up:
        time.sleep(0.02)
    assert lost_at, "on_lost did not fire"
    assert not api.unblock.is_set()  # the renewal was still blocked
    assert keeper.lost
    assert keeper.lost_reason is not None
    assert "renew deadline" in keeper.lost_reason
    with pytest.raises(LeaseLostError):
        keeper.stop()
    api.unblock.set()
