"""The timeline of one resource: its lease generations and what happened to them, built
from the event stream (DESIGN.md "Events") through the public client API, so it reads the
same on every arm (SQLite/PostgreSQL ledger, Redis authority, REST client) and sees only
what the caller's organization and role may see.

:func:`timeline_from_events` is the pure part (events in, :class:`Timeline` out);
:func:`prefect_baton.timeline.build_timeline` reads the events, the resource's outcomes
and, where the caller may read them, each generation's lease and handoff, then calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from prefect_baton._rules.access import may_read
from prefect_baton._rules.events import EXPIRY_TAKEN_OVER, FENCE_REJECTED
from prefect_baton.models import Event, Evidence, Handoff, Lease, Outcome, Time, from_ms, wire_time

__all__ = [
    "GenerationEnd",
    "GenerationStart",
    "MarkKind",
    "Timeline",
    "TimelineGeneration",
    "TimelineMark",
    "timeline_from_events",
]

GenerationStart = Literal["acquired", "taken_over", "superseded", "transferred", "handed_off"]
"""How a generation began: a plain acquire, a takeover after the previous one expired, an
acquire that superseded the holder's own earlier generation, a transfer, or the transfer of
an accepted handoff."""

GenerationEnd = Literal[
    "active",
    "released",
    "expired",
    "taken_over",
    "superseded",
    "transferred",
    "handed_off",
    "revoked",
]
"""How a generation ended (``active``: it has not)."""

MarkKind = Literal[
    "acquired",
    "renewed",
    "taken_over",
    "transferred",
    "released",
    "expired",
    "handoff_created",
    "handoff_accepted",
    "handoff_rejected",
    "handoff_expired",
    "fence_rejected",
    "outcome",
]
"""The kinds of :class:`TimelineMark`."""

#: Evidence URI schemes a rendering may turn into links; anything else is shown as text.
LINK_SCHEMES = ("http://", "https://", "file://")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TimelineGeneration(_Model):
    """One lease generation of the resource: a band along time.

    Attributes:
        epoch: the generation's fencing token (``int``).
        lease_id: its lease id.
        holder: the holding principal, or ``None`` when the caller may not see it (only the
            holder itself and ``owner``/``admin`` may:
            :func:`~prefect_baton._rules.access.may_read`).
        execution_key, purpose: from the lease, when the caller may read it; else ``None``.
        started_at: when it was granted (aware UTC).
        expires_at: its last known expiry (aware UTC).
        ended_at: when it ended: the release or transfer, or the expiry for a generation
            that ran out (``None`` while active).
        start, end: how it began and ended (:data:`GenerationStart`, :data:`GenerationEnd`).
        renewals: how many renewals it had (``int``).
    """

    epoch: int
    lease_id: str
    holder: str | None
    execution_key: str | None = None
    purpose: str | None = None
    started_at: Time
    expires_at: Time
    ended_at: Time | None = None
    start: GenerationStart = "acquired"
    end: GenerationEnd = "active"
    renewals: int = 0


class TimelineMark(_Model):
    """One thing that happened to the resource at a point in time.

    Attributes:
        kind: :data:`MarkKind`.
        at: when (aware UTC, the authority's clock).
        epoch: the generation it concerns, or ``None``.
        principal: who acted, or ``None`` when hidden from the caller.
        summary: one line of plain text describing it (already redacted).
        seq: the event's sequence number (``None`` for a mark not read from an event: a
            handoff that expired unresolved).
        handoff_id, outcome_id, status: the record it concerns, when any.
        evidence: an outcome's evidence items (empty otherwise).
    """

    kind: MarkKind
    at: Time
    epoch: int | None = None
    principal: str | None = None
    summary: str
    seq: int | None = None
    handoff_id: str | None = None
    outcome_id: str | None = None
    status: str | None = None
    evidence: tuple[Evidence, ...] = ()


class Timeline(_Model):
    """The picture of one resource's leases, as one caller may see it.

    Attributes:
        org, resource_type, resource_id: the resource.
        viewer, role: who it was built for (holders they may not see are ``None``).
        since: the lower time bound asked for, or ``None``.
        before_since: how many generations and marks ``since`` left out (``int``): the
            visible history before the window.
        generated_at: when it was built (aware UTC, this machine's clock; for display).
        generations: the lease generations, oldest first.
        marks: the marks, in event order.
    """

    org: str
    resource_type: str
    resource_id: str
    viewer: str
    role: str
    since: Time | None = None
    before_since: int = 0
    generated_at: Time
    generations: tuple[TimelineGeneration, ...] = ()
    marks: tuple[TimelineMark, ...] = ()

    @property
    def empty(self) -> bool:
        """``True`` when nothing of the resource is visible (never leased, or another
        organization's)."""
        return not self.generations and not self.marks

    @property
    def empty_reason(self) -> str:
        """Why an :attr:`empty` timeline shows nothing (``str``, naming the resource): no
        visible history at all, or none in the window from :attr:`since` on (history
        before it was left out)."""
        what = f"{self.resource_type}/{self.resource_id}"
        if self.since is not None and self.before_since:
            return (
                f"no lease history of {what} falls in the window since "
                f"{wire_time(self.since)} ({self.before_since} earlier generation(s) and "
                "mark(s) left out)"
            )
        return f"no lease history of {what} visible in org {self.org}"

    @property
    def bounds(self) -> tuple[datetime, datetime]:
        """The time span to draw: from the first start or mark to the last end, expiry or
        mark (``generated_at`` twice for an empty timeline)."""
        times: list[datetime] = [m.at for m in self.marks]
        for g in self.generations:
            times += [g.started_at, g.ended_at or g.expires_at]
        if not times:
            return self.generated_at, self.generated_at
        return min(times), max(times)


@dataclass
class _Open:
    """A generation while the events are read."""

    epoch: int
    lease_id: str
    owner: str
    started_at: datetime
    expires_at: datetime
    start: GenerationStart
    ended_at: datetime | None = None
    end: GenerationEnd = "active"
    renewals: int = 0
    expiry_seen: bool = False


@dataclass
class _Reader:
    """Folds the events of one resource into generations and marks for one caller."""

    resource: str
    resource_id: str
    principal: str
    role: str
    gens: dict[str, _Open] = field(default_factory=dict)
    head: _Open | None = None
    marks: list[TimelineMark] = field(default_factory=list)
    handoffs: dict[str, str | None] = field(default_factory=dict)  # id -> carried lease

    def who(self, *parties: str | None) -> str | None:
        """The first party, if the caller may see the record of ``parties``."""
        named = [p for p in parties if p]
        if named and may_read(self.role, self.principal, named):
            return named[0]
        return None

    def name(self, principal: str | None) -> str:
        return principal or "someone"

    def mark(
        self,
        e: Event,
        kind: MarkKind,
        epoch: int | None,
        summary: str,
        *,
        principal: str | None = None,
        status: str | None = None,
        handoff_id: str | None = None,
        outcome_id: str | None = None,
        evidence: tuple[Evidence, ...] = (),
    ) -> None:
        self.marks.append(
            TimelineMark(
                kind=kind,
                at=e.occurred_at,
                epoch=epoch,
                seq=e.seq,
                summary=summary,
                principal=principal,
                status=status,
                handoff_id=handoff_id,
                outcome_id=outcome_id,
                evidence=evidence,
            )
        )

    def ours(self, e: Event) -> bool:
        """Whether event ``e`` concerns this resource."""
        p = e.payload
        if e.kind.startswith("lease.") or e.kind == FENCE_REJECTED:
            return e.subject == self.resource
        if e.kind.startswith("handoff."):
            carried = p.get("lease_id")
            return e.subject == self.resource_id or carried in self.gens
        return e.kind == "outcome.recorded" and e.subject == self.resource_id

    def lease_event(self, e: Event) -> None:
        p = e.payload
        lease_id, epoch = str(p.get("lease_id")), int(p.get("epoch", 0))
        expires = from_ms(int(p["expires_at_ms"])) if "expires_at_ms" in p else e.occurred_at
        assert expires is not None
        owner = str(p.get("owner", ""))
        holder = self.who(owner)
        if e.kind in ("lease.acquired", "lease.transferred"):
            start: GenerationStart = "acquired" if e.kind == "lease.acquired" else "transferred"
            prev = self.gens.get(str(p.get("previous_lease_id") or ""))
            if prev is not None and prev.end == "active":
                start = "taken_over" if prev.expiry_seen else "superseded"
                prev.end = start
                prev.ended_at = min(prev.expires_at, e.occurred_at)
            elif (
                e.kind == "lease.transferred"
                and self.head is not None
                and self.head.end == "active"
            ):
                self.head.end, self.head.ended_at = "transferred", e.occurred_at
            gen = _Open(epoch, lease_id, owner, e.occurred_at, expires, start)
            self.gens[lease_id] = self.head = gen
            kind: MarkKind = (
                "taken_over"
                if start == "taken_over"
                else ("transferred" if start == "transferred" else "acquired")
            )
            verb = {
                "acquired": "acquired",
                "taken_over": "took over after expiry",
                "superseded": "acquired again (superseded)",
                "transferred": "received by transfer",
            }[start]
            self.mark(
                e, kind, epoch, f"epoch {epoch}: {self.name(holder)} {verb}", principal=holder
            )
            return
        held = self.gens.get(lease_id)
        if e.kind == "lease.renewed":
            if held is not None:
                held.renewals += 1
                held.expires_at = expires
            self.mark(
                e,
                "renewed",
                epoch,
                f"epoch {epoch}: renewed until {expires:%H:%M:%S} UTC",
                principal=holder,
            )
        elif e.kind == "lease.released":
            status = str(p.get("status", "released"))
            end: GenerationEnd = (
                "revoked"
                if p.get("forced_by")
                else ("expired" if status == "expired" else "released")
            )
            if held is not None and held.end == "active":
                held.end = end
                held.ended_at = (
                    min(held.expires_at, e.occurred_at) if end == "expired" else e.occurred_at
                )
            forced = self.who(str(p["forced_by"])) if p.get("forced_by") else None
            what = (
                f"force-released by {self.name(forced)}"
                if end == "revoked"
                else ("released after its expiry" if end == "expired" else "released")
            )
            self.mark(e, "released", epoch, f"epoch {epoch}: {what}", principal=holder, status=end)
        elif e.kind == "lease.expired":
            if held is not None:
                held.expiry_seen = True
            reason = str(p.get("reason", ""))
            what = "expired; taken over" if reason == EXPIRY_TAKEN_OVER else "expired unused"
            self.mark(
                e,
                "expired",
                epoch,
                f"epoch {epoch}: {what}",
                principal=holder,
                status=reason or None,
            )
        elif e.kind == FENCE_REJECTED:
            writer = self.who(e.principal)
            write = p.get("write", "write")
            self.mark(
                e,
                "fence_rejected",
                epoch,
                f"epoch {epoch}: {write} by {self.name(writer)} rejected (stale fence)",
                principal=writer,
            )

    def handoff_event(self, e: Event) -> None:
        p = e.payload
        hid = str(p.get("handoff_id"))
        parties = (str(p.get("from_principal")), str(p.get("to_principal")))
        seen = self.who(*parties) is not None  # a party, or owner/admin
        sender, to = parties if seen else (None, None)
        carried = self.gens.get(str(p.get("lease_id"))) if p.get("lease_id") else None
        epoch = carried.epoch if carried is not None else None
        with_lease = " with the lease" if carried is not None else ""
        if e.kind == "handoff.created":
            self.handoffs[hid] = p.get("lease_id")
            self.mark(
                e,
                "handoff_created",
                epoch,
                f"handoff {hid} from {self.name(sender)} to {self.name(to)}{with_lease}",
                principal=sender,
                handoff_id=hid,
            )
            return
        status = e.kind.removeprefix("handoff.")
        if status == "accepted" and p.get("accepted_lease_id"):
            new = self.gens.get(str(p["accepted_lease_id"]))
            if new is not None:
                new.start = "handed_off"
            if carried is not None:
                carried.end = "handed_off"
                carried.ended_at = carried.ended_at or e.occurred_at
            epoch = int(p.get("epoch") or 0) or epoch
        else:
            with_lease = ""
        kind: MarkKind = "handoff_accepted" if status == "accepted" else "handoff_rejected"
        self.mark(
            e,
            kind,
            epoch,
            f"handoff {hid} {status} by {self.name(to)}{with_lease}",
            principal=to,
            status=status,
            handoff_id=hid,
        )


def timeline_from_events(
    events: Iterable[Event],
    *,
    org: str,
    resource_type: str,
    resource_id: str,
    viewer: str,
    role: str,
    outcomes: Sequence[Outcome] = (),
    leases: Sequence[Lease] = (),
    expired_handoffs: Sequence[Handoff] = (),
    effective_epoch: int | None = None,
    since: datetime | None = None,
    generated_at: datetime | None = None,
) -> Timeline:
    """Fold the org's events (in ``seq`` order) into the timeline of one resource. Pure.

    Args:
        events: the org's events, oldest first (any others are skipped).
        org, resource_type, resource_id: the resource.
        viewer, role: the caller: holders and parties are kept only where
            :func:`~prefect_baton._rules.access.may_read` lets this caller read the record.
        outcomes: outcomes of the resource's subject (matched to ``outcome.recorded``
            events by id for their evidence; the others are ignored).
        leases: leases of the resource the caller may read (execution key and purpose).
        expired_handoffs: handoffs of the resource that expired unresolved.
        effective_epoch: the epoch the authority says is effective now (``None``: none):
            an unended generation of another epoch is shown as expired at its expiry.
        since: drop generations that ended and marks made before this time (aware).
        generated_at: the build time shown (default now, UTC).

    Returns:
        The :class:`Timeline`.
    """
    r = _Reader(f"{resource_type}/{resource_id}", resource_id, viewer, role)
    by_outcome = {o.outcome_id: o for o in outcomes}
    for e in events:
        if not r.ours(e):
            continue
        if e.kind.startswith("lease.") or e.kind == FENCE_REJECTED:
            r.lease_event(e)
        elif e.kind.startswith("handoff."):
            r.handoff_event(e)
        else:
            o = by_outcome.get(str(e.payload.get("outcome_id")))
            who = r.who(e.principal)
            gen = r.gens.get(o.lease_id) if o is not None and o.lease_id else None
            epoch = gen.epoch if gen is not None else None
            status = str(e.payload.get("status"))
            count = len(o.evidence) if o is not None else int(e.payload.get("evidence_count", 0))
            r.mark(
                e,
                "outcome",
                epoch,
                f"outcome {status} by {r.name(who)} with {count} evidence item(s)",
                principal=who,
                outcome_id=str(e.payload.get("outcome_id")),
                status=status,
                evidence=o.evidence if o is not None else (),
            )
    for h in expired_handoffs:
        if h.handoff_id in r.handoffs and h.expires_at is not None:
            gen = r.gens.get(h.lease_id) if h.lease_id else None
            r.marks.append(
                TimelineMark(
                    kind="handoff_expired",
                    at=h.expires_at,
                    epoch=gen.epoch if gen else None,
                    summary=f"handoff {h.handoff_id} expired unresolved",
                    handoff_id=h.handoff_id,
                    status="expired",
                )
            )
    known = {lease.lease_id: lease for lease in leases}
    gens: list[TimelineGeneration] = []
    before_since = 0
    for g in r.gens.values():
        if g.end == "active" and g.epoch != effective_epoch:
            g.end, g.ended_at = "expired", g.expires_at
        lease = known.get(g.lease_id)
        holder = r.who(g.owner)
        if since is not None and g.ended_at is not None and g.ended_at < since:
            before_since += 1
            continue
        gens.append(
            TimelineGeneration(
                # the fields the band shares with the open generation (epoch, times, ...)
                **{k: v for k, v in asdict(g).items() if k in TimelineGeneration.model_fields},
                holder=holder,
                execution_key=lease.execution_key if lease is not None and holder else None,
                purpose=lease.purpose if lease is not None and holder else None,
            )
        )
    handed = {g.epoch for g in r.gens.values() if g.start == "handed_off"}
    # a handoff's transfer is drawn once, as its acceptance
    drawn = [m for m in r.marks if not (m.kind == "transferred" and m.epoch in handed)]
    in_window = [m for m in drawn if since is None or m.at >= since]
    before_since += len(drawn) - len(in_window)
    marks = sorted(in_window, key=lambda m: (m.at, m.seq if m.seq is not None else 2**63))
    return Timeline(
        org=org,
        resource_type=resource_type,
        resource_id=resource_id,
        viewer=viewer,
        role=role,
        since=since,
        before_since=before_since,
        generated_at=generated_at or datetime.now(UTC),
        generations=tuple(sorted(gens, key=lambda g: g.epoch)),
        marks=tuple(marks),
    )
