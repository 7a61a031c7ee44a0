"""A lease block whose lease rides on a handoff (``handoffs.create(..., lease=held)`` with
the block ``held`` itself): the block's exit leaves the lease to the handoff instead of
releasing it, as :func:`prefect_baton.prefect.handoff_to` does, so the recipient can still
accept it after the sender's block ended (DESIGN.md "Handoffs"; ``LeaseKeeper.stop``)."""

from __future__ import annotations

import asyncio

import pytest

from prefect_baton import AsyncBaton, Baton, ConflictError, NotFoundError

from ._util import pass_deadline

SUBJ = "report-2024"
RT = "delivery"
RID = "weekly-report"


def test_block_exit_leaves_handed_off_lease_to_the_recipient(baton: Baton) -> None:
    """The block exits without releasing the lease it handed off (``receipt_status``
    ``handed_off``, the lease still active); nobody else can acquire the resource until the
    recipient accepts; accepting moves the lease to the recipient with epoch + 1."""
    b = baton.as_principal("agent-b")
    c = baton.as_principal("agent-c")
    with baton.lease(RT, RID, ttl_seconds=60) as held:
        h = baton.handoffs.create("agent-b", SUBJ, lease=held)
        epoch, lease_id = held.epoch, held.lease_id
    assert held.receipt_status == "handed_off"
    assert not held.lost
    assert baton.leases.get(lease_id).status == "active"
    assert (c.leases.inspect(RT, RID).held, c.leases.inspect(RT, RID).epoch) == (True, epoch)
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.lease.owner) == (lease_id, "agent-a")
    with pytest.raises(ConflictError):
        c.leases.acquire(RT, RID, ttl_seconds=60)
    assert [x.handoff_id for x in b.handoffs.inbox()] == [h.handoff_id]
    assert baton.handoffs.get(h.handoff_id).status == "pending"

    done = b.handoffs.resolve(h.handoff_id, "accepted")
    assert done.status == "accepted"
    assert done.lease is not None
    assert (done.lease.owner, done.lease.epoch) == ("agent-b", epoch + 1)
    with pytest.raises(ConflictError):
        c.leases.acquire(RT, RID, ttl_seconds=60)
    assert b.leases.release(done.lease).status == "released"


def test_block_exit_after_the_recipient_accepted_is_clean(baton: Baton) -> None:
    """Accepted while the block still runs: the block ends without error, ``handed_off``,
    and leaves the recipient's lease alone."""
    b = baton.as_principal("agent-b")
    with baton.lease(RT, RID, ttl_seconds=60) as held:
        h = baton.handoffs.create("agent-b", SUBJ, lease=held)
        moved = b.handoffs.resolve(h.handoff_id, "accepted").lease
    assert held.receipt_status == "handed_off"
    assert moved is not None
    info = b.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.lease.owner) == (moved.lease_id, "agent-b")


def test_handoff_rejected_after_block_exit_releases_the_lease(baton: Baton) -> None:
    """A handoff rejected after the sender's block ended releases the lease it carries
    (``released_lease``), so the resource is free at once."""
    with baton.lease(RT, RID, ttl_seconds=60) as held:
        h = baton.handoffs.create("agent-b", SUBJ, lease=held)
    assert held.receipt_status == "handed_off"
    rejected = baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, "rejected")
    assert rejected.released_lease is not None
    assert rejected.released_lease.lease_id == held.lease_id
    assert not baton.leases.inspect(RT, RID).held
    assert baton.as_principal("agent-c").leases.acquire(RT, RID, ttl_seconds=60).epoch > (
        held.epoch
    )


def test_handoff_expired_after_block_exit_releases_the_lease(baton: Baton) -> None:
    """A handoff that expires unaccepted after the sender's block ended releases the lease
    it carries; accepting it is then NOT_FOUND and the resource is free."""
    with baton.lease(RT, RID, ttl_seconds=60) as held:
        h = baton.handoffs.create("agent-b", SUBJ, lease=held, expires_in_seconds=1)
    assert held.receipt_status == "handed_off"
    pass_deadline(baton, h)
    with pytest.raises(NotFoundError):
        baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, "accepted")
    assert not baton.leases.inspect(RT, RID).held
    assert baton.as_principal("agent-c").leases.acquire(RT, RID, ttl_seconds=60).epoch > (
        held.epoch
    )


def test_failed_create_leaves_the_block_releasing(baton: Baton) -> None:
    """A create that fails (unknown checkpoint) leaves the block as it was: it still
    releases its lease on exit."""
    with baton.lease(RT, RID, ttl_seconds=60) as held:
        with pytest.raises(NotFoundError):
            baton.handoffs.create("agent-b", SUBJ, lease=held, checkpoint_id="ckpt_" + "0" * 32)
        assert held.handoff is None
    assert held.receipt_status == "released"
    assert not baton.leases.inspect(RT, RID).held


def test_async_block_exit_leaves_handed_off_lease_to_the_recipient(baton: Baton) -> None:
    """The same through :class:`AsyncBaton`: ``async with ab.lease(...)`` and
    ``await ab.handoffs.create(..., lease=held)``."""
    ab = AsyncBaton(sync=baton)
    ab_b = ab.as_principal("agent-b")

    async def main() -> tuple[int, int, str | None]:
        async with ab.lease(RT, RID, ttl_seconds=60) as held:
            h = await ab.handoffs.create("agent-b", SUBJ, lease=held)
        with pytest.raises(ConflictError):
            await ab.as_principal("agent-c").leases.acquire(RT, RID, ttl_seconds=60)
        done = await ab_b.handoffs.resolve(h.handoff_id, "accepted")
        assert done.lease is not None
        return held.epoch, done.lease.epoch, held.receipt_status

    old, new, receipt = asyncio.run(main())
    assert (new, receipt) == (old + 1, "handed_off")
