"""Checkpoints, handoffs, outcomes and events of the ledger store."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sqlalchemy import and_, or_, select
from sqlmodel import Session, col

from prefect_baton._rules import core as _core
from prefect_baton._rules.access import (
    check_checkpoint_delete,
    check_list_owner,
    check_resolver,
    may_read,
    may_read_checkpoint,
)
from prefect_baton._rules.core import Proof, TransferRequest
from prefect_baton._rules.digests import (
    checkpoint_save_digest,
    handoff_create_digest,
    operation_digest,
    outcome_record_digest,
)
from prefect_baton._rules.events import RELEASE_HANDOFF_REJECTED
from prefect_baton._rules.handoffs import (
    carried_lease_lapsed,
    decide_carried_release,
    stored_statuses,
)
from prefect_baton._rules.validation import canonical_json
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.convert import (
    checkpoint_model,
    copy_fields,
    generation_to_lease,
    handoff_model,
    handoff_payload,
    new_id,
    outcome_model,
    row_to_generation,
    shared_fields,
)
from prefect_baton._stores.ledger.expiry import ExpiryOps, carried_lapsed
from prefect_baton._stores.ledger.expiry import carried as carried_of
from prefect_baton._stores.ledger.tables import (
    CheckpointRow,
    CheckpointVersion,
    EventRow,
    GenerationRow,
    HandoffRow,
    OutcomeRow,
    Principal,
)
from prefect_baton._stores.protocol import (
    Caller,
    CheckpointWrite,
    HandoffOffer,
    HandoffQuery,
    OutcomeWrite,
    ResolveRequest,
)
from prefect_baton.errors import (
    LeaseLostError,
    NotFoundError,
    ValidationError,
)
from prefect_baton.models import (
    Checkpoint,
    Event,
    Handoff,
    Lease,
    Outcome,
    from_ms,
)


def _checkpoint_row(
    s: Session, caller: Caller, subject_id: str, kind: str, principal: str | None = None
) -> CheckpointRow | None:
    """The checkpoint row of ``(caller.org, subject_id, principal or the caller, kind)``,
    expired or not (``None`` when there is none)."""
    return s.execute(
        select(CheckpointRow).where(
            col(CheckpointRow.org_id) == caller.org,
            col(CheckpointRow.subject_id) == subject_id,
            col(CheckpointRow.principal) == (principal or caller.principal),
            col(CheckpointRow.kind) == kind,
        )
    ).scalar_one_or_none()


#: Copied from a :class:`HandoffOffer` to its :class:`HandoffRow` (the recipient, subject,
#: checkpoint, context and message).
_OFFER_FIELDS = shared_fields(
    HandoffRow.model_fields, [f.name for f in dataclasses.fields(HandoffOffer)]
)


def _ckpt_scope(ck: CheckpointRow | CheckpointWrite) -> str:
    """The receipt scope and lock name part of a checkpoint's saves: its subject and kind."""
    return f"{len(ck.subject_id)}:{ck.subject_id}:{ck.kind}"


def _readable(s: Session, caller: Caller, row: CheckpointRow | None) -> CheckpointRow | None:
    """``row`` if ``caller`` may read it (:func:`~prefect_baton._rules.access.may_read_checkpoint`:
    its writer, the recipient of a handoff of the org carrying it, ``owner``/``admin``),
    else ``None``: to anyone else it does not exist. Another org's row is ``None`` too."""
    if row is None or row.org_id != caller.org:
        return None
    recipients: list[str] = []
    if caller.principal != row.principal:
        recipients = list(
            s.execute(
                select(col(HandoffRow.to_principal)).where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.checkpoint_id) == row.checkpoint_id,
                )
            ).scalars()
        )
    if may_read_checkpoint(caller.role, caller.principal, row.principal, recipients):
        return row
    return None


class RecordOps(ExpiryOps):
    """Checkpoints, handoffs, outcomes and the event stream of :class:`LedgerStore`."""

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_save(
        self, caller: Caller, write: CheckpointWrite, *, idempotency_key: str | None
    ) -> Checkpoint:
        """Upsert the checkpoint of ``(org, subject, caller, kind)``; CAS with
        ``write.expected_version``; fenced by a lease when ``write.fence`` is given."""
        subject_id, kind, fence, ttl_ms = write.subject_id, write.kind, write.fence, write.ttl_ms
        state_text, state_hash = write.state_text, write.state_hash
        scope = _ckpt_scope(write)
        digest = checkpoint_save_digest(
            state_hash=state_hash,
            expected_version=write.expected_version,
            fence=(fence.lease_id, fence.epoch) if fence else None,
            ttl_ms=ttl_ms,
        )

        def op(tx: Tx) -> Checkpoint:
            self._check_fence(tx, fence, "checkpoint.save")
            s = tx.session
            row = _checkpoint_row(s, caller, subject_id, kind)
            current = row.version if row is not None else 0
            expired = (
                row is not None and row.expires_at_ms is not None and row.expires_at_ms <= tx.now_ms
            )
            # An expired checkpoint reads as absent, so a CAS against it expects version 0;
            # versions still continue from the old row so history keeps every one.
            _core.check_checkpoint_version(0 if expired else current, write.expected_version)
            if current >= _core.MAX_SAFE_INTEGER:
                raise ValidationError("checkpoint version counter is exhausted (2**53 - 1)")
            expires = tx.now_ms + ttl_ms if ttl_ms is not None else None
            if row is None:
                row = CheckpointRow(
                    checkpoint_id=new_id("ckpt"),
                    org_id=caller.org,
                    subject_id=subject_id,
                    principal=caller.principal,
                    kind=kind,
                    version=1,
                    state=state_text,
                    state_hash=state_hash,
                    created_at_ms=tx.now_ms,
                    updated_at_ms=tx.now_ms,
                    expires_at_ms=expires,
                )
            else:
                row.version = current + 1
                row.state = state_text
                row.state_hash = state_hash
                row.updated_at_ms = tx.now_ms
                row.expires_at_ms = expires
            s.add(row)
            s.add(
                CheckpointVersion(
                    checkpoint_id=row.checkpoint_id,
                    version=row.version,
                    state=state_text,
                    state_hash=state_hash,
                    saved_at_ms=tx.now_ms,
                    fence_lease_id=fence.lease_id if fence else None,
                    fence_epoch=fence.epoch if fence else None,
                )
            )
            s.flush()
            model = checkpoint_model(row)
            tx.emit(
                "checkpoint.saved",
                subject_id,
                {
                    "checkpoint_id": row.checkpoint_id,
                    "kind": kind,
                    "version": row.version,
                    "state_hash": state_hash,
                },
            )
            return model

        locks = [f"ckpt:{caller.org}:{scope}", *self._fence_locks(caller, fence)]
        return self._write_once(
            caller, locks, "checkpoint.save", idempotency_key, scope, digest, Checkpoint, op
        )

    def checkpoint_delete(
        self, caller: Caller, checkpoint_id: str, *, idempotency_key: str | None
    ) -> Checkpoint:
        """Delete the caller's checkpoint ``checkpoint_id``: from now on it reads as absent
        (as one whose TTL has passed: ``expires_at`` is set to now), its history stays
        readable, a later save of the same subject and kind continues its versions (a CAS
        then expects 0), and ``checkpoint.deleted`` is recorded. Rules:
        :func:`prefect_baton._rules.access.check_checkpoint_delete`.

        Returns:
            The checkpoint as it was deleted (``expires_at``: when).

        Raises:
            NotFoundError: unknown, already deleted or expired, or another org's.
            ForbiddenError: not the caller's. ConflictError: a pending handoff carries it.
            IdempotencyMismatchError: the key was used for another request.
        """
        digest = operation_digest("checkpoint.delete", {"checkpoint_id": checkpoint_id})

        def op(tx: Tx) -> Checkpoint:
            s = tx.session
            row = s.get(CheckpointRow, checkpoint_id)
            if (
                row is None
                or row.org_id != caller.org
                or (row.expires_at_ms is not None and row.expires_at_ms <= tx.now_ms)
            ):
                raise NotFoundError(f"checkpoint {checkpoint_id} not found")
            carried = s.execute(
                select(col(HandoffRow.handoff_id))
                .where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.checkpoint_id) == checkpoint_id,
                    col(HandoffRow.status) == "pending",
                    or_(
                        col(HandoffRow.expires_at_ms).is_(None),
                        col(HandoffRow.expires_at_ms) > tx.now_ms,
                    ),
                )
                .limit(1)
            ).scalar_one_or_none()
            check_checkpoint_delete(checkpoint_id, row.principal, caller.principal, carried)
            row.expires_at_ms = tx.now_ms
            row.updated_at_ms = tx.now_ms
            s.add(row)
            s.flush()
            tx.emit(
                "checkpoint.deleted",
                row.subject_id,
                {"checkpoint_id": checkpoint_id, "kind": row.kind, "version": row.version},
            )
            return checkpoint_model(row)

        with self._read() as (s, _now):
            found = s.get(CheckpointRow, checkpoint_id)
            # the lock of its saves (subject and kind), so a save and a delete serialise
            locks = [] if found is None else [f"ckpt:{caller.org}:{_ckpt_scope(found)}"]
        scope = f"{len(checkpoint_id)}:{checkpoint_id}"
        return self._write_once(
            caller,
            locks,
            "checkpoint.delete",
            idempotency_key,
            scope,
            digest,
            Checkpoint,
            op,
        )

    def checkpoint_get(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> Checkpoint | None:
        """The current checkpoint of ``(subject, principal or caller, kind)``, or ``None``
        when there is none or its TTL has passed."""
        with self._read() as (s, now):
            row = _readable(s, caller, _checkpoint_row(s, caller, subject_id, kind, principal))
            if row is None or (row.expires_at_ms is not None and row.expires_at_ms <= now):
                return None
            return checkpoint_model(row)

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id, for its writer, the recipient of a handoff carrying it, or
        ``owner``/``admin`` (:func:`~prefect_baton._rules.access.may_read_checkpoint`);
        only the writer can change one.

        Raises:
            NotFoundError: unknown, expired, another org's, or not readable by the caller.
        """
        with self._read() as (s, now):
            row = _readable(s, caller, s.get(CheckpointRow, checkpoint_id))
            if row is None:
                raise NotFoundError(f"checkpoint {checkpoint_id} not found")
            if row.expires_at_ms is not None and row.expires_at_ms <= now:
                raise NotFoundError(f"checkpoint {checkpoint_id} has expired")
            return checkpoint_model(row)

    def checkpoint_history(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> list[Checkpoint]:
        """Every version of a checkpoint, oldest first (empty when there is none or the
        caller may not read it, :func:`~prefect_baton._rules.access.may_read_checkpoint`)."""
        with self._read() as (s, _now):
            row = _readable(s, caller, _checkpoint_row(s, caller, subject_id, kind, principal))
            if row is None:
                return []
            versions = s.execute(
                select(CheckpointVersion)
                .where(col(CheckpointVersion.checkpoint_id) == row.checkpoint_id)
                .order_by(col(CheckpointVersion.version))
            ).scalars()
            return [checkpoint_model(row, saved=v) for v in versions]

    # ------------------------------------------------------------------ handoffs

    def handoff_create(
        self, caller: Caller, offer: HandoffOffer, *, idempotency_key: str | None
    ) -> Handoff:
        """Create a pending handoff (see :meth:`prefect_baton.Baton.handoffs`)."""
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
            # Only a checkpoint the sender may read can be handed on: attaching one makes
            # the recipient a reader.
            attached = s.get(CheckpointRow, offer.checkpoint_id) if offer.checkpoint_id else None
            if offer.checkpoint_id is not None and _readable(s, caller, attached) is None:
                raise NotFoundError(f"checkpoint {offer.checkpoint_id} not found")
            if offer.lease is not None:
                row = self._row_by_id(s, caller.org, offer.lease.lease_id)
                held = _core._check_proof(row_to_generation(row) if row else None, offer.lease)
                if not held.effective(tx.now_ms):
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

        return self._write_once(
            caller, [], "handoff.create", idempotency_key, "", digest, Handoff, op
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
        at most ``limit`` (1..10,000), after the ``(created_at ms, handoff_id)`` ``after``.
        Rows whose stored status differs from how they read (a pending one past its expiry,
        or whose carried lease lapsed) are skipped by reading on until the page is full."""

        def past(at: int, handoff_id: str) -> Any:
            return or_(
                col(HandoffRow.created_at_ms) > at,
                and_(col(HandoffRow.created_at_ms) == at, col(HandoffRow.handoff_id) > handoff_id),
            )

        with self._read() as (s, now):
            q = select(HandoffRow).where(col(HandoffRow.org_id) == caller.org)
            if party is not None:
                q = q.where(party)
            if status is not None:
                q = q.where(col(HandoffRow.status).in_(stored_statuses(status)))
            if status == "pending":
                unexpired = col(HandoffRow.expires_at_ms) > now
                q = q.where(or_(col(HandoffRow.expires_at_ms).is_(None), unexpired))
            if after is not None:
                q = q.where(past(*after))
            q = q.order_by(col(HandoffRow.created_at_ms), col(HandoffRow.handoff_id))
            want = max(1, min(limit, 10_000))
            out: list[Handoff] = []
            while len(out) < want:
                rows = list(s.execute(q.limit(want)).scalars())
                for r in rows:
                    h = handoff_model(r, now, carried_lapsed=carried_lapsed(s, r, now))
                    if (status is None or h.status == status) and len(out) < want:
                        out.append(h)
                if len(rows) < want:
                    break
                q = q.where(past(rows[-1].created_at_ms, rows[-1].handoff_id))
            return out

    def handoff_get(self, caller: Caller, handoff_id: str) -> Handoff:
        """A handoff, for its sender or recipient (or an owner/admin).

        Raises:
            NotFoundError: unknown, another org's, or not the caller's.
        """
        with self._read() as (s, now):
            row = s.get(HandoffRow, handoff_id)
            if (
                row is None
                or row.org_id != caller.org
                or not may_read(
                    caller.role, caller.principal, (row.from_principal, row.to_principal)
                )
            ):
                raise NotFoundError(f"handoff {handoff_id} not found")
            lease = None
            if row.accepted_lease_id:
                lrow = s.get(GenerationRow, row.accepted_lease_id)
                if lrow is not None and lrow.owner == caller.principal:
                    lease = generation_to_lease(row_to_generation(lrow))
            return handoff_model(row, now, lease, carried_lapsed=carried_lapsed(s, row, now))

    def _handoff_resolve(self, caller: Caller, resolution: ResolveRequest) -> Handoff:
        """Resolve a pending handoff addressed to the caller as ``accepted`` or ``rejected``.

        Accepting a handoff that carries a lease transfers the lease to the caller under
        ``resolution.execution_key`` (default ``handoff:<id>``) in the same transaction.
        """
        handoff_id, status = resolution.handoff_id, resolution.status
        lease_id: str | None = None
        expired = False
        with self._read() as (s, now):
            h = s.get(HandoffRow, handoff_id)
            if h is not None and h.org_id == caller.org:
                lease_id = h.lease_id  # accepting moves it, rejecting may release it
                expired = h.status == "pending" and (
                    handoff_model(h, now, carried_lapsed=carried_lapsed(s, h, now)).status
                    == "expired"
                )
        if expired:  # end it (releasing its lease) before answering that it expired
            self.expire_handoffs(caller, handoff_id=handoff_id)
            raise NotFoundError(f"handoff {handoff_id} has expired")
        # looked up after the first read ends: one connection at a time (the in-memory
        # ledger of prefect_baton.testing has only one)
        located = None if lease_id is None else self._resource_of(caller, lease_id)

        def op(tx: Tx) -> Handoff:
            s = tx.session
            row = s.get(HandoffRow, handoff_id)
            if row is None or row.org_id != caller.org or row.status != "pending":
                raise NotFoundError(f"pending handoff {handoff_id} not found")
            carried = carried_of(s, row)
            lapsed = carried_lease_lapsed(carried, tx.now_ms)
            if handoff_model(row, tx.now_ms, carried_lapsed=lapsed).status == "expired":
                raise NotFoundError(f"handoff {handoff_id} has expired")
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
                if status == "rejected"
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

    # ------------------------------------------------------------------ outcomes

    def outcome_record(
        self, caller: Caller, record: OutcomeWrite, *, idempotency_key: str | None
    ) -> Outcome:
        """Record an outcome with evidence; fenced by a lease when ``record.fence`` is given."""
        fence = record.fence
        ev = [e.model_dump() for e in record.evidence]
        digest = outcome_record_digest(
            status=record.status,
            evidence=ev,
            fence=(fence.lease_id, fence.epoch) if fence else None,
            lease_id=record.lease_id,
            handoff_id=record.handoff_id,
            checkpoint_id=record.checkpoint_id,
        )
        scope = record.subject_id

        def op(tx: Tx) -> Outcome:
            held = self._check_fence(tx, fence, "outcome.record")
            s = tx.session
            for kind_, ref, model_ in (
                ("handoff", record.handoff_id, HandoffRow),
                ("checkpoint", record.checkpoint_id, CheckpointRow),
                ("lease", record.lease_id, GenerationRow),
            ):
                if ref is not None:
                    obj: Any = s.get(model_, ref)
                    if obj is None or obj.org_id != caller.org:
                        raise NotFoundError(f"{kind_} {ref} not found")
            under = record.lease_id or (fence.lease_id if fence else None)
            _core.check_outcome(
                record.status,
                record.subject_id,
                under,
                succeeded_before=under is not None
                and s.execute(
                    select(col(OutcomeRow.outcome_id)).where(
                        col(OutcomeRow.org_id) == caller.org,
                        col(OutcomeRow.subject_id) == record.subject_id,
                        col(OutcomeRow.lease_id) == under,
                        col(OutcomeRow.status) == "succeeded",
                    )
                ).first()
                is not None,
            )
            row = OutcomeRow(
                outcome_id=new_id("out"),
                org_id=caller.org,
                subject_id=record.subject_id,
                principal=caller.principal,
                status=record.status,
                evidence=json.dumps(ev),
                lease_id=under,
                handoff_id=record.handoff_id,
                checkpoint_id=record.checkpoint_id,
                fence_epoch=held.epoch if held else None,
                recorded_at_ms=tx.now_ms,
            )
            s.add(row)
            s.flush()
            model = outcome_model(row)
            tx.emit(
                "outcome.recorded",
                record.subject_id,
                {"outcome_id": row.outcome_id, "status": record.status, "evidence_count": len(ev)},
            )
            return model

        return self._write_once(
            caller,
            [*self._fence_locks(caller, fence), f"outcome:{caller.org}:{record.subject_id}"],
            "outcome.record",
            idempotency_key,
            scope,
            digest,
            Outcome,
            op,
        )

    def outcome_list(
        self, caller: Caller, subject_id: str | None = None, *, limit: int = 1000
    ) -> list[Outcome]:
        """Outcomes of the org (of one subject when given), oldest first by the
        ledger clock (outcomes recorded in the same millisecond come in no fixed order)."""
        with self._read() as (s, _now):
            q = select(OutcomeRow).where(col(OutcomeRow.org_id) == caller.org)
            if subject_id is not None:
                q = q.where(col(OutcomeRow.subject_id) == subject_id)
            q = q.order_by(col(OutcomeRow.recorded_at_ms), col(OutcomeRow.outcome_id)).limit(
                max(1, min(limit, 100_000))
            )
            return [outcome_model(r) for r in s.execute(q).scalars()]

    # ------------------------------------------------------------------ events, history

    def events_list(
        self, caller: Caller, *, after_seq: int = 0, limit: int = 100, kind: str | None = None
    ) -> list[Event]:
        """Events of the caller's org with ``seq > after_seq``, in order, at most ``limit``
        (1..1000)."""
        with self._read() as (s, _now):
            q = select(EventRow).where(
                col(EventRow.org_id) == caller.org,
                col(EventRow.seq) > after_seq,
            )
            if kind is not None:
                q = q.where(col(EventRow.kind) == kind)
            q = q.order_by(col(EventRow.seq)).limit(max(1, min(limit, 1000)))
            out = []
            for r in s.execute(q).scalars():
                at = from_ms(r.occurred_at_ms)
                assert r.seq is not None and at is not None
                out.append(
                    Event(
                        seq=r.seq,
                        event_id=r.event_id,
                        kind=r.kind,
                        principal=r.principal,
                        subject=r.subject,
                        payload=json.loads(r.payload),
                        occurred_at=at,
                    )
                )
            return out
