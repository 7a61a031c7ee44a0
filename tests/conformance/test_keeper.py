"""``with b.lease(...)`` / ``async with`` (DESIGN.md "Prefect integration"): acquire on enter,
heartbeat renewals on a thread of its own, release on exit, a lost lease surfaced as
``.lost``, a callback and LEASE_LOST at exit, and no renewal or release from a forked child."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from prefect_baton import AsyncBaton, Baton, ConflictError, LeaseKeeper, LeaseLostError

from ._util import kinds, wait_until_expired

RT = "deploy"
RID = "checkout-service"


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _run(keeper: LeaseKeeper, body: Callable[[LeaseKeeper], None]) -> None:
    with keeper as held:
        body(held)


def test_block_acquires_and_releases(baton: Baton) -> None:
    """Entering the block acquires the lease; leaving it releases it."""
    with baton.lease(RT, RID, ttl_seconds=30, purpose="deploy") as held:
        info = baton.leases.inspect(RT, RID)
        assert info.lease is not None
        assert info.lease.lease_id == held.lease_id
        assert (held.owner, held.epoch, held.resource_id) == ("agent-a", 1, RID)
        assert not held.lost
    assert not baton.leases.inspect(RT, RID).held
    assert held.receipt_status == "released"
    assert kinds(baton) == ["lease.acquired", "lease.released"]


def test_block_passes_execution_key_and_scopes(baton: Baton) -> None:
    """The block acquires with the given execution key and scopes."""
    with baton.lease(RT, RID, ttl_seconds=30, idempotency_key="run-1", scopes=["src/**"]) as held:
        assert held.execution_key == "run-1"
        assert held.lease.scopes == ("src/**",)


def test_heartbeat_paused_sends_no_renewal(baton: Baton) -> None:
    """Inside ``heartbeat_paused()`` no renewal is sent (so a process stopped there holds no
    ledger transaction open); after it, renewals go on."""
    with baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05) as held:
        _wait_for(lambda: held.renewals >= 1, "a renewal")
        with held.heartbeat_paused():
            before = held.renewals
            version = baton.leases.inspect(RT, RID).lease.version  # type: ignore[union-attr]
            time.sleep(0.4)
            assert held.renewals == before
            assert baton.leases.inspect(RT, RID).lease.version == version  # type: ignore[union-attr]
        _wait_for(lambda: held.renewals > before, "a renewal after the pause")
        assert not held.lost


def test_block_conflict_on_enter(baton: Baton) -> None:
    """If another principal holds the resource, entering raises CONFLICT and the body never runs."""
    baton.as_principal("agent-b").leases.acquire(RT, RID, ttl_seconds=30)
    ran = False
    with pytest.raises(ConflictError), baton.lease(RT, RID, ttl_seconds=30):
        ran = True
    assert not ran


def test_body_exception_propagates_and_releases(baton: Baton) -> None:
    """An exception in the body propagates unchanged and the lease is still released."""

    class Boom(Exception):
        pass

    with pytest.raises(Boom), baton.lease(RT, RID, ttl_seconds=30):
        raise Boom
    assert not baton.leases.inspect(RT, RID).held


def test_heartbeat_renews(baton: Baton) -> None:
    """While the block runs, the heartbeat renews: same id and epoch, rising version."""
    with baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.1) as held:
        first = held.lease
        _wait_for(lambda: held.renewals >= 3, "three renewals")
        assert held.lease_id == first.lease_id
        assert held.epoch == first.epoch
        assert held.version >= first.version + 3
        assert not held.lost
        info = baton.leases.inspect(RT, RID)
        assert info.version >= first.version + 3
    assert kinds(baton).count("lease.renewed") >= 3
    assert not baton.leases.inspect(RT, RID).held


def test_heartbeat_stops_after_exit(baton: Baton) -> None:
    """After the block exits, no further renewals are made."""
    with baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05) as held:
        _wait_for(lambda: held.renewals >= 1, "a renewal")
    count = held.renewals
    events = kinds(baton)
    time.sleep(0.3)
    assert held.renewals == count
    assert kinds(baton) == events


def test_block_is_a_fence(baton: Baton) -> None:
    """The block itself can be passed as a fence to checkpoint and outcome writes."""
    with baton.lease(RT, RID, ttl_seconds=30) as held:
        ck = baton.checkpoints.save("subj", "progress", {"n": 1}, fence=held)
        out = baton.outcomes.record(
            "subj", "succeeded", evidence=[{"kind": "f", "uri": "u"}], fence=held
        )
    assert ck.version == 1
    assert out.fence_epoch == held.epoch


def test_lost_lease_is_flagged_and_raises_at_exit(baton: Baton) -> None:
    """A lease force-released mid-block sets .lost, calls on_lost, and raises LEASE_LOST at exit."""
    calls: list[LeaseKeeper] = []
    boss = baton.as_principal("boss", role="admin")
    held = baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05, on_lost=calls.append)

    def body(h: LeaseKeeper) -> None:
        boss.leases.force_release(h.lease_id)
        _wait_for(lambda: h.lost, "the heartbeat to notice the loss")
        assert calls == [h]

    with pytest.raises(LeaseLostError) as ei:
        _run(held, body)
    assert ei.value.code == "LEASE_LOST"
    assert ei.value.status == "revoked"  # as the message says: errors.md's .status
    assert "(revoked)" in ei.value.message
    assert ei.value.to_dict()["status"] == "revoked"
    assert held.lost
    assert calls == [held]


def test_on_lost_has_run_once_lost_reads_true_and_before_the_block_ends(baton: Baton) -> None:
    """A slow ``on_lost`` (0.5 s) has run by the time ``.lost`` reads ``True`` on the
    block's thread, and so by the time the block raises ``LEASE_LOST``: the heartbeat
    flags the loss first, then calls back, and neither the reader nor the exit may get
    ahead of the callback."""
    calls: list[LeaseKeeper] = []

    def slow(h: LeaseKeeper) -> None:
        time.sleep(0.5)
        calls.append(h)

    boss = baton.as_principal("boss", role="admin")
    held = baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05, on_lost=slow)

    def body(h: LeaseKeeper) -> None:
        boss.leases.force_release(h.lease_id)
        _wait_for(lambda: h.lost, "the heartbeat to notice the loss")
        seen.append(list(calls))

    seen: list[list[LeaseKeeper]] = []
    with pytest.raises(LeaseLostError):
        _run(held, body)
    assert seen == [[held]]
    assert calls == [held]


def test_loss_noticed_at_exit_raises(baton: Baton) -> None:
    """A loss the heartbeat has not seen yet is still raised as LEASE_LOST at exit."""
    held = baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=600)

    def body(h: LeaseKeeper) -> None:
        baton.leases.transfer(
            h, to_principal="agent-b", new_execution_key="other-run", ttl_seconds=30
        )
        assert not h.lost

    with pytest.raises(LeaseLostError) as ei:
        _run(held, body)
    assert ei.value.status == "transferred"  # the refused release's status, at exit
    assert held.lost
    b = baton.as_principal("agent-b").leases.inspect(RT, RID)
    assert b.lease is not None
    assert b.lease.owner == "agent-b"


def test_async_block(baton: Baton) -> None:
    """async with acquires, renews even while the event loop is blocked, and releases."""
    ab = AsyncBaton(sync=baton)

    async def main() -> tuple[int, int]:
        async with ab.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05) as held:
            info = await ab.leases.inspect(RT, RID)
            assert info.lease is not None
            assert info.lease.lease_id == held.lease_id
            start = held.version
            deadline = time.monotonic() + 20
            while held.renewals < 2:  # busy loop without awaiting: the loop is starved
                assert time.monotonic() < deadline
                time.sleep(0.01)
            return start, held.version

    start, end = asyncio.run(main())
    assert end >= start + 2
    assert not baton.leases.inspect(RT, RID).held


def test_async_block_lost_raises(baton: Baton) -> None:
    """A lease lost inside async with raises LEASE_LOST when the block exits."""
    ab = AsyncBaton(sync=baton)
    boss = AsyncBaton(sync=baton.as_principal("boss", role="owner"))

    async def main() -> None:
        async with ab.lease(RT, RID, ttl_seconds=30, renew_every_seconds=0.05) as held:
            await boss.leases.force_release(held.lease_id)
            while not held.lost:
                await asyncio.sleep(0.02)

    with pytest.raises(LeaseLostError):
        asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_neither_renews_nor_releases(baton: Baton) -> None:
    """A block inherited by a fork()-ed child does not release (or renew) the parent's lease."""
    with baton.lease(RT, RID, ttl_seconds=30, renew_every_seconds=600) as held:
        before = baton.leases.inspect(RT, RID)
        pid = os.fork()
        if pid == 0:  # the child: leave the inherited block, then exit at once
            code = 0
            try:
                held.__exit__(None, None, None)
                time.sleep(0.3)
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        after = baton.leases.inspect(RT, RID)
        assert after.held
        assert after.lease is not None
        assert after.lease.lease_id == held.lease_id
        assert after.version == before.version
        assert "lease.released" not in kinds(baton)
    assert held.receipt_status == "released"
    assert not baton.leases.inspect(RT, RID).held


@pytest.mark.slow
def test_expired_inside_block_raises_at_exit(baton: Baton) -> None:
    """A lease that runs out inside the block (no renewal in time) raises LEASE_LOST at exit."""
    with (
        pytest.raises(LeaseLostError),
        baton.lease(RT, RID, ttl_seconds=10, renew_every_seconds=600) as held,
    ):
        wait_until_expired(baton, held.lease)
    assert held.lost
    assert not baton.leases.inspect(RT, RID).held


def test_async_client_mirrors_sync(baton: Baton) -> None:
    """AsyncBaton offers the same operations as coroutines, with the same results and errors."""
    ab = AsyncBaton(sync=baton)
    ab_b = ab.as_principal("agent-b")
    evidence = [{"kind": "file", "uri": "u"}]

    async def main() -> list[str]:
        lease = await ab.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
        with pytest.raises(ConflictError):
            await ab_b.leases.acquire(RT, RID, ttl_seconds=30)
        renewed = await ab.leases.renew(lease)
        assert renewed.version == lease.version + 1
        ck = await ab.checkpoints.save("subj", "draft", {"n": 1}, fence=renewed)
        h = await ab.handoffs.create("agent-b", "subj", checkpoint_id=ck.checkpoint_id, lease=lease)
        assert [x.handoff_id for x in await ab_b.handoffs.inbox()] == [h.handoff_id]
        assert (await ab_b.checkpoints.get_by_id(ck.checkpoint_id)).state == {"n": 1}
        done = await ab_b.handoffs.resolve(h.handoff_id, "accepted")
        assert done.lease is not None
        with pytest.raises(LeaseLostError):
            await ab.leases.renew(renewed)
        await ab_b.outcomes.record("subj", "succeeded", evidence=evidence, fence=done.lease)
        receipt = await ab_b.leases.release(done.lease)
        assert receipt.status == "released"
        return [e.kind for e in await ab.events.list()]

    assert asyncio.run(main()) == [
        "lease.acquired",
        "lease.renewed",
        "checkpoint.saved",
        "handoff.created",
        "lease.transferred",
        "handoff.accepted",
        "outcome.recorded",
        "lease.released",
    ]
