"""Paged lists (lease list, handoff inbox, event stream, outcomes, checkpoint history:
``limit`` and an opaque ``cursor``, keyset paging) and the deletion of one's own checkpoint
(the seed service's ``DELETE``; DESIGN.md "Checkpoints": history stays, a pending handoff
keeps what it carries), on every store arm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from prefect_baton import (
    Baton,
    Checkpoint,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    Page,
    ValidationError,
    VersionConflictError,
)
from prefect_baton._rules.paging import (
    HISTORY_PAGE_BYTES,
    MAX_PAGE,
    encode_cursor,
    history_page_cap,
)

from ._util import kinds, pages

SUBJ = "ticket-7"
KIND = "progress"


def test_lease_list_pages_by_cursor(baton: Baton) -> None:
    """Five leases (three acquired in one step, so with one acquire time) read two at a
    time: every lease once, newest first, whatever ties the acquire times have."""
    batch = baton.leases.acquire_many(
        [("deploy", "a"), ("deploy", "b"), ("deploy", "c")], ttl_seconds=60
    )
    more = [baton.leases.acquire("deploy", x, ttl_seconds=60) for x in ("d", "e")]
    everything = baton.leases.list()
    assert {x.lease_id for x in everything} == {x.lease_id for x in [*batch, *more]}
    paged = pages(lambda c: baton.leases.list(limit=2, cursor=c), "leases", 2)
    assert [x.lease_id for x in paged] == [x.lease_id for x in everything]
    keys = [(x.acquired_at, x.lease_id) for x in paged]
    assert keys == sorted(keys, reverse=True)
    ended = pages(lambda c: baton.leases.list(include_ended=True, limit=3, cursor=c), "leases", 3)
    assert len(ended) == 5


def test_inbox_pages_by_cursor(baton: Baton) -> None:
    """The inbox read one at a time gives every pending handoff once, oldest first."""
    made = [baton.handoffs.create("agent-b", f"s-{i}") for i in range(3)]
    b = baton.as_principal("agent-b")
    paged = pages(lambda c: b.handoffs.inbox(limit=1, cursor=c), "handoffs", 1)
    assert [h.handoff_id for h in paged] == [h.handoff_id for h in b.handoffs.inbox()]
    assert {h.handoff_id for h in paged} == {h.handoff_id for h in made}


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "nonsense",
        "c1.",
        "c1.!!!!",
        "c1." + "A" * 2000,
        encode_cursor("events", (3,)),  # another list's
        encode_cursor("handoffs", (1, "hoff_x")),
    ],
)
def test_bad_lease_cursor_is_validation_error(baton: Baton, cursor: str) -> None:
    """A cursor that is not one of the lease list is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.leases.list(cursor=cursor)


def test_bad_inbox_cursor_is_validation_error(baton: Baton) -> None:
    """A lease list's cursor given to the inbox is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.handoffs.inbox(cursor=encode_cursor("leases", (1, "lease_x")))


def _lists(baton: Baton) -> dict[str, Callable[..., Page[Any]]]:
    """The paged lists of one arm, each filled by :func:`_add` (leases of ``baton``,
    handoffs to agent-b read from agent-b's inbox and from the org's list, outcomes,
    the versions of one checkpoint, events)."""
    b = baton.as_principal("agent-b")

    def history(**page: Any) -> Page[Checkpoint]:
        return baton.checkpoints.history(SUBJ, KIND, **page)

    return {
        "leases": baton.leases.list,
        "inbox": b.handoffs.inbox,
        "handoffs": b.handoffs.list,
        "outcomes": baton.outcomes.list,
        "history": history,
        "events": baton.events.list,
    }


#: How many items of each list of :func:`_lists` one :func:`_add` makes (1 unless named).
_PER_ADD = {"events": 4}


def _add(baton: Baton, i: int) -> None:
    """One more item in every list of :func:`_lists` but events, four more events: a
    lease, a handoff, an outcome and a checkpoint version (each an event)."""
    baton.leases.acquire("deploy", f"r{i}", ttl_seconds=60)
    baton.handoffs.create("agent-b", f"s{i}")
    baton.outcomes.record(f"o{i}", "failed")
    baton.checkpoints.save(SUBJ, KIND, {"i": i})


def test_an_exactly_full_last_page_has_no_next_cursor(baton: Baton) -> None:
    """A list of exactly ``limit`` items is one page with ``next_cursor`` None; one item
    more: a page of ``limit`` with a cursor, then a page of the one item left without."""
    for i in range(2):
        _add(baton, i)
    for name, listing in _lists(baton).items():
        limit = 2 * _PER_ADD.get(name, 1)
        whole = listing(limit=limit)
        assert len(whole) == limit, name
        assert whole.next_cursor is None, name
    _add(baton, 2)
    for name, listing in _lists(baton).items():
        limit = 3 * _PER_ADD.get(name, 1)
        assert listing(limit=limit).next_cursor is None, name
        first = listing(limit=limit - 1)
        assert first.next_cursor is not None, name
        second = listing(limit=limit - 1, cursor=first.next_cursor)
        assert len(second) == 1, name
        assert second[0] not in first, name
        assert second.next_cursor is None, name


def test_the_largest_page_learns_whether_another_follows(
    baton: Baton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the largest page the store still serves the one item more (the REST store asks
    the API for it with the page's cursor), so a full page at the maximum has a cursor
    only when an item follows; ``limit`` above the maximum stays VALIDATION_ERROR."""
    largest = {"leases": 2, "inbox": 2, "handoffs": 2, "outcomes": 2, "history": 2, "events": 8}
    lists = {"leases": "leases", "handoffs": "handoffs", "outcomes": "outcomes"}
    for name, list_name in {**lists, "history": "checkpoints", "events": "events"}.items():
        monkeypatch.setitem(MAX_PAGE, list_name, largest[name])
    for i in range(2):
        _add(baton, i)
    for name, listing in _lists(baton).items():
        n = largest[name]
        assert listing(limit=n).next_cursor is None, name
        with pytest.raises(ValidationError, match=f"limit must be an integer from 1 to {n}"):
            listing(limit=n + 1)
    _add(baton, 2)
    for name, listing in _lists(baton).items():
        n = largest[name]
        first = listing(limit=n)
        assert len(first) == n, name
        assert first.next_cursor is not None, name
        second = listing(limit=n, cursor=first.next_cursor)
        assert len(second) == 3 * n // 2 - n, name
        assert second.next_cursor is None, name


def test_events_after_seq_or_cursor(baton: Baton) -> None:
    """``after_seq`` given at all (0 too) with ``cursor`` is VALIDATION_ERROR naming
    ``after_seq``; neither reads from the start; a bad ``after_seq`` is named so."""
    _add(baton, 0)
    first = baton.events.list(limit=1)
    assert first.next_cursor is not None
    for after in (0, 1):
        with pytest.raises(ValidationError, match=r"^give after_seq or cursor, not both$"):
            baton.events.list(after_seq=after, cursor=first.next_cursor)
    kinds_ = ["lease.acquired", "handoff.created", "outcome.recorded", "checkpoint.saved"]
    assert [e.kind for e in baton.events.list()] == kinds_
    assert baton.events.list(cursor=first.next_cursor) == baton.events.list(after_seq=first[0].seq)
    with pytest.raises(ValidationError, match=r"^after_seq must be an integer from 0 to"):
        baton.events.list(after_seq=-1)


def test_outcome_list_pages_by_cursor(baton: Baton) -> None:
    """Seven outcomes (of two subjects, several often in one millisecond) read two at a
    time: every outcome once, oldest first (by record time, then outcome id), the order of
    the unpaged list; a subject's outcomes page the same way."""
    made = [baton.outcomes.record(f"subj-{i % 2}", "failed") for i in range(7)]
    everything = baton.outcomes.list()
    paged = pages(lambda c: baton.outcomes.list(limit=2, cursor=c), "outcomes", 2)
    assert [o.outcome_id for o in paged] == [o.outcome_id for o in everything]
    assert sorted(o.outcome_id for o in paged) == sorted(o.outcome_id for o in made)
    keys = [(o.recorded_at, o.outcome_id) for o in paged]
    assert keys == sorted(keys)
    one = pages(lambda c: baton.outcomes.list("subj-1", limit=2, cursor=c), "outcomes", 2)
    # Outcomes made in one millisecond are ordered by outcome id, not by when they were made.
    assert [o.outcome_id for o in one] == [o.outcome_id for o in paged if o.subject_id == "subj-1"]


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "nonsense",
        "c1.",
        "c1.!!!!",
        "c1." + "A" * 2000,
        encode_cursor("outcomes", (1, "x\x00")),  # an id no database can hold
        encode_cursor("events", (3,)),  # another list's
        encode_cursor("handoffs", (1, "hoff_x")),
        encode_cursor("leases", (1, "lease_x")),
        encode_cursor("keys", (1, "key_x")),
    ],
)
def test_bad_outcome_cursor_is_validation_error(baton: Baton, cursor: str) -> None:
    """A cursor that is not one of the outcome list is VALIDATION_ERROR."""
    baton.outcomes.record("s", "failed")
    with pytest.raises(ValidationError, match="cursor"):
        baton.outcomes.list(cursor=cursor)


def test_checkpoint_history_pages_by_cursor(baton: Baton) -> None:
    """Five versions read two at a time come back in three pages, oldest first, every
    version once, the last page without a next cursor; another principal's history pages
    the same way (``principal=``)."""
    saved = [baton.checkpoints.save(SUBJ, KIND, {"n": n}) for n in range(5)]
    seen: list[Page[Checkpoint]] = []
    cursor = None
    while not seen or cursor is not None:
        seen.append(baton.checkpoints.history(SUBJ, KIND, limit=2, cursor=cursor))
        cursor = seen[-1].next_cursor
    assert [len(p) for p in seen] == [2, 2, 1]
    assert [c.version for p in seen for c in p] == [1, 2, 3, 4, 5]
    assert [c.state for p in seen for c in p] == [c.state for c in saved]
    assert baton.checkpoints.history(SUBJ, KIND) == [c for p in seen for c in p]
    admin = baton.as_principal("boss", role="admin")
    theirs = pages(
        lambda c: admin.checkpoints.history(SUBJ, KIND, baton.principal, limit=3, cursor=c),
        "checkpoints",
        3,
    )
    assert [c.version for c in theirs] == [1, 2, 3, 4, 5]


def test_a_history_page_holds_at_most_16_mib_of_states(baton: Baton) -> None:
    """A checkpoint's history page holds at most :data:`HISTORY_PAGE_BYTES` (16 MiB) of
    the largest states: with the default 1 MiB states, 16 versions, whatever ``limit``
    asks; its ``next_cursor`` goes on, and every version is read once. Before, a page of
    100 versions of 1 MiB states made one answer of 100 MB to 470 MB over REST and MCP (a
    hostile trial's server reached 5 GB for one MCP call)."""
    cap = history_page_cap(baton.checkpoints.state_max_bytes)
    assert cap == HISTORY_PAGE_BYTES // (1024 * 1024) == 16
    for n in range(cap + 4):
        baton.checkpoints.save(SUBJ, KIND, {"n": n})
    first = baton.checkpoints.history(SUBJ, KIND, limit=100)
    assert [c.version for c in first] == list(range(1, cap + 1))
    assert first.next_cursor is not None
    rest = baton.checkpoints.history(SUBJ, KIND, limit=100, cursor=first.next_cursor)
    assert [c.version for c in rest] == list(range(cap + 1, cap + 5))
    assert rest.next_cursor is None
    exact = baton.checkpoints.history(SUBJ, KIND, limit=cap)
    assert [c.version for c in exact] == list(range(1, cap + 1))
    assert exact.next_cursor is not None


@pytest.mark.parametrize("limit", [0, -1, 101, True, "2"])
def test_bad_checkpoint_history_limit_is_validation_error(baton: Baton, limit: Any) -> None:
    """``limit`` outside 1..100 (or not an integer) is VALIDATION_ERROR."""
    baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    with pytest.raises(ValidationError, match=r"^limit must be an integer from 1 to 100$"):
        baton.checkpoints.history(SUBJ, KIND, limit=limit)


@pytest.mark.parametrize(
    "cursor",
    [
        "nonsense",
        "c1.!!!!",
        encode_cursor("checkpoints", (1, "x\x00")),  # an id no database can hold
        encode_cursor("outcomes", (1, "ckpt_x")),  # another list's
        encode_cursor("events", (3,)),
    ],
)
def test_bad_checkpoint_history_cursor_is_validation_error(baton: Baton, cursor: str) -> None:
    """A cursor that is not one of a checkpoint history is VALIDATION_ERROR."""
    baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    with pytest.raises(ValidationError, match=r"^cursor is not a cursor of the checkpoints list$"):
        baton.checkpoints.history(SUBJ, KIND, cursor=cursor)


def test_delete_own_checkpoint(baton: Baton) -> None:
    """The writer deletes its checkpoint: it reads as absent (by subject and kind, and by
    id, saying it was deleted), the history keeps every version, ``checkpoint.deleted`` is
    recorded, a second delete is NOT_FOUND, and a new save continues the versions (a CAS
    expects 0)."""
    baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 2})
    gone = baton.checkpoints.delete(ck.checkpoint_id)
    assert (gone.checkpoint_id, gone.version, gone.state) == (ck.checkpoint_id, 2, {"n": 2})
    assert gone.expires_at is not None
    assert baton.checkpoints.get(SUBJ, KIND) is None
    with pytest.raises(NotFoundError, match=f"checkpoint {ck.checkpoint_id} was deleted$"):
        baton.checkpoints.get_by_id(ck.checkpoint_id)
    assert [c.version for c in baton.checkpoints.history(SUBJ, KIND)] == [1, 2]
    assert kinds(baton)[-1] == "checkpoint.deleted"
    with pytest.raises(NotFoundError):
        baton.checkpoints.delete(ck.checkpoint_id)
    with pytest.raises(VersionConflictError):
        baton.checkpoints.save(SUBJ, KIND, {"n": 3}, expected_version=2)
    again = baton.checkpoints.save(SUBJ, KIND, {"n": 3}, expected_version=0)
    assert (again.checkpoint_id, again.version) == (ck.checkpoint_id, 3)


def test_delete_is_the_writers_alone(baton: Baton) -> None:
    """Another principal, an owner included, cannot delete your checkpoint (FORBIDDEN);
    an unknown id is NOT_FOUND; nothing changes."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    for other in (baton.as_principal("agent-b"), baton.as_principal("boss", role="owner")):
        with pytest.raises(ForbiddenError):
            other.checkpoints.delete(ck.checkpoint_id)
    with pytest.raises(NotFoundError):
        baton.checkpoints.delete("ckpt_" + "0" * 32)
    assert baton.checkpoints.get(SUBJ, KIND) == ck.model_copy(update={"replayed": False})
    assert "checkpoint.deleted" not in kinds(baton)


def test_delete_refused_while_a_pending_handoff_carries_it(baton: Baton) -> None:
    """A checkpoint carried by a pending handoff does not disappear under its recipient
    (CONFLICT, nothing changes); once the handoff is resolved it can be deleted."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    h = baton.handoffs.create("agent-b", SUBJ, checkpoint_id=ck.checkpoint_id)
    with pytest.raises(ConflictError) as ei:
        baton.checkpoints.delete(ck.checkpoint_id)
    assert h.handoff_id in ei.value.message
    b = baton.as_principal("agent-b")
    assert b.checkpoints.get_by_id(ck.checkpoint_id).state == {"n": 1}
    b.handoffs.resolve(h.handoff_id, "accepted")
    assert baton.checkpoints.delete(ck.checkpoint_id).checkpoint_id == ck.checkpoint_id


def test_delete_replays_under_its_key(baton: Baton) -> None:
    """A delete retried under its idempotency key replays the stored result."""
    ck = baton.checkpoints.save(SUBJ, KIND, {"n": 1})
    first = baton.checkpoints.delete(ck.checkpoint_id, idempotency_key="del-1")
    again = baton.checkpoints.delete(ck.checkpoint_id, idempotency_key="del-1")
    assert again.replayed
    assert again.model_copy(update={"replayed": False}) == first
    assert kinds(baton).count("checkpoint.deleted") == 1
