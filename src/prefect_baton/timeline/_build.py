"""Building a :class:`~prefect_baton.timeline.Timeline` through the public client API:
the resource's events, the resource's outcomes and current epoch, and the leases and
handoffs the caller may read (so it works on every arm and respects organization and
role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prefect_baton._rules import core as _core
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Event, Handoff, Lease
from prefect_baton.timeline._model import Timeline, timeline_from_events

if TYPE_CHECKING:
    from prefect_baton._client.sync import Baton

__all__ = ["build_timeline", "read_events"]

_PAGE = 1000  # events per page (the event stream's maximum)


def read_events(baton: Baton) -> list[Event]:
    """Every event of ``baton``'s org, oldest first (paged, 1,000 a call), to hand to
    several :func:`build_timeline` calls as ``events=``.

    Raises:
        UnavailableError: the store cannot be reached.
    """
    return _pages(baton)


def _pages(
    baton: Baton,
    *,
    after: int = 0,
    resource_type: str | None = None,
    resource_id: str | None = None,
    subject: str | None = None,
) -> list[Event]:
    """Every event of ``baton``'s org after ``seq`` ``after`` that the filters (of
    ``events.list``) keep, oldest first, 1,000 a call."""
    events: list[Event] = []
    cursor: str | None = None
    while True:
        page = baton.events.list(
            after_seq=after if cursor is None else None,
            limit=_PAGE,
            resource_type=resource_type,
            resource_id=resource_id,
            subject=subject,
            cursor=cursor,
        )
        events += page
        if page.next_cursor is None:
            return events
        cursor = page.next_cursor


#: The most filtered reads :func:`_resource_events` makes before it stops catching up.
_MAX_READS = 20


def _resource_events(baton: Baton, resource_type: str, resource_id: str) -> list[Event]:
    """The events a timeline of ``(resource_type, resource_id)`` is folded from, oldest
    first: those of the resource's leases (its lease and fence events, and the events of
    handoffs carrying one of its leases) and those whose subject is ``resource_id`` (its
    handoffs and outcomes), each read through the filter of ``events.list`` (paged, 1,000
    a call), so the cost follows the resource's history, not the org's.

    The store has no "either filter" read, so the two filters are read in turn, each
    again after its last event, until a read finds nothing new (usually the third): the
    events are then those of one instant (the read before it), so an event committed
    between two reads is in the timeline under both filters or under neither (events
    commit in ``seq`` order). Under writes to the resource that never pause, it stops
    after :data:`_MAX_READS` reads with what it has.

    Raises:
        ValidationError: a bad resource id. UnavailableError: the store cannot be reached.
    """
    filters: list[dict[str, str]] = [
        {"resource_type": resource_type, "resource_id": resource_id},
        {"subject": resource_id},
    ]
    last = [0, 0]
    by_seq: dict[int, Event] = {}
    for n in range(_MAX_READS):
        which = n % 2
        got = _pages(baton, after=last[which], **filters[which])
        if n and not got:
            break
        by_seq.update((e.seq, e) for e in got)
        if got:
            last[which] = got[-1].seq
    return [by_seq[seq] for seq in sorted(by_seq)]


def build_timeline(
    baton: Baton,
    resource_type: str,
    resource_id: str,
    *,
    since: datetime | None = None,
    events: Sequence[Event] | None = None,
) -> Timeline:
    """The timeline of resource ``(resource_type, resource_id)`` as ``baton``'s caller may
    see it, read through the public client API (works on every arm: SQLite/PostgreSQL
    ledger, Redis authority, REST client).

    Reads the resource's events (:func:`_resource_events`: filtered by the store, paged,
    1,000 events a call), the outcomes of subject ``resource_id``, the resource's current
    epoch (``inspect``), and for the generations and handoffs the caller may read, the lease
    (execution key, purpose) and the handoff (an unresolved one that expired). Another
    organization's resource reads as an empty timeline (:attr:`Timeline.empty`).

    Args:
        baton: the client; its organization and role decide what is shown.
        resource_type, resource_id: the resource (ids as for ``leases.acquire``).
        since: only generations and marks from this time on (an aware ``datetime``; a naive
            one is taken as UTC).
        events: the org's events as :func:`read_events` returns them, read once for
            several resources (default: only this resource's, read here with
            :func:`_resource_events`). Only events ``baton`` may list belong there: another
            org's are not filtered out.

    Raises:
        ValidationError: a bad resource id. UnavailableError: the store cannot be reached.
    """
    rtype = _core.validate_id("resource_type", resource_type)
    rid = _core.validate_id("resource_id", resource_id)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    if events is None:
        events = _resource_events(baton, rtype, rid)
    info = baton.leases.inspect(rtype, rid)
    whom: dict[str, Any] = {
        "org": baton.org,
        "resource_type": rtype,
        "resource_id": rid,
        "viewer": baton.principal,
        "role": baton.role,
        "effective_epoch": info.epoch if info.held else None,
    }
    base = timeline_from_events(events, **whom)
    outcomes = (
        baton.outcomes.list(rid, limit=100_000)
        if any(m.kind == "outcome" for m in base.marks)
        else []
    )
    leases: list[Lease] = []
    for g in base.generations:
        if g.holder is not None:
            try:
                leases.append(baton.leases.get(g.lease_id))
            except NotFoundError:
                pass
    expired: list[Handoff] = []
    for m in base.marks:
        if m.kind == "handoff_created" and m.handoff_id and m.principal is not None:
            try:
                h = baton.handoffs.get(m.handoff_id)
            except NotFoundError:
                continue
            if h.status == "expired":
                expired.append(h)
    return timeline_from_events(
        events,
        **whom,
        outcomes=outcomes,
        leases=leases,
        expired_handoffs=expired,
        since=since,
        generated_at=base.generated_at,
    )
