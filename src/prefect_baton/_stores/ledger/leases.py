"""Lease operations of the ledger store, the embedded lease authority: its lease rows and
the writes (acquire, renew, transfer, release, force release).

Its reads are in :mod:`~prefect_baton._stores.ledger.lease_reads`; the fence checks of
record writes in :mod:`~prefect_baton._stores.ledger.fences`; the expiry report and handoff
expiry in :mod:`~prefect_baton._stores.ledger.expiry`.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable
from functools import cache

from sqlalchemy import func, select
from sqlmodel import Session, col

from prefect_baton._rules import core as _core
from prefect_baton._rules import events as _events
from prefect_baton._rules import scopes as _scopes
from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.core import (
    Decision,
    Generation,
    ReleaseRequest,
    RenewRequest,
    TransferRequest,
)
from prefect_baton._rules.digests import acquire_request_digest, resource_key
from prefect_baton._rules.keeping import heartbeat_call_timeout
from prefect_baton._stores.ledger.base import T, Tx
from prefect_baton._stores.ledger.conditions import lease_effective
from prefect_baton._stores.ledger.convert import (
    GENERATION_FIELDS,
    copy_fields,
    generation_to_lease,
    lease_payload,
    row_to_generation,
    shared_fields,
    subject_of,
)
from prefect_baton._stores.ledger.lease_reads import LeaseReads
from prefect_baton._stores.ledger.receipted_ops import ReceiptedLeaseOps
from prefect_baton._stores.ledger.tables import (
    GenerationRow,
    HandoffRow,
    LeaseTransition,
)
from prefect_baton._stores.protocol import AcquireRequest, Caller, Execution
from prefect_baton.errors import ConflictError, LeaseLostError, NotFoundError
from prefect_baton.models import Lease, Receipt

ATTEMPT_FIELD = "attempt"
"""The key of an acquire receipt's stored response (the lease's JSON) that holds the token of
the attempt that made it (``None``: an anonymous attempt; absent in receipts stored before
attempts existed, which reads as anonymous)."""


#: Copied from a :class:`Generation` to its :class:`LeaseTransition` row (the resource is
#: the transition's own).
_TRANSITION_FIELDS = shared_fields(
    LeaseTransition.model_fields, GENERATION_FIELDS, "resource_type", "resource_id"
)

#: Copied from a new :class:`Generation` to its :class:`GenerationRow` (the resource and
#: scopes are written apart; a new generation has not ended).
_NEW_ROW_FIELDS = shared_fields(
    GenerationRow.model_fields,
    GENERATION_FIELDS,
    "resource_type",
    "resource_id",
    "scopes",
    "ended_at_ms",
    "ended_by",
)


_LEASES = GenerationRow.__tablename__
#: The columns of a lease row, in the order of the statements below.
_LEASE_COLUMNS = tuple(GenerationRow.model_fields)
#: A lease row as :meth:`LeaseOps._sql` reads it, by column name.
_LeaseRow = namedtuple("_LeaseRow", _LEASE_COLUMNS)  # type: ignore[misc]
_ORG = _LEASE_COLUMNS.index("org_id")
_SELECT_LEASE = f"SELECT {', '.join(_LEASE_COLUMNS)} FROM {_LEASES}"
#: The newest generation (the head) of a resource: org, type, id.
_HEAD = (
    f"{_SELECT_LEASE} WHERE org_id = ? AND resource_type = ? AND resource_id = ? "
    "ORDER BY epoch DESC LIMIT 1"
)
_BY_ID = f"{_SELECT_LEASE} WHERE lease_id = ?"
_INSERT_LEASE = (
    f"INSERT INTO {_LEASES} ({', '.join(_LEASE_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_LEASE_COLUMNS))})"
)
_END_LEASE = f"UPDATE {_LEASES} SET status = ?, ended_at_ms = ?, ended_by = ? WHERE lease_id = ?"
_UPDATE_LEASE = (
    f"UPDATE {_LEASES} SET version = ?, expires_at_ms = ?, ttl_ms = ?, status = ?, "
    "ended_at_ms = ?, ended_by = ? WHERE lease_id = ?"
)
#: The columns of a transition row copied from its generation, then the transition's own.
_TRANSITION_COLUMNS = (*_TRANSITION_FIELDS, "org_id", "resource_type", "resource_id")
_INSERT_TRANSITION = (
    f"INSERT INTO {LeaseTransition.__tablename__} "
    f"({', '.join(_TRANSITION_COLUMNS)}, action, at_ms, actor) "
    f"VALUES ({', '.join('?' * (len(_TRANSITION_COLUMNS) + 3))})"
)


#: Where a lease is: its resource type, resource id, and whether it has scopes.
_Located = tuple[str, str, bool]
#: How many leases' whereabouts a store remembers (:meth:`LeaseOps._locate`).
LOCATED_MAX = 10_000


class LeaseOps(LeaseReads, ReceiptedLeaseOps):
    """The lease authority half of :class:`LedgerStore` (see :mod:`prefect_baton._rules.core`);
    its reads are :class:`~prefect_baton._stores.ledger.lease_reads.LeaseReads`."""

    # ------------------------------------------------------------------ lease rows

    def _head(self, tx: Tx, rtype: str, rid: str) -> Generation | None:
        """The resource's newest generation (highest epoch), or ``None`` if never leased."""
        row = self._sql(tx.session, _HEAD, (tx.caller.org, rtype, rid)).fetchone()
        if row is None:
            return None
        head = row_to_generation(_LeaseRow._make(row))
        tx.stored_lease_ids.add(head.lease_id)
        return head

    def _generation_by_id(self, session: Session, org: str, lease_id: str) -> Generation | None:
        """Generation ``lease_id`` of ``org`` (``None``: unknown, or another org's)."""
        row = self._sql(session, _BY_ID, (lease_id,)).fetchone()
        if row is None:
            return None
        return None if row[_ORG] != org else row_to_generation(_LeaseRow._make(row))

    def _epoch_floor(self, tx: Tx, rtype: str, rid: str) -> int:
        """The highest epoch the ledger ever recorded for the resource (0 if none): the
        ledger's epoch floor (see :func:`prefect_baton._rules.core.next_epoch`)."""
        top = tx.session.execute(
            select(func.max(col(GenerationRow.epoch))).where(
                col(GenerationRow.org_id) == tx.caller.org,
                col(GenerationRow.resource_type) == rtype,
                col(GenerationRow.resource_id) == rid,
            )
        ).scalar_one_or_none()
        return int(top or 0)

    def _locate(self, org: str, lease_id: str) -> _Located | None:
        """Where lease ``lease_id`` of ``org`` is, if this store saw it: its resource and
        whether it has scopes, facts of a lease id that never change (no row read)."""
        return self._located.get((org, lease_id))

    def _remember(self, org: str, g: Generation) -> _Located:
        """Remember where generation ``g`` of ``org`` is (:meth:`_locate`); the oldest
        entry is forgotten past :data:`LOCATED_MAX`."""
        where = (g.resource_type, g.resource_id, bool(g.scopes))
        located = self._located
        if len(located) >= LOCATED_MAX:
            try:
                del located[next(iter(located))]
            except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                pass
        located[(org, g.lease_id)] = where
        return where

    def _scope_conflict(
        self, tx: Tx, principal: str, scopes: tuple[str, ...], exclude: tuple[str, str]
    ) -> int | None:
        """The latest expiry among other principals' effective leases whose scopes overlap
        ``scopes`` (:func:`~prefect_baton._rules.scopes.latest_overlap`), or ``None``.

        Raises:
            ValidationError: the transaction's comparisons took more than
                :data:`~prefect_baton._rules.scopes.SCOPE_CHECK_STEPS` steps
                (:attr:`Tx.scope_steps`).
        """
        if not scopes:
            return None
        budget = tx.scope_steps
        rows = tx.session.execute(
            select(GenerationRow).where(
                col(GenerationRow.org_id) == tx.caller.org,
                lease_effective(tx.now_ms),
                col(GenerationRow.has_scopes) == 1,
                col(GenerationRow.owner) != principal,
            )
        ).scalars()
        return _scopes.latest_overlap(
            scopes,
            (
                (json.loads(row.scopes), int(row.expires_at_ms))
                for row in rows
                if (row.resource_type, row.resource_id) != exclude
            ),
            budget,
        )

    def _apply(self, tx: Tx, decision: Decision, org: str, *, resource: tuple[str, str]) -> None:
        """Write a lease decision: ended row, new/updated row, transitions and events.

        Raises:
            ForbiddenError: Redis decides the org's leases (every lease decision the
                ledger applies is checked here, :meth:`_check_ledger_authority`).
        """
        self._check_ledger_authority(tx, lock=True)
        s = tx.session
        s.flush()  # ORM objects a caller added go first, as they always did
        actor = tx.caller.principal
        e = decision.ended
        reported = False
        if e is not None:
            self._defer(s, _END_LEASE, (e.status, e.ended_at_ms, e.ended_by, e.lease_id))
            self._transition(tx, e, org, resource, action=e.status, actor=actor)
            reported = _events.reports_expiry(e.status) and self._expiry_reported(tx, e)
        n = decision.new
        events = _events.lease_events(
            decision.action,
            None if n is None else lease_payload(n, resource),
            new_status=n.status if n is not None else "",
            forced_by=n.ended_by if n is not None else None,
            ended=None if e is None else lease_payload(e, resource),
            ended_status=None if e is None else e.status,
            expiry_reported=reported,
            extra=decision.extra,
        )
        if n is None:
            for kind, payload in events:
                tx.emit(kind, subject_of(resource), payload)
            return
        # the generation's row if it has one (renew, release), else a new row
        changed = (n.version, n.expires_at_ms, n.ttl_ms, n.status, n.ended_at_ms, n.ended_by)
        if n.lease_id in tx.stored_lease_ids:
            self._defer(s, _UPDATE_LEASE, (*changed, n.lease_id))
        elif n.lease_id in tx.new_lease_ids or not (
            self._sql(s, _UPDATE_LEASE, (*changed, n.lease_id)).rowcount
        ):
            row = {
                **copy_fields(n, _NEW_ROW_FIELDS),
                "org_id": org,
                "resource_type": resource[0],
                "resource_id": resource[1],
                "scopes": json.dumps(list(n.scopes)),
                "has_scopes": 1 if n.scopes else 0,
                "ended_at_ms": None,
                "ended_by": None,
            }
            self._defer(s, _INSERT_LEASE, tuple(row[c] for c in _LEASE_COLUMNS))
            self._remember(org, n)
        self._transition(tx, n, org, resource, action=decision.action, actor=actor)
        for kind, payload in events:
            tx.emit(kind, subject_of(resource), payload)

    def _transition(
        self, tx: Tx, h: Generation, org: str, resource: tuple[str, str], *, action: str, actor: str
    ) -> None:
        self._defer(
            tx.session,
            _INSERT_TRANSITION,
            (
                *(getattr(h, f) for f in _TRANSITION_FIELDS),
                org,
                *resource,
                action,
                tx.now_ms,
                actor,
            ),
        )

    def _resource_of(self, caller: Caller, lease_id: str) -> _Located | None:
        """Lease ``lease_id``'s resource type, id and whether it has scopes (``None``:
        unknown, or another org's)."""
        where = self._locate(caller.org, lease_id)
        if where is not None:
            return where
        with self._read() as (s, _now):
            g = self._generation_by_id(s, caller.org, lease_id)
            return None if g is None else self._remember(caller.org, g)

    def _lease_locks(self, caller: Caller, rtype: str, rid: str, scoped: bool) -> list[str]:
        locks = [f"res:{caller.org}:{resource_key(rtype, rid)}"]
        if scoped:
            locks.append(self._scopes_lock(caller))
        return locks

    @staticmethod
    def _scopes_lock(caller: Caller) -> str:
        """The lock key of the org's write scopes (PostgreSQL): every transaction that grants,
        renews, transfers or ends a scoped lease holds it, after its resource locks."""
        return f"scopes:{caller.org}"

    # ------------------------------------------------------------------ lease authority

    def acquire(self, caller: Caller, request: AcquireRequest, execution: Execution) -> Lease:
        """Acquire or take over a resource (see :func:`prefect_baton._rules.core.decide_acquire`).

        With ``execution.key`` an exact retry by the same ``execution.attempt`` replays its
        receipt, unless the lease has since been lost (:class:`LeaseLostError`); another
        attempt is decided by :func:`prefect_baton._rules.core.replay_check`.
        """
        return self._write(
            caller,
            self._lease_locks(
                caller, request.resource_type, request.resource_id, bool(request.scopes)
            ),
            lambda tx: self._acquire_in_tx(tx, caller, request, execution),
            authority=True,
        )

    def _acquire_in_tx(
        self, tx: Tx, caller: Caller, req: AcquireRequest, execution: Execution
    ) -> Lease:
        """The transaction body of :meth:`acquire` (and of each resource of
        ``acquire_many``): replay the receipt of ``execution.key`` to the attempt that made
        it, or decide, apply and keep the receipt (with ``execution.attempt``, the key
        :data:`ATTEMPT_FIELD` of its stored response)."""
        key, attempt = execution.key, execution.attempt
        resource = (req.resource_type, req.resource_id)
        scope = resource_key(*resource)
        digest = acquire_request_digest(req)
        stored = self._receipt(tx, "acquire", key, scope, digest)
        if stored is not None:
            row = self._row_by_id(tx.session, caller.org, stored["lease_id"])
            held = _core.replay_check(
                row_to_generation(row) if row else None,
                lease_id=stored["lease_id"],
                owner=caller.principal,
                execution_key=key,
                epoch=int(stored["epoch"]),
                now_ms=tx.now_ms,
                attempt=attempt,
                receipt_attempt=stored.get(ATTEMPT_FIELD),
            )
            if held is not None:
                return generation_to_lease(held, replayed=True)
            assert key is not None  # a receipt is only found under a key
            self._drop_receipt(tx, "acquire", key, scope)  # another attempt acquires afresh
        head = self._head(tx, *resource)
        if head is not None and head.scopes and not req.scopes and head.effective(tx.now_ms):
            # ending another effective scoped generation (a supersede, or a release under an
            # expired handoff) changes what a concurrent acquire's scope check sees: hold the
            # org's scope lock for it too (taken after the resource lock, as every transaction
            # orders them) and read the clock again under it, so no scoped grant falls inside
            # the recorded life of this generation
            tx.now_ms = self._lock_all_then_now(tx.session, [self._scopes_lock(caller)])
        # the scope check runs at most once per request, only when the decision reaches it:
        # deciding again below spends no more of the request's steps
        scope_check = cache(
            lambda: self._scope_conflict(tx, caller.principal, req.scopes, resource)
        )
        try:
            decision = self._decide_acquire(tx, head, req, key, scope_check)
        except ConflictError:
            # held under a pending handoff whose deadline passed: that handoff ends and
            # releases it here (_rules.handoffs.decide_handoff_expiry), then decide again
            freed = None if head is None else self._expired_carrier(tx, head)
            if freed is None:
                raise
            decision = self._decide_acquire(tx, freed, req, key, scope_check)
        assert decision.new is not None
        if decision.noop:
            return generation_to_lease(decision.new, replayed=True)
        self._apply(tx, decision, caller.org, resource=resource)
        lease = generation_to_lease(decision.new)
        response = {**lease.model_dump(mode="json"), ATTEMPT_FIELD: attempt}
        self._store_receipt(tx, "acquire", key, scope, digest, response)
        return lease

    def _decide_acquire(
        self,
        tx: Tx,
        head: Generation | None,
        req: AcquireRequest,
        key: str | None,
        scope_check: Callable[[], int | None],
    ) -> Decision:
        return _core.decide_acquire(
            head,
            req,
            principal=tx.caller.principal,
            execution_key=key,
            now_ms=tx.now_ms,
            new_lease_id=tx.new_lease_id(),
            scope_conflict_expires_ms=scope_check,
            # the head is the generation with the highest epoch: the ledger's floor (above
            # the last Redis incarnation's epochs in an org handed back to the ledger)
            epoch_floor=max(head.epoch if head is not None else 0, tx.epoch_floor),
        )

    def _expired_carrier(self, tx: Tx, head: Generation) -> Generation | None:
        """``head`` released when an expired pending handoff carried it (implemented by
        :class:`~prefect_baton._stores.ledger.expiry.ExpiryOps`); ``None`` here."""
        return None

    def _by_proof(
        self,
        caller: Caller,
        lease_id: str,
        fn: Callable[[Tx, Generation | None, tuple[str, str]], T],
        *,
        extra_scoped: bool = False,
        statement_timeout_ms: int | None = None,
    ) -> T:
        # one transaction: where the lease is (its resource and scopes never change) names
        # the locks to take; the row is read once they are held. A lease this store has not
        # seen is read first to find them, and on PostgreSQL read again under the locks
        # (SQLite's BEGIN IMMEDIATE already holds the database's write lock).
        found: list[Generation] = []  # the row read before the locks, this attempt
        where: list[_Located] = []

        def locks(session: Session) -> list[str]:
            found.clear()
            where.clear()
            located = self._locate(caller.org, lease_id)
            if located is None:
                g = self._generation_by_id(session, caller.org, lease_id)
                if g is None:
                    raise NotFoundError(f"lease {lease_id} not found")
                found.append(g)
                located = self._remember(caller.org, g)
            where.append(located)
            rtype, rid, scoped = located
            return self._lease_locks(caller, rtype, rid, scoped or extra_scoped)

        def op(tx: Tx) -> T:
            if found and self.engines.is_sqlite:
                g: Generation | None = found[0]
            else:
                g = self._generation_by_id(tx.session, caller.org, lease_id)
                if g is None:
                    raise NotFoundError(f"lease {lease_id} not found")
            tx.stored_lease_ids.add(lease_id)
            return fn(tx, g, (where[0][0], where[0][1]))

        return self._write(
            caller, locks, op, statement_timeout_ms=statement_timeout_ms, authority=True
        )

    def _renew(self, caller: Caller, request: RenewRequest) -> Lease:
        """Renew a lease the caller holds (see
        :func:`prefect_baton._rules.transitions.decide_renew`). On PostgreSQL its statements
        time out after :func:`~prefect_baton._rules.keeping.heartbeat_call_timeout` of the
        TTL, below the keeper's renew deadline."""

        def fn(tx: Tx, row: Generation | None, resource: tuple[str, str]) -> Lease | LeaseLostError:
            deadline = self._carried_deadline(tx, row)
            try:
                d = _transitions.decide_renew(
                    row, request, now_ms=tx.now_ms, handoff_deadline_ms=deadline
                )
            except LeaseLostError as lost:
                if not self._end_carrier(tx, row, deadline):
                    raise
                return lost
            self._apply(tx, d, caller.org, resource=resource)
            assert d.new is not None
            return generation_to_lease(d.new)

        timeout_ms = int(heartbeat_call_timeout(request.ttl_ms / 1000) * 1000)
        return _raised(
            self._by_proof(caller, request.proof.lease_id, fn, statement_timeout_ms=timeout_ms)
        )

    def _carried_deadline(self, tx: Tx, row: Generation | None) -> int | None:
        """The earliest deadline (epoch ms) of the pending handoffs of the caller's org
        carrying ``row``, or ``None`` (:func:`_core.handoff_deadline_passed`)."""
        if row is None:
            return None
        return tx.session.execute(
            select(func.min(col(HandoffRow.expires_at_ms))).where(
                col(HandoffRow.lease_id) == row.lease_id,
                col(HandoffRow.org_id) == tx.caller.org,
                col(HandoffRow.status) == "pending",
            )
        ).scalar()

    def _end_carrier(self, tx: Tx, row: Generation | None, deadline: int | None) -> bool:
        """After a renew, transfer or fenced write of ``row`` was refused: when a handoff
        carrying ``row`` passed its ``deadline`` (:func:`_core.handoff_deadline_passed`), end
        it in ``tx`` as an acquire does (:meth:`_expired_carrier`: the handoff stored
        ``expired``, ``row`` released with reason ``handoff_expired``) and return ``True``;
        the refusal is then raised once ``tx`` commits (:func:`_raised`). Else ``False``
        (nothing to keep)."""
        if row is None or not _core.handoff_deadline_passed(deadline, tx.now_ms):
            return False
        self._expired_carrier(tx, row)
        return True

    def _transfer_in_tx(
        self,
        tx: Tx,
        row: Generation | None,
        resource: tuple[str, str],
        request: TransferRequest,
    ) -> Lease:
        scopes = row.scopes if row else ()
        d = _transitions.decide_transfer(
            row,
            request,
            now_ms=tx.now_ms,
            new_lease_id=tx.new_lease_id(),
            scope_conflict_expires_ms=lambda: self._scope_conflict(
                tx, request.to_principal, scopes, resource
            ),
            epoch_floor=self._epoch_floor(tx, *resource),
            handoff_deadline_ms=self._carried_deadline(tx, row),
        )
        self._apply(tx, d, tx.caller.org, resource=resource)
        assert d.new is not None
        return generation_to_lease(d.new)

    def _transfer(self, caller: Caller, request: TransferRequest) -> Lease:
        """Transfer a lease as ``request`` says (see :func:`_transitions.decide_transfer`)."""

        def fn(tx: Tx, row: Generation | None, resource: tuple[str, str]) -> Lease | LeaseLostError:
            try:
                return self._transfer_in_tx(tx, row, resource, request)
            except LeaseLostError as lost:
                if not self._end_carrier(tx, row, self._carried_deadline(tx, row)):
                    raise
                return lost

        return _raised(self._by_proof(caller, request.proof.lease_id, fn))

    def _receipt_of(self, tx: Tx, d: Decision, action: str, resource: tuple[str, str]) -> Receipt:
        assert d.new is not None
        if not d.noop:
            self._apply(tx, d, tx.caller.org, resource=resource)
        status = "no_change" if d.noop else d.receipt_status
        return Receipt(action=action, status=status, lease=generation_to_lease(d.new))  # type: ignore[arg-type,unused-ignore]

    def _release(self, caller: Caller, request: ReleaseRequest) -> Receipt:
        """Release by proof (see :func:`_transitions.decide_release`)."""

        def fn(tx: Tx, row: Generation | None, resource: tuple[str, str]) -> Receipt:
            d = _transitions.decide_release(row, request, now_ms=tx.now_ms)
            return self._receipt_of(tx, d, "release", resource)

        return self._by_proof(caller, request.proof.lease_id, fn)

    def _release_by_id(self, caller: Caller, lease_id: str) -> Receipt:
        """Release by id alone, as the holder (see :func:`_transitions.decide_release_by_id`)."""

        def fn(tx: Tx, row: Generation | None, resource: tuple[str, str]) -> Receipt:
            d = _transitions.decide_release_by_id(
                row, principal=caller.principal, lease_id=lease_id, now_ms=tx.now_ms
            )
            return self._receipt_of(tx, d, "release_by_id", resource)

        return self._by_proof(caller, lease_id, fn)

    def _force_release(self, caller: Caller, lease_id: str) -> Receipt:
        """Force-release any lease of the org, as ``owner`` or ``admin`` (see
        :func:`_transitions.decide_force_release`)."""

        def fn(tx: Tx, row: Generation | None, resource: tuple[str, str]) -> Receipt:
            d = _transitions.decide_force_release(
                row,
                principal=caller.principal,
                role=caller.role,
                lease_id=lease_id,
                now_ms=tx.now_ms,
            )
            return self._receipt_of(tx, d, "force_release", resource)

        return self._by_proof(caller, lease_id, fn)

    def _expiry_reported(self, tx: Tx, h: Generation) -> bool:
        found = tx.session.execute(
            select(col(LeaseTransition.seq)).where(
                col(LeaseTransition.lease_id) == h.lease_id,
                col(LeaseTransition.version) == h.version,
                col(LeaseTransition.action) == "expired",
            )
        ).first()
        return found is not None


def _raised(result: Lease | LeaseLostError) -> Lease:
    """``result`` of a committed renew or transfer transaction, or the refusal it
    committed (the end of an expired handoff, :meth:`LeaseOps._end_carrier`) raised."""
    if isinstance(result, LeaseLostError):
        raise result
    return result
