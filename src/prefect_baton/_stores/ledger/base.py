"""The ledger store's plumbing: transactions, locks, receipts, the outbox.

The ledger store applies the core's decisions to the SQL ledger, one transaction each.

Every mutation runs in one database transaction that (1) takes its locks up front (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: transaction advisory locks on the resource, on the org's
write scopes when scopes are involved, and on the org's event stream just before the outbox
insert, so event sequence numbers are handed out in commit order), (2) reads the database
clock (or the clock the store was given), (3) checks the idempotency receipt, (4) decides
with :mod:`prefect_baton._rules.core`, (5) writes the rows, the transition history, the
events and the receipt, and commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from pydantic import BaseModel
from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlmodel import Session, col

from prefect_baton._rules import core as _core
from prefect_baton._rules.digests import mismatch
from prefect_baton._rules.events import event_lease_id
from prefect_baton._rules.scopes import ScopeCheckBudget
from prefect_baton._stores.ledger.authority import (
    INCARNATION_OP,
    RETURNED_KEY,
    SHARED_LOCK_PREFIX,
    STATE_KEY,
    SYSTEM_PRINCIPAL,
    authority_lock,
    redis_authority_sql,
    redis_decides_error,
)
from prefect_baton._stores.ledger.convert import new_id
from prefect_baton._stores.ledger.engine import (
    SQLITE_BUSY_TIMEOUT_MS,
    Engines,
    ledger_failure,
    make_engines,
    make_memory_engines,
    upgrade,
    write_turn_timed_out,
)
from prefect_baton._stores.ledger.receipts import (
    RECEIPT_DELETE,
    RECEIPT_INSERT,
    RECEIPT_SELECT,
    receipt_key,
)
from prefect_baton._stores.ledger.statements import Statements
from prefect_baton._stores.ledger.tables import (
    EventRow,
    Organization,
    Principal,
    ReceiptRow,
)
from prefect_baton._stores.protocol import Caller
from prefect_baton.errors import (
    BatonError,
    UnavailableError,
)

#: The outbox insert of :meth:`StoreBase._flush_events` (``?`` placeholders).
_INSERT_EVENT = (
    f"INSERT INTO {EventRow.__tablename__} (event_id, org_id, kind, principal, subject, "
    "payload, occurred_at_ms, lease_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
#: A statement's prefix that first takes the transaction advisory lock of its first
#: parameter (PostgreSQL); the statement reads ``FROM locked``.
_LOCKED = "WITH locked AS (SELECT pg_advisory_xact_lock(hashtextextended(?, 0))) "
#: Whether Redis decides the organization's leases (``authority.py``).
_REDIS_AUTHORITY = redis_authority_sql()


#: The outbox insert behind the org's event lock (PostgreSQL): sequence numbers are handed
#: out in commit order.
_LOCKED_INSERT_EVENT = (
    f"{_LOCKED}INSERT INTO {EventRow.__tablename__} (event_id, org_id, kind, principal, "
    "subject, payload, occurred_at_ms, lease_id) SELECT ?, ?, ?, ?, ?, ?, ?, ? FROM locked"
)
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
MAX_ATTEMPTS = 8
DEFAULT_RECEIPT_RETENTION_SECONDS = 24 * 3600
PRUNE_EVERY_WRITES = 500  # every this many writes, also delete expired receipts ...
PRUNE_BATCH = 1000  # ... at most this many at a time


def _lock_sql(key: str) -> tuple[str, str]:
    """The PostgreSQL function that takes lock ``key`` and the key to hash: shared
    (``pg_advisory_xact_lock_shared``) for a key with :data:`SHARED_LOCK_PREFIX`, which is
    removed, else exclusive (``pg_advisory_xact_lock``)."""
    if key.startswith(SHARED_LOCK_PREFIX):
        return "pg_advisory_xact_lock_shared", key[len(SHARED_LOCK_PREFIX) :]
    return "pg_advisory_xact_lock", key


@dataclass
class Tx:
    """One open write transaction: the session, the store's clock, pending events."""

    session: Session
    now_ms: int
    caller: Caller
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    registered: tuple[str, str, str] | None = None
    #: Lease ids made in this transaction (:meth:`new_lease_id`): they have no row yet.
    new_lease_ids: set[str] = field(default_factory=set)
    #: Lease ids whose row this transaction read: they have one.
    stored_lease_ids: set[str] = field(default_factory=set)
    #: Events to record in a transaction of their own when this one fails with a
    #: :class:`BatonError` (a refused fenced write's ``fence.rejected``).
    on_refusal: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: What to run, each in transactions of its own, when this one fails with a
    #: :class:`BatonError`, after :attr:`on_refusal` (a fenced write refused past the deadline
    #: of a handoff carrying its lease ends that handoff, ``FenceOps._check_fence``).
    after_refusal: list[Callable[[], object]] = field(default_factory=list)
    #: The ledger may decide the org's leases (checked in this transaction, under the
    #: lock: :meth:`StoreBase._check_ledger_authority`), and the epoch floor of its grants.
    authority_checked: bool = False
    epoch_floor: int = 0
    #: The steps this transaction's write-scope comparisons may spend, all decisions of it
    #: together (every resource of ``acquire_many``), as one call of the Redis scripts.
    scope_steps: ScopeCheckBudget = field(default_factory=ScopeCheckBudget)

    def emit(self, kind: str, subject: str, payload: dict[str, Any]) -> None:
        self.events.append((kind, subject, payload))

    def new_lease_id(self) -> str:
        """A fresh lease id for a decision of this transaction (no row has it yet)."""
        lease_id = new_id("lease")
        self.new_lease_ids.add(lease_id)
        return lease_id


class StoreBase(Statements):
    """The plumbing under :class:`~prefect_baton._stores.ledger.store.LedgerStore` (the
    transaction loop, locks, receipts, the outbox); the constructor's arguments and errors
    are documented there."""

    def __init__(
        self,
        url: str,
        *,
        receipt_retention_seconds: int = DEFAULT_RECEIPT_RETENTION_SECONDS,
        state_max_bytes: int = _core.DEFAULT_STATE_MAX_BYTES,
        migrate: bool = True,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._setup(
            make_engines(url),
            receipt_retention_seconds=receipt_retention_seconds,
            state_max_bytes=state_max_bytes,
            migrate=migrate,
            clock=clock,
        )

    @classmethod
    def in_memory(
        cls,
        *,
        clock: Callable[[], int] | None = None,
        receipt_retention_seconds: int = DEFAULT_RECEIPT_RETENTION_SECONDS,
        state_max_bytes: int = _core.DEFAULT_STATE_MAX_BYTES,
    ) -> Self:
        """A store on a new, private in-memory SQLite database, migrated to the newest
        schema; every thread of this process sees it, no other process does, and
        :meth:`close` frees it (see
        :func:`~prefect_baton._stores.ledger.engine.make_memory_engines`).

        Args:
            clock: as for the constructor (default: the database clock, i.e. the
                system's wall clock).
            receipt_retention_seconds: how long idempotency receipts are kept (default 24 h).
            state_max_bytes: the checkpoint state cap in bytes (default 1 MiB).
        """
        engines = make_memory_engines()
        store = cls.__new__(cls)
        try:
            store._setup(
                engines,
                receipt_retention_seconds=receipt_retention_seconds,
                state_max_bytes=state_max_bytes,
                migrate=True,
                clock=clock,
            )
        except BaseException:
            engines.dispose()
            raise
        return store

    def _setup(
        self,
        engines: Engines,
        *,
        receipt_retention_seconds: int,
        state_max_bytes: int,
        migrate: bool,
        clock: Callable[[], int] | None,
    ) -> None:
        self.engines = engines
        self.url = self.engines.url
        self.receipt_retention_ms = receipt_retention_seconds * 1000
        self.state_max_bytes = state_max_bytes
        self.clock = clock
        self._registered: set[tuple[str, str, str]] = set()
        #: Where leases are, by (org, lease id): see ``LeaseOps._locate``.
        self._located: dict[tuple[str, str], tuple[str, str, bool]] = {}
        self._writes = 0
        self._now_sql = text(self.engines.now_sql())
        self._listen()
        if migrate:
            upgrade(self.engines)

    def close(self) -> None:
        """Dispose of the connection pools."""
        self.engines.dispose()

    # ------------------------------------------------------------------ plumbing

    def _lock(self, session: Session, key: str) -> None:
        """Take the transaction advisory lock ``key`` (PostgreSQL; shared for a key with
        :data:`SHARED_LOCK_PREFIX`); nothing on SQLite (``BEGIN IMMEDIATE`` locked it all)."""
        if not self.engines.is_sqlite:
            fn, key = _lock_sql(key)
            self._sql(session, f"SELECT {fn}(hashtextextended(?, 0))", (key,))

    def _refuse_unless_ledger_decides(self, session: Session, org: str) -> list[Any]:
        """Refuse, in ``session``, to act as the lease authority of ``org`` (``str``), or to
        answer for it, when Redis decides its leases (a client with a Redis URL has used the
        org and it was not handed back: :mod:`prefect_baton._stores.ledger.authority`): the
        one place that decides it, for lease decisions and lease reads alike.

        Returns:
            The org's incarnation counter rows ``(idem_key, response)`` (``list``): none,
            or the one of an org handed back to the ledger.

        Raises:
            ForbiddenError: Redis decides the org's leases (the message names the remedy).
        """
        args = (org, SYSTEM_PRINCIPAL, INCARNATION_OP, STATE_KEY, RETURNED_KEY)
        rows = list(self._sql(session, _REDIS_AUTHORITY, args).fetchall())
        if any(key == STATE_KEY for key, _response in rows):
            raise redis_decides_error(org)
        return rows

    def check_ledger_decides(self, org: str) -> None:
        """Refuse to act as the lease authority of ``org`` (``str``) when Redis decides its
        leases (:meth:`_refuse_unless_ledger_decides`). A read of the ledger, no lock; the
        lease decisions themselves check in their own transaction.

        Raises:
            ForbiddenError: Redis decides the org's leases (the message names the remedy).
            UnavailableError: the ledger cannot be reached.
        """
        with self._read() as (session, _now_ms):
            self._refuse_unless_ledger_decides(session, org)

    def _check_ledger_authority(self, tx: Tx, *, lock: bool = False) -> None:
        """Refuse a lease decision of ``tx``'s org applied on the ledger while Redis
        decides its leases (:meth:`_refuse_unless_ledger_decides`), once per
        transaction; note the epoch floor of the ledger's grants in an org handed back
        (``tx.epoch_floor``: the last Redis incarnation's ceiling). Read in the decision's
        own transaction, under the shared lock of the org's incarnation counter: taken by
        :meth:`_write` with ``authority``, or here with ``lock`` (after the transaction's
        other locks, as every transaction orders them).

        Raises:
            ForbiddenError: Redis decides the org's leases.
        """
        if tx.authority_checked:
            return
        org = tx.caller.org
        if lock:
            self._lock(tx.session, SHARED_LOCK_PREFIX + authority_lock(org))
        for _key, response in self._refuse_unless_ledger_decides(tx.session, org):
            tx.epoch_floor = _core.incarnation_epochs(int(json.loads(response)["n"]))[1]
        tx.authority_checked = True

    def _connection_lost(self) -> None:
        """A pooled database connection was found closed (e.g. the server restarted):
        forget every pooled connection, so the next checkout connects anew."""
        for engine in {self.engines.write, self.engines.read}:
            engine.dispose()

    def _lock_all_then_now(self, session: Session, keys: list[str]) -> int:
        """Take the locks ``keys`` in their order, then read the store's clock (epoch ms).
        On PostgreSQL the locks and the clock are one statement (one round trip), its
        target list taking the locks left to right and the clock read once they are held."""
        if self.engines.is_sqlite:  # BEGIN IMMEDIATE locked the database
            keys = []
        if not keys:
            if self.clock is not None:
                return int(self.clock())
            return int(self._sql(session, self._now_sql.text).fetchone()[0])
        locks = [_lock_sql(key) for key in keys]
        taken = ", ".join(f"{fn}(hashtextextended(?, 0))" for fn, _key in locks)
        read = "SELECT 0" if self.clock is not None else self._now_sql.text
        row = self._sql(
            session,
            f"WITH locked AS (SELECT {taken}) {read} FROM locked",
            tuple(key for _fn, key in locks),
        ).fetchone()
        return int(self.clock()) if self.clock is not None else int(row[0])

    def _write(
        self,
        caller: Caller,
        locks: Sequence[str] | Callable[[Session], Sequence[str]],
        fn: Callable[[Tx], T],
        *,
        statement_timeout_ms: int | None = None,
        register: bool = True,
        authority: bool = False,
    ) -> T:
        """Run ``fn`` in a write transaction, retrying on serialization/unique races.

        ``locks``: the lock keys taken up front, or a function of the session that returns
        them, run first in the transaction (it may raise a :class:`BatonError`, which rolls
        the transaction back).

        ``statement_timeout_ms`` (PostgreSQL): every statement of the transaction, lock
        waits included, is cancelled after this many milliseconds (``UnavailableError``).

        ``register``: first register the caller's org and principal (:meth:`_register`) in
        a transaction of its own when this store has not yet done so.

        ``authority``: ``fn`` decides lease transitions on the ledger's own lease rows (the
        ledger is the lease authority): checked up front, the org's authority lock taken
        with the others (:meth:`_check_ledger_authority`; ``LeaseOps._apply`` checks any
        other decision itself).

        Raises:
            ForbiddenError: with ``authority``, Redis decides the org's leases.
            UnavailableError: the database is unreachable, or stayed locked.
        """
        if register and (caller.org, caller.principal, caller.role) not in self._registered:
            # in a transaction of its own, before any lock: a first write that inserted its
            # principal row and then waited for a lock taken in the body (the scope lock of
            # a supersede) could deadlock with another process registering the same principal
            self._write(caller, [], self._register, register=False)
        last: Exception | None = None
        reconnected = False
        locked_deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
        for _attempt in range(MAX_ATTEMPTS):
            committing = False
            tx: Tx | None = None
            try:
                with Session(self.engines.write, expire_on_commit=False) as session:
                    with session.begin():
                        if statement_timeout_ms is not None and not self.engines.is_sqlite:
                            session.execute(
                                text(f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}")
                            )
                        keys = sorted(set(locks(session) if callable(locks) else locks))
                        if authority:  # last: every transaction takes its locks in order
                            keys.append(SHARED_LOCK_PREFIX + authority_lock(caller.org))
                        now_ms = self._lock_all_then_now(session, keys)
                        tx = Tx(session=session, now_ms=now_ms, caller=caller)
                        if authority:
                            self._check_ledger_authority(tx)
                        result = fn(tx)
                        self._flush_events(tx)
                        self._writes += 1
                        if self._writes % PRUNE_EVERY_WRITES == 0:
                            self._prune(session, now_ms)
                        if not self.engines.is_sqlite:
                            self._send_deferred(self._dbapi(session))
                        committing = True
                    if tx.registered is not None:
                        self._registered.add(tx.registered)
                    return result
            except BatonError:
                if tx is not None:
                    self._after_refusal(caller, tx)
                raise
            except IntegrityError as exc:
                last = exc
                continue
            except OperationalError as exc:
                last = exc
                if self.engines.is_sqlite and "locked" in str(exc.orig).lower():
                    # SQLITE_BUSY at once (no busy handler, e.g. a WAL snapshot race) is
                    # retried; a lock another process held for the whole busy timeout is
                    # not waited for again: the write then waited as long as its threads
                    # waiting for the connection do (write_turn_timed_out)
                    if time.monotonic() < locked_deadline:
                        continue
                    raise UnavailableError(
                        f"ledger database stayed locked for {SQLITE_BUSY_TIMEOUT_MS / 1000:g} "
                        f"s by another writer: {exc.orig}; retry"
                    ) from exc
                if exc.connection_invalidated and not committing and not reconnected:
                    # a pooled connection found closed before COMMIT was sent: nothing of
                    # this transaction was committed, so it runs once more on a new one
                    reconnected = True
                    self._connection_lost()
                    continue
                raise ledger_failure(self.engines, exc) from exc
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) in ("40001", "40P01"):
                    last = exc
                    continue
                raise
            except PoolTimeoutError as exc:
                raise write_turn_timed_out() from exc
        raise UnavailableError(f"ledger write did not settle after {MAX_ATTEMPTS} tries: {last}")

    def _after_refusal(self, caller: Caller, refused: Tx) -> None:
        """After write transaction ``refused`` failed with a :class:`BatonError` (and rolled
        back): record its :attr:`Tx.on_refusal` events in a transaction of their own, then
        run its :attr:`Tx.after_refusal`. Best effort: the refusal is what the caller gets,
        so a failure of either is dropped."""

        def op(tx: Tx) -> None:
            for kind, subject, payload in refused.on_refusal:
                tx.emit(kind, subject, payload)

        steps = [lambda: self._write(caller, [], op)] if refused.on_refusal else []
        for step in (*steps, *refused.after_refusal):
            try:
                step()
            except BatonError:
                pass

    @contextmanager
    def _read(self) -> Iterator[tuple[Session, int]]:
        """A read transaction and the store's clock (epoch ms). A pooled connection found
        closed by the clock read (the first statement; with the store's own ``clock``, by
        a ``SELECT 1`` on PostgreSQL) is replaced once."""
        for attempt in (1, 2):
            started = False
            try:
                with (
                    Session(self.engines.read, expire_on_commit=False) as session,
                    session.begin(),
                ):
                    if self.clock is None:
                        now_ms = int(self._sql(session, self._now_sql.text).fetchone()[0])
                    else:
                        if not self.engines.is_sqlite:
                            self._sql(session, "SELECT 1")
                        now_ms = int(self.clock())
                    started = True
                    yield session, now_ms
                return
            except OperationalError as exc:
                if started or not exc.connection_invalidated or attempt == 2:
                    raise ledger_failure(self.engines, exc) from exc
                self._connection_lost()

    @property
    def receipt_ledger(self) -> StoreBase:
        """The ledger keeping this store's idempotency receipts: itself."""
        return self

    def now_ms(self) -> int:
        """The store's clock (the database's, or ``clock``) in epoch milliseconds."""
        with self._read() as (_s, now):
            return now

    def _insert_ignore(self, session: Session, model: type[Any], values: dict[str, Any]) -> None:
        ins = sqlite_insert if self.engines.is_sqlite else pg_insert
        stmt = ins(model).values(**values).on_conflict_do_nothing()
        session.execute(stmt)

    def _register(self, tx: Tx) -> None:
        """Register the caller's org and principal (and its role) in transaction ``tx``, run
        by :meth:`_write` before the caller's first write; remembered once it commits."""
        c = tx.caller
        key = (c.org, c.principal, c.role)
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
        org, principal = tx.caller.org, tx.caller.principal
        # PostgreSQL: each insert takes the org's event lock first (one statement)
        lock = () if self.engines.is_sqlite else (f"events:{org}",)
        statement = _INSERT_EVENT if self.engines.is_sqlite else _LOCKED_INSERT_EVENT
        for kind, subject, payload in tx.events:
            self._defer(
                tx.session,
                statement,
                (
                    *lock,
                    new_id("evt"),
                    org,
                    kind,
                    principal,
                    subject,
                    _core.canonical_json(payload),
                    tx.now_ms,
                    event_lease_id(payload),
                ),
            )

    # ------------------------------------------------------------------ receipts

    def _receipt(
        self, tx: Tx, operation: str, key: str | None, scope: str, digest: str
    ) -> dict[str, Any] | None:
        """Return the stored response for an exact retry, raise on a changed request."""
        if key is None:
            return None
        row = self._sql(
            tx.session, RECEIPT_SELECT, receipt_key(tx.caller, operation, key, scope)
        ).fetchone()
        if row is None:
            return None
        row_id, expires_at_ms, request_digest, response = row
        if expires_at_ms <= tx.now_ms:
            self._defer(tx.session, "DELETE FROM baton_receipts WHERE id = ?", (row_id,))
            return None
        if request_digest != digest:
            raise mismatch(operation, key)
        result: dict[str, Any] = json.loads(response)
        return result

    def _drop_receipt(self, tx: Tx, operation: str, key: str, scope: str) -> None:
        """Delete the receipt of ``(tx.caller, operation, key, scope)`` (one being replaced)."""
        self._defer(tx.session, RECEIPT_DELETE, receipt_key(tx.caller, operation, key, scope))

    def _write_once(
        self,
        caller: Caller,
        locks: Sequence[str],
        operation: str,
        key: str | None,
        scope: str,
        digest: str,
        model: type[M],
        fn: Callable[[Tx], M],
    ) -> M:
        """One write transaction (:meth:`_write`) of an operation whose receipt is kept in
        it: with idempotency key ``key``, an exact retry returns the stored response marked
        ``replayed`` (a changed request, digested as ``digest``, raises
        IdempotencyMismatchError), else ``fn(tx)`` runs and its result is kept as the
        receipt of ``(operation, key, scope)``."""

        def op(tx: Tx) -> M:
            stored = self._receipt(tx, operation, key, scope, digest)
            if stored is not None:
                return model.model_validate({**stored, "replayed": True})
            result = fn(tx)
            self._store_receipt(tx, operation, key, scope, digest, result.model_dump(mode="json"))
            return result

        return self._write(caller, locks, op)

    def _store_receipt(
        self, tx: Tx, operation: str, key: str | None, scope: str, digest: str, response: Any
    ) -> None:
        if key is None:
            return
        expires_at_ms = tx.now_ms + self.receipt_retention_ms
        self._defer(
            tx.session,
            RECEIPT_INSERT,
            (
                *receipt_key(tx.caller, operation, key, scope),
                digest,
                json.dumps(response),
                tx.now_ms,
                expires_at_ms,
            ),
        )

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
