"""Idempotency keys and receipts (DESIGN.md "Idempotency and receipts")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from prefect_baton import (
    Baton,
    BatonError,
    ConflictError,
    ForbiddenError,
    IdempotencyInFlightError,
    IdempotencyMismatchError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
    ValidationError,
)
from prefect_baton._stores.ledger import receipts

from ._util import kinds, wait_until_expired

RT = "deploy"
RID = "checkout-service"
EVIDENCE = [{"kind": "file", "uri": "file:///tmp/report.md", "digest": "sha256:00"}]


# ------------------------------------------------------------------------------- acquire


def test_exact_retry_replays_acquire(baton: Baton) -> None:
    """An exact retry of a keyed acquire replays it: same lease, replayed=True, no new event."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30, purpose="p", idempotency_key="run-1")
    assert not first.replayed
    events = kinds(baton)
    again = baton.leases.acquire(RT, RID, ttl_seconds=30, purpose="p", idempotency_key="run-1")
    assert again.replayed
    assert (again.lease_id, again.epoch, again.execution_key) == (
        first.lease_id,
        first.epoch,
        "run-1",
    )
    assert kinds(baton) == events
    assert events.count("lease.acquired") == 1


def test_retry_of_cas_acquire_replays(baton: Baton) -> None:
    """An exact retry of an expected_version=0 acquire replays instead of failing its own CAS."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30, expected_version=0, idempotency_key="r")
    again = baton.leases.acquire(RT, RID, ttl_seconds=30, expected_version=0, idempotency_key="r")
    assert again.replayed
    assert again.lease_id == first.lease_id


def test_replay_after_renewal_reports_current_lease(baton: Baton) -> None:
    """A replay after renewals returns the lease as it now stands (current version and expiry)."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    renewed = baton.leases.renew(baton.leases.renew(first))
    again = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert again.replayed
    assert (again.lease_id, again.epoch) == (first.lease_id, first.epoch)
    assert again.version == renewed.version
    assert again.expires_at == renewed.expires_at


@pytest.mark.parametrize(
    "change",
    [
        {"ttl_seconds": 60},
        {"purpose": "something else"},
        {"scopes": ["docs/**"]},
        {"expected_version": 0},
    ],
    ids=["ttl", "purpose", "scopes", "expected_version"],
)
def test_changed_request_is_mismatch(baton: Baton, change: dict[str, Any]) -> None:
    """Reusing an execution key for a different acquire is IDEMPOTENCY_MISMATCH, nothing written."""
    request: dict[str, Any] = {"ttl_seconds": 30, "purpose": "p", "scopes": ["src/**"]}
    first = baton.leases.acquire(RT, RID, idempotency_key="run-1", **request)
    events = kinds(baton)
    with pytest.raises(IdempotencyMismatchError) as ei:
        baton.leases.acquire(RT, RID, idempotency_key="run-1", **{**request, **change})
    assert ei.value.code == "IDEMPOTENCY_MISMATCH"
    # The key an acquire's receipt is kept under is its execution key: the message says so.
    assert str(ei.value).startswith(
        "execution key 'run-1' was used for a different acquire request of this resource"
    ), str(ei.value)
    assert kinds(baton) == events
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (first.lease_id, first.version)


def test_mismatch_after_release_writes_nothing(baton: Baton) -> None:
    """A changed request under a used key is a mismatch even after release, and acquires nothing."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    baton.leases.release(lease)
    events = kinds(baton)
    with pytest.raises(IdempotencyMismatchError):
        baton.leases.acquire(RT, RID, ttl_seconds=45, idempotency_key="run-1")
    assert kinds(baton) == events
    assert not baton.leases.inspect(RT, RID).held


def test_replay_does_not_revive_released_lease(baton: Baton) -> None:
    """A replayed acquire whose lease was since released is LEASE_LOST and acquires nothing."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    baton.leases.release(lease)
    events = kinds(baton)
    with pytest.raises(LeaseLostError) as ei:
        baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert ei.value.code == "LEASE_LOST"
    assert ei.value.status == "released"
    assert kinds(baton) == events
    assert not baton.leases.inspect(RT, RID).held


def test_replay_does_not_revive_transferred_lease(baton: Baton) -> None:
    """A replayed acquire whose lease was since transferred is LEASE_LOST; the receiver keeps it."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    moved = baton.leases.transfer(
        lease, to_principal="agent-b", new_execution_key="run-2", ttl_seconds=30
    )
    with pytest.raises(LeaseLostError) as ei:
        baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert ei.value.status == "transferred"  # how it ended, e.g. for a Prefect retry
    info = baton.as_principal("agent-b").leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == moved.lease_id


def test_replay_does_not_revive_revoked_lease(baton: Baton) -> None:
    """A replayed acquire whose lease was force-released is LEASE_LOST."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    baton.as_principal("boss", role="admin").leases.force_release(lease.lease_id)
    with pytest.raises(LeaseLostError) as ei:
        baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert ei.value.status == "revoked"
    assert not baton.leases.inspect(RT, RID).held


def test_agent_force_release_is_forbidden_before_its_key(baton: Baton) -> None:
    """An agent's force release is FORBIDDEN, never IDEMPOTENCY_MISMATCH, even under a key
    its principal used for another force release as admin: every store checks the role
    before it looks at the receipt, and writes nothing."""
    one = baton.leases.acquire(RT, RID, ttl_seconds=30)
    two = baton.leases.acquire(RT, "svc-2", ttl_seconds=30)
    admin = baton.as_principal("boss", role="admin")
    admin.leases.force_release(one.lease_id, idempotency_key="k-1")
    with pytest.raises(ForbiddenError):
        baton.as_principal("boss", role="agent").leases.force_release(
            two.lease_id, idempotency_key="k-1"
        )
    assert baton.leases.inspect(RT, "svc-2").held


def test_key_identity_includes_principal(baton: Baton) -> None:
    """Another principal using the holder's key is a different identity: CONFLICT, not a replay."""
    baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    with pytest.raises(ConflictError):
        baton.as_principal("agent-b").leases.acquire(
            RT, RID, ttl_seconds=30, idempotency_key="run-1"
        )


def test_key_identity_includes_resource(baton: Baton) -> None:
    """The same execution key on another resource is a separate acquire, not a replay."""
    first = baton.leases.acquire(RT, "svc-1", ttl_seconds=30, idempotency_key="run-1")
    second = baton.leases.acquire(RT, "svc-2", ttl_seconds=30, idempotency_key="run-1")
    assert not second.replayed
    assert second.lease_id != first.lease_id
    assert (second.resource_id, second.epoch) == ("svc-2", 1)


def test_failed_validation_stores_no_receipt(baton: Baton) -> None:
    """A keyed request that failed validation stores nothing: a corrected request then runs."""
    with pytest.raises(ValidationError):
        baton.leases.acquire(RT, RID, ttl_seconds=5, idempotency_key="run-1")
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert not lease.replayed
    assert lease.version == 1


def test_refused_acquire_stores_no_receipt(baton: Baton) -> None:
    """A keyed acquire refused with CONFLICT stores nothing: the same request later acquires."""
    held = baton.leases.acquire(RT, RID, ttl_seconds=30)
    b = baton.as_principal("agent-b")
    with pytest.raises(ConflictError):
        b.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-b")
    baton.leases.release(held)
    lease = b.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-b")
    assert not lease.replayed
    assert lease.owner == "agent-b"


def test_concurrent_duplicates_run_once(baton: Baton) -> None:
    """Eight concurrent copies of one keyed acquire yield one lease and one acquired event."""
    n = 8
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
        except BatonError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errors = [r for r in results if isinstance(r, BatonError)]
    # A duplicate may be refused while the first is in flight, but never run twice.
    assert all(e.code == "IDEMPOTENCY_IN_FLIGHT" for e in errors), errors
    leases = [r for r in results if not isinstance(r, BatonError)]
    assert leases
    assert len({lease.lease_id for lease in leases}) == 1
    assert sum(not lease.replayed for lease in leases) <= 1
    assert kinds(baton) == ["lease.acquired"]


# ---------------------------------------------------------------- attempts of one execution


def test_concurrent_attempts_of_one_execution_run_one_body(baton: Baton) -> None:
    """Ten blocks entered at once under one execution key run one body; the other nine are
    refused with IDEMPOTENCY_IN_FLIGHT while it holds the lease (DESIGN.md "Leases")."""
    n = 10
    barrier = threading.Barrier(n)
    done = threading.Condition()
    finished: list[int] = []
    bodies: list[int] = []
    codes: list[str] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            with baton.lease("task", "A9", ttl_seconds=30, idempotency_key="run-123"):
                bodies.append(i)
                with done:  # hold the lease until every other attempt has been answered
                    done.wait_for(lambda: len(finished) >= n - 1, timeout=60)
        except BatonError as exc:
            codes.append(exc.code)
        finally:
            with done:
                finished.append(i)
                done.notify_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(bodies) == 1
    assert codes == ["IDEMPOTENCY_IN_FLIGHT"] * (n - 1)
    assert kinds(baton) == ["lease.acquired", "lease.released"]


def test_same_attempt_replays_and_another_is_in_flight(baton: Baton) -> None:
    """An exact retry by the same attempt replays (same lease id and epoch); another
    attempt, or an anonymous one, is refused IDEMPOTENCY_IN_FLIGHT and writes nothing."""
    kw: dict[str, Any] = {"ttl_seconds": 30, "idempotency_key": "run-123"}
    first = baton.leases.acquire(RT, RID, attempt="attempt-1", **kw)
    events = kinds(baton)
    again = baton.leases.acquire(RT, RID, attempt="attempt-1", **kw)
    assert again.replayed
    assert (again.lease_id, again.epoch) == (first.lease_id, first.epoch)
    for other in ("attempt-2", None):
        with pytest.raises(IdempotencyInFlightError) as ei:
            baton.leases.acquire(RT, RID, attempt=other, **kw)
        assert ei.value.code == "IDEMPOTENCY_IN_FLIGHT"
    assert kinds(baton) == events
    with pytest.raises(IdempotencyInFlightError):
        baton.leases.acquire_many([(RT, RID), (RT, "other")], attempt="attempt-2", **kw)
    assert not baton.leases.inspect(RT, "other").held
    many = baton.leases.acquire_many([(RT, RID), (RT, "other")], attempt="attempt-1", **kw)
    assert [m.replayed for m in many] == [True, False]
    assert many[0].lease_id == first.lease_id


def test_new_attempt_takes_over_after_expiry_with_new_epoch(baton: Baton) -> None:
    """Once the holding attempt's lease expired, another attempt of the execution takes
    over with a new generation and a higher epoch; the old attempt's fenced write is then
    STALE_FENCE, and its retry is IDEMPOTENCY_IN_FLIGHT."""
    kw: dict[str, Any] = {"ttl_seconds": 10, "idempotency_key": "run-123"}
    old = baton.leases.acquire(RT, RID, attempt="attempt-1", **kw)
    with pytest.raises(IdempotencyInFlightError):
        baton.leases.acquire(RT, RID, attempt="attempt-2", **kw)
    wait_until_expired(baton, old)
    new = baton.leases.acquire(RT, RID, attempt="attempt-2", **kw)
    assert not new.replayed
    assert new.lease_id != old.lease_id
    assert new.epoch > old.epoch
    assert new.execution_key == "run-123"
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save("subj", "progress", {"n": 1}, fence=old)
    with pytest.raises(IdempotencyInFlightError):
        baton.leases.acquire(RT, RID, attempt="attempt-1", **kw)
    again = baton.leases.acquire(RT, RID, attempt="attempt-2", **kw)
    assert again.replayed
    assert again.lease_id == new.lease_id
    assert baton.checkpoints.save("subj", "progress", {"n": 1}, fence=new).version == 1


@pytest.mark.parametrize("recipient", ["holds", "released"])
def test_no_attempt_acquires_again_after_a_transfer(baton: Baton, recipient: str) -> None:
    """Once the lease of an execution was transferred (its work went to the recipient),
    every attempt of that execution is refused LEASE_LOST with status ``transferred``:
    another process of it does not take the resource again, even after the recipient
    released it; nothing is written."""
    kw: dict[str, Any] = {"ttl_seconds": 30, "idempotency_key": "run-123"}
    old = baton.leases.acquire(RT, RID, attempt="attempt-1", **kw)
    reviewer = baton.as_principal("reviewer")
    moved = baton.leases.transfer(
        old, to_principal="reviewer", new_execution_key="review-1", ttl_seconds=30
    )
    if recipient == "released":
        reviewer.leases.release(moved)
    events = kinds(baton)
    for attempt in ("attempt-1", "attempt-2", None):
        with pytest.raises(LeaseLostError) as info:
            baton.leases.acquire(RT, RID, attempt=attempt, **kw)
        assert info.value.code == "LEASE_LOST"
        assert info.value.status == "transferred"
    with pytest.raises(LeaseLostError):
        baton.leases.acquire_many([(RT, RID), (RT, "other")], attempt="attempt-2", **kw)
    assert not baton.leases.inspect(RT, "other").held
    assert kinds(baton) == events
    assert baton.leases.inspect(RT, RID).held is (recipient == "holds")


def test_block_retries_its_acquire_after_a_lost_response(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block whose acquire was granted but whose response was lost (UNAVAILABLE) retries
    it under its own attempt: the grant comes back replayed and the body runs."""
    authority = baton.authority
    acquire = authority.acquire
    granted: list[Any] = []

    def lost_response(*args: Any, **kwargs: Any) -> Any:
        lease = acquire(*args, **kwargs)
        if not granted:
            granted.append(lease)
            raise UnavailableError("the response was lost")
        return lease

    monkeypatch.setattr(authority, "acquire", lost_response)
    with baton.lease(RT, RID, ttl_seconds=30, idempotency_key="run-123") as held:
        assert held.lease.replayed
        assert (held.lease_id, held.epoch) == (granted[0].lease_id, granted[0].epoch)
    assert held.receipt_status == "released"


def test_block_without_key_is_not_superseded(baton: Baton) -> None:
    """A block without an execution key uses a fresh one: a second block of the same
    principal is refused CONFLICT instead of superseding the first."""
    with baton.lease(RT, RID, ttl_seconds=30) as first:
        assert first.execution_key is not None
        with pytest.raises(ConflictError), baton.lease(RT, RID, ttl_seconds=30):
            pytest.fail("the second block entered")
        info = baton.leases.inspect(RT, RID)
        assert info.lease is not None
        assert info.lease.lease_id == first.lease_id
    assert first.receipt_status == "released"


def test_same_key_for_different_operations(baton: Baton) -> None:
    """An idempotency key's identity includes the operation: one key serves several operations."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="k")
    ck = baton.checkpoints.save("subj", "progress", {"n": 1}, idempotency_key="k")
    out = baton.outcomes.record("subj", "succeeded", evidence=EVIDENCE, idempotency_key="k")
    assert [lease.replayed, ck.replayed, out.replayed] == [False, False, False]


def test_prune_keeps_fresh_receipts(baton: Baton) -> None:
    """Pruning removes only receipts past retention: a fresh receipt still replays (over
    REST pruning is not offered: FORBIDDEN, and the receipt replays all the same)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    if baton.authority.bound_caller() is not None:  # the REST API
        with pytest.raises(ForbiddenError):
            baton.prune_receipts()
    else:
        pruned = baton.prune_receipts()
        assert isinstance(pruned, int)
        assert pruned >= 0
    again = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    assert again.replayed
    assert again.lease_id == lease.lease_id


# ------------------------------------------------------------------------------- other writes


def test_checkpoint_save_replay_and_mismatch(baton: Baton) -> None:
    """A keyed checkpoint save replays exactly once; a changed state under the key is a mismatch."""
    first = baton.checkpoints.save("subj", "progress", {"n": 1}, idempotency_key="save-1")
    again = baton.checkpoints.save("subj", "progress", {"n": 1}, idempotency_key="save-1")
    assert again.replayed
    assert (again.checkpoint_id, again.version) == (first.checkpoint_id, 1)
    assert len(baton.checkpoints.history("subj", "progress")) == 1
    assert kinds(baton) == ["checkpoint.saved"]
    with pytest.raises(IdempotencyMismatchError):
        baton.checkpoints.save("subj", "progress", {"n": 2}, idempotency_key="save-1")
    current = baton.checkpoints.get("subj", "progress")
    assert current is not None
    assert (current.version, current.state) == (1, {"n": 1})


def test_handoff_create_replay_and_mismatch(baton: Baton) -> None:
    """A keyed handoff create replays (one handoff); a changed message is a mismatch."""
    first = baton.handoffs.create("agent-b", "subj", message="over to you", idempotency_key="h-1")
    again = baton.handoffs.create("agent-b", "subj", message="over to you", idempotency_key="h-1")
    assert again.replayed
    assert again.handoff_id == first.handoff_id
    with pytest.raises(IdempotencyMismatchError):
        baton.handoffs.create("agent-b", "subj", message="changed", idempotency_key="h-1")
    inbox = baton.as_principal("agent-b").handoffs.inbox()
    assert [h.handoff_id for h in inbox] == [first.handoff_id]
    assert kinds(baton) == ["handoff.created"]


def test_outcome_record_replay_and_mismatch(baton: Baton) -> None:
    """A keyed outcome record replays (one outcome); changed evidence is a mismatch."""
    first = baton.outcomes.record("subj", "succeeded", evidence=EVIDENCE, idempotency_key="o-1")
    again = baton.outcomes.record("subj", "succeeded", evidence=EVIDENCE, idempotency_key="o-1")
    assert again.replayed
    assert again.outcome_id == first.outcome_id
    with pytest.raises(IdempotencyMismatchError):
        baton.outcomes.record(
            "subj", "succeeded", evidence=[{"kind": "file", "uri": "other"}], idempotency_key="o-1"
        )
    assert [o.outcome_id for o in baton.outcomes.list("subj")] == [first.outcome_id]
    assert kinds(baton) == ["outcome.recorded"]


# ------------------------------------------------------------ release, renew, transfer, resolve
#
# Each case sets up one operation and gives ``call(key, variant)``: ``"ok"`` the request,
# ``"changed"`` a different request under the same key, ``"bad"`` a request that fails
# (VERSION_CONFLICT, NOT_FOUND or VALIDATION_ERROR).


@dataclass
class Case:
    """One keyed operation under test."""

    actor: Baton
    call: Callable[[str | None, str], Any]
    rerun: Callable[[str], None]  # checks the answer of running "ok" again under a key
    other: Callable[[str], Any]  # the "ok" request by another principal under ``key``


def _release(b: Baton) -> Case:
    lease = b.leases.acquire(RT, RID, ttl_seconds=30)
    bad_version = lease.version + 7

    def call(key: str | None, variant: str) -> Any:
        ev = {"ok": None, "changed": lease.version, "bad": bad_version}[variant]
        return b.leases.release(lease, expected_version=ev, idempotency_key=key)

    def rerun(key: str) -> None:
        again = b.leases.release(lease, idempotency_key=key)
        assert (again.status, again.replayed) == ("no_change", False)

    def other(key: str) -> Any:
        return b.as_principal("agent-b").leases.release(lease, idempotency_key=key)

    return Case(b, call, rerun, other)


def _release_by_id(b: Baton) -> Case:
    one = b.leases.acquire(RT, RID, ttl_seconds=30)
    two = b.leases.acquire(RT, "svc-2", ttl_seconds=30)

    def call(key: str | None, variant: str) -> Any:
        lid = {"ok": one.lease_id, "changed": two.lease_id, "bad": "lease-unknown"}[variant]
        return b.leases.release_by_id(lid, idempotency_key=key)

    def rerun(key: str) -> None:
        try:
            receipt = b.leases.release_by_id(one.lease_id, idempotency_key=key)
        except NotFoundError:
            return
        assert receipt.status == "no_change"

    def other(key: str) -> Any:
        return b.as_principal("agent-b").leases.release_by_id(one.lease_id, idempotency_key=key)

    return Case(b, call, rerun, other)


def _force_release(b: Baton) -> Case:
    one = b.leases.acquire(RT, RID, ttl_seconds=30)
    two = b.leases.acquire(RT, "svc-2", ttl_seconds=30)
    boss = b.as_principal("boss", role="admin")

    def call(key: str | None, variant: str) -> Any:
        lid = {"ok": one.lease_id, "changed": two.lease_id, "bad": "lease-unknown"}[variant]
        return boss.leases.force_release(lid, idempotency_key=key)

    def rerun(key: str) -> None:
        with pytest.raises(NotFoundError):
            boss.leases.force_release(one.lease_id, idempotency_key=key)

    def other(key: str) -> Any:
        return b.as_principal("boss-2", role="admin").leases.force_release(
            one.lease_id, idempotency_key=key
        )

    return Case(boss, call, rerun, other)


def _renew(b: Baton) -> Case:
    lease = b.leases.acquire(RT, RID, ttl_seconds=30)
    bad_version = lease.version + 7

    def call(key: str | None, variant: str) -> Any:
        ttl, ev = {"ok": (40, None), "changed": (50, None), "bad": (40, bad_version)}[variant]
        return b.leases.renew(lease, ttl_seconds=ttl, expected_version=ev, idempotency_key=key)

    def rerun(key: str) -> None:
        before = b.leases.inspect(RT, RID).version
        again = b.leases.renew(lease, ttl_seconds=40, idempotency_key=key)
        assert not again.replayed
        assert again.version == before + 1

    def other(key: str) -> Any:
        return b.as_principal("agent-b").leases.renew(lease, ttl_seconds=40, idempotency_key=key)

    return Case(b, call, rerun, other)


def _transfer(b: Baton) -> Case:
    lease = b.leases.acquire(RT, RID, ttl_seconds=30)
    bad_version = lease.version + 7

    def call(key: str | None, variant: str) -> Any:
        to, ev = {"ok": ("agent-b", None), "changed": ("agent-c", None)}.get(
            variant, ("agent-b", bad_version)
        )
        return b.leases.transfer(
            lease,
            to_principal=to,
            new_execution_key="moved-1",
            ttl_seconds=30,
            expected_version=ev,
            idempotency_key=key,
        )

    def rerun(key: str) -> None:
        with pytest.raises(LeaseLostError):
            call(key, "ok")

    def other(key: str) -> Any:
        return b.as_principal("agent-c").leases.transfer(
            lease,
            to_principal="agent-b",
            new_execution_key="moved-1",
            ttl_seconds=30,
            idempotency_key=key,
        )

    return Case(b, call, rerun, other)


def _resolve(b: Baton) -> Case:
    handoff = b.handoffs.create("agent-b", "subj", message="over to you")
    target = b.as_principal("agent-b")

    def call(key: str | None, variant: str) -> Any:
        if variant == "bad":  # a TTL below the minimum: VALIDATION_ERROR
            return target.handoffs.resolve(
                handoff.handoff_id, "accepted", "n", ttl_seconds=5, idempotency_key=key
            )
        status = "accepted" if variant == "ok" else "rejected"
        return target.handoffs.resolve(handoff.handoff_id, status, "n", idempotency_key=key)

    def rerun(key: str) -> None:
        # the handoff reads as this request resolved it: the retry replays it
        again = call(key, "ok")
        assert (again.status, again.note, again.replayed) == ("accepted", "n", True)

    def other(key: str) -> Any:
        return b.as_principal("agent-c").handoffs.resolve(
            handoff.handoff_id, "accepted", "n", idempotency_key=key
        )

    return Case(target, call, rerun, other)


CASES = {
    "release": _release,
    "release_by_id": _release_by_id,
    "force_release": _force_release,
    "renew": _renew,
    "transfer": _transfer,
    "resolve": _resolve,
}
OPS = pytest.mark.parametrize("make", list(CASES.values()), ids=list(CASES))


def _state(b: Baton) -> tuple[list[str], Any, Any]:
    """The org's event kinds and the two resources' lease info (what an operation changes)."""
    return kinds(b), b.leases.inspect(RT, RID), b.leases.inspect(RT, "svc-2")


@OPS
def test_exact_retry_replays(baton: Baton, make: Callable[[Baton], Case]) -> None:
    """An exact retry of a keyed release/renew/transfer/force release/resolve returns the
    stored result marked replayed, and changes nothing (no second transition or event)."""
    case = make(baton)
    first = case.call("op-1", "ok")
    assert not first.replayed
    state = _state(baton)
    again = case.call("op-1", "ok")
    assert again.replayed
    assert again.model_dump(exclude={"replayed"}) == first.model_dump(exclude={"replayed"})
    assert _state(baton) == state


@OPS
def test_changed_request_under_key_is_mismatch(baton: Baton, make: Callable[[Baton], Case]) -> None:
    """A different request under a used key is IDEMPOTENCY_MISMATCH and writes nothing."""
    case = make(baton)
    case.call("op-1", "ok")
    state = _state(baton)
    with pytest.raises(IdempotencyMismatchError) as ei:
        case.call("op-1", "changed")
    assert ei.value.code == "IDEMPOTENCY_MISMATCH"
    assert str(ei.value).startswith("idempotency key 'op-1' was used for a different "), str(
        ei.value
    )
    assert _state(baton) == state


@OPS
def test_failed_operation_stores_nothing(baton: Baton, make: Callable[[Baton], Case]) -> None:
    """A keyed request that fails keeps no receipt: the corrected request under the same key
    then really runs (not replayed, not a mismatch)."""
    case = make(baton)
    state = _state(baton)
    with pytest.raises(BatonError) as ei:
        case.call("op-1", "bad")
    assert ei.value.code in ("VERSION_CONFLICT", "NOT_FOUND", "VALIDATION_ERROR")
    assert _state(baton) == state
    result = case.call("op-1", "ok")
    assert not result.replayed
    assert _state(baton) != state


@OPS
def test_other_principal_same_key_is_independent(
    baton: Baton, make: Callable[[Baton], Case]
) -> None:
    """Another principal's request under the same key is not a replay of the first
    principal's receipt: it gets its own answer (here a refusal, as without a key)."""
    case = make(baton)
    first = case.call("op-1", "ok")
    assert not first.replayed
    with pytest.raises((NotFoundError, LeaseLostError, ForbiddenError)):
        case.other("op-1")


@OPS
def test_duplicate_in_flight_is_refused(
    baton: Baton, make: Callable[[Baton], Case], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate sent while the first request under the key is still in flight (done, its
    receipt not yet stored) is IDEMPOTENCY_IN_FLIGHT and runs nothing; afterwards the
    retry replays."""
    case = make(baton)
    seen: list[BaseException | Any] = []
    complete = receipts._complete

    def hooked(*args: Any) -> None:
        if not seen:
            try:
                seen.append(case.call("op-1", "ok"))
            except BatonError as exc:
                seen.append(exc)
        complete(*args)

    monkeypatch.setattr(receipts, "_complete", hooked)
    first = case.call("op-1", "ok")
    monkeypatch.undo()
    assert len(seen) == 1
    assert isinstance(seen[0], IdempotencyInFlightError), seen
    assert seen[0].code == "IDEMPOTENCY_IN_FLIGHT"
    state = _state(baton)
    again = case.call("op-1", "ok")
    assert again.replayed
    assert again.model_dump(exclude={"replayed"}) == first.model_dump(exclude={"replayed"})
    assert _state(baton) == state


@OPS
def test_lapsed_claim_lets_retry_run(
    baton: Baton, make: Callable[[Baton], Case], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash window: a process that dies after the operation but before storing the
    receipt leaves a claim; once it has lapsed, a retry runs the operation again and gets
    that operation's own answer (no_change, extends again, LEASE_LOST), except a resolve,
    which finds the handoff resolved as it asked and replays it."""
    case = make(baton)

    def died(*_args: Any) -> None:
        """The receipt is never stored (the claim stays behind, as after a crash)."""

    monkeypatch.setattr(receipts, "CLAIM_TIMEOUT_SECONDS", 0)  # the claim lapses at once
    monkeypatch.setattr(receipts, "_complete", died)
    case.call("op-1", "ok")
    monkeypatch.undo()
    case.rerun("op-1")


@OPS
def test_malformed_key_is_refused(baton: Baton, make: Callable[[Baton], Case]) -> None:
    """An empty or over-long idempotency key is VALIDATION_ERROR and writes nothing."""
    case = make(baton)
    state = _state(baton)
    for key in ("", "k" * 257):
        with pytest.raises(ValidationError):
            case.call(key, "ok")
    assert _state(baton) == state
    assert not case.call("op-1", "ok").replayed


@pytest.mark.parametrize("status", ["rejected", "accepted"])
@pytest.mark.parametrize("lapsed", [False, True], ids=["abandoned", "lapsed"])
def test_resolve_retry_after_its_receipt_was_lost_replays(
    baton: Baton, monkeypatch: pytest.MonkeyPatch, status: str, lapsed: bool
) -> None:
    """A keyed resolve of a lease-carrying handoff whose resolution committed but whose
    receipt was never stored (storing it failed: the caller got UNAVAILABLE; or the process
    died and its claim lapsed) is retried under the same key: the retry replays the
    handoff as resolved (DESIGN.md: an exact retry replays), instead of NOT_FOUND as a
    second resolve, and changes nothing; the retry's receipt is stored, so a further retry
    replays it too."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    handoff = baton.handoffs.create("agent-b", "subj", lease=lease)
    target = baton.as_principal("agent-b")
    resolve = lambda: target.handoffs.resolve(  # noqa: E731
        handoff.handoff_id, status, "done", idempotency_key="op-1"
    )

    def lost(*_args: Any) -> None:
        if not lapsed:
            raise UnavailableError("the receipt could not be stored")

    if lapsed:
        monkeypatch.setattr(receipts, "CLAIM_TIMEOUT_SECONDS", 0)  # the claim lapses at once
    monkeypatch.setattr(receipts, "_complete", lost)
    try:
        resolve()
    except UnavailableError:
        assert not lapsed
    monkeypatch.undo()
    state = _state(baton)
    for _ in range(2):
        again = resolve()
        assert (again.handoff_id, again.status, again.note) == (handoff.handoff_id, status, "done")
        assert again.replayed
        assert _state(baton) == state
    if status == "accepted":
        assert again.lease is not None
        assert again.lease.execution_key == f"handoff:{handoff.handoff_id}"
        assert baton.leases.inspect(RT, RID).held
    else:
        assert not baton.leases.inspect(RT, RID).held


def test_resolve_retry_finding_another_resolution_is_not_found(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry whose earlier claim lapsed replays only the resolution it asked for: a
    handoff found accepted by another request is not the keyed reject's effect, so the
    retry is a second resolve: NOT_FOUND, saying it was already accepted."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    handoff = baton.handoffs.create("agent-b", "subj", lease=lease)
    target = baton.as_principal("agent-b")
    target.handoffs.resolve(handoff.handoff_id, "accepted", execution_key="run-9")
    # a keyed reject whose process died before it cleaned up its claim: the claim lapses
    monkeypatch.setattr(receipts, "CLAIM_TIMEOUT_SECONDS", 0)
    monkeypatch.setattr(receipts, "_drop", lambda *_args: None)
    with pytest.raises(NotFoundError):
        target.handoffs.resolve(handoff.handoff_id, "rejected", idempotency_key="op-1")
    monkeypatch.undo()
    with pytest.raises(NotFoundError) as ei:
        target.handoffs.resolve(handoff.handoff_id, "rejected", idempotency_key="op-1")
    assert "was already accepted" in ei.value.message


def test_claim_left_by_crash_blocks_until_lapsed(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until a claim left by a crashed process lapses, a retry under its key is
    IDEMPOTENCY_IN_FLIGHT and runs nothing."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    monkeypatch.setattr(receipts, "_complete", lambda *_args: None)
    monkeypatch.setattr(receipts, "_process", "a-process-that-crashed")
    baton.leases.renew(lease, ttl_seconds=40, idempotency_key="op-1")
    monkeypatch.undo()
    state = _state(baton)
    with pytest.raises(IdempotencyInFlightError) as ei:
        baton.leases.renew(lease, ttl_seconds=40, idempotency_key="op-1")
    assert ei.value.code == "IDEMPOTENCY_IN_FLIGHT"
    assert _state(baton) == state


def test_claim_whose_commit_reply_was_lost_is_taken_over_by_the_retry(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the reply to a claim's COMMIT is lost (the claim is stored, the caller gets
    UNAVAILABLE and never runs the operation), the caller's keyed retry learns at once that
    the claim is its own abandoned one and runs the release (no 60 s IN_FLIGHT)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    claim = receipts._claim

    def lost_reply(*args: Any) -> Any:
        claim(*args)
        raise UnavailableError("ledger database unavailable: server closed the connection")

    monkeypatch.setattr(receipts, "_claim", lost_reply)
    with pytest.raises(UnavailableError):
        baton.leases.release(lease, idempotency_key="rel-1")
    monkeypatch.undo()
    assert baton.leases.inspect(RT, RID).held
    receipt = baton.leases.release(lease, idempotency_key="rel-1")
    assert (receipt.status, receipt.replayed) == ("released", False)
    assert not baton.leases.inspect(RT, RID).held
    assert baton.leases.release(lease, idempotency_key="rel-1").replayed
