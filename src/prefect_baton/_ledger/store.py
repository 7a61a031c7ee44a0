"""The ledger store: applies the core's decisions to the SQL ledger, one transaction each.

Every mutation runs in one database transaction that (1) takes its locks up front (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: transaction advisory locks on the resource, on the org's
write scopes when scopes are involved, and on the org's event stream just before the outbox
insert, so event sequence numbers are handed out in commit order), (2) reads the database
clock, (3) checks the idempotency receipt, (4) decides with :mod:`prefect_baton._core`,
(5) writes the rows, the transition history, the events and the receipt, and commits.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import delete, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlmodel import Session, col

from .. import _core, _scopes
from .._authority import Caller
from .._core import Decision, Holding, Proof
from ..errors import (
    BatonError,
    ForbiddenError,
    IdempotencyMismatchError,
    LeaseLostError,
    NotFoundError,
    UnavailableError,
    ValidationError,
)
from ..models import (
    Checkpoint,
    Event,
    Evidence,
    Handoff,
    Lease,
    LeaseInfo,
    Outcome,
    Receipt,
    from_ms,
)
from .engine import Engines, make_engines, upgrade
from .tables import (
    CheckpointRow,
    CheckpointVersion,
    EventRow,
    HandoffRow,
    LeaseRow,
    LeaseTransition,
    Organization,
    OutcomeRow,
    Principal,
    ReceiptRow,
)

T = TypeVar("T")
MAX_ATTEMPTS = 8
DEFAULT_RECEIPT_RETENTION_SECONDS = 24 * 3600
PRUNE_EVERY_WRITES = 500  # every this many writes, also delete expired receipts ...
PRUNE_BATCH = 1000  # ... at most this many at a time


def new_id(prefix: str) -> str:
    """A fresh id: ``prefix_`` + 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def resource_key(resource_type: str, resource_id: str) -> str:
    """Unambiguous key of a resource (length-prefixed, so ids cannot forge separators)."""
    return f"{len(resource_type)}:{resource_type}:{resource_id}"


# ----------------------------------------------------------------------------- conversions


def row_to_holding(row: LeaseRow) -> Holding:
    return Holding(
        lease_id=row.lease_id,
        resource_type=row.resource_type,
        resource_id=row.resource_id,
        owner=row.owner,
        execution_key=row.execution_key,
        version=row.version,
        epoch=row.epoch,
        status=row.status,  # type: ignore[arg-type,unused-ignore]
        acquired_at_ms=row.acquired_at_ms,
        expires_at_ms=row.expires_at_ms,
        ttl_ms=row.ttl_ms,
        scopes=tuple(json.loads(row.scopes)),
        purpose=row.purpose,
        ended_at_ms=row.ended_at_ms,
        ended_by=row.ended_by,
    )


def holding_to_lease(h: Holding, *, replayed: bool = False) -> Lease:
    acquired = from_ms(h.acquired_at_ms)
    expires = from_ms(h.expires_at_ms)
    assert acquired is not None and expires is not None
    return Lease(
        lease_id=h.lease_id,
        resource_type=h.resource_type,
        resource_id=h.resource_id,
        owner=h.owner,
        execution_key=h.execution_key,
        version=h.version,
        epoch=h.epoch,
        scopes=h.scopes,
        status=h.status,
        purpose=h.purpose,
        acquired_at=acquired,
        expires_at=expires,
        ttl_seconds=h.ttl_ms // 1000,
        released_at=from_ms(h.ended_at_ms),
        replayed=replayed,
    )


def _checkpoint_model(row: CheckpointRow, *, replayed: bool = False) -> Checkpoint:
    created, updated = from_ms(row.created_at_ms), from_ms(row.updated_at_ms)
    assert created is not None and updated is not None
    return Checkpoint(
        checkpoint_id=row.checkpoint_id,
        subject_id=row.subject_id,
        kind=row.kind,
        principal=row.principal,
        version=row.version,
        state=json.loads(row.state),
        state_hash=row.state_hash,
        created_at=created,
        updated_at=updated,
        expires_at=from_ms(row.expires_at_ms),
        replayed=replayed,
    )


def _handoff_model(row: HandoffRow, now_ms: int, lease: Lease | None = None) -> Handoff:
    status = row.status
    if status == "pending" and row.expires_at_ms is not None and row.expires_at_ms <= now_ms:
        status = "expired"
    created = from_ms(row.created_at_ms)
    assert created is not None
    return Handoff(
        handoff_id=row.handoff_id,
        from_principal=row.from_principal,
        to_principal=row.to_principal,
        subject_id=row.subject_id,
        checkpoint_id=row.checkpoint_id,
        context_id=row.context_id,
        message=row.message,
        lease_id=row.lease_id,
        status=status,  # type: ignore[arg-type,unused-ignore]
        created_at=created,
        expires_at=from_ms(row.expires_at_ms),
        resolved_at=from_ms(row.resolved_at_ms),
        note=row.note,
        lease=lease,
    )


def _outcome_model(row: OutcomeRow) -> Outcome:
    recorded = from_ms(row.recorded_at_ms)
    assert recorded is not None
    return Outcome(
        outcome_id=row.outcome_id,
        subject_id=row.subject_id,
        principal=row.principal,
        status=row.status,  # type: ignore[arg-type,unused-ignore]
        evidence=tuple(Evidence(**e) for e in json.loads(row.evidence)),
        lease_id=row.lease_id,
        handoff_id=row.handoff_id,
        checkpoint_id=row.checkpoint_id,
        fence_epoch=row.fence_epoch,
        recorded_at=recorded,
    )


# ----------------------------------------------------------------------------- transaction


@dataclass
class Tx:
    """One open write transaction: the session, the database clock, pending events."""

    session: Session
    now_ms: int
    caller: Caller
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    registered: tuple[str, str, str] | None = None

    def emit(self, kind: str, subject: str, payload: dict[str, Any]) -> None:
        self.events.append((kind, subject, payload))


@dataclass(frozen=True)
class Fence:
    """A lease presented as a fencing token: its id and epoch.

    When another authority than the ledger holds the leases (Redis), ``resource`` names the
    lease's resource (its lock serialises fenced writes of that resource) and ``check``
    reads the generation and the authority's clock inside the write transaction, so the
    fence is judged by the authority, not by the ledger's copy.
    """

    lease_id: str
    epoch: int
    resource: tuple[str, str] | None = None
    check: Callable[[], tuple[Holding | None, int]] | None = None


class LedgerStore:
    """The SQL ledger and the embedded lease authority.

    Args:
        url: SQLAlchemy URL, ``sqlite:///path`` or ``postgresql://...`` (psycopg 3).
        receipt_retention_seconds: how long idempotency receipts are kept (default 24 h).
        state_max_bytes: the checkpoint state cap in bytes (default 1 MiB).
        migrate: apply the shipped Alembic migrations on first use (default ``True``).

    Raises:
        ValidationError: a malformed URL. UnavailableError: the database cannot be reached.
    """

    def __init__(
        self,
        url: str,
        *,
        receipt_retention_seconds: int = DEFAULT_RECEIPT_RETENTION_SECONDS,
        state_max_bytes: int = _core.DEFAULT_STATE_MAX_BYTES,
        migrate: bool = True,
    ) -> None:
        self.engines: Engines = make_engines(url)
        self.url = self.engines.url
        self.receipt_retention_ms = receipt_retention_seconds * 1000
        self.state_max_bytes = state_max_bytes
        self._registered: set[tuple[str, str, str]] = set()
        self._writes = 0
        self._now_sql = text(self.engines.now_sql())
        if migrate:
            upgrade(self.engines)

    def close(self) -> None:
        """Dispose of the connection pools."""
        self.engines.dispose()

    # ------------------------------------------------------------------ plumbing

    def _lock(self, session: Session, key: str) -> None:
        if not self.engines.is_sqlite:
            session.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": key}
            )

    def _write(self, caller: Caller, locks: Sequence[str], fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a write transaction, retrying on serialization/unique races."""
        last: Exception | None = None
        for _attempt in range(MAX_ATTEMPTS):
            try:
                with Session(self.engines.write, expire_on_commit=False) as session:
                    with session.begin():
                        for key in sorted(set(locks)):
                            self._lock(session, key)
                        now_ms = int(session.execute(self._now_sql).scalar_one())
                        tx = Tx(session=session, now_ms=now_ms, caller=caller)
                        self._register(tx)
                        result = fn(tx)
                        self._flush_events(tx)
                        self._writes += 1
                        if self._writes % PRUNE_EVERY_WRITES == 0:
                            self._prune(session, now_ms)
                    if tx.registered is not None:
                        self._registered.add(tx.registered)
                    return result
            except BatonError:
                raise
            except IntegrityError as exc:
                last = exc
                continue
            except OperationalError as exc:
                last = exc
                if self.engines.is_sqlite and "locked" in str(exc.orig).lower():
                    continue
                raise UnavailableError(f"ledger database unavailable: {exc.orig}") from exc
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) in ("40001", "40P01"):
                    last = exc
                    continue
                raise
        raise UnavailableError(f"ledger write did not settle after {MAX_ATTEMPTS} tries: {last}")

    @contextmanager
    def _read(self) -> Iterator[tuple[Session, int]]:
        try:
            with (
                Session(self.engines.read, expire_on_commit=False) as session,
                session.begin(),
            ):
                now_ms = int(session.execute(self._now_sql).scalar_one())
                yield session, now_ms
        except OperationalError as exc:
            raise UnavailableError(f"ledger database unavailable: {exc.orig}") from exc

    def now_ms(self) -> int:
        """The database clock in epoch milliseconds."""
        with self._read() as (_s, now):
            return now

    def _insert_ignore(self, session: Session, model: type[Any], values: dict[str, Any]) -> None:
        ins = sqlite_insert if self.engines.is_sqlite else pg_insert
        stmt = ins(model).values(**values).on_conflict_do_nothing()
        session.execute(stmt)

    def _register(self, tx: Tx) -> None:
        """Register the caller's org and principal in this transaction (first use only;
        remembered once the transaction commits, so a rolled-back first write retries)."""
        c = tx.caller
        key = (c.org, c.principal, c.role)
        if key in self._registered:
            return
        self._insert_ignore(tx.session, Organization, {"org_id": c.org, "created_at_ms": tx.now_ms})
        self._insert_ignore(
            tx.session,
            Principal,
            {"org_id": c.org, "name": c.principal, "role": c.role, "created_at_ms": tx.now_ms},
        )
        tx.session.execute(
            update(Principal)
            .where(col(Principal.org_id) == c.org, col(Principal.name) == c.principal)
            .where(col(Principal.role) != c.role)
            .values(role=c.role)
        )
        tx.registered = key

    def _flush_events(self, tx: Tx) -> None:
        if not tx.events:
            return
        self._lock(tx.session, f"events:{tx.caller.org}")
        for kind, subject, payload in tx.events:
            tx.session.add(
                EventRow(
                    event_id=new_id("evt"),
                    org_id=tx.caller.org,
                    kind=kind,
                    principal=tx.caller.principal,
                    subject=subject,
                    payload=_core.canonical_json(payload),
                    occurred_at_ms=tx.now_ms,
                )
            )
        tx.session.flush()

    # ------------------------------------------------------------------ receipts

    def _receipt(
        self, tx: Tx, operation: str, key: str | None, scope: str, digest: str
    ) -> dict[str, Any] | None:
        """Return the stored response for an exact retry, raise on a changed request."""
        if key is None:
            return None
        c = tx.caller
        row = tx.session.execute(
            select(ReceiptRow).where(
                col(ReceiptRow.org_id) == c.org,
                col(ReceiptRow.principal) == c.principal,
                col(ReceiptRow.operation) == operation,
                col(ReceiptRow.idem_key) == key,
                col(ReceiptRow.scope_key) == scope,
            )
        ).scalar_one_or_none()
        if row is None:
            return None
        if row.expires_at_ms <= tx.now_ms:
            tx.session.delete(row)
            tx.session.flush()
            return None
        if row.request_digest != digest:
            raise IdempotencyMismatchError(
                f"idempotency key {key!r} was used for a different {operation} request"
            )
        result: dict[str, Any] = json.loads(row.response)
        return result

    def _store_receipt(
        self, tx: Tx, operation: str, key: str | None, scope: str, digest: str, response: Any
    ) -> None:
        if key is None:
            return
        c = tx.caller
        tx.session.add(
            ReceiptRow(
                org_id=c.org,
                principal=c.principal,
                operation=operation,
                idem_key=key,
                scope_key=scope,
                request_digest=digest,
                response=json.dumps(response),
                created_at_ms=tx.now_ms,
                expires_at_ms=tx.now_ms + self.receipt_retention_ms,
            )
        )
        tx.session.flush()

    def _prune(self, session: Session, now_ms: int) -> int:
        ids = select(col(ReceiptRow.id)).where(col(ReceiptRow.expires_at_ms) <= now_ms)
        res = session.execute(
            delete(ReceiptRow).where(
                col(ReceiptRow.id).in_(ids.limit(PRUNE_BATCH).scalar_subquery())
            )
        )
        return int(res.rowcount or 0)  # type: ignore[attr-defined]

    def prune_receipts(self, caller: Caller) -> int:
        """Delete idempotency receipts past their retention; returns how many (``int``)."""

        def op(tx: Tx) -> int:
            res = tx.session.execute(
                delete(ReceiptRow).where(col(ReceiptRow.expires_at_ms) <= tx.now_ms)
            )
            return int(res.rowcount or 0)  # type: ignore[attr-defined]

        return self._write(caller, [], op)

    # ------------------------------------------------------------------ lease rows

    def _head(self, tx: Tx, rtype: str, rid: str) -> LeaseRow | None:
        return tx.session.execute(
            select(LeaseRow)
            .where(
                col(LeaseRow.org_id) == tx.caller.org,
                col(LeaseRow.resource_type) == rtype,
                col(LeaseRow.resource_id) == rid,
            )
            .order_by(col(LeaseRow.epoch).desc())
            .limit(1)
        ).scalar_one_or_none()

    def _row_by_id(self, session: Session, org: str, lease_id: str) -> LeaseRow | None:
        row = session.get(LeaseRow, lease_id)
        if row is None or row.org_id != org:
            return None
        return row

    def _scope_conflict(
        self, tx: Tx, principal: str, scopes: tuple[str, ...], exclude: tuple[str, str]
    ) -> int | None:
        """Expiry of another principal's effective lease whose scopes overlap ``scopes``."""
        if not scopes:
            return None
        rows = tx.session.execute(
            select(LeaseRow).where(
                col(LeaseRow.org_id) == tx.caller.org,
                col(LeaseRow.status) == "active",
                col(LeaseRow.has_scopes) == 1,
                col(LeaseRow.expires_at_ms) > tx.now_ms,
                col(LeaseRow.owner) != principal,
            )
        ).scalars()
        for row in rows:
            if (row.resource_type, row.resource_id) == exclude:
                continue
            if _scopes.sets_overlap(scopes, json.loads(row.scopes)):
                return int(row.expires_at_ms)
        return None

    def _apply(self, tx: Tx, decision: Decision, org: str, *, resource: tuple[str, str]) -> None:
        """Write a lease decision: ended row, new/updated row, transitions and events."""
        s = tx.session
        actor = tx.caller.principal
        if decision.ended is not None:
            e = decision.ended
            s.execute(
                update(LeaseRow)
                .where(col(LeaseRow.lease_id) == e.lease_id)
                .values(status=e.status, ended_at_ms=e.ended_at_ms, ended_by=e.ended_by)
            )
            s.flush()
            self._transition(tx, e, org, resource, action=e.status, actor=actor)
            if e.status == "taken_over":
                tx.emit("lease.expired", _subject(resource), _lease_payload(e, resource))
        n = decision.new
        if n is None:
            return
        existing = s.get(LeaseRow, n.lease_id)
        if existing is None:
            s.add(
                LeaseRow(
                    lease_id=n.lease_id,
                    org_id=org,
                    resource_type=resource[0],
                    resource_id=resource[1],
                    owner=n.owner,
                    execution_key=n.execution_key,
                    purpose=n.purpose,
                    scopes=json.dumps(list(n.scopes)),
                    has_scopes=1 if n.scopes else 0,
                    version=n.version,
                    epoch=n.epoch,
                    status=n.status,
                    acquired_at_ms=n.acquired_at_ms,
                    expires_at_ms=n.expires_at_ms,
                    ttl_ms=n.ttl_ms,
                )
            )
        else:
            existing.version = n.version
            existing.expires_at_ms = n.expires_at_ms
            existing.ttl_ms = n.ttl_ms
            existing.status = n.status
            existing.ended_at_ms = n.ended_at_ms
            existing.ended_by = n.ended_by
            s.add(existing)
        s.flush()
        self._transition(tx, n, org, resource, action=decision.action, actor=actor)
        kind = {
            "acquire": "lease.acquired",
            "takeover": "lease.acquired",
            "supersede": "lease.acquired",
            "renew": "lease.renewed",
            "transfer": "lease.transferred",
            "release": "lease.released",
            "force_release": "lease.released",
        }[decision.action]
        payload = _lease_payload(n, resource)
        if decision.action in ("takeover", "supersede"):
            payload["previous_lease_id"] = decision.ended.lease_id if decision.ended else None
        if decision.action in ("release", "force_release"):
            payload["status"] = n.status
            if n.ended_by:
                payload["forced_by"] = n.ended_by
        tx.emit(kind, _subject(resource), payload)

    def _transition(
        self, tx: Tx, h: Holding, org: str, resource: tuple[str, str], *, action: str, actor: str
    ) -> None:
        tx.session.add(
            LeaseTransition(
                org_id=org,
                resource_type=resource[0],
                resource_id=resource[1],
                lease_id=h.lease_id,
                action=action,
                version=h.version,
                epoch=h.epoch,
                owner=h.owner,
                execution_key=h.execution_key,
                status=h.status,
                at_ms=tx.now_ms,
                expires_at_ms=h.expires_at_ms,
                actor=actor,
            )
        )
        tx.session.flush()

    def _resource_of(self, caller: Caller, lease_id: str) -> tuple[str, str, bool] | None:
        with self._read() as (s, _now):
            row = self._row_by_id(s, caller.org, lease_id)
            if row is None:
                return None
            return row.resource_type, row.resource_id, bool(row.has_scopes)

    def _lease_locks(self, caller: Caller, rtype: str, rid: str, scoped: bool) -> list[str]:
        locks = [f"res:{caller.org}:{resource_key(rtype, rid)}"]
        if scoped:
            locks.append(f"scopes:{caller.org}")
        return locks

    # ------------------------------------------------------------------ lease authority

    def acquire(
        self,
        caller: Caller,
        resource_type: str,
        resource_id: str,
        *,
        ttl_ms: int,
        scopes: tuple[str, ...],
        purpose: str | None,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> Lease:
        """Acquire or take over a resource (see :func:`prefect_baton._core.decide_acquire`).

        With ``idempotency_key`` (the execution key) an exact retry replays its receipt,
        unless the lease has since been lost (:class:`LeaseLostError`).
        """
        resource = (resource_type, resource_id)
        scope = resource_key(resource_type, resource_id)
        digest = _core.request_digest(
            "acquire",
            {
                "expected_version": expected_version,
                "ttl_ms": ttl_ms,
                "scopes": list(scopes),
                "purpose": purpose,
            },
        )

        def op(tx: Tx) -> Lease:
            stored = self._receipt(tx, "acquire", idempotency_key, scope, digest)
            if stored is not None:
                row = self._row_by_id(tx.session, caller.org, stored["lease_id"])
                held = _core.replay_check(
                    row_to_holding(row) if row else None,
                    lease_id=stored["lease_id"],
                    owner=caller.principal,
                    execution_key=idempotency_key,
                    epoch=int(stored["epoch"]),
                    now_ms=tx.now_ms,
                )
                return holding_to_lease(held, replayed=True)
            head_row = self._head(tx, resource_type, resource_id)
            head = row_to_holding(head_row) if head_row else None
            decision = _core.decide_acquire(
                head,
                resource_type=resource_type,
                resource_id=resource_id,
                principal=caller.principal,
                execution_key=idempotency_key,
                ttl_ms=ttl_ms,
                scopes=scopes,
                purpose=purpose,
                expected_version=expected_version,
                now_ms=tx.now_ms,
                new_lease_id=new_id("lease"),
                scope_conflict_expires_ms=self._scope_conflict(
                    tx, caller.principal, scopes, resource
                ),
            )
            assert decision.new is not None
            if decision.noop:
                return holding_to_lease(decision.new, replayed=True)
            self._apply(tx, decision, caller.org, resource=resource)
            lease = holding_to_lease(decision.new)
            self._store_receipt(
                tx, "acquire", idempotency_key, scope, digest, lease.model_dump(mode="json")
            )
            return lease

        return self._write(
            caller, self._lease_locks(caller, resource_type, resource_id, bool(scopes)), op
        )

    def _by_proof(
        self,
        caller: Caller,
        lease_id: str,
        fn: Callable[[Tx, Holding | None, tuple[str, str]], T],
        *,
        extra_scoped: bool = False,
    ) -> T:
        located = self._resource_of(caller, lease_id)
        if located is None:
            raise NotFoundError(f"lease {lease_id} not found")
        rtype, rid, scoped = located

        def op(tx: Tx) -> T:
            row = self._row_by_id(tx.session, caller.org, lease_id)
            return fn(tx, row_to_holding(row) if row else None, (rtype, rid))

        return self._write(
            caller, self._lease_locks(caller, rtype, rid, scoped or extra_scoped), op
        )

    def renew(
        self, caller: Caller, proof: Proof, *, ttl_ms: int, expected_version: int | None
    ) -> Lease:
        """Renew a lease the caller holds (see :func:`prefect_baton._core.decide_renew`)."""

        def fn(tx: Tx, row: Holding | None, resource: tuple[str, str]) -> Lease:
            d = _core.decide_renew(
                row, proof, ttl_ms=ttl_ms, expected_version=expected_version, now_ms=tx.now_ms
            )
            self._apply(tx, d, caller.org, resource=resource)
            assert d.new is not None
            return holding_to_lease(d.new)

        return self._by_proof(caller, proof.lease_id, fn)

    def _transfer_in_tx(
        self,
        tx: Tx,
        row: Holding | None,
        resource: tuple[str, str],
        proof: Proof,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_ms: int,
        expected_version: int | None,
    ) -> Lease:
        scopes = row.scopes if row else ()
        d = _core.decide_transfer(
            row,
            proof,
            to_principal=to_principal,
            new_execution_key=new_execution_key,
            ttl_ms=ttl_ms,
            expected_version=expected_version,
            now_ms=tx.now_ms,
            new_lease_id=new_id("lease"),
            scope_conflict_expires_ms=self._scope_conflict(tx, to_principal, scopes, resource),
        )
        self._apply(tx, d, tx.caller.org, resource=resource)
        assert d.new is not None
        return holding_to_lease(d.new)

    def transfer(
        self,
        caller: Caller,
        proof: Proof,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_ms: int,
        expected_version: int | None,
    ) -> Lease:
        """Transfer a lease to ``to_principal`` (see :func:`_core.decide_transfer`)."""

        def fn(tx: Tx, row: Holding | None, resource: tuple[str, str]) -> Lease:
            return self._transfer_in_tx(
                tx,
                row,
                resource,
                proof,
                to_principal=to_principal,
                new_execution_key=new_execution_key,
                ttl_ms=ttl_ms,
                expected_version=expected_version,
            )

        return self._by_proof(caller, proof.lease_id, fn)

    def _receipt_of(self, tx: Tx, d: Decision, action: str, resource: tuple[str, str]) -> Receipt:
        assert d.new is not None
        if not d.noop:
            self._apply(tx, d, tx.caller.org, resource=resource)
        status = "no_change" if d.noop else d.receipt_status
        return Receipt(action=action, status=status, lease=holding_to_lease(d.new))  # type: ignore[arg-type,unused-ignore]

    def release(self, caller: Caller, proof: Proof, *, expected_version: int | None) -> Receipt:
        """Release by proof (see :func:`_core.decide_release`)."""

        def fn(tx: Tx, row: Holding | None, resource: tuple[str, str]) -> Receipt:
            d = _core.decide_release(
                row, proof, expected_version=expected_version, now_ms=tx.now_ms
            )
            return self._receipt_of(tx, d, "release", resource)

        return self._by_proof(caller, proof.lease_id, fn)

    def release_by_id(self, caller: Caller, lease_id: str) -> Receipt:
        """Release by id alone, as the holder (see :func:`_core.decide_release_by_id`)."""

        def fn(tx: Tx, row: Holding | None, resource: tuple[str, str]) -> Receipt:
            d = _core.decide_release_by_id(
                row, principal=caller.principal, lease_id=lease_id, now_ms=tx.now_ms
            )
            return self._receipt_of(tx, d, "release_by_id", resource)

        return self._by_proof(caller, lease_id, fn)

    def force_release(self, caller: Caller, lease_id: str) -> Receipt:
        """Force-release any lease of the org, as ``owner`` or ``admin``."""
        if caller.role not in ("owner", "admin"):
            raise ForbiddenError("force release needs the owner or admin role")

        def fn(tx: Tx, row: Holding | None, resource: tuple[str, str]) -> Receipt:
            d = _core.decide_force_release(
                row,
                principal=caller.principal,
                role=caller.role,
                lease_id=lease_id,
                now_ms=tx.now_ms,
            )
            return self._receipt_of(tx, d, "force_release", resource)

        return self._by_proof(caller, lease_id, fn)

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo:
        """What any principal of the org may see about a resource (holder details only for
        the holder itself)."""
        with self._read() as (s, now):
            row = s.execute(
                select(LeaseRow)
                .where(
                    col(LeaseRow.org_id) == caller.org,
                    col(LeaseRow.resource_type) == resource_type,
                    col(LeaseRow.resource_id) == resource_id,
                )
                .order_by(col(LeaseRow.epoch).desc())
                .limit(1)
            ).scalar_one_or_none()
            return _info(caller, resource_type, resource_id, row, now)

    def get(self, caller: Caller, lease_id: str) -> Lease:
        """The lease generation ``lease_id`` as its owner sees it.

        Raises:
            NotFoundError: unknown, another org's, or another principal's lease (unless the
                caller is ``owner``/``admin``).
        """
        with self._read() as (s, _now):
            row = self._row_by_id(s, caller.org, lease_id)
            if row is None or (row.owner != caller.principal and caller.role == "agent"):
                raise NotFoundError(f"lease {lease_id} not found")
            return holding_to_lease(row_to_holding(row))

    def list_leases(
        self,
        caller: Caller,
        *,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: int = 100,
    ) -> list[Lease]:
        """Leases of the org: the caller's own by default; ``owner``/``admin`` roles may list
        anyone's (``owner="*"`` for all). Effective ones only unless ``include_ended``."""
        who = caller.principal if owner is None else owner
        if who != caller.principal and caller.role == "agent":
            raise ForbiddenError("listing another principal's leases needs the owner or admin role")
        with self._read() as (s, now):
            q = select(LeaseRow).where(col(LeaseRow.org_id) == caller.org)
            if who != "*":
                q = q.where(col(LeaseRow.owner) == who)
            if resource_type is not None:
                q = q.where(col(LeaseRow.resource_type) == resource_type)
            if not include_ended:
                q = q.where(col(LeaseRow.status) == "active", col(LeaseRow.expires_at_ms) > now)
            q = q.order_by(col(LeaseRow.acquired_at_ms).desc()).limit(max(1, min(limit, 10_000)))
            return [holding_to_lease(row_to_holding(r)) for r in s.execute(q).scalars()]

    # ------------------------------------------------------------------ fences

    def _check_fence(self, tx: Tx, fence: Fence | None) -> Holding | None:
        if fence is None:
            return None
        if fence.check is not None:
            held, now_ms = fence.check()
            return _core.check_fence(
                held,
                lease_id=fence.lease_id,
                epoch=fence.epoch,
                now_ms=now_ms,
                principal=tx.caller.principal,
            )
        row = self._row_by_id(tx.session, tx.caller.org, fence.lease_id)
        return _core.check_fence(
            row_to_holding(row) if row else None,
            lease_id=fence.lease_id,
            epoch=fence.epoch,
            now_ms=tx.now_ms,
            principal=tx.caller.principal,
        )

    def _fence_locks(self, caller: Caller, fence: Fence | None) -> list[str]:
        if fence is None:
            return []
        if fence.resource is not None:
            return [f"res:{caller.org}:{resource_key(*fence.resource)}"]
        located = self._resource_of(caller, fence.lease_id)
        if located is None:
            return []
        return [f"res:{caller.org}:{resource_key(located[0], located[1])}"]

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_save(
        self,
        caller: Caller,
        subject_id: str,
        kind: str,
        state: dict[str, Any],
        *,
        state_text: str,
        state_hash: str,
        expected_version: int | None,
        fence: Fence | None,
        idempotency_key: str | None,
        ttl_ms: int | None,
    ) -> Checkpoint:
        """Upsert the checkpoint of ``(org, subject, caller, kind)``; CAS with
        ``expected_version``; fenced by a lease when ``fence`` is given."""
        scope = f"{len(subject_id)}:{subject_id}:{kind}"
        digest = _core.request_digest(
            "checkpoint.save",
            {
                "state_hash": state_hash,
                "expected_version": expected_version,
                "fence": [fence.lease_id, fence.epoch] if fence else None,
                "ttl_ms": ttl_ms,
            },
        )

        def op(tx: Tx) -> Checkpoint:
            stored = self._receipt(tx, "checkpoint.save", idempotency_key, scope, digest)
            if stored is not None:
                return Checkpoint.model_validate({**stored, "replayed": True})
            self._check_fence(tx, fence)
            s = tx.session
            row = s.execute(
                select(CheckpointRow).where(
                    col(CheckpointRow.org_id) == caller.org,
                    col(CheckpointRow.subject_id) == subject_id,
                    col(CheckpointRow.principal) == caller.principal,
                    col(CheckpointRow.kind) == kind,
                )
            ).scalar_one_or_none()
            current = row.version if row is not None else 0
            expired = (
                row is not None and row.expires_at_ms is not None and row.expires_at_ms <= tx.now_ms
            )
            # An expired checkpoint reads as absent, so a CAS against it expects version 0;
            # versions still continue from the old row so history keeps every one.
            _core.check_checkpoint_version(0 if expired else current, expected_version)
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
            model = _checkpoint_model(row)
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
            self._store_receipt(
                tx, "checkpoint.save", idempotency_key, scope, digest, model.model_dump(mode="json")
            )
            return model

        locks = [f"ckpt:{caller.org}:{scope}", *self._fence_locks(caller, fence)]
        return self._write(caller, locks, op)

    def checkpoint_get(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> Checkpoint | None:
        """The current checkpoint of ``(subject, principal or caller, kind)``, or ``None``
        when there is none or its TTL has passed."""
        with self._read() as (s, now):
            row = s.execute(
                select(CheckpointRow).where(
                    col(CheckpointRow.org_id) == caller.org,
                    col(CheckpointRow.subject_id) == subject_id,
                    col(CheckpointRow.principal) == (principal or caller.principal),
                    col(CheckpointRow.kind) == kind,
                )
            ).scalar_one_or_none()
            if row is None or (row.expires_at_ms is not None and row.expires_at_ms <= now):
                return None
            return _checkpoint_model(row)

    def checkpoint_get_by_id(self, caller: Caller, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id. Checkpoints are readable by every principal of their org (a
        handoff's recipient reads the one attached to it; a reviewer traces an outcome to its
        linked checkpoint); only the writer can change one.

        Raises:
            NotFoundError: unknown, expired, or another org's.
        """
        with self._read() as (s, now):
            row = s.get(CheckpointRow, checkpoint_id)
            if row is None or row.org_id != caller.org:
                raise NotFoundError(f"checkpoint {checkpoint_id} not found")
            if row.expires_at_ms is not None and row.expires_at_ms <= now:
                raise NotFoundError(f"checkpoint {checkpoint_id} has expired")
            return _checkpoint_model(row)

    def checkpoint_history(
        self, caller: Caller, subject_id: str, kind: str, principal: str | None = None
    ) -> list[Checkpoint]:
        """Every version of a checkpoint, oldest first (empty when there is none)."""
        with self._read() as (s, _now):
            row = s.execute(
                select(CheckpointRow).where(
                    col(CheckpointRow.org_id) == caller.org,
                    col(CheckpointRow.subject_id) == subject_id,
                    col(CheckpointRow.principal) == (principal or caller.principal),
                    col(CheckpointRow.kind) == kind,
                )
            ).scalar_one_or_none()
            if row is None:
                return []
            versions = s.execute(
                select(CheckpointVersion)
                .where(col(CheckpointVersion.checkpoint_id) == row.checkpoint_id)
                .order_by(col(CheckpointVersion.version))
            ).scalars()
            out = []
            for v in versions:
                saved = from_ms(v.saved_at_ms)
                created = from_ms(row.created_at_ms)
                assert saved is not None and created is not None
                out.append(
                    Checkpoint(
                        checkpoint_id=row.checkpoint_id,
                        subject_id=row.subject_id,
                        kind=row.kind,
                        principal=row.principal,
                        version=v.version,
                        state=json.loads(v.state),
                        state_hash=v.state_hash,
                        created_at=created,
                        updated_at=saved,
                    )
                )
            return out

    # ------------------------------------------------------------------ handoffs

    def handoff_create(
        self,
        caller: Caller,
        to_principal: str,
        subject_id: str,
        *,
        checkpoint_id: str | None,
        context_id: str | None,
        message: str | None,
        lease: Proof | None,
        expires_in_ms: int | None,
        idempotency_key: str | None,
    ) -> Handoff:
        """Create a pending handoff (see :meth:`prefect_baton.Baton.handoffs`)."""
        digest = _core.request_digest(
            "handoff.create",
            {
                "to": to_principal,
                "subject": subject_id,
                "checkpoint_id": checkpoint_id,
                "context_id": context_id,
                "message": message,
                "lease_id": lease.lease_id if lease else None,
                "expires_in_ms": expires_in_ms,
            },
        )

        def op(tx: Tx) -> Handoff:
            stored = self._receipt(tx, "handoff.create", idempotency_key, "", digest)
            if stored is not None:
                return Handoff.model_validate({**stored, "replayed": True})
            s = tx.session
            if to_principal == caller.principal:
                raise ValidationError("a handoff must name another principal")
            if checkpoint_id is not None:
                ck = s.get(CheckpointRow, checkpoint_id)
                if ck is None or ck.org_id != caller.org:
                    raise NotFoundError(f"checkpoint {checkpoint_id} not found")
            if lease is not None:
                row = self._row_by_id(s, caller.org, lease.lease_id)
                held = _core._check_proof(row_to_holding(row) if row else None, lease)
                if not held.effective(tx.now_ms):
                    raise LeaseLostError(f"lease {lease.lease_id} is no longer held")
            self._insert_ignore(
                s,
                Principal,
                {
                    "org_id": caller.org,
                    "name": to_principal,
                    "role": "agent",
                    "created_at_ms": tx.now_ms,
                },
            )
            row_h = HandoffRow(
                handoff_id=new_id("hoff"),
                org_id=caller.org,
                from_principal=caller.principal,
                to_principal=to_principal,
                subject_id=subject_id,
                checkpoint_id=checkpoint_id,
                context_id=context_id,
                message=message,
                lease_id=lease.lease_id if lease else None,
                status="pending",
                created_at_ms=tx.now_ms,
                expires_at_ms=tx.now_ms + expires_in_ms if expires_in_ms else None,
            )
            s.add(row_h)
            s.flush()
            model = _handoff_model(row_h, tx.now_ms)
            tx.emit("handoff.created", subject_id, _handoff_payload(row_h))
            self._store_receipt(
                tx, "handoff.create", idempotency_key, "", digest, model.model_dump(mode="json")
            )
            return model

        return self._write(caller, [], op)

    def handoff_inbox(self, caller: Caller, *, limit: int = 100) -> list[Handoff]:
        """Pending, unexpired handoffs addressed to the caller, oldest first."""
        with self._read() as (s, now):
            rows = s.execute(
                select(HandoffRow)
                .where(
                    col(HandoffRow.org_id) == caller.org,
                    col(HandoffRow.to_principal) == caller.principal,
                    col(HandoffRow.status) == "pending",
                    or_(
                        col(HandoffRow.expires_at_ms).is_(None), col(HandoffRow.expires_at_ms) > now
                    ),
                )
                .order_by(col(HandoffRow.created_at_ms))
                .limit(max(1, min(limit, 10_000)))
            ).scalars()
            return [_handoff_model(r, now) for r in rows]

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
                or (
                    caller.principal not in (row.from_principal, row.to_principal)
                    and caller.role == "agent"
                )
            ):
                raise NotFoundError(f"handoff {handoff_id} not found")
            lease = None
            if row.accepted_lease_id:
                lrow = s.get(LeaseRow, row.accepted_lease_id)
                if lrow is not None and lrow.owner == caller.principal:
                    lease = holding_to_lease(row_to_holding(lrow))
            return _handoff_model(row, now, lease)

    def handoff_resolve(
        self,
        caller: Caller,
        handoff_id: str,
        status: str,
        *,
        note: str | None,
        execution_key: str | None,
        ttl_ms: int | None,
    ) -> Handoff:
        """Resolve a pending handoff addressed to the caller as ``accepted`` or ``rejected``.

        Accepting a handoff that carries a lease transfers the lease to the caller under
        ``execution_key`` (default ``handoff:<id>``) in the same transaction.
        """
        located: tuple[str, str, bool] | None = None
        with self._read() as (s, _now):
            h = s.get(HandoffRow, handoff_id)
            if h is not None and h.org_id == caller.org and h.lease_id and status == "accepted":
                located = self._resource_of(caller, h.lease_id)

        def op(tx: Tx) -> Handoff:
            s = tx.session
            row = s.get(HandoffRow, handoff_id)
            if row is None or row.org_id != caller.org or row.status != "pending":
                raise NotFoundError(f"pending handoff {handoff_id} not found")
            if row.expires_at_ms is not None and row.expires_at_ms <= tx.now_ms:
                raise NotFoundError(f"handoff {handoff_id} has expired")
            if row.to_principal != caller.principal:
                raise ForbiddenError("only the target principal can resolve a handoff")
            lease: Lease | None = None
            if status == "accepted" and row.lease_id:
                lrow = self._row_by_id(s, caller.org, row.lease_id)
                held = row_to_holding(lrow) if lrow else None
                if held is None:
                    raise NotFoundError(f"lease {row.lease_id} not found")
                proof = Proof(held.lease_id, row.from_principal, held.execution_key)
                lease = self._transfer_in_tx(
                    tx,
                    held,
                    (held.resource_type, held.resource_id),
                    proof,
                    to_principal=caller.principal,
                    new_execution_key=execution_key or f"handoff:{handoff_id}",
                    ttl_ms=ttl_ms or held.ttl_ms,
                    expected_version=None,
                )
                row.accepted_lease_id = lease.lease_id
            row.status = status
            row.note = note
            row.resolved_at_ms = tx.now_ms
            s.add(row)
            s.flush()
            payload = _handoff_payload(row)
            if lease is not None:
                payload["accepted_lease_id"] = lease.lease_id
                payload["epoch"] = lease.epoch
            tx.emit(f"handoff.{status}", row.subject_id, payload)
            return _handoff_model(row, tx.now_ms, lease)

        locks = [f"hoff:{handoff_id}"]
        if located is not None:
            locks += self._lease_locks(caller, located[0], located[1], located[2])
        return self._write(caller, locks, op)

    # ------------------------------------------------------------------ outcomes

    def outcome_record(
        self,
        caller: Caller,
        subject_id: str,
        status: str,
        *,
        evidence: Sequence[Evidence],
        fence: Fence | None,
        lease_id: str | None,
        handoff_id: str | None,
        checkpoint_id: str | None,
        idempotency_key: str | None,
    ) -> Outcome:
        """Record an outcome with evidence; fenced by a lease when ``fence`` is given."""
        ev = [e.model_dump() for e in evidence]
        digest = _core.request_digest(
            "outcome.record",
            {
                "status": status,
                "evidence": ev,
                "fence": [fence.lease_id, fence.epoch] if fence else None,
                "lease_id": lease_id,
                "handoff_id": handoff_id,
                "checkpoint_id": checkpoint_id,
            },
        )
        scope = subject_id

        def op(tx: Tx) -> Outcome:
            stored = self._receipt(tx, "outcome.record", idempotency_key, scope, digest)
            if stored is not None:
                return Outcome.model_validate({**stored, "replayed": True})
            held = self._check_fence(tx, fence)
            s = tx.session
            for kind_, ref, model_ in (
                ("handoff", handoff_id, HandoffRow),
                ("checkpoint", checkpoint_id, CheckpointRow),
                ("lease", lease_id, LeaseRow),
            ):
                if ref is not None:
                    obj: Any = s.get(model_, ref)
                    if obj is None or obj.org_id != caller.org:
                        raise NotFoundError(f"{kind_} {ref} not found")
            row = OutcomeRow(
                outcome_id=new_id("out"),
                org_id=caller.org,
                subject_id=subject_id,
                principal=caller.principal,
                status=status,
                evidence=json.dumps(ev),
                lease_id=lease_id or (fence.lease_id if fence else None),
                handoff_id=handoff_id,
                checkpoint_id=checkpoint_id,
                fence_epoch=held.epoch if held else None,
                recorded_at_ms=tx.now_ms,
            )
            s.add(row)
            s.flush()
            model = _outcome_model(row)
            tx.emit(
                "outcome.recorded",
                subject_id,
                {"outcome_id": row.outcome_id, "status": status, "evidence_count": len(ev)},
            )
            self._store_receipt(
                tx, "outcome.record", idempotency_key, scope, digest, model.model_dump(mode="json")
            )
            return model

        return self._write(caller, self._fence_locks(caller, fence), op)

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
            return [_outcome_model(r) for r in s.execute(q).scalars()]

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

    def lease_history(self, org: str) -> tuple[list[Holding], list[LeaseTransition]]:
        """Every lease generation and transition of ``org`` (for the audit)."""
        with self._read() as (s, _now):
            rows = [
                row_to_holding(r)
                for r in s.execute(
                    select(LeaseRow)
                    .where(col(LeaseRow.org_id) == org)
                    .order_by(
                        LeaseRow.resource_type, col(LeaseRow.resource_id), col(LeaseRow.epoch)
                    )
                ).scalars()
            ]
            transitions = list(
                s.execute(
                    select(LeaseTransition)
                    .where(col(LeaseTransition.org_id) == org)
                    .order_by(col(LeaseTransition.seq))
                ).scalars()
            )
            return rows, transitions


def _subject(resource: tuple[str, str]) -> str:
    return f"{resource[0]}/{resource[1]}"


def _lease_payload(h: Holding, resource: tuple[str, str]) -> dict[str, Any]:
    return {
        "lease_id": h.lease_id,
        "resource_type": resource[0],
        "resource_id": resource[1],
        "owner": h.owner,
        "version": h.version,
        "epoch": h.epoch,
        "expires_at_ms": h.expires_at_ms,
    }


def _handoff_payload(row: HandoffRow) -> dict[str, Any]:
    return {
        "handoff_id": row.handoff_id,
        "from_principal": row.from_principal,
        "to_principal": row.to_principal,
        "checkpoint_id": row.checkpoint_id,
        "lease_id": row.lease_id,
    }


def _info(caller: Caller, rtype: str, rid: str, row: LeaseRow | None, now: int) -> LeaseInfo:
    if row is None:
        return LeaseInfo(resource_type=rtype, resource_id=rid, held=False, version=0, epoch=0)
    h = row_to_holding(row)
    held = h.effective(now)
    mine = held and h.owner == caller.principal
    return LeaseInfo(
        resource_type=rtype,
        resource_id=rid,
        held=held,
        version=h.version,
        epoch=h.epoch,
        expires_at=from_ms(h.expires_at_ms) if held else None,
        lease=holding_to_lease(h) if mine else None,
    )
