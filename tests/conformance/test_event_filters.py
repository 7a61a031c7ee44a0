"""The event stream filtered by resource and by subject (``b.events.list(resource_type=...,
resource_id=..., subject=...)``; DESIGN.md "Events"), on every arm."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from prefect_baton import Baton, Event, StaleFenceError, ValidationError

RT, RID = "deploy", "svc"
#: The kinds of the resource's events in the history of :func:`_history`, in order.
RESOURCE_KINDS = [
    "lease.acquired",
    "lease.renewed",
    "handoff.created",
    "lease.transferred",
    "handoff.accepted",
    "fence.rejected",
    "lease.released",
]


@dataclass
class History:
    """The lease ids of resource ``(RT, RID)`` and every event of the org, in order."""

    lease_ids: set[str]
    events: list[Event]


def _history(baton: Baton) -> History:
    """A history mixing the resource's events with others': another resource of the same
    type, resources whose ``<type>/<id>`` subjects coincide, a checkpoint, a handoff without
    a lease and an outcome whose subject is ``RID``, and a handoff carrying the resource's
    lease under another subject (accepted), then a stale fenced write and the release."""
    bob = baton.as_principal("agent-b")
    lease = baton.leases.acquire(RT, RID, ttl_seconds=60)
    baton.leases.acquire(RT, "svc-2", ttl_seconds=60)
    baton.leases.acquire(RT, f"{RID}/x", ttl_seconds=60)  # subject deploy/svc/x
    baton.leases.acquire(f"{RT}/{RID}", "x", ttl_seconds=60)  # subject deploy/svc/x too
    lease = baton.leases.renew(lease)
    baton.checkpoints.save(RID, "plan", {"step": 1})
    offer = baton.handoffs.create("agent-b", "ticket-1", lease=lease)
    taken = bob.handoffs.resolve(offer.handoff_id, "accepted").lease
    assert taken is not None
    baton.handoffs.create("agent-b", RID, message="no lease")
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save(RID, "plan", {"step": 2}, fence=lease)
    baton.outcomes.record(RID, "failed", evidence=[])
    bob.leases.release(taken)
    return History({lease.lease_id, taken.lease_id}, _all(baton))


def _all(b: Baton, **filters: Any) -> list[Event]:
    """Every event ``filters`` keep, paged 1,000 a call."""
    out: list[Event] = []
    while True:
        page = b.events.list(after_seq=out[-1].seq if out else 0, limit=1000, **filters)
        out += page
        if len(page) < 1000:
            return out


def test_resource_filter_returns_the_events_of_its_leases(baton: Baton) -> None:
    """Filtered by resource: exactly the events naming one of its leases (its lease and
    fence events, and the handoff that carried its lease under another subject), in seq
    order; not the events of another resource, even one whose subject reads the same, nor
    the checkpoint, handoff and outcome events that only share ``RID`` as subject."""
    h = _history(baton)
    got = baton.events.list(resource_type=RT, resource_id=RID, limit=1000)
    assert [e.kind for e in got] == RESOURCE_KINDS
    assert got == [e for e in h.events if e.payload.get("lease_id") in h.lease_ids]
    assert [e.seq for e in got] == sorted(e.seq for e in got)
    for e in got:
        if e.kind.startswith("lease.") or e.kind == "fence.rejected":
            assert (e.payload["resource_type"], e.payload["resource_id"]) == (RT, RID)
    coinciding = baton.events.list(resource_type=RT, resource_id=f"{RID}/x")
    assert [(e.kind, e.payload["resource_type"]) for e in coinciding] == [("lease.acquired", RT)]
    assert baton.events.list(resource_type=RT, resource_id="never-leased") == []


def test_resource_filter_with_kind(baton: Baton) -> None:
    """The resource filter and ``kind`` narrow together."""
    _history(baton)
    got = baton.events.list(kind="lease.acquired", resource_type=RT, resource_id=RID)
    assert [(e.kind, e.subject) for e in got] == [("lease.acquired", f"{RT}/{RID}")]


def test_resource_filter_pages_with_after_seq(baton: Baton) -> None:
    """Pages of the filtered list (``after_seq`` = the last seq, ``limit`` 2) cover it
    exactly once, in order."""
    h = _history(baton)
    want = [e for e in h.events if e.payload.get("lease_id") in h.lease_ids]
    pages: list[list[Event]] = []
    after = 0
    while page := baton.events.list(after_seq=after, limit=2, resource_type=RT, resource_id=RID):
        assert len(page) <= 2
        assert all(e.seq > after for e in page)
        pages.append(page)
        after = page[-1].seq
    assert [e for p in pages for e in p] == want
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    middle = want[2].seq
    assert baton.events.list(after_seq=middle, resource_type=RT, resource_id=RID) == want[3:]


def test_subject_filter_returns_the_events_of_that_subject(baton: Baton) -> None:
    """Filtered by subject: the events whose subject is exactly that, in seq order (a lease
    event's subject is ``<type>/<id>``)."""
    h = _history(baton)
    got = baton.events.list(subject=RID, limit=1000)
    assert [e.kind for e in got] == [
        "checkpoint.saved",
        "handoff.created",
        "outcome.recorded",
    ]
    assert got == [e for e in h.events if e.subject == RID]
    by_resource = baton.events.list(subject=f"{RT}/{RID}/x")
    assert len(by_resource) == 2  # two resources share this subject
    carried = baton.events.list(subject="ticket-1", kind="handoff.created")
    assert [e.payload["lease_id"] in h.lease_ids for e in carried] == [True]


def test_another_orgs_events_never_appear(baton: Baton, baton_in_org: Callable[..., Baton]) -> None:
    """The same resource and subject in another org: neither org's filtered list shows
    the other's events."""
    other = baton_in_org(f"org-{uuid.uuid4().hex[:12]}")
    theirs = other.leases.acquire(RT, RID, ttl_seconds=60)
    other.outcomes.record(RID, "failed", evidence=[])
    h = _history(baton)
    ours = baton.events.list(resource_type=RT, resource_id=RID, limit=1000)
    assert {e.event_id for e in ours} <= {e.event_id for e in h.events}
    assert theirs.lease_id not in {e.payload.get("lease_id") for e in ours}
    assert [e.kind for e in other.events.list(resource_type=RT, resource_id=RID)] == [
        "lease.acquired"
    ]
    assert [e.kind for e in other.events.list(subject=RID)] == ["outcome.recorded"]


@pytest.mark.parametrize("role", ["agent", "owner", "admin"])
def test_every_role_lists_as_unfiltered(baton: Baton, role: str) -> None:
    """Role limits are those of the unfiltered list: every role of the org lists every
    event, so another principal of each role sees the same filtered lists."""
    _history(baton)
    viewer = baton.as_principal(f"viewer-{role}", role)
    assert viewer.events.list(limit=1000) == baton.events.list(limit=1000)
    for filters in ({"resource_type": RT, "resource_id": RID}, {"subject": RID}):
        assert viewer.events.list(**filters) == baton.events.list(**filters) != []


BAD_FILTERS: list[Any] = [
    pytest.param({"resource_type": RT}, id="type-alone"),
    pytest.param({"resource_id": RID}, id="id-alone"),
    pytest.param({"resource_type": RT, "resource_id": None}, id="id-none"),
    pytest.param({"resource_type": "", "resource_id": RID}, id="type-empty"),
    pytest.param({"resource_type": RT, "resource_id": ""}, id="id-empty"),
    pytest.param({"resource_type": " ", "resource_id": RID}, id="type-blank"),
    pytest.param({"resource_type": RT, "resource_id": "x" * 257}, id="id-too-long"),
    pytest.param({"resource_type": "t\x00", "resource_id": RID}, id="type-control"),
    pytest.param({"resource_type": RT, "resource_id": "a\nb"}, id="id-control"),
    pytest.param({"resource_type": 1, "resource_id": RID}, id="type-int"),
    pytest.param({"resource_type": RT, "resource_id": ["svc"]}, id="id-list"),
    pytest.param({"resource_type": RT, "resource_id": "\ud800"}, id="id-surrogate"),
    pytest.param({"subject": ""}, id="subject-empty"),
    pytest.param({"subject": "s" * 257}, id="subject-too-long"),
    pytest.param({"subject": "a\x1fb"}, id="subject-control"),
    pytest.param({"subject": 7}, id="subject-int"),
]


@pytest.mark.parametrize("filters", BAD_FILTERS)
def test_bad_filter_is_validation_error(baton: Baton, filters: dict[str, Any]) -> None:
    """Only one of resource_type/resource_id, or a bad id (as ``leases.acquire`` refuses
    it), is VALIDATION_ERROR."""
    baton.leases.acquire(RT, RID, ttl_seconds=60)
    with pytest.raises(ValidationError) as info:
        baton.events.list(**filters)
    assert info.value.code == "VALIDATION_ERROR"
