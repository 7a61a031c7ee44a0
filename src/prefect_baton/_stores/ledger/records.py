"""Checkpoints, outcomes and events of the ledger store, and :class:`RecordOps`, which adds
them to the handoffs (:mod:`~prefect_baton._stores.ledger.handoffs`) and the fence checks of
record writes (:mod:`~prefect_baton._stores.ledger.fences`)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlmodel import Session, col

from prefect_baton._rules import core as _core
from prefect_baton._rules import outcomes as _outcomes
from prefect_baton._rules.access import (
    check_checkpoint_delete,
    check_checkpoint_live,
    check_outcome_link,
)
from prefect_baton._rules.digests import (
    checkpoint_save_digest,
    operation_digest,
    outcome_record_digest,
)
from prefect_baton._rules.paging import store_limit
from prefect_baton._stores.ledger.base import Tx
from prefect_baton._stores.ledger.conditions import handoff_unexpired
from prefect_baton._stores.ledger.convert import checkpoint_model, new_id, outcome_model
from prefect_baton._stores.ledger.expiry import read_status
from prefect_baton._stores.ledger.fences import FenceOps
from prefect_baton._stores.ledger.handoffs import (
    HandoffOps,
    _readable,
    checkpoint_lock,
    checkpoint_parties,
    checkpoint_scope,
    handoff_parties,
)
from prefect_baton._stores.ledger.paging import after_key
from prefect_baton._stores.ledger.tables import (
    CheckpointRow,
    CheckpointVersion,
    EventRow,
    GenerationRow,
    HandoffRow,
    OutcomeRow,
)
from prefect_baton._stores.protocol import Caller, CheckpointWrite, OutcomeWrite
from prefect_baton._stores.queries import EventQuery, HistoryQuery, OutcomeQuery
from prefect_baton.errors import NotFoundError, ValidationError
from prefect_baton.models import Checkpoint, Event, Outcome, from_ms


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


class RecordOps(HandoffOps, FenceOps):
    """Checkpoints, handoffs, outcomes and the event stream of :class:`LedgerStore`: the
    handoffs are :class:`~prefect_baton._stores.ledger.handoffs.HandoffOps`, the fence
    checks of checkpoint saves and outcome records
    :class:`~prefect_baton._stores.ledger.fences.FenceOps`."""

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_save(
        self, caller: Caller, write: CheckpointWrite, *, idempotency_key: str | None
    ) -> Checkpoint:
        """Upsert the checkpoint of ``(org, subject, caller, kind)``; CAS with
        ``write.expected_version``; fenced by a lease when ``write.fence`` is given."""
        subject_id, kind, fence, ttl_ms = write.subject_id, write.kind, write.fence, write.ttl_ms
        state_text, state_hash = write.state_text, write.state_hash
        scope = checkpoint_scope(write)
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

        locks = [checkpoint_lock(caller.org, write), *self._fence_locks(caller, fence)]
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
            pending = s.execute(
                select(HandoffRow).where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.checkpoint_id) == checkpoint_id,
                    col(HandoffRow.status) == "pending",
                    handoff_unexpired(tx.now_ms),
                )
            ).scalars()
            # one that reads pending (not one whose carried lease ended: it reads expired)
            carried = next(
                (h.handoff_id for h in pending if read_status(s, h, tx.now_ms) == "pending"),
                None,
            )
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
            locks = [] if found is None else [checkpoint_lock(caller.org, found)]
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
            found = _checkpoint_row(s, caller, subject_id, kind, principal)
            row = _readable(s, caller, found, now)
            if row is None or (row.expires_at_ms is not None and row.expires_at_ms <= now):
                return None
            return checkpoint_model(row)

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id, for its writer, the recipient of a pending or accepted handoff
        carrying it, or ``owner``/``admin``
        (:func:`~prefect_baton._rules.access.may_read_checkpoint`); only the writer can
        change one.

        Raises:
            NotFoundError: unknown, another org's, or not readable by the caller; deleted
                or expired (the message says which,
                :func:`~prefect_baton._rules.access.check_checkpoint_live`).
        """
        with self._read() as (s, now):
            row = _readable(s, caller, s.get(CheckpointRow, checkpoint_id), now)
            if row is None:
                raise NotFoundError(f"checkpoint {checkpoint_id} not found")
            check_checkpoint_live(
                checkpoint_id,
                expires_at_ms=row.expires_at_ms,
                updated_at_ms=row.updated_at_ms,
                now_ms=now,
            )
            return checkpoint_model(row)

    def checkpoint_history(self, caller: Caller, query: HistoryQuery) -> list[Checkpoint]:
        """The versions of the checkpoint ``query`` names, oldest first, at most
        ``query.limit`` (1..1,001, :func:`~prefect_baton._rules.paging.store_limit`), after
        the ``(version, checkpoint_id)`` ``query.after`` (empty when there is none or the
        caller may not read it, :func:`~prefect_baton._rules.access.may_read_checkpoint`)."""
        version, cid = col(CheckpointVersion.version), col(CheckpointVersion.checkpoint_id)
        which = (query.subject_id, query.kind, query.principal)
        with self._read() as (s, now):
            row = _readable(s, caller, _checkpoint_row(s, caller, *which), now)
            if row is None:
                return []
            q = select(CheckpointVersion).where(cid == row.checkpoint_id)
            if query.after is not None:
                q = q.where(after_key(version, cid, query.after))
            q = q.order_by(version, cid).limit(store_limit("checkpoints", query.limit))
            return [checkpoint_model(row, saved=v) for v in s.execute(q).scalars()]

    # ------------------------------------------------------------------ outcomes

    def outcome_record(
        self, caller: Caller, record: OutcomeWrite, *, idempotency_key: str | None
    ) -> Outcome:
        """Record an outcome with evidence; fenced by a lease when ``record.fence`` is given."""
        fence = record.fence
        under = _outcomes.outcome_lease(record.lease_id, fence.lease_id if fence else None)
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
            for kind_, ref in (
                ("handoff", record.handoff_id),
                ("checkpoint", record.checkpoint_id),
                ("lease", record.lease_id),
            ):
                if ref is not None:
                    parties = self._link_parties(tx, record, kind_, ref)
                    check_outcome_link(caller.role, caller.principal, kind_, ref, parties)
            _outcomes.check_outcome(
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

    def _link_parties(
        self, tx: Tx, record: OutcomeWrite, kind: str, ref: str
    ) -> tuple[str, ...] | None:
        """Who may read the ``kind`` record ``ref`` outcome ``record`` links, besides
        ``owner``/``admin`` (a handoff's sender and recipient, a checkpoint's
        :func:`checkpoint_parties`, a lease generation's owner), or ``None`` when the
        caller's org has no such record.

        Raises:
            ForbiddenError: a lease link judged on the ledger's own rows
                (``record.ledger_authority``) while Redis decides the org's leases
                (:meth:`_check_ledger_authority`, as a fence without a check).
        """
        s, caller = tx.session, tx.caller
        if kind == "handoff":
            return handoff_parties(caller, s.get(HandoffRow, ref))
        if kind == "checkpoint":
            return checkpoint_parties(s, caller, s.get(CheckpointRow, ref), tx.now_ms)
        if record.ledger_authority:  # the ledger's copy lags an authority it is not
            self._check_ledger_authority(tx, lock=True)
        row = self._row_by_id(s, caller.org, ref)
        return None if row is None else (row.owner,)

    def outcome_list(self, caller: Caller, query: OutcomeQuery) -> list[Outcome]:
        """The outcomes of the caller's org that ``query`` keeps, oldest first by the
        ledger clock, then by outcome id."""
        at, oid = col(OutcomeRow.recorded_at_ms), col(OutcomeRow.outcome_id)
        with self._read() as (s, _now):
            q = select(OutcomeRow).where(col(OutcomeRow.org_id) == caller.org)
            if query.subject_id is not None:
                q = q.where(col(OutcomeRow.subject_id) == query.subject_id)
            if query.after is not None:
                q = q.where(after_key(at, oid, query.after))
            q = q.order_by(at, oid).limit(store_limit("outcomes", query.limit))
            return [outcome_model(r) for r in s.execute(q).scalars()]

    # ------------------------------------------------------------------ events, history

    def events_list(self, caller: Caller, query: EventQuery) -> list[Event]:
        """The events of the caller's org that ``query`` keeps, in ``seq`` order (a
        resource's: those whose ``lease_id`` column names one of its generations)."""
        resource = query.resource
        with self._read() as (s, _now):
            q = select(EventRow).where(
                col(EventRow.org_id) == caller.org,
                col(EventRow.seq) > query.after_seq,
            )
            if query.kind is not None:
                q = q.where(col(EventRow.kind) == query.kind)
            if resource is not None:
                leases = select(col(GenerationRow.lease_id)).where(
                    col(GenerationRow.org_id) == caller.org,
                    col(GenerationRow.resource_type) == resource[0],
                    col(GenerationRow.resource_id) == resource[1],
                )
                q = q.where(col(EventRow.lease_id).in_(leases))
            if query.subject is not None:
                q = q.where(col(EventRow.subject) == query.subject)
            # by resource: sorted as an expression, else SQLite (no statistics) walks the
            # org's whole stream in ix_event_org_seq for its order, instead of each lease's
            # events in ix_event_lease and a sort of the resource's few
            seq = col(EventRow.seq)
            q = q.order_by(seq if resource is None else seq + 0)
            q = q.limit(store_limit("events", query.limit))
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
