"""Checkpoints (DESIGN.md "Checkpoints"): upsert per (org, subject, principal, kind), version
+1 per write, state_hash, CAS, history, JSON-only and size-capped state, fences, TTL."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from prefect_baton import (
    Baton,
    NotFoundError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)

from ._util import assert_refusal_recorded, kinds, pass_deadline

SUBJ = "file:src/app/main.py"
KIND = "progress"
MIB = 1024 * 1024


def test_first_save_creates_version_1(baton: Baton) -> None:
    """A first save creates the checkpoint at version 1 with the state and a SHA-256 state_hash."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"done": 3, "files": ["a.py", "b.py"]})
    assert ck.checkpoint_id
    assert (ck.subject_id, ck.kind, ck.principal, ck.version) == (SUBJ, KIND, "agent-a", 1)
    assert ck.state == {"done": 3, "files": ["a.py", "b.py"]}
    assert re.fullmatch(r"(sha256:)?[0-9a-f]{64}", ck.state_hash)
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert (got.checkpoint_id, got.version, got.state) == (ck.checkpoint_id, 1, ck.state)


def test_save_upserts_and_bumps_version(baton: Baton) -> None:
    """Saving again updates the same checkpoint: same id, version +1, new state, changed hash."""
    first = baton.checkpoints.save(SUBJ, KIND, {"done": 1})
    second = baton.checkpoints.save(SUBJ, KIND, {"done": 2})
    assert second.checkpoint_id == first.checkpoint_id
    assert second.version == 2
    assert second.state_hash != first.state_hash
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert (got.version, got.state) == (2, {"done": 2})


def test_state_hash_is_canonical(baton: Baton) -> None:
    """The hash ignores key order; an identical write keeps the hash but bumps the version."""
    a = baton.checkpoints.save(SUBJ, KIND, {"a": 1, "b": {"x": [1, 2], "y": "é"}})
    b = baton.checkpoints.save(SUBJ, KIND, {"b": {"y": "é", "x": [1, 2]}, "a": 1})
    assert b.state_hash == a.state_hash
    assert b.version == a.version + 1


def test_checkpoint_key_is_subject_principal_kind(baton: Baton) -> None:
    """Another kind, subject or principal is a separate checkpoint with its own versions."""
    mine = baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    baton.checkpoints.save(SUBJ, KIND, {"n": 2})
    other_kind = baton.checkpoints.save(SUBJ, "notes", {"n": 1})
    other_subject = baton.checkpoints.save("file:other.py", KIND, {"n": 1})
    theirs = baton.as_principal("agent-b").checkpoints.save(SUBJ, KIND, {"n": 1})
    ids = {mine.checkpoint_id, other_kind.checkpoint_id, other_subject.checkpoint_id}
    ids.add(theirs.checkpoint_id)
    assert len(ids) == 4
    assert other_kind.version == other_subject.version == theirs.version == 1
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert got.state == {"n": 2}
    b_got = baton.as_principal("agent-b").checkpoints.get(SUBJ, KIND)
    assert b_got is not None
    assert b_got.state == {"n": 1}


def test_get_missing_is_none(baton: Baton) -> None:
    """Getting a checkpoint that was never saved returns None and has no history."""
    assert baton.checkpoints.get(SUBJ, KIND) is None
    assert baton.checkpoints.history(SUBJ, KIND) == []


def test_cas_expected_version_zero_creates(baton: Baton) -> None:
    """expected_version=0 creates a new checkpoint and refuses when one already exists."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1}, expected_version=0)
    assert ck.version == 1
    with pytest.raises(VersionConflictError) as ei:
        baton.checkpoints.save(SUBJ, KIND, {"n": 2}, expected_version=0)
    assert (ei.value.current_version, ei.value.expected_version) == (1, 0)


def test_cas_stale_version_conflicts_and_writes_nothing(baton: Baton) -> None:
    """A save with a stale expected_version is VERSION_CONFLICT and writes nothing."""
    baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    current = baton.checkpoints.save(SUBJ, KIND, {"n": 2}, expected_version=1)
    assert current.version == 2
    events = kinds(baton)
    with pytest.raises(VersionConflictError) as ei:
        baton.checkpoints.save(SUBJ, KIND, {"n": 99}, expected_version=1)
    assert ei.value.code == "VERSION_CONFLICT"
    assert (ei.value.current_version, ei.value.expected_version) == (2, 1)
    assert kinds(baton) == events
    assert len(baton.checkpoints.history(SUBJ, KIND)) == 2
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert got.state == {"n": 2}


def test_cas_on_missing_checkpoint(baton: Baton) -> None:
    """A save expecting a version of a checkpoint that does not exist is VERSION_CONFLICT."""
    with pytest.raises(VersionConflictError) as ei:
        baton.checkpoints.save(SUBJ, KIND, {"n": 1}, expected_version=1)
    assert (ei.value.current_version, ei.value.expected_version) == (0, 1)
    assert baton.checkpoints.get(SUBJ, KIND) is None


def test_history_keeps_every_version(baton: Baton) -> None:
    """History returns every version of the checkpoint, oldest first, with its state and hash."""
    saved = [baton.checkpoints.save(SUBJ, KIND, {"step": i}) for i in range(1, 5)]
    history = baton.checkpoints.history(SUBJ, KIND)
    assert [c.version for c in history] == [1, 2, 3, 4]
    assert [c.state for c in history] == [{"step": i} for i in range(1, 5)]
    assert [c.state_hash for c in history] == [c.state_hash for c in saved]
    assert {c.checkpoint_id for c in history} == {saved[0].checkpoint_id}


class _Obj:
    pass


@pytest.mark.parametrize(
    "state",
    [
        {"s": {1, 2}},
        {"x": float("nan")},
        {"x": float("inf")},
        {"o": _Obj()},
        {"b": b"bytes"},
        {("t", 1): 1},
        [1, 2, 3],
        "not an object",
        None,
        42,
        _Obj(),
    ],
    ids=[
        "set",
        "nan",
        "inf",
        "object",
        "bytes",
        "tuple-key",
        "list",
        "str",
        "none",
        "int",
        "bare-object",
    ],
)
def test_non_json_state_is_validation_error(baton: Baton, state: Any) -> None:
    """State that is not a JSON object is VALIDATION_ERROR and nothing is written."""
    with pytest.raises(ValidationError) as ei:
        baton.checkpoints.save(SUBJ, KIND, state)
    assert ei.value.code == "VALIDATION_ERROR"
    assert baton.checkpoints.get(SUBJ, KIND) is None
    assert kinds(baton) == []


def test_oversized_state_is_validation_error(baton: Baton) -> None:
    """State over 1 MiB of JSON is VALIDATION_ERROR and nothing is written."""
    with pytest.raises(ValidationError):
        baton.checkpoints.save(SUBJ, KIND, {"blob": "x" * MIB})
    assert baton.checkpoints.get(SUBJ, KIND) is None
    assert kinds(baton) == []


def test_state_just_under_cap_is_accepted(baton: Baton) -> None:
    """State just under 1 MiB of JSON is stored and read back intact."""
    blob = "x" * (MIB - 64)
    ck = baton.checkpoints.save(SUBJ, KIND, {"blob": blob})
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert got.state["blob"] == blob
    assert got.version == ck.version == 1


def test_fenced_save_with_current_lease(baton: Baton) -> None:
    """A save fenced by the current lease (even an older handle of it) is accepted."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    baton.leases.renew(lease)
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1}, fence=lease)
    assert ck.version == 1


def test_fenced_save_after_takeover_is_stale(baton: Baton) -> None:
    """A save fenced by a lease another principal has since taken over is STALE_FENCE; the
    refusal is recorded as ``fence.rejected`` and nothing else is written."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    baton.checkpoints.save(SUBJ, KIND, {"n": 1}, fence=lease)
    baton.as_principal("boss", role="admin").leases.force_release(lease.lease_id)
    new = baton.as_principal("agent-b").leases.acquire("file", "main.py", ttl_seconds=30)
    assert new.epoch == lease.epoch + 1
    events = kinds(baton)
    with pytest.raises(StaleFenceError) as ei:
        baton.checkpoints.save(SUBJ, KIND, {"n": 2}, fence=lease)
    assert ei.value.code == "STALE_FENCE"
    assert_refusal_recorded(baton, events, lease, "checkpoint.save")
    got = baton.checkpoints.get(SUBJ, KIND)
    assert got is not None
    assert (got.version, got.state) == (1, {"n": 1})


def test_fenced_save_after_transfer_or_release_is_stale(baton: Baton) -> None:
    """A save fenced by a transferred, superseded or released lease is STALE_FENCE."""
    transferred = baton.leases.acquire("file", "a", ttl_seconds=30, idempotency_key="r1")
    baton.leases.transfer(
        transferred, to_principal="agent-b", new_execution_key="r2", ttl_seconds=30
    )
    superseded = baton.leases.acquire("file", "b", ttl_seconds=30)
    baton.leases.acquire("file", "b", ttl_seconds=30)
    released = baton.leases.acquire("file", "c", ttl_seconds=30)
    baton.leases.release(released)
    for lease in (transferred, superseded, released):
        with pytest.raises(StaleFenceError):
            baton.checkpoints.save(SUBJ, KIND, {"n": 1}, fence=lease)
    assert baton.checkpoints.get(SUBJ, KIND) is None


def test_fence_with_wrong_epoch_is_stale(baton: Baton) -> None:
    """A fence naming the current lease id with another epoch is STALE_FENCE, and the
    message says the epoch does not match (not that the lease is no longer effective)."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    for epoch in (lease.epoch - 1, lease.epoch + 1):
        forged = lease.model_copy(update={"epoch": epoch})
        said = f"fence lease {lease.lease_id} does not have epoch {epoch}"
        with pytest.raises(StaleFenceError, match=said):
            baton.checkpoints.save(SUBJ, KIND, {"n": 1}, fence=forged)
        with pytest.raises(StaleFenceError, match=said):
            baton.outcomes.record(SUBJ, "failed", evidence=[], fence=forged)
    assert baton.checkpoints.get(SUBJ, KIND) is None
    assert baton.outcomes.list(SUBJ) == []


def test_fence_must_be_a_lease(baton: Baton) -> None:
    """A fence that is not a lease is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.checkpoints.save(SUBJ, KIND, {"n": 1}, fence="lease_123")  # type: ignore[arg-type]


def test_get_by_id_for_writer(baton: Baton) -> None:
    """The writer reads its checkpoint by id; an unknown id is NOT_FOUND."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    assert baton.checkpoints.get_by_id(ck.checkpoint_id).state == {"n": 1}
    with pytest.raises(NotFoundError):
        baton.checkpoints.get_by_id("ckpt_" + "0" * 32)


def _reads(b: Baton, ck_id: str, writer: str) -> bool:
    """Whether ``b`` reads the checkpoint ``ck_id`` of ``writer`` (``SUBJ``/``KIND``) on
    every read path: by id, by key and as history (asserting the paths agree)."""
    try:
        by_id = b.checkpoints.get_by_id(ck_id)
    except NotFoundError:
        by_id = None
    by_key = b.checkpoints.get(SUBJ, KIND, principal=writer)
    history = b.checkpoints.history(SUBJ, KIND, principal=writer)
    seen = [by_id is not None, by_key is not None, bool(history)]
    assert len(set(seen)) == 1, seen
    if by_id is not None:
        assert by_id.state == by_key.state == history[-1].state  # type: ignore[union-attr]
    return seen[0]


def test_checkpoint_read_visibility(baton: Baton) -> None:
    """Who reads a checkpoint (DESIGN.md "Checkpoints"): its writer, the recipient of a
    handoff carrying it, owner/admin; any other agent of the org gets not found on get by
    id, get by key and history, and cannot attach it to a handoff."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"secret": 1})
    baton.checkpoints.save(SUBJ, KIND, {"secret": 2})
    ck_id = ck.checkpoint_id
    other = baton.as_principal("agent-c")
    assert _reads(baton, ck_id, "agent-a")
    assert not _reads(other, ck_id, "agent-a")
    with pytest.raises(NotFoundError):
        other.handoffs.create("agent-d", SUBJ, checkpoint_id=ck_id)
    assert _reads(baton.as_principal("boss", role="owner"), ck_id, "agent-a")
    assert _reads(baton.as_principal("root", role="admin"), ck_id, "agent-a")
    recipient = baton.as_principal("agent-b")
    assert not _reads(recipient, ck_id, "agent-a")
    baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck_id)
    assert _reads(recipient, ck_id, "agent-a")
    assert not _reads(other, ck_id, "agent-a")


def test_a_handoff_grants_its_checkpoint_only_while_pending_or_accepted(baton: Baton) -> None:
    """The recipient of a handoff reads the checkpoint it carries (on every read path, and
    may link it from an outcome) while the handoff reads pending or accepted; once it reads
    rejected or expired (its deadline passed, or the lease it carries ended, though the row
    still says pending) the recipient no longer reads it, not even the writer's later
    versions under the same id (DESIGN.md "Checkpoints"), while the writer and owner/admin
    still do."""
    writer = "agent-a"
    ck_id = baton.checkpoints.save(SUBJ, KIND, {"v": 1}).checkpoint_id
    readers = {name: baton.as_principal(name) for name in ("r-accept", "r-reject", "r-late")}
    readers["r-lease"] = baton.as_principal("r-lease")
    lease = baton.leases.acquire("doc", "one", ttl_seconds=300)
    sent = {
        name: baton.handoffs.create(
            name,
            SUBJ,
            checkpoint_id=ck_id,
            expires_in_seconds=1 if name == "r-late" else 300,
            lease=lease if name == "r-lease" else None,
        )
        for name in readers
    }
    for b in readers.values():  # pending: every recipient reads it
        assert _reads(b, ck_id, writer)
    readers["r-accept"].handoffs.resolve(sent["r-accept"].handoff_id, "accepted")
    readers["r-reject"].handoffs.resolve(sent["r-reject"].handoff_id, "rejected")
    baton.leases.release(lease)  # "r-lease"'s handoff reads expired: its lease ended
    pass_deadline(baton, sent["r-late"])  # "r-late"'s reads expired: its deadline passed
    baton.checkpoints.save(SUBJ, KIND, {"v": 2})  # the same checkpoint, a later version
    assert _reads(readers["r-accept"], ck_id, writer)
    for name in ("r-reject", "r-late", "r-lease"):
        b = readers[name]
        assert not _reads(b, ck_id, writer), name
        with pytest.raises(NotFoundError):
            b.outcomes.record(SUBJ, "failed", checkpoint_id=ck_id)
    readers["r-accept"].outcomes.record(SUBJ, "failed", checkpoint_id=ck_id)
    assert _reads(baton, ck_id, writer)
    assert _reads(baton.as_principal("boss", role="owner"), ck_id, writer)
    assert _reads(baton.as_principal("root", role="admin"), ck_id, writer)
    # deleted and saved again under the same id: still not the rejecting recipient's
    baton.checkpoints.delete(ck_id)
    assert baton.checkpoints.save(SUBJ, KIND, {"v": 3}).checkpoint_id == ck_id
    assert not _reads(readers["r-reject"], ck_id, writer)
    assert _reads(readers["r-accept"], ck_id, writer)


def test_checkpoint_ttl(baton: Baton) -> None:
    """A checkpoint past its TTL is no longer returned; by id, NOT_FOUND says it expired."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1}, ttl_seconds=1)
    assert ck.expires_at is not None
    time.sleep(1.3)
    deadline = time.monotonic() + 10
    while baton.checkpoints.get(SUBJ, KIND) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(NotFoundError, match=f"checkpoint {ck.checkpoint_id} has expired$"):
        baton.checkpoints.get_by_id(ck.checkpoint_id)


@pytest.mark.parametrize("ttl", [0, -1, 1.5, True, "10"])
def test_bad_checkpoint_ttl(baton: Baton, ttl: object) -> None:
    """A checkpoint TTL that is not a positive integer is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.checkpoints.save(SUBJ, KIND, {"n": 1}, ttl_seconds=ttl)  # type: ignore[arg-type]
    assert baton.checkpoints.get(SUBJ, KIND) is None


def test_fence_must_be_the_writers_own_lease(baton: Baton) -> None:
    """Another principal's current lease does not fence your write: STALE_FENCE, nothing saved."""
    theirs = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    other = baton.as_principal("agent-b")
    with pytest.raises(StaleFenceError):
        other.checkpoints.save("s", "k", {"n": 1}, fence=theirs)
    with pytest.raises(StaleFenceError):
        other.outcomes.record(
            "s", "succeeded", evidence=[{"kind": "log", "uri": "x"}], fence=theirs
        )
    assert other.checkpoints.get("s", "k") is None
    assert other.outcomes.list("s") == []


@pytest.mark.slow
def test_expired_checkpoint_reads_absent_and_cas_starts_over(baton: Baton) -> None:
    """After its TTL a checkpoint reads as None and a CAS expecting version 0 succeeds,
    continuing the version count so history keeps every version."""
    first = baton.checkpoints.save("s", "k", {"n": 1}, ttl_seconds=1)
    time.sleep(1.3)
    assert baton.checkpoints.get("s", "k") is None
    again = baton.checkpoints.save("s", "k", {"n": 2}, expected_version=0)
    assert again.version == first.version + 1
    assert [c.version for c in baton.checkpoints.history("s", "k")] == [1, 2]
