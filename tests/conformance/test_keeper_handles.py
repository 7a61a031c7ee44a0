"""Lease handles are safe by default (DESIGN.md "Prefect integration"): a lease inherited
across ``fork()`` neither renews nor releases in the child, a dropped keeper stops renewing,
``max_hold_seconds`` caps the renewals, and the lease block (``current_lease()``) reads as
every field of its :class:`Lease`."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import ExitStack

import pytest

from prefect_baton import Baton, Lease, LeaseLostError, ValidationError
from tests.conftest import arm_of

RT = "deploy"
RID = "handles"


def _in_child(action: Callable[[], None]) -> int:
    """Run ``action`` in a fork()-ed child: 0 if it raised ``VALIDATION_ERROR``, 1 if it
    returned, 2 if it raised anything else."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            action()
        except ValidationError:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_lease_inherited_across_fork_cannot_renew_or_release(baton: Baton) -> None:
    """A child cannot release, renew or transfer the parent's lease (nor the lease of the
    parent's block), and the parent's block then releases it normally."""
    lease = baton.leases.acquire(RT, "plain", ttl_seconds=30)
    with baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=600) as held:
        before = baton.leases.inspect(RT, RID).version
        assert _in_child(lambda: baton.leases.release(held)) == 0
        assert _in_child(lambda: baton.leases.release(lease)) == 0
        assert _in_child(lambda: baton.leases.renew(lease)) == 0
        assert (
            _in_child(
                lambda: baton.leases.transfer(
                    lease, to_principal="agent-b", new_execution_key="k2", ttl_seconds=30
                )
            )
            == 0
        )
        info = baton.leases.inspect(RT, RID)
        assert info.held
        assert info.version == before
    assert held.receipt_status == "released"
    assert baton.leases.release(lease).status == "released"


def test_dropped_keeper_stops_renewing(baton: Baton, request: pytest.FixtureRequest) -> None:
    """A started keeper that is dropped without being stopped stops renewing."""
    if arm_of(request) == "fakeredis":
        pytest.skip(
            "fakeredis keeps its last script error (NOSCRIPT) with its traceback, which pins "
            "the frames of the call that made it, so the keeper is never freed there"
        )
    keeper = baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05)
    keeper.start()
    give_up = time.monotonic() + 20
    while keeper.renewals < 1:
        assert time.monotonic() < give_up, "no renewal"
        time.sleep(0.02)
    ref = weakref.ref(keeper)
    del keeper
    give_up = time.monotonic() + 20
    while ref() is not None:  # a renewal running at this instant holds it until it returns
        assert time.monotonic() < give_up, "the dropped keeper was never freed"
        gc.collect()
        time.sleep(0.02)
    version = baton.leases.inspect(RT, RID).version
    time.sleep(0.3)
    assert baton.leases.inspect(RT, RID).version == version


def test_held_blocks_share_the_keeper_threads(baton: Baton) -> None:
    """Fifty blocks held at once (each still renewed) start no thread of their own: the
    process's one timer thread schedules them all (before it, each block started two)."""
    baton.leases.release(baton.leases.acquire(RT, "warm-up", ttl_seconds=30))
    with baton.lease(RT, "first", ttl_seconds=30):
        pass  # the timer thread is running from here on
    before = threading.active_count()
    with ExitStack() as stack:
        held = [
            stack.enter_context(baton.lease(RT, f"{RID}-{i}", ttl_seconds=30)) for i in range(50)
        ]
        assert threading.active_count() <= before + 1  # at most a renewal worker
        assert not any(h.lost for h in held)
    assert all(h.receipt_status == "released" for h in held)


def test_max_hold_caps_renewals(baton: Baton) -> None:
    """After ``max_hold_seconds`` no renewal is sent; the lease is lost at its renew
    deadline and leaving the block raises LEASE_LOST naming the cap."""
    lost = threading.Event()
    with (  # noqa: PT012
        pytest.raises(LeaseLostError, match="max_hold_seconds"),
        baton.lease(
            RT,
            RID,
            ttl_seconds=30,
            renew_every_seconds=0.05,
            renew_deadline_seconds=1.0,
            max_hold_seconds=0.3,
            on_lost=lambda _: lost.set(),
        ) as held,
    ):
        assert lost.wait(20)
        renewals = held.renewals
        assert renewals >= 1
        version = baton.leases.inspect(RT, RID).version
        time.sleep(0.2)
        assert baton.leases.inspect(RT, RID).version == version
        assert held.renewals == renewals


def test_bad_timing_options_acquire_nothing(baton: Baton) -> None:
    """A renew deadline not below the TTL, or a non-positive cap, is VALIDATION_ERROR on
    enter, before anything is acquired."""
    for kwargs in (
        {"renew_deadline_seconds": 30},
        {"renew_deadline_seconds": 0},
        {"max_hold_seconds": -1},
        {"max_hold_seconds": float("nan")},
    ):
        with pytest.raises(ValidationError), baton.lease(RT, RID, ttl_seconds=30, **kwargs):
            pass
    assert not baton.leases.inspect(RT, RID).held


def test_current_lease_has_every_lease_field(baton: Baton) -> None:
    """``current_lease()`` (the block) reads as every field of its :class:`Lease`."""
    from prefect_baton.prefect import current_lease, leased

    seen: dict[str, object] = {}

    @leased(RT, RID, ttl_seconds=30, baton=baton, scopes=["src/**"], purpose="p")
    def body() -> None:
        current = current_lease()
        assert current is not None
        for name in Lease.model_fields:
            seen[name] = getattr(current, name)
        seen["fencing_token"] = current.fencing_token
        assert seen == {
            **current.lease.model_dump(),
            "fencing_token": current.lease.fencing_token,
        }

    body()
    assert seen["acquired_at"] is not None
    assert seen["scopes"] == ("src/**",)
