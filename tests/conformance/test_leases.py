"""Lease lifecycle (DESIGN.md "Leases"): acquire, conflict, re-acquire, renew, transfer,
release, force release, inspect, CAS on versions, and expiry/takeover."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, timedelta

import pytest

from prefect_baton import (
    Baton,
    ConflictError,
    ForbiddenError,
    Lease,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)

from ._util import kinds, wait_until_expired

RT = "deploy"
RID = "checkout-service"
MS = timedelta(milliseconds=1)


# ------------------------------------------------------------------------------- acquire


def test_first_acquire_is_version_1_epoch_1(baton: Baton) -> None:
    """A first acquire returns an active lease, version 1, epoch 1, expiring ttl after it began."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, purpose="ship it")
    assert lease.lease_id
    assert (lease.resource_type, lease.resource_id) == (RT, RID)
    assert lease.owner == "agent-a"
    assert lease.execution_key is None
    assert (lease.version, lease.epoch) == (1, 1)
    assert lease.status == "active"
    assert lease.ttl_seconds == 30
    assert lease.acquired_at.utcoffset() == timedelta(0)
    assert lease.expires_at.tzinfo is not None
    assert abs((lease.expires_at - lease.acquired_at) - timedelta(seconds=30)) <= MS
    assert lease.fencing_token == lease.epoch


def test_conflict_names_only_the_expiry(baton: Baton) -> None:
    """A conflict carries the holder's expiry and never its holder, purpose, scopes, id or key."""
    held = baton.leases.acquire(
        RT,
        RID,
        ttl_seconds=60,
        purpose="secret-purpose-xyzzy",
        scopes=["private/zone/**"],
        idempotency_key="exec-key-of-a",
    )
    other = baton.as_principal("agent-b")
    with pytest.raises(ConflictError) as ei:
        other.leases.acquire(RT, RID, ttl_seconds=30)
    err = ei.value
    assert err.code == "CONFLICT"
    assert err.expires_at is not None
    assert abs(err.expires_at - held.expires_at) <= MS
    text = f"{err} {err.message} {err.to_dict()!r} {err!r}"
    secrets = ("agent-a", "secret-purpose-xyzzy", "private/zone", held.lease_id, "exec-key-of-a")
    for secret in secrets:
        assert secret not in text


def test_conflict_writes_nothing(baton: Baton) -> None:
    """A refused acquire leaves the holder's lease and the event stream untouched."""
    held = baton.leases.acquire(RT, RID, ttl_seconds=60)
    before = kinds(baton)
    with pytest.raises(ConflictError):
        baton.as_principal("agent-b").leases.acquire(RT, RID, ttl_seconds=30)
    assert kinds(baton) == before
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == held.lease_id
    assert info.version == held.version


def test_reacquire_without_key_supersedes(baton: Baton) -> None:
    """Acquiring again as the holder with no execution key gives a new lease_id with epoch +1."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30)
    second = baton.leases.acquire(RT, RID, ttl_seconds=30)
    assert second.lease_id != first.lease_id
    assert second.epoch == first.epoch + 1
    assert second.version == first.version + 1
    assert second.owner == "agent-a"
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == second.lease_id


def test_superseded_id_is_gone(baton: Baton) -> None:
    """After a re-acquire the old id is NOT_FOUND on release, by id and by proof."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30)
    second = baton.leases.acquire(RT, RID, ttl_seconds=30)
    with pytest.raises(NotFoundError) as nf:
        baton.leases.release_by_id(first.lease_id)
    assert nf.value.code == "NOT_FOUND"
    with pytest.raises(NotFoundError) as nf2:
        baton.leases.release(first)
    assert nf2.value.code == "NOT_FOUND"
    with pytest.raises(LeaseLostError):
        baton.leases.renew(first)
    assert baton.leases.inspect(RT, RID).held
    assert baton.leases.release(second).status == "released"


def test_same_principal_other_execution_key_conflicts(baton: Baton) -> None:
    """While a lease is effective, the same principal under a different execution key conflicts."""
    held = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    with pytest.raises(ConflictError):
        baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-2")
    with pytest.raises(ConflictError):
        baton.leases.acquire(RT, RID, ttl_seconds=30)
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.lease.execution_key) == (held.lease_id, "run-1")


def test_keyless_holder_then_keyed_acquire_conflicts(baton: Baton) -> None:
    """A keyed acquire conflicts with the same principal's effective keyless lease."""
    baton.leases.acquire(RT, RID, ttl_seconds=30)
    with pytest.raises(ConflictError):
        baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")


def test_new_generation_after_release_bumps_epoch(baton: Baton) -> None:
    """After a release, the next acquire (by anyone) gets version +1 and epoch +1."""
    first = baton.leases.acquire(RT, RID, ttl_seconds=30)
    baton.leases.release(first)
    nxt = baton.as_principal("agent-b").leases.acquire(RT, RID, ttl_seconds=30)
    assert nxt.epoch == first.epoch + 1
    assert nxt.version == first.version + 1
    assert nxt.lease_id != first.lease_id


# ------------------------------------------------------------------------------- renew


def test_renew_keeps_identity_and_bumps_version(baton: Baton) -> None:
    """Renew keeps id, owner, key, epoch and scopes, bumps version and pushes expiry out."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, scopes=["src/**"], idempotency_key="k1")
    renewed = baton.leases.renew(lease, ttl_seconds=600)
    assert renewed.lease_id == lease.lease_id
    assert renewed.epoch == lease.epoch
    assert renewed.owner == lease.owner
    assert renewed.execution_key == lease.execution_key
    assert renewed.scopes == lease.scopes
    assert renewed.version == lease.version + 1
    assert renewed.expires_at > lease.expires_at
    assert renewed.ttl_seconds == 600
    again = baton.leases.renew(renewed)
    assert again.version == lease.version + 2
    assert again.ttl_seconds == 600


def test_renew_by_other_principal_is_not_found(baton: Baton) -> None:
    """Another principal presenting the holder's lease cannot renew it (NOT_FOUND)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    with pytest.raises(NotFoundError):
        baton.as_principal("agent-b").leases.renew(lease)
    info = baton.leases.inspect(RT, RID)
    assert info.version == lease.version


def test_renew_with_wrong_execution_key_is_lost(baton: Baton) -> None:
    """A renew presenting another execution key than the holder's is LEASE_LOST."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    forged = lease.model_copy(update={"execution_key": "run-x"})
    with pytest.raises(LeaseLostError):
        baton.leases.renew(forged)
    assert baton.leases.inspect(RT, RID).version == lease.version


@pytest.mark.parametrize("op", ["release", "renew", "transfer"])
def test_own_lease_under_another_execution_key_says_how_to_pass_it(baton: Baton, op: str) -> None:
    """Presenting your own keyed lease without its execution key, or with another one, stays
    LEASE_LOST (the code clients rely on) but says the lease is held by you and how to pass
    the key, never showing it; the lease is left as it was."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="secret-run-1")
    calls: dict[str, Callable[[Lease], object]] = {
        "release": baton.leases.release,
        "renew": baton.leases.renew,
        "transfer": lambda proof: baton.leases.transfer(
            proof, to_principal="agent-b", new_execution_key="b-run", ttl_seconds=30
        ),
    }
    for given in (None, "run-x"):
        proof = lease.model_copy(update={"execution_key": given})
        with pytest.raises(LeaseLostError) as caught:
            calls[op](proof)
        message = caught.value.message
        assert caught.value.code == "LEASE_LOST"
        assert f"lease {lease.lease_id} is held by you" in message
        assert "execution_key over REST" in message
        assert "--execution-key" in message
        assert "secret-run-1" not in message
        assert "run-x" not in message
        assert ("none was given" in message) == (given is None)
    info = baton.leases.inspect(RT, RID)
    assert info.held
    assert info.version == lease.version


def test_key_given_for_a_keyless_lease_says_to_leave_it_out(baton: Baton) -> None:
    """A lease acquired without an execution key presented with one is LEASE_LOST, saying
    the lease is held by you without a key (the given key is not echoed)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    with pytest.raises(LeaseLostError) as caught:
        baton.leases.release(lease.model_copy(update={"execution_key": "run-x"}))
    assert "is held by you without an execution key" in caught.value.message
    assert "run-x" not in caught.value.message
    assert baton.leases.inspect(RT, RID).held


def test_lease_accepted_from_a_handoff_names_its_key_form(baton: Baton) -> None:
    """A lease taken over by accepting a handoff has the key handoff:<id>; releasing it
    without a key is LEASE_LOST with a message naming that form."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    h = baton.handoffs.create("agent-b", "subj", lease=lease)
    b = baton.as_principal("agent-b")
    moved = b.handoffs.resolve(h.handoff_id, "accepted").lease
    assert moved is not None
    with pytest.raises(LeaseLostError, match="handoff:<handoff id>"):
        b.leases.release(moved.model_copy(update={"execution_key": None}))
    assert b.leases.release(moved).status == "released"


def test_renew_after_release_is_lost(baton: Baton) -> None:
    """A released lease cannot be renewed back to life (LEASE_LOST)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    baton.leases.release(lease)
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    assert not baton.leases.inspect(RT, RID).held


# ------------------------------------------------------------------------------- CAS


def test_acquire_expected_version_zero_for_never_leased(baton: Baton) -> None:
    """expected_version=0 admits the first acquire of a never-leased resource."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, expected_version=0)
    assert lease.version == 1


def test_acquire_stale_expected_version_conflicts(baton: Baton) -> None:
    """A stale expected_version on acquire is VERSION_CONFLICT (both versions), nothing written."""
    with pytest.raises(VersionConflictError) as ei:
        baton.leases.acquire(RT, RID, ttl_seconds=30, expected_version=3)
    assert ei.value.code == "VERSION_CONFLICT"
    assert (ei.value.current_version, ei.value.expected_version) == (0, 3)
    assert not baton.leases.inspect(RT, RID).held
    assert kinds(baton) == []
    first = baton.leases.acquire(RT, RID, ttl_seconds=30)
    baton.leases.release(first)
    with pytest.raises(VersionConflictError) as ei2:
        baton.as_principal("agent-b").leases.acquire(RT, RID, ttl_seconds=30, expected_version=0)
    assert (ei2.value.current_version, ei2.value.expected_version) == (first.version, 0)
    nxt = baton.as_principal("agent-b").leases.acquire(
        RT, RID, ttl_seconds=30, expected_version=first.version
    )
    assert nxt.version == first.version + 1


def test_renew_expected_version(baton: Baton) -> None:
    """Renew with a stale expected_version is VERSION_CONFLICT; the current version renews."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    renewed = baton.leases.renew(lease)
    with pytest.raises(VersionConflictError) as ei:
        baton.leases.renew(renewed, expected_version=lease.version)
    assert (ei.value.current_version, ei.value.expected_version) == (renewed.version, lease.version)
    assert baton.leases.inspect(RT, RID).version == renewed.version
    again = baton.leases.renew(renewed, expected_version=renewed.version)
    assert again.version == renewed.version + 1


def test_release_expected_version(baton: Baton) -> None:
    """A release with a stale expected_version never releases; the current version does."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    renewed = baton.leases.renew(lease)
    with pytest.raises(VersionConflictError):
        baton.leases.release(renewed, expected_version=lease.version)
    assert baton.leases.inspect(RT, RID).held
    receipt = baton.leases.release(renewed, expected_version=renewed.version)
    assert receipt.status == "released"


def test_transfer_expected_version(baton: Baton) -> None:
    """A transfer with a stale expected_version is VERSION_CONFLICT; the sender keeps it."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    baton.leases.renew(lease)
    with pytest.raises(VersionConflictError):
        baton.leases.transfer(
            lease,
            to_principal="agent-b",
            new_execution_key="run-2",
            ttl_seconds=30,
            expected_version=lease.version,
        )
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == lease.lease_id


# ------------------------------------------------------------------------------- transfer


def test_transfer_creates_new_generation(baton: Baton) -> None:
    """Transfer gives the receiver a new lease_id, epoch +1, version +1, its key, same scopes."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, scopes=["src/**"], idempotency_key="r1")
    moved = baton.leases.transfer(
        lease, to_principal="agent-b", new_execution_key="r2", ttl_seconds=45
    )
    assert moved.lease_id != lease.lease_id
    assert moved.epoch == lease.epoch + 1
    assert moved.version == lease.version + 1
    assert moved.owner == "agent-b"
    assert moved.execution_key == "r2"
    assert moved.scopes == lease.scopes == ("src/**",)
    assert moved.ttl_seconds == 45
    b = baton.as_principal("agent-b")
    info = b.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == moved.lease_id


def test_transfer_locks_out_old_holder(baton: Baton) -> None:
    """After a transfer the old holder can neither renew nor release; the receiver can."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="r1")
    moved = baton.leases.transfer(
        lease, to_principal="agent-b", new_execution_key="r2", ttl_seconds=30
    )
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    with pytest.raises(LeaseLostError):
        baton.leases.release(lease)
    with pytest.raises(NotFoundError):
        baton.leases.release_by_id(lease.lease_id)
    with pytest.raises(NotFoundError):
        baton.leases.release_by_id(moved.lease_id)
    b = baton.as_principal("agent-b")
    assert b.leases.renew(moved).version == moved.version + 1
    assert b.leases.release(moved).status == "released"


def test_transfer_needs_new_execution_key(baton: Baton) -> None:
    """A transfer under the current execution key is VALIDATION_ERROR and changes nothing."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="r1")
    before = kinds(baton)
    with pytest.raises(ValidationError):
        baton.leases.transfer(lease, to_principal="agent-b", new_execution_key="r1", ttl_seconds=30)
    assert kinds(baton) == before
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (lease.lease_id, lease.version)


def test_transfer_to_new_execution_of_same_principal(baton: Baton) -> None:
    """A new execution of the same principal takes over by transfer: epoch +1, old handle lost."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    moved = baton.leases.transfer(
        lease, to_principal="agent-a", new_execution_key="run-2", ttl_seconds=30
    )
    assert moved.epoch == lease.epoch + 1
    assert moved.execution_key == "run-2"
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    assert baton.leases.renew(moved).lease_id == moved.lease_id


def test_transfer_by_non_holder_is_not_found(baton: Baton) -> None:
    """Another principal cannot transfer a lease it does not hold."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="r1")
    with pytest.raises(NotFoundError):
        baton.as_principal("agent-b").leases.transfer(
            lease, to_principal="agent-b", new_execution_key="r9", ttl_seconds=30
        )
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert info.lease.lease_id == lease.lease_id


# ------------------------------------------------------------------------------- release


def test_release_ends_lease_keeping_counters(baton: Baton) -> None:
    """Release answers released, keeps version and epoch, and frees the resource."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    receipt = baton.leases.release(lease)
    assert receipt.status == "released"
    assert receipt.lease.lease_id == lease.lease_id
    assert receipt.lease.status == "released"
    assert receipt.lease.released_at is not None
    assert (receipt.lease.version, receipt.lease.epoch) == (lease.version, lease.epoch)
    info = baton.leases.inspect(RT, RID)
    assert not info.held
    assert info.expires_at is None
    assert info.version == lease.version


def test_second_release_is_no_change(baton: Baton) -> None:
    """Releasing an already released lease with the same proof is a no_change receipt, no event."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    baton.leases.release(lease)
    before = kinds(baton)
    again = baton.leases.release(lease)
    assert again.status == "no_change"
    assert again.lease.lease_id == lease.lease_id
    assert kinds(baton) == before


def test_release_by_id(baton: Baton) -> None:
    """Release by id works once for the holder; a second time, or an unknown id, is NOT_FOUND."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    assert baton.leases.release_by_id(lease.lease_id).status == "released"
    with pytest.raises(NotFoundError):
        baton.leases.release_by_id(lease.lease_id)
    with pytest.raises(NotFoundError):
        baton.leases.release_by_id("lease_" + "0" * 32)


def test_release_by_other_principal_is_refused(baton: Baton) -> None:
    """Another principal can release neither by id nor with the holder's handle."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    b = baton.as_principal("agent-b")
    with pytest.raises(NotFoundError):
        b.leases.release_by_id(lease.lease_id)
    with pytest.raises(NotFoundError):
        b.leases.release(lease)
    info = baton.leases.inspect(RT, RID)
    assert info.held
    assert info.version == lease.version


def test_release_with_wrong_execution_key_is_refused(baton: Baton) -> None:
    """A release with a forged execution key is LEASE_LOST and never releases."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    with pytest.raises(LeaseLostError):
        baton.leases.release(lease.model_copy(update={"execution_key": "run-x"}))
    with pytest.raises(LeaseLostError):
        baton.leases.release(lease.model_copy(update={"execution_key": None}))
    assert baton.leases.inspect(RT, RID).held


@pytest.mark.parametrize("key", ["run-x", None])
def test_release_of_a_released_lease_under_another_key_says_it_is_no_longer_held(
    baton: Baton, key: str | None
) -> None:
    """Releasing your already released lease with another execution key (or none) stays
    LEASE_LOST but says the lease is no longer held, not that you hold it under another key."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    baton.leases.release(lease)
    with pytest.raises(LeaseLostError) as ei:
        baton.leases.release(lease.model_copy(update={"execution_key": key}))
    assert ei.value.code == "LEASE_LOST"
    assert ei.value.message == f"lease {lease.lease_id} is no longer held (released)"
    assert ei.value.status == "released"


# ------------------------------------------------------------------------------- force release


def test_force_release_needs_owner_or_admin(baton: Baton) -> None:
    """An agent's force release is FORBIDDEN and leaves the lease held."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    for who in (baton, baton.as_principal("agent-b")):
        with pytest.raises(ForbiddenError) as ei:
            who.leases.force_release(lease.lease_id)
        assert ei.value.code == "FORBIDDEN"
    assert baton.leases.inspect(RT, RID).held


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_force_release_revokes(baton: Baton, role: str) -> None:
    """An owner/admin force release revokes the lease; the holder then gets LEASE_LOST."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    boss = baton.as_principal("boss", role=role)
    receipt = boss.leases.force_release(lease.lease_id)
    assert receipt.status == "released"
    assert receipt.lease.status == "revoked"
    assert not baton.leases.inspect(RT, RID).held
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    with pytest.raises(LeaseLostError):
        baton.leases.release(lease)
    with pytest.raises(NotFoundError):
        boss.leases.force_release(lease.lease_id)
    event = baton.events.list(kind="lease.released")[-1]
    assert event.payload["lease_id"] == lease.lease_id
    assert event.payload.get("forced_by") == "boss"


def test_force_release_unknown_is_not_found(baton: Baton) -> None:
    """Force release of an unknown lease id is NOT_FOUND."""
    with pytest.raises(NotFoundError):
        baton.as_principal("boss", role="admin").leases.force_release("lease_" + "f" * 32)


# ------------------------------------------------------------------------------- inspect, get


def test_inspect_never_leased(baton: Baton) -> None:
    """Inspecting a never-leased resource shows it free at version 0, epoch 0."""
    info = baton.leases.inspect(RT, RID)
    assert (info.held, info.version, info.epoch, info.expires_at, info.lease) == (
        False,
        0,
        0,
        None,
        None,
    )


def test_inspect_shows_others_only_status_and_expiry(baton: Baton) -> None:
    """The holder sees its full lease; another principal sees held, expiry, version, epoch only."""
    lease = baton.leases.acquire(
        RT, RID, ttl_seconds=30, purpose="secret-purpose-xyzzy", scopes=["private/**"]
    )
    mine = baton.leases.inspect(RT, RID)
    assert mine.lease is not None
    assert mine.lease.purpose == "secret-purpose-xyzzy"
    theirs = baton.as_principal("agent-b").leases.inspect(RT, RID)
    assert theirs.held
    assert theirs.lease is None
    assert theirs.expires_at is not None
    assert abs(theirs.expires_at - lease.expires_at) <= MS
    assert (theirs.version, theirs.epoch) == (lease.version, lease.epoch)
    dump = theirs.model_dump_json()
    for secret in ("agent-a", "secret-purpose-xyzzy", "private", lease.lease_id):
        assert secret not in dump


def test_get_lease_by_id(baton: Baton) -> None:
    """A lease is readable by id for its owner and an org owner, NOT_FOUND for another agent."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    assert baton.leases.get(lease.lease_id).lease_id == lease.lease_id
    assert baton.as_principal("boss", role="owner").leases.get(lease.lease_id).owner == "agent-a"
    with pytest.raises(NotFoundError):
        baton.as_principal("agent-b").leases.get(lease.lease_id)


def test_resource_ids_do_not_collide(baton: Baton) -> None:
    """Resources whose type/id differ only in where a separator falls are distinct."""
    baton.leases.acquire("a:b", "c", ttl_seconds=30)
    other = baton.as_principal("agent-b").leases.acquire("a", "b:c", ttl_seconds=30)
    assert other.epoch == 1
    mine = baton.leases.inspect("a:b", "c")
    assert mine.lease is not None
    assert mine.lease.owner == "agent-a"


# ------------------------------------------------------------------------------- expiry


@pytest.mark.slow
def test_expired_lease_is_not_held(baton: Baton) -> None:
    """Past its TTL: renew/replay LEASE_LOST, fences STALE_FENCE, the release says expired."""
    leases = {
        name: baton.leases.acquire(RT, name, ttl_seconds=10, idempotency_key=f"run-{name}")
        for name in ("rel", "byid", "renew", "replay", "fence")
    }
    for lease in leases.values():
        wait_until_expired(baton, lease)
    for name, lease in leases.items():
        info = baton.leases.inspect(RT, name)
        assert not info.held
        assert info.lease is None
        assert info.epoch == lease.epoch
    receipt = baton.leases.release(leases["rel"])
    assert receipt.status == "expired"
    assert baton.leases.release(leases["rel"]).status == "no_change"
    assert baton.leases.release_by_id(leases["byid"].lease_id).status == "expired"
    with pytest.raises(LeaseLostError):
        baton.leases.renew(leases["renew"])
    with pytest.raises(LeaseLostError):
        baton.leases.acquire(RT, "replay", ttl_seconds=10, idempotency_key="run-replay")
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save("subj", "progress", {"n": 1}, fence=leases["fence"])
    with pytest.raises(StaleFenceError):
        baton.outcomes.record(
            "subj", "failed", evidence=[{"kind": "log", "uri": "x"}], fence=leases["fence"]
        )
    assert baton.checkpoints.get("subj", "progress") is None
    assert baton.outcomes.list("subj") == []


@pytest.mark.slow
def test_takeover_after_expiry(baton: Baton) -> None:
    """Another principal takes over an expired lease with epoch +1; the old holder is fenced out."""
    old = baton.leases.acquire(RT, RID, ttl_seconds=10, idempotency_key="run-a")
    wait_until_expired(baton, old)
    b = baton.as_principal("agent-b")
    new = b.leases.acquire(RT, RID, ttl_seconds=60)
    assert new.lease_id != old.lease_id
    assert new.epoch == old.epoch + 1
    assert new.version == old.version + 1
    assert kinds(baton)[-2:] == ["lease.expired", "lease.acquired"]
    (expired,) = baton.events.list(kind="lease.expired")
    assert (expired.payload["lease_id"], expired.payload["reason"]) == (old.lease_id, "taken_over")
    with pytest.raises(LeaseLostError):
        baton.leases.release(old)
    with pytest.raises(LeaseLostError):
        baton.leases.renew(old)
    with pytest.raises(LeaseLostError):
        baton.leases.acquire(RT, RID, ttl_seconds=10, idempotency_key="run-a")
    with pytest.raises(StaleFenceError) as sf:
        baton.checkpoints.save("subj", "progress", {"n": 1}, fence=old)
    assert sf.value.code == "STALE_FENCE"
    with pytest.raises(StaleFenceError):
        baton.outcomes.record("subj", "succeeded", evidence=[{"kind": "f", "uri": "u"}], fence=old)
    info = b.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (new.lease_id, new.version)
    assert b.checkpoints.save("subj", "progress", {"n": 2}, fence=new).version == 1


def test_expires_at_is_utc(baton: Baton) -> None:
    """Lease times are timezone-aware UTC."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    assert lease.expires_at.tzinfo is not None
    assert lease.expires_at.astimezone(UTC) == lease.expires_at
    assert lease.expires_at.utcoffset() == timedelta(0)


def test_list_leases(baton: Baton) -> None:
    """An agent lists its own effective leases; listing others' needs the owner or admin role."""
    mine = baton.leases.acquire(RT, "one", ttl_seconds=30)
    ended = baton.leases.acquire(RT, "two", ttl_seconds=30)
    baton.leases.release(ended)
    theirs = baton.as_principal("agent-b").leases.acquire(RT, "three", ttl_seconds=30)
    assert [x.lease_id for x in baton.leases.list()] == [mine.lease_id]
    assert {x.lease_id for x in baton.leases.list(include_ended=True)} == {
        mine.lease_id,
        ended.lease_id,
    }
    with pytest.raises(ForbiddenError):
        baton.leases.list(owner="*")
    with pytest.raises(ForbiddenError):
        baton.leases.list(owner="agent-b")
    everyone = baton.as_principal("boss", role="owner").leases.list(owner="*")
    assert {x.lease_id for x in everyone} == {mine.lease_id, theirs.lease_id}


@pytest.mark.slow
def test_report_expired_records_lease_expired_once(baton: Baton) -> None:
    """A lapsed lease is reported once as lease.expired, is left as it was (its holder's
    release says expired), and a later takeover does not report it again."""
    crashed = baton.leases.acquire(RT, RID, ttl_seconds=10)
    kept = baton.leases.acquire(RT, "other", ttl_seconds=60)
    assert baton.leases.report_expired() == []
    wait_until_expired(baton, crashed)
    reporter = baton.as_principal("reporter")
    reported = reporter.leases.report_expired()
    assert [lease.lease_id for lease in reported] == [crashed.lease_id]
    assert reporter.leases.report_expired() == []
    assert kinds(baton).count("lease.expired") == 1
    (expired,) = baton.events.list(kind="lease.expired")
    assert (expired.payload["lease_id"], expired.payload["reason"]) == (crashed.lease_id, "lapsed")
    taker = baton.as_principal("agent-b").leases.acquire(RT, RID, ttl_seconds=30)
    assert taker.epoch == crashed.epoch + 1
    assert kinds(baton).count("lease.expired") == 1
    with pytest.raises(LeaseLostError):
        baton.leases.release(crashed)
    assert baton.leases.release(kept).status == "released"
