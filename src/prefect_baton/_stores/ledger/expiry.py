"""Expiry in the ledger: the report of leases past their TTL
(:meth:`ExpiryOps.report_expired`, ``lease.expired``) and handoff expiry, applying
:func:`prefect_baton._rules.handoffs.decide_handoff_expiry`.

A pending handoff that expired is stored as ``expired`` and, when the lease it carries is
still its sender's and effective, that lease is released in the same transaction
(``lease.released`` with ``reason`` ``handoff_expired``). It runs:

- in an acquire refused by the carried lease (:meth:`ExpiryOps._expired_carrier`, inside
  the acquire's transaction), so the resource is acquirable from the handoff's deadline on;
- before a resolve of an expired handoff answers ``NOT_FOUND``, and on the first read of
  it past its deadline (``HandoffAPI.get`` calls :meth:`ExpiryOps.expire_handoffs`);
- in the sweep: ``LeaseAPI.report_expired`` ends every expired pending handoff of the org.

Applying it twice finds the handoff no longer pending and does nothing, so duplicate
deliveries and concurrent sweepers record one release.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import and_, or_, select
from sqlmodel import Session, col

from prefect_baton._rules import events as _events
from prefect_baton._rules.core import Decision, Generation
from prefect_baton._rules.digests import resource_key
from prefect_baton._rules.handoffs import (
    carried_lease_ended,
    decide_handoff_expiry,
    handoff_status,
)
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.conditions import handoff_expired, lease_lapsed
from prefect_baton._stores.ledger.convert import (
    generation_to_lease,
    lease_payload,
    row_to_generation,
    subject_of,
)
from prefect_baton._stores.ledger.leases import LeaseOps
from prefect_baton._stores.ledger.tables import GenerationRow, HandoffRow
from prefect_baton._stores.protocol import Caller
from prefect_baton.models import Lease

__all__ = ["ExpiryOps", "carried", "carried_ended", "read_status"]


def carried(s: Session, row: HandoffRow) -> Generation | None:
    """The lease generation handoff ``row`` carries (``None``: none, or unknown)."""
    if row.lease_id is None:
        return None
    lrow = s.get(GenerationRow, row.lease_id)
    return row_to_generation(lrow) if lrow is not None else None


def carried_ended(s: Session, row: HandoffRow, now_ms: int) -> bool:
    """Whether the lease pending handoff ``row`` carries is no longer in effect
    (:func:`carried_lease_ended`)."""
    return row.status == "pending" and carried_lease_ended(carried(s, row), now_ms)


def read_status(s: Session, row: HandoffRow, now_ms: int) -> str:
    """The status handoff ``row`` reads as at ``now_ms`` (epoch ms):
    :func:`~prefect_baton._rules.handoffs.handoff_status`, a stored ``pending`` one reading
    ``expired`` past its expiry or once its carried lease ended (:func:`carried_ended`)."""
    ended = carried_ended(s, row, now_ms)
    return handoff_status(row.status, row.expires_at_ms, now_ms, carried_ended=ended)


class ExpiryOps(LeaseOps):
    """The expiry report and handoff expiry of
    :class:`~prefect_baton._stores.ledger.store.LedgerStore` (see the module docstring)."""

    def _expire_in_tx(
        self, tx: Tx, row: HandoffRow, *, release: bool = True
    ) -> tuple[bool, Decision | None]:
        """Apply :func:`decide_handoff_expiry` to ``row`` in ``tx``: store it ``expired``
        and, with ``release``, release its carried lease when the rule says so.

        Returns:
            ``(expired, release)``: whether ``row`` was an expired pending handoff (and is
            now stored ``expired``), and the release applied, or ``None``.
        """
        held = carried(tx.session, row)
        expiry = decide_handoff_expiry(
            row.handoff_id,
            row.status,
            row.expires_at_ms,
            carried=held,
            from_principal=row.from_principal,
            now_ms=tx.now_ms,
        )
        if expiry is None:
            return False, None
        applied = expiry.release if release else None
        if applied is not None and held is not None:
            self._apply(tx, applied, row.org_id, resource=(held.resource_type, held.resource_id))
        row.status = "expired"
        row.resolved_at_ms = tx.now_ms
        tx.session.add(row)
        tx.session.flush()
        return True, applied

    def _expired_carrier(self, tx: Tx, head: Generation) -> Generation | None:
        """In an acquire refused by ``head``: when a pending handoff carrying ``head`` has
        expired, end it (:meth:`_expire_in_tx`) and return ``head`` as released, so the
        acquire proceeds; else ``None`` (the refusal stands)."""
        rows = list(
            tx.session.execute(
                select(HandoffRow)
                .where(
                    col(HandoffRow.lease_id) == head.lease_id,
                    col(HandoffRow.org_id) == tx.caller.org,
                    col(HandoffRow.status) == "pending",
                )
                .order_by(col(HandoffRow.expires_at_ms))
            ).scalars()
        )
        for row in rows:  # one lease may ride on several handoffs: the first to expire frees it
            _expired, applied = self._expire_in_tx(tx, row)
            if applied is not None:
                return applied.new
        return None

    def report_expired(
        self,
        caller: Caller,
        *,
        limit: int = 1000,
        check: Callable[[str], tuple[Generation | None, int]] | None = None,
    ) -> list[Lease]:
        """Record ``lease.expired`` once for each active lease of the org whose TTL has
        passed and that nobody has acted on since (a crashed holder's, typically).

        Nothing about the lease changes: no sweeper is needed for correctness (expiry is
        judged when someone next acts), its holder's release still answers ``expired``, and a
        later takeover does not record ``lease.expired`` a second time.

        Expiry is judged by the org's lease authority. Without ``check`` that is the ledger
        itself, so a client without Redis in an org Redis decides is refused
        (:meth:`_check_ledger_authority`): the ledger's copy lags (a renewal Redis applied
        may not be drained yet) and the event would be false. With ``check`` (from
        :meth:`RedisAuthority.report_expired`) the ledger's copy only proposes candidates:
        one is recorded when ``check(lease_id)`` (the authority's generation of that lease,
        or ``None``, and the authority's clock in epoch ms; read inside the transaction,
        under the resource's lock) shows the same generation still active and past its TTL.

        Args:
            limit: at most this many leases per call (1..10,000), oldest expiry first.
            check: the authority's view of a lease (see above), or ``None``.

        Returns:
            The leases newly reported by this call.

        Raises:
            ForbiddenError: no ``check`` and Redis decides the org's leases.
        """
        with self._read() as (s, now):
            candidates = [
                (r.lease_id, r.resource_type, r.resource_id)
                for r in s.execute(
                    select(GenerationRow)
                    .where(col(GenerationRow.org_id) == caller.org, lease_lapsed(now))
                    .order_by(col(GenerationRow.expires_at_ms))
                    .limit(max(1, min(limit, 10_000)))
                ).scalars()
            ]

        def op(tx: Tx) -> list[Lease]:
            out: list[Lease] = []
            for lease_id, rtype, rid in candidates:
                self._lock(tx.session, f"res:{caller.org}:{resource_key(rtype, rid)}")
                row = self._row_by_id(tx.session, caller.org, lease_id)
                if row is None:
                    continue
                h = row_to_generation(row)
                if not h.lapsed(tx.now_ms):
                    continue  # renewed or ended meanwhile
                if check is not None:
                    held, now_ms = check(lease_id)
                    if held is None or held.version != h.version:
                        continue  # the authority moved on (or forgot it): not this generation
                    if not held.lapsed(now_ms):
                        continue
                if self._expiry_reported(tx, h):
                    continue
                resource = (rtype, rid)
                self._transition(
                    tx, h, caller.org, resource, action="expired", actor=caller.principal
                )
                tx.emit(
                    "lease.expired",
                    subject_of(resource),
                    _events.expired_payload(lease_payload(h, resource), _events.EXPIRY_LAPSED),
                )
                out.append(generation_to_lease(h))
            return out

        if not candidates:
            return []
        return self._write(caller, [f"expiry:{caller.org}"], op, authority=check is None)

    def expired_handoffs(
        self, caller: Caller, *, limit: int = 1000
    ) -> list[tuple[str, str | None]]:
        """The oldest ``limit`` (1..10,000) pending handoffs of the caller's org that read
        ``expired`` (their own expiry passed, or their carried lease ended), as
        ``(handoff_id, carried lease id or None)`` pairs: what the sweep ends."""
        with self._read() as (s, now):
            q = (
                select(col(HandoffRow.handoff_id), col(HandoffRow.lease_id))
                .outerjoin(GenerationRow, col(GenerationRow.lease_id) == col(HandoffRow.lease_id))
                .where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.status) == "pending",
                    handoff_expired(now),
                )
                .order_by(col(HandoffRow.created_at_ms), col(HandoffRow.handoff_id))
                .limit(max(1, min(limit, 10_000)))
            )
            return [(str(hid), lid) for hid, lid in s.execute(q).all()]

    def expire_handoffs(
        self,
        caller: Caller,
        *,
        handoff_id: str | None = None,
        limit: int = 1000,
        release: bool = True,
    ) -> list[Lease]:
        """End expired pending handoffs of the caller's org (``handoff_id``: that one if it
        expired; else those of :meth:`expired_handoffs`), each in its own transaction
        (:func:`decide_handoff_expiry`).

        Args:
            release: release the carried lease here (``False`` when another authority holds
                the leases and released it already: the ledger then only marks the handoff).

        Returns:
            The carried leases released by this call (status ``released``).
        """
        if handoff_id is None:
            found = self.expired_handoffs(caller, limit=limit)
        else:
            with self._read() as (s, _now):
                row = s.get(HandoffRow, handoff_id)
                ok = row is not None and row.org_id == caller.org and row.status == "pending"
                found = [(handoff_id, row.lease_id)] if ok and row is not None else []
        out: list[Lease] = []
        for hid, lease_id in found:
            locks = [f"hoff:{hid}"]
            located = None if lease_id is None else self._resource_of(caller, lease_id)
            if located is not None:
                locks += self._lease_locks(caller, located[0], located[1], located[2])

            def op(tx: Tx, hid: str = hid) -> Lease | None:
                row = tx.session.get(HandoffRow, hid)
                if row is None or row.org_id != caller.org:
                    return None
                _expired, applied = self._expire_in_tx(tx, row, release=release)
                if applied is None or applied.new is None:
                    return None
                return generation_to_lease(applied.new)

            lease = self._write(caller, locks, op, authority=release and located is not None)
            if lease is not None:
                out.append(lease)
        return out

    def lease_carriers(self, caller: Caller, lease_id: str) -> list[tuple[str, int]]:
        """The pending handoffs of the caller's org with an expiry that carry lease
        ``lease_id``, as ``(handoff_id, expires_at_ms)``, earliest deadline first: what an
        authority keeping its leases elsewhere passes to a renew
        (:func:`prefect_baton._rules.core.handoff_deadline_passed`)."""
        with self._read() as (s, _now):
            rows = s.execute(
                select(col(HandoffRow.handoff_id), col(HandoffRow.expires_at_ms))
                .where(
                    col(HandoffRow.lease_id) == lease_id,
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.status) == "pending",
                    col(HandoffRow.expires_at_ms).is_not(None),
                )
                .order_by(col(HandoffRow.expires_at_ms))
            ).all()
            return [(str(h), int(x)) for h, x in rows]

    def handoff_carriers(
        self, caller: Caller, resources: list[tuple[str, str]]
    ) -> tuple[int, list[tuple[str, int, str, str]]]:
        """The pending handoffs of the caller's org with an expiry that carry a lease on one
        of ``resources`` (``(type, id)`` pairs), as the ledger has them: what an authority
        keeping its leases elsewhere ends when an acquire is refused.

        Returns:
            The ledger's clock (epoch ms) and ``(handoff_id, expires_at_ms, resource_type,
            resource_id)`` of each such handoff, expired or not.
        """
        with self._read() as (s, now):
            rows = s.execute(
                select(
                    col(HandoffRow.handoff_id),
                    col(HandoffRow.expires_at_ms),
                    col(GenerationRow.resource_type),
                    col(GenerationRow.resource_id),
                )
                .join(GenerationRow, col(GenerationRow.lease_id) == col(HandoffRow.lease_id))
                .where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.status) == "pending",
                    col(HandoffRow.expires_at_ms).is_not(None),
                    or_(
                        *(
                            and_(
                                col(GenerationRow.resource_type) == rt,
                                col(GenerationRow.resource_id) == rid,
                            )
                            for rt, rid in resources
                        )
                    ),
                )
            ).all()
            return now, [(str(h), int(x), str(rt), str(rid)) for h, x, rt, rid in rows]
