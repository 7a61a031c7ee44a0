"""Outcomes with evidence (DESIGN.md "Outcomes") and the event stream ("Events")."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_baton import (
    Baton,
    ConflictError,
    Evidence,
    ForbiddenError,
    Lease,
    NotFoundError,
    Outcome,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)

from ._util import assert_refusal_recorded, kinds

SUBJ = "file:src/app/main.py"
EVIDENCE = [
    {"kind": "file", "uri": "file:///src/app/main.py", "digest": "sha256:" + "a" * 64, "note": "x"},
    {"kind": "log", "uri": "s3://bucket/run-7.log"},
]
FAKE_ID = "x_" + "0" * 32


# ------------------------------------------------------------------------------- outcomes


def test_record_outcome_with_evidence(baton: Baton) -> None:
    """A recorded outcome keeps its status, principal and every evidence item."""
    out = baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE)
    assert out.outcome_id
    assert (out.subject_id, out.status, out.principal) == (SUBJ, "succeeded", "agent-a")
    assert out.recorded_at.tzinfo is not None
    assert [e.model_dump(exclude_none=True) for e in out.evidence] == EVIDENCE
    listed = baton.outcomes.list(SUBJ)
    assert [o.outcome_id for o in listed] == [out.outcome_id]
    assert listed[0].evidence == out.evidence


def test_evidence_models_accepted(baton: Baton) -> None:
    """Evidence may be given as Evidence models as well as dicts."""
    out = baton.outcomes.record(SUBJ, "failed", evidence=[Evidence(kind="log", uri="u://1")])
    assert out.evidence == (Evidence(kind="log", uri="u://1"),)


def test_list_by_subject(baton: Baton) -> None:
    """Listing by subject returns only that subject's outcomes; without a subject, all."""
    a = baton.outcomes.record("subj-a", "succeeded", evidence=EVIDENCE)
    b = baton.as_principal("agent-b").outcomes.record("subj-b", "failed", evidence=[])
    c = baton.outcomes.record("subj-a", "cancelled", evidence=[])
    assert {o.outcome_id for o in baton.outcomes.list("subj-a")} == {a.outcome_id, c.outcome_id}
    assert [o.outcome_id for o in baton.outcomes.list("subj-b")] == [b.outcome_id]
    everything = {o.outcome_id for o in baton.outcomes.list()}
    assert everything == {a.outcome_id, b.outcome_id, c.outcome_id}
    assert baton.outcomes.list("subj-none") == []


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_non_success_without_evidence(baton: Baton, status: str) -> None:
    """A failed or cancelled outcome may carry no evidence; ``evidence`` defaults to none."""
    assert baton.outcomes.record(SUBJ, status, evidence=[]).evidence == ()
    assert baton.outcomes.record(SUBJ, status).evidence == ()


def test_bad_evidence_item_message_is_one_line(baton: Baton) -> None:
    """A malformed evidence item is VALIDATION_ERROR in one line (``field: message``),
    without pydantic's layout or documentation URL."""
    with pytest.raises(ValidationError) as info:
        baton.outcomes.record(SUBJ, "failed", evidence=[{"kind": "log"}])
    assert info.value.message == "bad evidence item: uri: Field required"


def test_success_needs_evidence(baton: Baton) -> None:
    """A succeeded outcome without evidence is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.outcomes.record(SUBJ, "succeeded", evidence=[])
    with pytest.raises(ValidationError, match="at least one evidence item"):
        baton.outcomes.record(SUBJ, "succeeded")
    assert baton.outcomes.list(SUBJ) == []


@pytest.mark.parametrize("status", ["done", "SUCCEEDED", "", None, 1])
def test_bad_status(baton: Baton, status: object) -> None:
    """An outcome status other than succeeded/failed/cancelled is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.outcomes.record(SUBJ, status, evidence=EVIDENCE)  # type: ignore[arg-type]
    assert baton.outcomes.list(SUBJ) == []
    assert kinds(baton) == []


@pytest.mark.parametrize(
    "evidence",
    [
        {"kind": "file", "uri": "u"},
        "file:///x",
        None,
        [{"kind": "file"}],
        [{"uri": "u"}],
        [{"kind": "", "uri": "u"}],
        [{"kind": "file", "uri": ""}],
        [{"kind": "file", "uri": "u", "secret": 1}],
        ["file:///x"],
        [42],
        [{"kind": "f", "uri": "u"}] * 1001,
    ],
    ids=[
        "dict",
        "str",
        "none",
        "no-uri",
        "no-kind",
        "empty-kind",
        "empty-uri",
        "extra-field",
        "str-item",
        "int-item",
        "too-many",
    ],
)
def test_bad_evidence(baton: Baton, evidence: Any) -> None:
    """Malformed evidence is VALIDATION_ERROR and records nothing."""
    with pytest.raises(ValidationError):
        baton.outcomes.record(SUBJ, "failed", evidence=evidence)
    assert baton.outcomes.list(SUBJ) == []
    assert kinds(baton) == []


def test_outcome_links_trace_back(baton: Baton) -> None:
    """An outcome links to its lease, handoff and checkpoint, which a reviewer can follow."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    ck = baton.checkpoints.save(SUBJ, "analysis", {"lines": 120})
    h = baton.handoffs.create("reviewer", SUBJ, checkpoint_id=ck.checkpoint_id)
    out = baton.outcomes.record(
        SUBJ,
        "succeeded",
        evidence=EVIDENCE,
        lease_id=lease.lease_id,
        handoff_id=h.handoff_id,
        checkpoint_id=ck.checkpoint_id,
    )
    reviewer = baton.as_principal("reviewer")
    seen = reviewer.outcomes.list(SUBJ)[0]
    assert (seen.lease_id, seen.handoff_id, seen.checkpoint_id) == (
        lease.lease_id,
        h.handoff_id,
        ck.checkpoint_id,
    )
    assert seen.outcome_id == out.outcome_id
    assert reviewer.checkpoints.get_by_id(seen.checkpoint_id).state == {"lines": 120}
    assert reviewer.handoffs.get(seen.handoff_id).checkpoint_id == ck.checkpoint_id


@pytest.mark.parametrize("link", ["lease_id", "handoff_id", "checkpoint_id"])
def test_unknown_link_is_not_found(baton: Baton, link: str) -> None:
    """An outcome linking an unknown lease, handoff or checkpoint is NOT_FOUND, no record."""
    with pytest.raises(NotFoundError):
        baton.outcomes.record(SUBJ, "failed", evidence=[], **{link: FAKE_ID})
    assert baton.outcomes.list(SUBJ) == []


def _refusal(b: Baton, **link: Any) -> str:
    """The NOT_FOUND message of ``b`` recording a failed outcome with ``link``."""
    with pytest.raises(NotFoundError) as err:
        b.outcomes.record(SUBJ, "failed", evidence=[], **link)
    return err.value.message


def test_another_principals_lease_link_is_not_found(baton: Baton) -> None:
    """An agent cannot record an outcome under another principal's lease generation: it is
    NOT_FOUND worded as an unknown id, nothing is written, and the holder still records
    its own succeeded outcome under that generation (``_rules.access.check_outcome_link``)."""
    bob = baton.as_principal("agent-b")
    theirs = bob.leases.acquire("job", "run", ttl_seconds=60)
    before = kinds(baton)
    for status, evidence in (("succeeded", EVIDENCE), ("failed", [])):
        with pytest.raises(NotFoundError) as err:
            baton.outcomes.record(SUBJ, status, evidence=evidence, lease_id=theirs.lease_id)
        assert err.value.message == f"lease {theirs.lease_id} not found"
    assert _refusal(baton, lease_id=FAKE_ID) == f"lease {FAKE_ID} not found"
    assert kinds(baton) == before
    assert baton.outcomes.list(SUBJ) == []
    out = bob.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=theirs)
    assert (out.principal, out.lease_id) == ("agent-b", theirs.lease_id)


@pytest.mark.parametrize("link", ["checkpoint_id", "handoff_id"])
def test_unreadable_checkpoint_or_handoff_link_is_not_found(baton: Baton, link: str) -> None:
    """A checkpoint or handoff the caller may not read (another principal's checkpoint; a
    handoff between two others) cannot be linked: NOT_FOUND with the message of a made-up
    id and of ``checkpoints.get_by_id`` / ``handoffs.get``, so its existence does not
    leak; nothing is written."""
    bob = baton.as_principal("agent-b")
    ck = bob.checkpoints.save("bs", "k", {"secret": 1})
    h = bob.handoffs.create("agent-c", "bs", checkpoint_id=ck.checkpoint_id, message="private")
    real, kind = (
        (ck.checkpoint_id, "checkpoint") if link == "checkpoint_id" else (h.handoff_id, "handoff")
    )
    before = kinds(baton)
    read = baton.checkpoints.get_by_id if link == "checkpoint_id" else baton.handoffs.get
    with pytest.raises(NotFoundError) as hidden:
        read(real)
    assert _refusal(baton, **{link: real}) == hidden.value.message == f"{kind} {real} not found"
    assert _refusal(baton, **{link: FAKE_ID}) == f"{kind} {FAKE_ID} not found"
    assert kinds(baton) == before
    assert baton.outcomes.list(SUBJ) == []


def _bobs_links(bob: Baton) -> tuple[Lease, dict[str, Any]]:
    """A lease of ``bob``'s, and as outcome links: it, a checkpoint ``bob`` wrote and
    ``bob``'s handoff of that checkpoint to ``agent-c``."""
    ck = bob.checkpoints.save("bs", "k", {"n": 1})
    h = bob.handoffs.create("agent-c", "bs", checkpoint_id=ck.checkpoint_id)
    lease = bob.leases.acquire("job", "run", ttl_seconds=60)
    return lease, {
        "lease_id": lease.lease_id,
        "handoff_id": h.handoff_id,
        "checkpoint_id": ck.checkpoint_id,
    }


def _links(out: Outcome) -> dict[str, str | None]:
    return {
        "lease_id": out.lease_id,
        "handoff_id": out.handoff_id,
        "checkpoint_id": out.checkpoint_id,
    }


def test_own_links_still_work(baton: Baton) -> None:
    """A principal links the leases it holds or held, the handoffs it sent or received and
    the checkpoints it wrote or was handed."""
    bob, carol = baton.as_principal("agent-b"), baton.as_principal("agent-c")
    lease, ids = _bobs_links(bob)
    bob.leases.release(lease)
    assert _links(bob.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, **ids)) == ids
    del ids["lease_id"]
    got = carol.outcomes.record(SUBJ, "failed", **ids)
    assert got.principal == "agent-c"
    assert _links(got) == {**ids, "lease_id": None}
    assert _refusal(carol, lease_id=lease.lease_id) == f"lease {lease.lease_id} not found"


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_owner_or_admin_links_anyones(baton: Baton, role: str) -> None:
    """``owner``/``admin`` may link any of the org's leases, checkpoints and handoffs (they
    read them all and may force-release any lease); the outcome is credited to them, and a
    succeeded one settles the generation, so the holder's second one is CONFLICT."""
    bob = baton.as_principal("agent-b")
    lease, ids = _bobs_links(bob)
    out = baton.as_principal("boss", role=role).outcomes.record(
        SUBJ, "succeeded", evidence=EVIDENCE, **ids
    )
    assert (out.principal, _links(out)) == ("boss", ids)
    with pytest.raises(ConflictError):
        bob.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=lease)


def test_fenced_outcome(baton: Baton) -> None:
    """An outcome fenced by the current lease records the fence's lease and epoch."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    out = baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=lease)
    assert out.fence_epoch == lease.epoch
    assert out.lease_id == lease.lease_id


def test_fenced_outcome_after_takeover_is_stale(baton: Baton) -> None:
    """An outcome fenced by a lease someone else has since taken over is STALE_FENCE; the
    refusal is recorded as ``fence.rejected`` and nothing else is written."""
    lease = baton.leases.acquire("file", "main.py", ttl_seconds=30)
    baton.as_principal("boss", role="owner").leases.force_release(lease.lease_id)
    baton.as_principal("agent-b").leases.acquire("file", "main.py", ttl_seconds=30)
    events = kinds(baton)
    with pytest.raises(StaleFenceError):
        baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=lease)
    assert baton.outcomes.list(SUBJ) == []
    assert_refusal_recorded(baton, events, lease, "outcome.record")


# ------------------------------------------------------------------------------- events


def test_lease_transitions_append_events_in_order(baton: Baton) -> None:
    """Acquire, renew, transfer and release append their events in order with rising seq."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="r1")
    renewed = baton.leases.renew(lease)
    moved = baton.leases.transfer(
        renewed, to_principal="agent-b", new_execution_key="r2", ttl_seconds=30
    )
    baton.as_principal("agent-b").leases.release(moved)
    events = baton.events.list()
    assert [e.kind for e in events] == [
        "lease.acquired",
        "lease.renewed",
        "lease.transferred",
        "lease.released",
    ]
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    assert len({e.event_id for e in events}) == 4
    assert [e.principal for e in events] == ["agent-a", "agent-a", "agent-a", "agent-b"]
    assert events[0].payload["lease_id"] == lease.lease_id
    assert events[0].payload["epoch"] == lease.epoch
    assert events[1].payload["version"] == renewed.version
    assert events[2].payload["lease_id"] == moved.lease_id
    assert events[2].payload["epoch"] == moved.epoch
    assert events[3].payload["lease_id"] == moved.lease_id
    assert all(e.occurred_at.tzinfo is not None for e in events)


def test_supersede_appends_acquired(baton: Baton) -> None:
    """A re-acquire by the holder appends one lease.acquired for the new generation."""
    first = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    second = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    events = baton.events.list()
    assert [e.kind for e in events] == ["lease.acquired", "lease.acquired"]
    assert [e.payload["lease_id"] for e in events] == [first.lease_id, second.lease_id]


def test_other_transitions_append_events(baton: Baton) -> None:
    """Checkpoint, handoff and outcome writes append their documented events in order."""
    ck = baton.checkpoints.save(SUBJ, "progress", {"n": 1})
    h1 = baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck.checkpoint_id)
    h2 = baton.handoffs.create("agent-b", "other")
    b = baton.as_principal("agent-b")
    b.handoffs.resolve(h1.handoff_id, "accepted")
    b.handoffs.resolve(h2.handoff_id, "rejected")
    b.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE)
    events = baton.events.list()
    assert [e.kind for e in events] == [
        "checkpoint.saved",
        "handoff.created",
        "handoff.created",
        "handoff.accepted",
        "handoff.rejected",
        "outcome.recorded",
    ]
    assert events[0].payload["checkpoint_id"] == ck.checkpoint_id
    assert events[1].payload["handoff_id"] == h1.handoff_id
    assert events[3].payload["handoff_id"] == h1.handoff_id
    assert events[4].payload["handoff_id"] == h2.handoff_id
    assert [e.subject for e in events][-1] == SUBJ


def test_unknown_event_kind_is_validation_error(baton: Baton) -> None:
    """Event kinds are a fixed set: an unknown ``kind`` filter is VALIDATION_ERROR naming
    the known kinds, not an empty list; a known one filters."""
    baton.checkpoints.save(SUBJ, "progress", {"n": 1})
    with pytest.raises(ValidationError, match=r"unknown event kind 'nope'.*lease\.acquired"):
        baton.events.list(kind="nope")
    assert [e.kind for e in baton.events.list(kind="checkpoint.saved")] == ["checkpoint.saved"]


def test_force_release_event_names_who_forced(baton: Baton) -> None:
    """A force release appends lease.released recording who forced it."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    baton.as_principal("boss", role="admin").leases.force_release(lease.lease_id)
    last = baton.events.list()[-1]
    assert last.kind == "lease.released"
    assert last.principal == "boss"
    assert last.payload["forced_by"] == "boss"


def test_refused_operations_append_nothing(baton: Baton) -> None:
    """Refused operations (conflict, version conflict, forbidden) append no event."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    before = kinds(baton)
    b = baton.as_principal("agent-b")
    with pytest.raises(ConflictError):
        b.leases.acquire("deploy", "svc", ttl_seconds=30)
    with pytest.raises(VersionConflictError):
        baton.leases.renew(lease, expected_version=99)
    with pytest.raises(ForbiddenError):
        b.leases.force_release(lease.lease_id)
    with pytest.raises(NotFoundError):
        b.leases.release_by_id(lease.lease_id)
    assert kinds(baton) == before


def test_paging(baton: Baton) -> None:
    """Pages by after_seq and limit cover the stream exactly once, in order."""
    for i in range(7):
        baton.checkpoints.save(SUBJ, "progress", {"n": i})
    everything = baton.events.list()
    assert len(everything) == 7
    pages: list[int] = []
    after = 0
    while True:
        page = baton.events.list(after_seq=after, limit=3)
        assert len(page) <= 3
        if not page:
            break
        assert all(e.seq > after for e in page)
        pages.extend(e.seq for e in page)
        after = page[-1].seq
    assert pages == [e.seq for e in everything]
    assert [e.payload["version"] for e in everything] == list(range(1, 8))
    assert baton.events.list(after_seq=everything[-1].seq) == []


def test_filter_by_kind(baton: Baton) -> None:
    """Events can be filtered by kind."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=30)
    baton.leases.renew(lease)
    baton.leases.renew(lease)
    baton.checkpoints.save(SUBJ, "progress", {"n": 1})
    assert [e.kind for e in baton.events.list(kind="lease.renewed")] == ["lease.renewed"] * 2


@pytest.mark.parametrize(
    "kwargs", [{"after_seq": -1}, {"limit": 0}, {"limit": 1001}, {"after_seq": "1"}]
)
def test_bad_paging_arguments(baton: Baton, kwargs: dict[str, Any]) -> None:
    """A negative after_seq or a limit outside 1..1000 is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.events.list(**kwargs)


def test_second_succeeded_outcome_under_one_lease_is_a_conflict(baton: Baton) -> None:
    """A second ``succeeded`` outcome of a subject under the same lease generation is refused
    with CONFLICT and writes nothing; its exact retry replays; failed ones and another
    generation's are not limited."""
    lease = baton.leases.acquire("file", "x.py", ttl_seconds=60)
    first = baton.outcomes.record(
        SUBJ, "succeeded", evidence=EVIDENCE, fence=lease, idempotency_key="o1"
    )
    assert baton.outcomes.record(
        SUBJ, "succeeded", evidence=EVIDENCE, fence=lease, idempotency_key="o1"
    ).replayed
    before = kinds(baton)
    with pytest.raises(ConflictError) as err:
        baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=lease)
    assert err.value.code == "CONFLICT"
    with pytest.raises(ConflictError):
        baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, lease_id=lease.lease_id)
    assert kinds(baton) == before
    baton.outcomes.record(SUBJ, "failed", evidence=[], fence=lease)
    baton.leases.release(lease)
    again = baton.leases.acquire("file", "x.py", ttl_seconds=60)
    baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=again)
    assert [o.status for o in baton.outcomes.list(SUBJ)].count("succeeded") == 2
    assert first.outcome_id in {o.outcome_id for o in baton.outcomes.list(SUBJ)}


def test_an_outcome_linking_another_lease_than_its_fence_is_refused(baton: Baton) -> None:
    """A ``lease_id`` link that is not the fence's lease is VALIDATION_ERROR and writes
    nothing: the outcome is recorded under one lease generation. Before, the one-succeeded
    rule was checked against the link while the fence's generation did the work, so a
    holder of two leases recorded ``succeeded`` for one piece of work again and again by
    linking the other (found by the hostile REST trial). Linking the fence's own lease
    still works, and counts against that generation."""
    fenced = baton.leases.acquire("file", "a.py", ttl_seconds=60)
    other = baton.leases.acquire("file", "b.py", ttl_seconds=60)
    baton.outcomes.record(SUBJ, "succeeded", evidence=EVIDENCE, fence=fenced)
    before = kinds(baton)
    for status in ("succeeded", "failed"):
        with pytest.raises(ValidationError, match="is not the fence's lease"):
            baton.outcomes.record(
                SUBJ, status, evidence=EVIDENCE, fence=fenced, lease_id=other.lease_id
            )
    assert kinds(baton) == before
    with pytest.raises(ConflictError):
        baton.outcomes.record(
            SUBJ, "succeeded", evidence=EVIDENCE, fence=fenced, lease_id=fenced.lease_id
        )
    assert [o.status for o in baton.outcomes.list(SUBJ)] == ["succeeded"]
