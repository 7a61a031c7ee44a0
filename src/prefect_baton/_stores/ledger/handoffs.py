"""Handoffs of the ledger store: create, read (inbox, list, get) and resolve (accepting one
that carries a lease transfers it in the same transaction).

Also who may read a checkpoint (:func:`_readable`: its writer, the recipient of a pending
or accepted handoff carrying it, ``owner``/``admin``), which the checkpoint reads of
:class:`~prefect_baton._stores.ledger.records.RecordOps` and a handoff's attached checkpoint
both apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import or_, select
from sqlmodel import Session, col

from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.access import (
    CHECKPOINT_GRANTING_STATUSES,
    check_checkpoint_attachable,
    check_list_owner,
    check_resolver,
    checkpoint_readers,
    may_read,
    may_read_checkpoint,
)
from prefect_baton._rules.core import Proof, TransferRequest
from prefect_baton._rules.digests import handoff_create_digest
from prefect_baton._rules.events import RELEASE_HANDOFF_REJECTED
from prefect_baton._rules.handoffs import (
    accepted_lease_view,
    carried_lease_ended,
    decide_carried_release,
    expired_message,
    not_pending_message,
    stored_statuses,
)
from prefect_baton._rules.paging import store_limit
from prefect_baton._rules.validation import canonical_json
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.conditions import handoff_unexpired
from prefect_baton._stores.ledger.convert import (
    copy_fields,
    generation_to_lease,
    handoff_model,
    handoff_payload,
    new_id,
    row_to_generation,
    shared_fields,
)
from prefect_baton._stores.ledger.expiry import ExpiryOps, carried_ended, read_status
from prefect_baton._stores.ledger.expiry import carried as carried_of
from prefect_baton._stores.ledger.paging import after_key
from prefect_baton._stores.ledger.tables import CheckpointRow, GenerationRow, HandoffRow, Principal
from prefect_baton._stores.protocol import Caller, CheckpointWrite, HandoffOffer, ResolveRequest
from prefect_baton._stores.queries import HandoffQuery
from prefect_baton.errors import LeaseLostError, NotFoundError, ValidationError
from prefect_baton.models import Handoff, Lease

#: Copied from a :class:`HandoffOffer` to its :class:`HandoffRow` (the recipient, subject,
#: checkpoint, context and message).
_OFFER_FIELDS = shared_fields(
    HandoffRow.model_fields, [f.name for f in dataclasses.fields(HandoffOffer)]
)


def checkpoint_lock(org: str, ck: CheckpointRow | CheckpointWrite) -> str:
    """The lock of a checkpoint's saves, its delete and the handoffs created carrying it
    (PostgreSQL advisory lock key ``str``): its org, subject and kind."""
    return f"ckpt:{org}:{checkpoint_scope(ck)}"


def checkpoint_scope(ck: CheckpointRow | CheckpointWrite) -> str:
    """The receipt scope and lock name part of a checkpoint's saves: its subject and kind."""
    return f"{len(ck.subject_id)}:{ck.subject_id}:{ck.kind}"


def checkpoint_parties(
    s: Session, caller: Caller, row: CheckpointRow | None, now_ms: int
) -> tuple[str, ...] | None:
    """Who may read checkpoint ``row`` besides ``owner``/``admin`` at ``now_ms`` (epoch ms):
    its writer, and (unless the caller is its writer) the recipient of every handoff of the
    org carrying it that reads pending or accepted
    (:func:`~prefect_baton._rules.access.checkpoint_readers`); ``None`` for no row or
    another org's."""
    carriers = _carriers(s, caller, row, now_ms)
    if row is None or carriers is None:
        return None
    return checkpoint_readers(row.principal, carriers)


def _carriers(
    s: Session, caller: Caller, row: CheckpointRow | None, now_ms: int
) -> list[tuple[str, str]] | None:
    """``(to_principal, status as it reads at now_ms)`` of the org's handoffs carrying
    checkpoint ``row`` that may read as a status granting its recipient the checkpoint
    (:data:`~prefect_baton._rules.access.CHECKPOINT_GRANTING_STATUSES`; none asked when the
    caller is its writer); ``None`` for no row or another org's."""
    if row is None or row.org_id != caller.org:
        return None
    if caller.principal == row.principal:
        return []
    stored = {st for g in CHECKPOINT_GRANTING_STATUSES for st in stored_statuses(g)}
    handoffs = s.execute(
        select(HandoffRow).where(
            col(HandoffRow.org_id) == caller.org,
            col(HandoffRow.checkpoint_id) == row.checkpoint_id,
            col(HandoffRow.status).in_(sorted(stored)),
        )
    ).scalars()
    return [(h.to_principal, read_status(s, h, now_ms)) for h in handoffs]


def handoff_parties(caller: Caller, row: HandoffRow | None) -> tuple[str, ...] | None:
    """Who may read handoff ``row`` besides ``owner``/``admin``: its sender and recipient;
    ``None`` for no row or another org's."""
    if row is None or row.org_id != caller.org:
        return None
    return (row.from_principal, row.to_principal)


def _readable(
    s: Session, caller: Caller, row: CheckpointRow | None, now_ms: int
) -> CheckpointRow | None:
    """``row`` if ``caller`` may read it at ``now_ms`` (epoch ms;
    :func:`~prefect_baton._rules.access.may_read_checkpoint`: its writer, the recipient of a
    pending or accepted handoff of the org carrying it, ``owner``/``admin``), else ``None``:
    to anyone else it does not exist. Another org's row is ``None`` too."""
    carriers = _carriers(s, caller, row, now_ms)
    if row is None or carriers is None:
        return None
    if may_read_checkpoint(caller.role, caller.principal, row.principal, carriers):
        return row
    return None


class HandoffOps(ExpiryOps):
    """The handoffs of :class:`~prefect_baton._stores.ledger.store.LedgerStore` (their
    expiry: :class:`~prefect_baton._stores.ledger.expiry.ExpiryOps`)."""

    def handoff_create(
        self, caller: Caller, offer: HandoffOffer, *, idempotency_key: str | None
    ) -> Handoff:
        """Create a pending handoff (see :meth:`prefect_baton.Baton.handoffs`).

        A carried lease must be held: judged by the lease authority through
        ``offer.lease_fence``'s check (Redis), else on the ledger's rows, and then only
        where the ledger decides the org's leases (:meth:`_check_ledger_authority`).

        An attached checkpoint must be readable by the sender and must still exist
        (:func:`~prefect_baton._rules.access.check_checkpoint_attachable`); it is read under
        the lock its delete takes, so a concurrent delete either wins (this is NOT_FOUND) or
        is refused (CONFLICT, the pending handoff carries it).

        Raises:
            NotFoundError: the attached checkpoint is unknown, not readable by the sender,
                deleted or past its TTL.
            ForbiddenError: a carried lease, no authority check, and Redis decides the
                org's leases.
        """
        digest = handoff_create_digest(
            to_principal=offer.to_principal,
            subject_id=offer.subject_id,
            checkpoint_id=offer.checkpoint_id,
            context_id=offer.context_id,
            message=offer.message,
            lease_id=offer.lease.lease_id if offer.lease else None,
            expires_in_ms=offer.expires_in_ms,
            parameters=offer.parameters,
        )

        def op(tx: Tx) -> Handoff:
            s = tx.session
            if offer.to_principal == caller.principal:
                raise ValidationError("a handoff must name another principal")
            if offer.checkpoint_id is not None:  # read under its lock, as its delete is
                ck_row = s.get(CheckpointRow, offer.checkpoint_id)
                attached = _readable(s, caller, ck_row, tx.now_ms)
                check_checkpoint_attachable(
                    offer.checkpoint_id,
                    readable=attached is not None,
                    expires_at_ms=attached.expires_at_ms if attached is not None else None,
                    updated_at_ms=attached.updated_at_ms if attached is not None else 0,
                    now_ms=tx.now_ms,
                )
            if offer.lease is not None:
                fence = offer.lease_fence
                if fence is not None and fence.check is not None:
                    found, now_ms = fence.check()  # the authority's generation and clock
                else:  # the ledger's own rows: only where it decides the org's leases
                    self._check_ledger_authority(tx, lock=True)
                    row = self._row_by_id(s, caller.org, offer.lease.lease_id)
                    found, now_ms = (row_to_generation(row) if row else None), tx.now_ms
                held = _transitions._check_proof(found, offer.lease, now_ms)
                if not held.effective(now_ms):
                    raise LeaseLostError(f"lease {offer.lease.lease_id} is no longer held")
            self._insert_ignore(
                s,
                Principal,
                {
                    "org_id": caller.org,
                    "name": offer.to_principal,
                    "role": "agent",
                    "created_at_ms": tx.now_ms,
                },
            )
            row_h = HandoffRow(
                **copy_fields(offer, _OFFER_FIELDS),
                handoff_id=new_id("hoff"),
                org_id=caller.org,
                from_principal=caller.principal,
                lease_id=offer.lease.lease_id if offer.lease else None,
                status="pending",
                created_at_ms=tx.now_ms,
                expires_at_ms=tx.now_ms + offer.expires_in_ms if offer.expires_in_ms else None,
                parameters_json=(
                    None if offer.parameters is None else canonical_json(offer.parameters)
                ),
            )
            s.add(row_h)
            s.flush()
            model = handoff_model(row_h, tx.now_ms)
            tx.emit("handoff.created", offer.subject_id, handoff_payload(row_h))
            return model

        locks: list[str] = []
        if offer.checkpoint_id is not None:
            with self._read() as (s, _now):
                found = s.get(CheckpointRow, offer.checkpoint_id)
                # the lock its delete takes: the delete and this create serialise
                if found is not None and found.org_id == caller.org:
                    locks.append(checkpoint_lock(caller.org, found))
        return self._write_once(
            caller, locks, "handoff.create", idempotency_key, "", digest, Handoff, op
        )

    def handoff_inbox(
        self, caller: Caller, *, limit: int = 100, after: tuple[int, str] | None = None
    ) -> list[Handoff]:
        """Pending, unexpired handoffs addressed to the caller, oldest first; ``after``:
        the page continues after this ``(created_at ms, handoff_id)``."""
        to_caller = col(HandoffRow.to_principal) == caller.principal
        return self._handoff_page(caller, to_caller, "pending", limit, after)

    def handoff_list(self, caller: Caller, query: HandoffQuery) -> list[Handoff]:
        """Handoffs of the org sent or received by ``query.party`` (default the caller;
        ``"*"`` everyone's, needing ``owner``/``admin``: :func:`check_list_owner`) that read
        as ``query.status`` (``None``: any), oldest first; ``query.after``: the page
        continues after this ``(created_at ms, handoff_id)``.

        Raises:
            ForbiddenError: another principal's or everyone's handoffs asked by an agent.
        """
        who = caller.principal if query.party is None else query.party
        check_list_owner(caller.role, caller.principal, who, "handoffs")
        party = None
        if who != "*":
            party = or_(col(HandoffRow.from_principal) == who, col(HandoffRow.to_principal) == who)
        return self._handoff_page(caller, party, query.status, query.limit, query.after)

    def _handoff_page(
        self,
        caller: Caller,
        party: Any,
        status: str | None,
        limit: int,
        after: tuple[int, str] | None,
    ) -> list[Handoff]:
        """One page of the org's handoffs matching the SQL condition ``party`` (``None``:
        all) that read as ``status`` (``None``: any; :func:`handoff_status`), oldest first,
        at most ``limit`` (1..10,001, :func:`~prefect_baton._rules.paging.store_limit`),
        after the ``(created_at ms, handoff_id)`` ``after``.
        Rows whose stored status differs from how they read (a pending one past its expiry,
        or whose carried lease ended) are skipped by reading on until the page is full."""

        at, hid = col(HandoffRow.created_at_ms), col(HandoffRow.handoff_id)
        with self._read() as (s, now):
            q = select(HandoffRow).where(col(HandoffRow.org_id) == caller.org)
            if party is not None:
                q = q.where(party)
            if status is not None:
                q = q.where(col(HandoffRow.status).in_(stored_statuses(status)))
            if status == "pending":
                q = q.where(handoff_unexpired(now))
            if after is not None:
                q = q.where(after_key(at, hid, after))
            q = q.order_by(at, hid)
            want = store_limit("handoffs", limit)
            out: list[Handoff] = []
            while len(out) < want:
                rows = list(s.execute(q.limit(want)).scalars())
                leases = self._accepted_leases(s, caller, rows)
                for r in rows:
                    lease = leases.get(r.accepted_lease_id or "")
                    h = handoff_model(r, now, lease, carried_ended=carried_ended(s, r, now))
                    if (status is None or h.status == status) and len(out) < want:
                        out.append(h)
                if len(rows) < want:
                    break
                q = q.where(after_key(at, hid, (rows[-1].created_at_ms, rows[-1].handoff_id)))
            return out

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff:
        """A handoff, for its sender or recipient (or an owner/admin).

        Raises:
            NotFoundError: unknown, another org's, or not the caller's.
        """
        with self._read() as (s, now):
            row = s.get(HandoffRow, handoff_id)
            parties = handoff_parties(caller, row)
            if (
                row is None
                or parties is None
                or not may_read(caller.role, caller.principal, parties)
            ):
                raise NotFoundError(f"handoff {handoff_id} not found")
            lease = self._accepted_leases(s, caller, [row]).get(row.accepted_lease_id or "")
            return handoff_model(row, now, lease, carried_ended=carried_ended(s, row, now))

    @staticmethod
    def _accepted_leases(s: Session, caller: Caller, rows: list[HandoffRow]) -> dict[str, Lease]:
        """The ``lease`` each accepted handoff of ``rows`` shows ``caller``
        (:func:`~prefect_baton._rules.handoffs.accepted_lease_view`), by accepted lease id
        (one query for the rows)."""
        ids = [r.accepted_lease_id for r in rows if r.accepted_lease_id]
        if not ids:
            return {}
        found = s.execute(
            select(GenerationRow).where(
                col(GenerationRow.org_id) == caller.org, col(GenerationRow.lease_id).in_(ids)
            )
        ).scalars()
        out: dict[str, Lease] = {}
        for lrow in found:
            view = accepted_lease_view(
                row_to_generation(lrow), role=caller.role, principal=caller.principal
            )
            if view is not None:
                out[lrow.lease_id] = generation_to_lease(view)
        return out

    def _handoff_resolve(
        self, caller: Caller, resolution: ResolveRequest, *, carried_released: bool = False
    ) -> Handoff:
        """Resolve a pending handoff addressed to the caller as ``accepted`` or ``rejected``.

        Accepting a handoff that carries a lease transfers the lease to the caller under
        ``resolution.execution_key`` (default ``handoff:<id>``) in the same transaction.
        ``carried_released``: the lease authority (Redis) settled this rejection before the
        handoff's deadline and released the carried lease for it
        (``_stores.redis.handoffs.mark_rejected``), so neither the lease's end nor the
        deadline passing since makes the handoff read ``expired`` here: it is recorded
        ``rejected``.
        """
        handoff_id, status = resolution.handoff_id, resolution.status
        lease_id: str | None = None
        expired: str | None = None  # the message, when it reads expired
        with self._read() as (s, now):
            h = s.get(HandoffRow, handoff_id)
            if h is not None and h.org_id == caller.org:
                lease_id = h.lease_id  # accepting moves it, rejecting may release it
                if h.status == "pending" and not carried_released:
                    held = carried_of(s, h)
                    ended = carried_lease_ended(held, now)
                    if handoff_model(h, now, carried_ended=ended).status == "expired":
                        expired = expired_message(handoff_id, h.expires_at_ms, held, now)
        if expired is not None:  # end it (releasing its lease) before answering
            self.expire_handoffs(caller, handoff_id=handoff_id)
            raise NotFoundError(expired)
        # looked up after the first read ends: one connection at a time (the in-memory
        # ledger of prefect_baton.testing has only one)
        located = None if lease_id is None else self._resource_of(caller, lease_id)

        def op(tx: Tx) -> Handoff:
            s = tx.session
            row = s.get(HandoffRow, handoff_id)
            if row is None or row.org_id != caller.org:
                raise NotFoundError(f"pending handoff {handoff_id} not found")
            carried = carried_of(s, row)
            if row.status != "pending":
                if caller.principal not in (row.to_principal, row.from_principal):
                    raise NotFoundError(f"pending handoff {handoff_id} not found")
                raise NotFoundError(
                    not_pending_message(
                        handoff_id, row.status, row.expires_at_ms, carried, tx.now_ms
                    )
                )
            ended = carried_lease_ended(carried, tx.now_ms)
            if (
                not carried_released
                and handoff_model(row, tx.now_ms, carried_ended=ended).status == "expired"
            ):
                raise NotFoundError(
                    expired_message(handoff_id, row.expires_at_ms, carried, tx.now_ms)
                )
            check_resolver(row.to_principal, caller.principal)
            lease: Lease | None = None
            released: Lease | None = None
            release = (
                decide_carried_release(
                    carried,
                    handoff_id=handoff_id,
                    from_principal=row.from_principal,
                    reason=RELEASE_HANDOFF_REJECTED,
                    now_ms=tx.now_ms,
                )
                if status == "rejected" and not carried_released
                else None
            )
            if release is not None and carried is not None and release.new is not None:
                self._apply(
                    tx, release, caller.org, resource=(carried.resource_type, carried.resource_id)
                )
                released = generation_to_lease(release.new)
            if status == "accepted" and row.lease_id:
                lrow = self._row_by_id(s, caller.org, row.lease_id)
                held = row_to_generation(lrow) if lrow else None
                if held is None:
                    raise NotFoundError(f"lease {row.lease_id} not found")
                request = TransferRequest(
                    Proof(held.lease_id, row.from_principal, held.execution_key),
                    caller.principal,
                    resolution.execution_key or f"handoff:{handoff_id}",
                    resolution.ttl_ms or held.ttl_ms,
                )
                resource = (held.resource_type, held.resource_id)
                lease = self._transfer_in_tx(tx, held, resource, request)
                row.accepted_lease_id = lease.lease_id
            row.status = status
            row.note = resolution.note
            row.resolved_at_ms = tx.now_ms
            s.add(row)
            s.flush()
            payload = (
                handoff_payload(row)
                if lease is None
                else handoff_payload(row, accepted_lease_id=lease.lease_id, epoch=lease.epoch)
            )
            tx.emit(f"handoff.{status}", row.subject_id, payload)
            return handoff_model(row, tx.now_ms, lease, released=released)

        locks = [f"hoff:{handoff_id}"]
        if located is not None:
            locks += self._lease_locks(caller, located[0], located[1], located[2])
        return self._write(caller, locks, op)
