"""Handoffs (DESIGN.md "Handoffs"): inbox, target-only resolve, single resolution, expiry,
attached checkpoints, and lease transfer on acceptance."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from prefect_baton import (
    Baton,
    BatonError,
    Handoff,
    Lease,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)
from prefect_baton.testing import ManualClock, clock_of

from ._util import kinds, wait_until_expired

SUBJ = "report-2024"
RT = "delivery"
RID = "weekly-report"
EVIDENCE = [{"kind": "file", "uri": "file:///tmp/report.md"}]


def test_create_is_pending_with_fields(baton: Baton) -> None:
    """A created handoff is pending and keeps recipient, subject, context and message."""
    h = baton.handoffs.create("agent-b", SUBJ, context_id="ctx-1", message="please review")
    assert h.handoff_id
    assert h.status == "pending"
    assert (h.from_principal, h.to_principal, h.subject_id) == ("agent-a", "agent-b", SUBJ)
    assert (h.context_id, h.message) == ("ctx-1", "please review")
    assert h.resolved_at is None
    assert h.lease_id is None


def test_inbox_lists_only_handoffs_addressed_to_caller(baton: Baton) -> None:
    """The target's inbox lists the handoff; the sender's and a third principal's stay empty."""
    h = baton.handoffs.create("agent-b", SUBJ)
    assert [x.handoff_id for x in baton.as_principal("agent-b").handoffs.inbox()] == [h.handoff_id]
    assert baton.handoffs.inbox() == []
    assert baton.as_principal("agent-c").handoffs.inbox() == []


def test_handoff_to_principal_that_never_acted(baton: Baton) -> None:
    """A handoff may name a principal that has never acted; it sees and accepts it later."""
    h = baton.handoffs.create("brand-new-agent", SUBJ)
    newcomer = baton.as_principal("brand-new-agent")
    assert [x.handoff_id for x in newcomer.handoffs.inbox()] == [h.handoff_id]
    assert newcomer.handoffs.resolve(h.handoff_id, "accepted").status == "accepted"


def test_handoff_to_self_is_validation_error(baton: Baton) -> None:
    """A handoff addressed to its own sender is VALIDATION_ERROR and writes nothing."""
    with pytest.raises(ValidationError):
        baton.handoffs.create("agent-a", SUBJ)
    assert kinds(baton) == []
    assert baton.handoffs.inbox() == []


def test_accept(baton: Baton) -> None:
    """The target accepts: status accepted, note and resolved_at kept, inbox empties."""
    h = baton.handoffs.create("agent-b", SUBJ)
    b = baton.as_principal("agent-b")
    done = b.handoffs.resolve(h.handoff_id, "accepted", note="on it")
    assert (done.handoff_id, done.status, done.note) == (h.handoff_id, "accepted", "on it")
    assert done.resolved_at is not None
    assert b.handoffs.inbox() == []
    assert baton.handoffs.get(h.handoff_id).status == "accepted"


def test_reject(baton: Baton) -> None:
    """The target rejects: status rejected, and the sender sees it rejected."""
    h = baton.handoffs.create("agent-b", SUBJ)
    b = baton.as_principal("agent-b")
    done = b.handoffs.resolve(h.handoff_id, "rejected", note="not mine")
    assert done.status == "rejected"
    assert b.handoffs.inbox() == []
    assert baton.handoffs.get(h.handoff_id).status == "rejected"


@pytest.mark.parametrize("who", ["agent-a", "agent-c"])
def test_only_target_may_resolve(baton: Baton, who: str) -> None:
    """The sender or a third principal resolving is the seed's VALIDATION_ERROR "Only the
    target principal can resolve a handoff." and the handoff stays pending."""
    h = baton.handoffs.create("agent-b", SUBJ)
    other = baton.as_principal(who)
    for status in ("accepted", "rejected"):
        with pytest.raises(ValidationError) as ei:
            other.handoffs.resolve(h.handoff_id, status)
        assert ei.value.code == "VALIDATION_ERROR"
        assert ei.value.message == "Only the target principal can resolve a handoff."
    assert baton.handoffs.get(h.handoff_id).status == "pending"
    assert [x.handoff_id for x in baton.as_principal("agent-b").handoffs.inbox()] == [h.handoff_id]


@pytest.mark.parametrize("status", ["done", "ACCEPTED", "pending", "expired", "", None])
def test_unknown_status_is_validation_error(baton: Baton, status: object) -> None:
    """Resolving to anything but accepted/rejected is VALIDATION_ERROR and changes nothing."""
    h = baton.handoffs.create("agent-b", SUBJ)
    events = kinds(baton)
    with pytest.raises(ValidationError):
        baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, status)  # type: ignore[arg-type]
    assert baton.handoffs.get(h.handoff_id).status == "pending"
    assert kinds(baton) == events


@pytest.mark.parametrize(("first", "second"), [("accepted", "rejected"), ("accepted", "accepted")])
def test_second_resolve_is_not_found(baton: Baton, first: str, second: str) -> None:
    """Resolution matches only pending handoffs: a second resolve is NOT_FOUND and flips nothing."""
    h = baton.handoffs.create("agent-b", SUBJ)
    b = baton.as_principal("agent-b")
    b.handoffs.resolve(h.handoff_id, first)
    with pytest.raises(NotFoundError, match=f"was already {first}; only a pending handoff"):
        b.handoffs.resolve(h.handoff_id, second)
    assert baton.handoffs.get(h.handoff_id).status == first


def test_resolve_unknown_is_not_found(baton: Baton) -> None:
    """Resolving an unknown handoff id is NOT_FOUND."""
    with pytest.raises(NotFoundError):
        baton.handoffs.resolve("hoff_" + "0" * 32, "accepted")


def test_get_limited_to_sender_and_recipient(baton: Baton) -> None:
    """A handoff is readable by its sender and recipient; another agent gets NOT_FOUND."""
    h = baton.handoffs.create("agent-b", SUBJ)
    assert baton.as_principal("agent-b").handoffs.get(h.handoff_id).handoff_id == h.handoff_id
    with pytest.raises(NotFoundError):
        baton.as_principal("agent-c").handoffs.get(h.handoff_id)


def test_expired_handoff_cannot_be_resolved(baton: Baton) -> None:
    """A pending handoff past its expiry reads expired, leaves the inbox and cannot be resolved."""
    h = baton.handoffs.create("agent-b", SUBJ, expires_in_seconds=1)
    assert h.expires_at is not None
    b = baton.as_principal("agent-b")
    time.sleep(1.3)
    deadline = time.monotonic() + 10
    while baton.handoffs.get(h.handoff_id).status != "expired":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert b.handoffs.inbox() == []
    with pytest.raises(NotFoundError):
        b.handoffs.resolve(h.handoff_id, "accepted")


# ------------------------------------------------------------------------------- checkpoints


def test_recipient_reads_attached_checkpoint(baton: Baton) -> None:
    """The recipient can read the attached checkpoint by id, written by another principal."""
    ck = baton.checkpoints.save(SUBJ, "draft", {"sections": 3})
    h = baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck.checkpoint_id)
    assert h.checkpoint_id == ck.checkpoint_id
    got = baton.as_principal("agent-b").checkpoints.get_by_id(ck.checkpoint_id)
    assert (got.state, got.principal) == ({"sections": 3}, "agent-a")
    with pytest.raises(VersionConflictError):
        baton.as_principal("agent-b").checkpoints.save(SUBJ, "draft", {"x": 1}, expected_version=1)


def test_unknown_checkpoint_is_not_found(baton: Baton) -> None:
    """Attaching an unknown checkpoint id is NOT_FOUND and creates nothing."""
    with pytest.raises(NotFoundError):
        baton.handoffs.create("agent-b", SUBJ, checkpoint_id="ckpt_" + "0" * 32)
    assert baton.as_principal("agent-b").handoffs.inbox() == []
    assert kinds(baton) == []


def test_deleted_checkpoint_is_not_found(baton: Baton) -> None:
    """A handoff cannot carry a checkpoint its writer deleted: NOT_FOUND (saying so),
    nothing created, and the recipient still cannot read the checkpoint."""
    ck = baton.checkpoints.save(SUBJ, "draft", {"sections": 3})
    baton.checkpoints.delete(ck.checkpoint_id)
    before = kinds(baton)
    with pytest.raises(NotFoundError, match=f"^checkpoint {ck.checkpoint_id} was deleted$") as ei:
        baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck.checkpoint_id)
    assert ei.value.code == "NOT_FOUND"
    b = baton.as_principal("agent-b")
    assert b.handoffs.inbox() == []
    assert kinds(baton) == before
    with pytest.raises(NotFoundError):
        b.checkpoints.get_by_id(ck.checkpoint_id)


def test_expired_checkpoint_is_not_found(baton: Baton) -> None:
    """A handoff cannot carry a checkpoint past its TTL: NOT_FOUND, nothing created."""
    ck = baton.checkpoints.save(SUBJ, "draft", {"sections": 3}, ttl_seconds=1)
    try:
        clock: ManualClock | None = clock_of(baton)
    except ValueError:
        clock = None
    if clock is not None:
        clock.advance(1.001)
    else:
        time.sleep(1.2)
    while baton.checkpoints.get(SUBJ, "draft") is not None:  # the store's clock, not ours
        time.sleep(0.1)
    before = kinds(baton)
    with pytest.raises(NotFoundError, match=f"^checkpoint {ck.checkpoint_id} has expired$") as ei:
        baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck.checkpoint_id)
    assert ei.value.code == "NOT_FOUND"
    assert baton.as_principal("agent-b").handoffs.inbox() == []
    assert kinds(baton) == before


# ------------------------------------------------------------------------------- leases


def test_accept_transfers_lease(baton: Baton) -> None:
    """Accepting a handoff carrying a lease makes the recipient the holder with epoch +1."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, scopes=["out/**"], idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    assert h.lease_id == lease.lease_id
    b = baton.as_principal("agent-b")
    done = b.handoffs.resolve(h.handoff_id, "accepted")
    assert done.status == "accepted"
    moved = done.lease
    assert moved is not None
    assert moved.owner == "agent-b"
    assert moved.lease_id != lease.lease_id
    assert moved.epoch == lease.epoch + 1
    assert moved.execution_key not in (None, "w1")
    assert moved.scopes == ("out/**",)
    info = b.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == moved.lease_id
    assert b.leases.renew(moved).version == moved.version + 1


def test_get_of_an_accepted_handoff_gives_the_recipient_its_lease(baton: Baton) -> None:
    """``handoffs.get`` and ``list`` of an accepted lease-carrying handoff: the recipient
    (and an owner) reads ``lease``, the generation it was handed, as it stands (its
    renewals included); the sender, who no longer holds it, reads ``None``. Once the
    recipient's lease has ended, ``lease`` is that ended generation (what it was handed)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    b = baton.as_principal("agent-b")
    moved = b.handoffs.resolve(h.handoff_id, "accepted").lease
    assert moved is not None
    got = b.handoffs.get(h.handoff_id)
    assert got.status == "accepted"
    assert got.lease is not None
    assert (got.lease.lease_id, got.lease.owner, got.lease.epoch) == (
        moved.lease_id,
        "agent-b",
        lease.epoch + 1,
    )
    assert [x.lease for x in b.handoffs.list(status="accepted")] == [got.lease]
    assert baton.handoffs.get(h.handoff_id).lease is None  # the sender's view
    assert [x.lease for x in baton.handoffs.list(status="accepted")] == [None]
    boss = baton.as_principal("boss", role="owner")
    assert boss.handoffs.get(h.handoff_id).lease == got.lease
    assert [x.lease for x in boss.handoffs.list(party="*", status="any")] == [got.lease]
    renewed = b.leases.renew(moved)
    after = b.handoffs.get(h.handoff_id).lease
    assert after is not None
    assert (after.lease_id, after.version) == (moved.lease_id, renewed.version)
    b.leases.release(renewed)
    ended = b.handoffs.get(h.handoff_id).lease
    assert ended is not None
    assert (ended.lease_id, ended.status) == (moved.lease_id, "released")


def test_accept_with_execution_key_and_ttl(baton: Baton) -> None:
    """The recipient may name its execution key and TTL when accepting a lease."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    done = baton.as_principal("agent-b").handoffs.resolve(
        h.handoff_id, "accepted", execution_key="op-run-7", ttl_seconds=120
    )
    assert done.lease is not None
    assert (done.lease.execution_key, done.lease.ttl_seconds) == ("op-run-7", 120)


def test_accept_fences_out_old_holder(baton: Baton) -> None:
    """After acceptance the old holder cannot renew, release, or write fenced records."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    b = baton.as_principal("agent-b")
    moved = b.handoffs.resolve(h.handoff_id, "accepted").lease
    assert moved is not None
    with pytest.raises(LeaseLostError) as renewed:
        baton.leases.renew(lease)
    with pytest.raises(LeaseLostError) as released:
        baton.leases.release(lease)
    assert (renewed.value.status, released.value.status) == ("transferred", "transferred")
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save(SUBJ, "draft", {"late": True}, fence=lease)
    with pytest.raises(StaleFenceError):
        baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=lease)
    assert baton.checkpoints.get(SUBJ, "draft") is None
    assert baton.outcomes.list(SUBJ) == []
    assert b.checkpoints.save(SUBJ, "delivery", {"ok": True}, fence=moved).version == 1
    out = b.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=moved)
    assert out.fence_epoch == moved.epoch


def test_reject_releases_carried_lease(baton: Baton) -> None:
    """Rejecting a handoff that carries a lease releases the lease (recorded as
    lease.released before handoff.rejected) instead of leaving it held by nobody until its
    TTL; the resource is free at once and the sender's generation is over."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    done = baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, "rejected")
    assert (done.status, done.lease) == ("rejected", None)
    assert kinds(baton)[-2:] == ["lease.released", "handoff.rejected"]
    (released,) = baton.events.list(kind="lease.released")
    assert (released.payload["lease_id"], released.payload["status"]) == (
        lease.lease_id,
        "released",
    )
    assert not baton.leases.inspect(RT, RID).held
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    taker = baton.as_principal("agent-c").leases.acquire(RT, RID, ttl_seconds=60)
    assert taker.epoch == lease.epoch + 1


@pytest.mark.slow
def test_handoff_whose_carried_lease_ran_out_reads_expired(baton: Baton) -> None:
    """A pending handoff whose carried lease ran out reads expired, leaves the recipient's
    inbox and can no longer be resolved; one without a lease stays pending.

    The lease is held for an hour while the pending state is checked, and only then renewed
    to the shortest TTL to run out: on a loaded machine the steps before the wait may take
    longer than that TTL, which must not make the lease run out before they are checked."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=3600, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    plain = baton.handoffs.create("agent-b", "other-subject")
    b = baton.as_principal("agent-b")
    assert [x.handoff_id for x in b.handoffs.inbox()] == [h.handoff_id, plain.handoff_id]
    assert b.handoffs.get(h.handoff_id).status == "pending"
    lease = baton.leases.renew(lease, ttl_seconds=10)
    wait_until_expired(baton, lease)
    assert baton.handoffs.get(h.handoff_id).status == "expired"
    assert b.handoffs.get(h.handoff_id).status == "expired"
    assert [x.handoff_id for x in b.handoffs.inbox()] == [plain.handoff_id]
    for status in ("accepted", "rejected"):
        with pytest.raises(NotFoundError):
            b.handoffs.resolve(h.handoff_id, status)
    assert baton.handoffs.get(plain.handoff_id).status == "pending"


def _release(baton: Baton, lease: Lease) -> None:
    baton.leases.release(lease)


def _force_release(baton: Baton, lease: Lease) -> None:
    baton.as_principal("boss", role="admin").leases.force_release(lease.lease_id)


def _supersede(baton: Baton, lease: Lease) -> None:
    baton.leases.acquire(RT, RID, ttl_seconds=60)  # the holder's own keyless re-acquire


def _transfer(baton: Baton, lease: Lease) -> None:
    other = baton.handoffs.create("agent-c", SUBJ, lease=lease)
    baton.as_principal("agent-c").handoffs.resolve(other.handoff_id, "accepted")


@pytest.mark.parametrize(
    ("end", "how"),
    [
        (_release, "was released"),
        (_force_release, "was force-released"),
        (_supersede, "was re-acquired under a new generation"),
        (_transfer, "moved to another holder"),
    ],
    ids=["released", "force-released", "superseded", "transferred"],
)
def test_handoff_whose_carried_lease_ended_reads_expired(
    baton: Baton, end: Callable[[Baton, Lease], None], how: str
) -> None:
    """A pending handoff whose carried lease is no longer in effect (released by its
    sender, force-released, superseded by a re-acquire, moved by another accepted handoff)
    can never be accepted: it reads expired, leaves the inbox, a resolve is NOT_FOUND (the
    first one saying how the lease ended) and it is stored expired, with no lease released
    under it; one without a lease stays pending."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60)
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    plain = baton.handoffs.create("agent-b", "other-subject")
    end(baton, lease)
    released = len(baton.events.list(kind="lease.released"))
    b = baton.as_principal("agent-b")
    assert [x.handoff_id for x in b.handoffs.inbox()] == [plain.handoff_id]
    assert b.handoffs.get(h.handoff_id).status == "expired"
    with pytest.raises(NotFoundError, match=f"\\({lease.lease_id}\\) {how}"):
        b.handoffs.resolve(h.handoff_id, "accepted")
    for status in ("accepted", "rejected"):
        with pytest.raises(NotFoundError):
            b.handoffs.resolve(h.handoff_id, status)
    assert [x.handoff_id for x in b.handoffs.list(status="expired")] == [h.handoff_id]
    assert b.handoffs.list(status="pending") == [b.handoffs.get(plain.handoff_id)]
    assert len(baton.events.list(kind="lease.released")) == released
    assert baton.handoffs.get(plain.handoff_id).status == "pending"


def test_sweep_stores_a_handoff_whose_carried_lease_was_released_expired(
    baton: Baton,
) -> None:
    """The sweep (report_expired) ends a pending handoff whose carried lease its sender
    released, as it ends one past its own expiry: afterwards it is stored expired (a
    resolve finds it resolved, not pending)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    baton.leases.release(lease)
    baton.leases.report_expired()
    assert baton.handoffs.get(h.handoff_id).status == "expired"
    assert baton.as_principal("agent-b").handoffs.inbox() == []
    with pytest.raises(
        NotFoundError,
        match=f"has expired: the lease it carries \\({lease.lease_id}\\) was released",
    ):
        baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, "accepted")
    with pytest.raises(NotFoundError, match=r"^pending handoff .* not found$"):  # not a party
        baton.as_principal("agent-c").handoffs.resolve(h.handoff_id, "accepted")


def test_create_with_lease_not_held(baton: Baton) -> None:
    """A handoff cannot carry a lease the sender does not hold (released or someone else's)."""
    mine = baton.leases.acquire(RT, RID, ttl_seconds=60)
    baton.leases.release(mine)
    with pytest.raises(LeaseLostError):
        baton.handoffs.create("agent-b", SUBJ, lease=mine)
    theirs = baton.as_principal("agent-c").leases.acquire(RT, "other", ttl_seconds=60)
    with pytest.raises(NotFoundError):
        baton.handoffs.create("agent-b", SUBJ, lease=theirs)
    assert baton.as_principal("agent-b").handoffs.inbox() == []


def test_create_with_forged_execution_key_is_lost(baton: Baton) -> None:
    """A handoff carrying the sender's lease under another execution key is LEASE_LOST."""
    mine = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="run-1")
    for key in ("run-x", None):
        with pytest.raises(LeaseLostError):
            baton.handoffs.create(
                "agent-b", SUBJ, lease=mine.model_copy(update={"execution_key": key})
            )
    assert baton.as_principal("agent-b").handoffs.inbox() == []
    assert kinds(baton) == ["lease.acquired"]


def test_accept_with_lease_is_atomic_in_events(baton: Baton) -> None:
    """Accepting a lease handoff appends lease.transferred then handoff.accepted."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    baton.as_principal("agent-b").handoffs.resolve(h.handoff_id, "accepted")
    assert kinds(baton) == [
        "lease.acquired",
        "handoff.created",
        "lease.transferred",
        "handoff.accepted",
    ]


def test_lease_moves_only_once(baton: Baton) -> None:
    """Of two handoffs carrying one lease only the first accepted moves it; the other then
    reads expired and cannot be accepted (NOT_FOUND)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60, idempotency_key="w1")
    h1 = baton.handoffs.create("agent-b", SUBJ, lease=lease)
    h2 = baton.handoffs.create("agent-c", SUBJ, lease=lease)
    moved = baton.as_principal("agent-b").handoffs.resolve(h1.handoff_id, "accepted").lease
    assert moved is not None
    with pytest.raises(NotFoundError, match="moved to another holder"):
        baton.as_principal("agent-c").handoffs.resolve(h2.handoff_id, "accepted")
    assert baton.handoffs.get(h2.handoff_id).status == "expired"
    info = baton.as_principal("agent-b").leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == moved.lease_id


def test_handoff_keeps_its_parameters(baton: Baton) -> None:
    """Parameters for the recipient's run are stored with the handoff and read back by the
    recipient (inbox and get); a handoff without them reads ``None``; a non-object or
    parameters over the size cap are VALIDATION_ERROR naming `parameters` and write nothing."""
    params = {"report": "r1", "sections": [1, 2], "nested": {"a": None}}
    h = baton.handoffs.create("agent-b", SUBJ, parameters=params, idempotency_key="p1")
    assert h.parameters == params
    b = baton.as_principal("agent-b")
    assert b.handoffs.get(h.handoff_id).parameters == params
    assert [x.parameters for x in b.handoffs.inbox()] == [params]
    again = baton.handoffs.create("agent-b", SUBJ, parameters=params, idempotency_key="p1")
    assert (again.replayed, again.handoff_id) == (True, h.handoff_id)
    assert baton.handoffs.create("agent-b", "plain").parameters is None
    before = kinds(baton)
    with pytest.raises(ValidationError, match=r"^parameters must be a JSON object"):
        baton.handoffs.create("agent-b", SUBJ, parameters=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"^parameters is \d+ bytes of JSON"):
        baton.handoffs.create("agent-b", SUBJ, parameters={"big": "x" * (2 * 1024 * 1024)})
    assert kinds(baton) == before


RACERS = 6


def _race(calls: list[Callable[[], object]]) -> list[object]:
    """Run ``calls`` at once from as many threads; each result, or the error it raised."""
    start = threading.Barrier(len(calls))
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = calls[i]()
        except BatonError as err:
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("status", ["accepted", "rejected"])
def test_concurrent_resolves_of_a_lease_handoff_have_one_winner(baton: Baton, status: str) -> None:
    """Six resolves of one lease-carrying handoff at once (accepts under six execution
    keys, or rejects), five rounds: exactly one succeeds and the others are NOT_FOUND,
    every arm. An accept leaves the lease with the winner's execution key (no two runs
    hold one fencing token); a reject leaves the handoff rejected and its lease released
    once, with one handoff.rejected event (no request answered 4xx after releasing it)."""
    b = baton.as_principal("agent-b")
    for rnd in range(5):
        lease = baton.leases.acquire(RT, f"race-{rnd}", ttl_seconds=60, idempotency_key="w")
        h = baton.handoffs.create("agent-b", SUBJ, lease=lease)
        results = _race(
            [
                lambda k=k, hid=h.handoff_id: b.handoffs.resolve(
                    hid, status, execution_key=f"run-{k}"
                )
                for k in range(RACERS)
            ]
        )
        wins = [r for r in results if isinstance(r, Handoff)]
        assert len(wins) == 1, results
        assert all(isinstance(r, NotFoundError) for r in results if r is not wins[0]), results
        assert baton.handoffs.get(h.handoff_id).status == status
        info = b.leases.inspect(RT, f"race-{rnd}")  # the holder's view shows the lease
        if status == "accepted":
            moved = wins[0].lease
            assert moved is not None
            assert info.lease is not None
            assert (info.lease.lease_id, info.lease.owner) == (moved.lease_id, "agent-b")
            assert info.lease.execution_key == moved.execution_key
        else:
            assert not info.held
            ended = [
                e
                for e in baton.events.list(kind="lease.released")
                if e.payload.get("lease_id") == lease.lease_id
            ]
            assert len(ended) == 1
            rejected = [
                e
                for e in baton.events.list(kind="handoff.rejected")
                if e.payload.get("handoff_id") == h.handoff_id
            ]
            assert len(rejected) == 1
