"""The reconciler's ledger writes: journal entries turned into rows, and the bulk SQL.

:class:`LedgerWriter` gathers the rows of a batch of journal entries in journal order
(:meth:`~LedgerWriter._collect` into a :class:`Batch`: each lease's newest state, the
transitions, the events with ids derived from the entry, the acquire receipts, a handoff's
acceptance) and writes them in one transaction (:meth:`~LedgerWriter._flush`): lease rows
as an upsert that only moves towards a newer state, transitions and events as
insert-or-ignore, receipts as an upsert, then the journal cursor. A lease acquired and
released within one batch is one lease row written once (its newest state), with both
transitions and both events.

Statements and round trips of a batch:

* PostgreSQL: each kind of row is one statement (``INSERT ... SELECT FROM unnest`` of one
  binary array per column, ``ORDER BY`` the position so that serial ``seq`` columns
  follow journal order), and all the statements of a batch (lease rows, transitions,
  receipts, cursor, the ``events:<org>`` lock, events) go to the server in one pipeline:
  one round trip. The journal lock and the cursor read are another pipeline of two
  statements (each statement still takes its own snapshot, so the cursor is read after
  the lock is held). In ``copy`` mode (large batches, see :meth:`LedgerWriter._flush`) the
  transitions, the events and the rows of leases created in the batch are written with
  ``COPY`` (in journal order) after that pipeline instead.
* SQLite: each kind is one prepared statement run by ``executemany``.

The org and the actors (principals with their role) are registered in the batch's
transaction the first time this writer sees them, and remembered once that transaction has
committed (:meth:`~LedgerWriter._committed`), as the ledger store registers its callers;
a principal whose role differs from the remembered one is written again.

The authority's own records (the journal cursor and the incarnation counter) are kept in the
receipts table under :data:`SYSTEM_PRINCIPAL`. The drain loop that drives this is
:class:`prefect_baton._stores.redis.reconciler.Reconciler`; the rows and statements are in
:mod:`prefect_baton._stores.redis.ledger_rows`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import col

from prefect_baton._rules.events import (
    event_lease_id,
    lease_events,
    released_by_handoff,
    reports_expiry,
)
from prefect_baton._stores.ledger.authority import STATE_KEY, SYSTEM_PRINCIPAL, system_where
from prefect_baton._stores.ledger.convert import handoff_payload
from prefect_baton._stores.ledger.engine import SQLITE_BUSY_TIMEOUT_MS
from prefect_baton._stores.ledger.leases import ATTEMPT_FIELD
from prefect_baton._stores.ledger.store import LedgerStore, generation_to_lease, resource_key
from prefect_baton._stores.ledger.tables import (
    HandoffRow,
    LeaseTransition,
    ReceiptRow,
)
from prefect_baton._stores.redis.codec import from_gen
from prefect_baton._stores.redis.ledger_rows import (
    CURSOR_SET_SQL,
    CURSOR_SQL,
    EVENT_CONFLICT,
    EVENT_TABLE,
    FOREVER_MS,
    LEASE_CONFLICT,
    LEASE_TABLE,
    LOCK_SQL,
    ORG_SQL,
    PRINCIPAL_TABLE,
    PRINCIPALS,
    RECEIPT_CONFLICT,
    RECEIPT_TABLE,
    TRANSITION_CONFLICT,
    TRANSITION_TABLE,
    Batch,
    BulkTable,
    event_digest,
    event_payload,
    gen_fields,
    lease_row,
)

__all__ = [
    "FAULT_OP",
    "FOREVER_MS",
    "MAX_FAULTS",
    "SYSTEM_PRINCIPAL",
    "Batch",
    "LedgerWriter",
    "journal_lock",
]

log = logging.getLogger("prefect_baton.reconciler")


def journal_lock(org: str) -> str:
    """The lock key of ``org``'s journal (``str``; a PostgreSQL advisory lock): held by a
    drain from before it reads the journal from Redis until its batch is committed, and by
    the incarnation bump of a rebuild (:func:`~prefect_baton._stores.redis.rebuild.
    bump_incarnation`), which therefore waits for a drain in flight to commit."""
    return f"journal:{org}"


JOURNAL_OP = "redis.journal"
"""The receipts-table operation under which an org's journal cursor is kept."""
FAULT_OP = "redis.fault"
"""The receipts-table operation under which an org's journal faults are kept (journal
entries the ledger refused, see :meth:`prefect_baton._stores.redis.reconciler.Reconciler`;
``{"faults": [...]}``, the newest :data:`MAX_FAULTS`); ``baton audit`` reports them."""
MAX_FAULTS = 100

_CREATES = frozenset(("acquire", "takeover", "supersede"))
"""Journal actions whose new generation is a new lease (a new lease id)."""


def _make_canonical() -> Callable[[Any], str]:
    """The same text as :func:`prefect_baton._rules.validation.canonical_json` (sorted keys, no
    spaces, UTF-8, no NaN) from an encoder built once (the C one when there is one)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has it
        return json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode
    enc = make(None, None, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    return lambda value: "".join(enc(value, 0))


_canonical = _make_canonical()

_SQLITE_SQL: dict[str, str] = {}


def _sqlite_sql(sql: str) -> str:
    """``sql`` with SQLite's placeholders (``?`` for ``%s``), converted once per text."""
    return _SQLITE_SQL.get(sql) or _SQLITE_SQL.setdefault(sql, sql.replace("%s", "?"))


class LedgerWriter:
    """The ledger side of a drain: row gathering and bulk writes into ``store``
    (:class:`prefect_baton._stores.ledger.store.LedgerStore`), in a transaction the caller opens."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._sqlite = store.engines.is_sqlite
        self._insert = sqlite_insert if self._sqlite else pg_insert
        # {(org, principal): role} and orgs written by a committed batch of this writer
        self._known_actors: dict[tuple[str, str], str] = {}
        self._known_orgs: set[str] = set()
        #: how long a drain waits for the org's journal lock on PostgreSQL before giving up
        #: (``lock_timeout``; seconds): SQLite's busy timeout, so a drainer stopped while
        #: holding the lock blocks the others for a bounded time on both databases
        self.lock_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_MS / 1000

    def _sqlite_run(self, conn: Connection, sql: str, params: Any, *, many: bool = False) -> Any:
        """Run ``sql`` (``%s`` placeholders) on SQLite with the driver's cursor of ``conn``,
        in its transaction (no statement wrapping: a drain round runs about six of them);
        ``many``: ``params`` is a list of rows for ``executemany``. Returns the cursor.

        Raises:
            sqlalchemy.exc.DBAPIError: the driver's error wrapped as SQLAlchemy wraps it
                (``IntegrityError``, ``OperationalError``, ...).
        """
        dbapi = conn.connection
        cur = dbapi.driver_connection.cursor()  # type: ignore[union-attr]
        sql = _sqlite_sql(sql)
        try:
            if many:
                cur.executemany(sql, params)
            else:
                cur.execute(sql, params)
        except self.store._driver_error as exc:
            raise self.store._wrap(dbapi, cur, sql, params, exc) from exc
        return cur

    def _lock(self, conn: Connection, key: str) -> None:
        """Take the exclusive transaction advisory lock ``key`` (PostgreSQL; on SQLite the
        transaction's ``BEGIN IMMEDIATE`` holds the database)."""
        if not self._sqlite:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": key})

    def _system_row(
        self, conn: Connection, org: str, operation: str, key: str = STATE_KEY
    ) -> dict[str, Any] | None:
        """The authority's own record ``operation`` of ``org`` (under ``key``), or ``None``."""
        raw = conn.execute(
            select(col(ReceiptRow.response)).where(*system_where(org, operation, (key,)))
        ).scalar_one_or_none()
        return None if raw is None else dict(json.loads(raw))

    def _delete_system_row(
        self, conn: Connection, org: str, operation: str, key: str = STATE_KEY
    ) -> None:
        """Delete the authority's record ``operation`` of ``org`` (under ``key``)."""
        conn.execute(delete(ReceiptRow).where(*system_where(org, operation, (key,))))

    def _set_system_row(
        self,
        conn: Connection,
        org: str,
        operation: str,
        value: dict[str, Any],
        now_ms: int,
        key: str = STATE_KEY,
    ) -> None:
        """Write the authority's record ``operation`` of ``org`` (under ``key``)."""
        response = json.dumps(value)
        stmt = self._insert(ReceiptRow).values(
            org_id=org,
            principal=SYSTEM_PRINCIPAL,
            operation=operation,
            idem_key=key,
            scope_key="",
            request_digest="-",
            response=response,
            created_at_ms=now_ms,
            expires_at_ms=FOREVER_MS,
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["org_id", "principal", "operation", "idem_key", "scope_key"],
                set_={"response": response, "expires_at_ms": FOREVER_MS},
            )
        )

    def _lock_and_read_cursor(self, conn: Connection, org: str) -> tuple[str, str] | None:
        """Take the org's journal lock (PostgreSQL: ``journal:<org>`` advisory lock, waiting
        at most :attr:`lock_timeout_seconds`; SQLite: the transaction's ``BEGIN IMMEDIATE``,
        waiting at most the busy timeout) and read the org's journal cursor
        ``(incarnation id, last applied entry id)`` (``None``: nothing applied yet).
        PostgreSQL: one round trip (a pipeline of the lock and the read)."""
        args = (org, SYSTEM_PRINCIPAL, JOURNAL_OP)
        if self._sqlite:
            row = self._sqlite_run(conn, CURSOR_SQL, args).fetchone()
            raw = None if row is None else row[0]
        else:
            pg = conn.connection.driver_connection
            assert pg is not None
            with pg.pipeline(), pg.cursor() as lock, pg.cursor() as cur:
                ms = max(1, int(self.lock_timeout_seconds * 1000))
                lock.execute(f"SET LOCAL lock_timeout = {ms}")
                lock.execute(LOCK_SQL, (journal_lock(org),))
                cur.execute(CURSOR_SQL, args)
                row = cur.fetchone()
            raw = None if row is None else row[0]
        if raw is None:
            return None
        value = json.loads(raw)
        return str(value["inc"]), str(value["id"])

    def _expiry_reported(self, conn: Connection, lease_id: str, version: int) -> bool:
        """Whether ``report_expired`` already recorded ``lease.expired`` for this generation."""
        found = conn.execute(
            select(col(LeaseTransition.seq)).where(
                col(LeaseTransition.lease_id) == lease_id,
                col(LeaseTransition.version) == version,
                col(LeaseTransition.action) == "expired",
            )
        ).first()
        return found is not None

    def _collect(
        self, conn: Connection, org: str, eid: str, p: dict[str, Any], batch: Batch
    ) -> None:
        """Add one journal entry's rows to ``batch`` (in journal order); nothing is written
        yet except what :meth:`_accept_handoff` reads. Generations are handled as their
        17 fields (see :mod:`prefect_baton._stores.redis.codec`)."""
        at = int(p["at"])
        actor = str(p["ac"])
        batch.actors[actor] = str(p["ro"])
        if batch.first_at is None:
            batch.first_at = at
        events: list[tuple[str, str, dict[str, Any]]] = []
        last: list[str] | None = None
        ho = p.get("ho")
        # a release entry with handoff fields: a handoff's end released its carried lease
        # (_rules.handoffs.decide_carried_release); any other entry with them accepts it
        by_handoff = (
            released_by_handoff(str(ho["id"]), str(ho["nt"]))
            if ho and any(it["a"] == "release" for it in p["it"])
            else None
        )
        for item in p["it"]:
            new = gen_fields(item["n"])
            subject = f"{new[1]}/{new[2]}"
            x = item.get("x")
            ended = gen_fields(x) if x else None
            action = str(item["a"])
            reported = False
            if ended is not None:
                batch.lease(ended)
                batch.transition(org, ended, ended[8], at, actor)
                reported = reports_expiry(ended[8]) and self._expiry_reported(
                    conn, ended[0], int(ended[6])
                )
            batch.lease(new)
            batch.transition(org, new, action, at, actor)
            if action in _CREATES:
                batch.created.add(new[0])
            for kind, payload in lease_events(
                action,
                event_payload(new),
                new_status=new[8],
                forced_by=new[15] or None,
                ended=None if ended is None else event_payload(ended),
                ended_status=None if ended is None else ended[8],
                expiry_reported=reported,
                extra=by_handoff,
            ):
                events.append((kind, subject, payload))
            rc = item.get("rc")
            if rc and new[5]:
                h = from_gen(new)
                batch.receipts[(actor, new[5], resource_key(new[1], new[2]))] = (
                    str(rc["d"]),
                    json.dumps(
                        {
                            **generation_to_lease(h).model_dump(mode="json"),
                            ATTEMPT_FIELD: rc.get("a"),
                        }
                    ),
                    at,
                    int(rc["ex"]),
                )
            last = new
        if ho and by_handoff is None and last is not None:
            events += self._accept_handoff(conn, org, ho, last, at)
        inc = str(p["i"])
        append = batch.events.append
        for n, (kind, subject, payload) in enumerate(events):
            append(
                (
                    "evt_" + event_digest(inc, eid, n),
                    org,
                    kind,
                    actor,
                    subject,
                    _canonical(payload),
                    at,
                    event_lease_id(payload),
                )
            )

    def _flush(
        self,
        conn: Connection,
        org: str,
        batch: Batch,
        cursor: tuple[str, str],
        *,
        copy: bool = False,
    ) -> None:
        """Write a batch and move the org's journal cursor to ``cursor`` (``(incarnation
        id, last entry id)``): the org and actors not registered yet, lease rows (update
        towards the newer state, else insert), receipts (upsert), cursor (upsert),
        transitions and events (insert-or-ignore, in journal order, events under the
        ``events:<org>`` lock).

        PostgreSQL: one pipeline (one round trip). With ``copy`` (PostgreSQL only), the
        transitions, the events and the rows of the leases created in this batch (by an
        acquire, takeover or supersede entry, so not in the ledger unless the entry was
        applied before) are instead written with ``COPY``, which inserts rows at about two
        thirds of the server's cost but cannot ignore or update a row that is already
        there: such a row raises :class:`psycopg.errors.UniqueViolation`, and the caller
        rolls the transaction back and writes the batch again without ``copy``. SQLite:
        one ``executemany`` per kind.
        """
        copy = copy and not self._sqlite
        at = batch.first_at or 0
        inc, last = cursor
        stmts: list[tuple[str, Any, bool]] = []  # (sql, params, many)
        if org not in self._known_orgs:
            stmts.append((ORG_SQL, (org, at), False))
        actors = [
            (name, role)
            for name, role in batch.actors.items()
            if self._known_actors.get((org, name)) != role
        ]
        if actors:
            stmts.append(self._principals(org, actors, at))
        # with copy, the leases created in this batch are new to the ledger: COPYed after
        # the upsert of the others (which may end the resource's previous active lease)
        fresh: list[list[str]] = []
        upserts: list[list[str]] = []
        for f in batch.leases.values():
            (fresh if copy and f[0] in batch.created else upserts).append(f)
        if upserts:
            leases = [lease_row(org, f) for f in upserts]
            stmts.append(self._bulk(LEASE_TABLE, leases, LEASE_CONFLICT))
        if batch.receipts:
            receipts = [
                (org, actor, "acquire", key, scope, *values)
                for (actor, key, scope), values in batch.receipts.items()
            ]
            stmts.append(self._bulk(RECEIPT_TABLE, receipts, RECEIPT_CONFLICT))
        response = json.dumps({"inc": inc, "id": last})
        created = int(last.partition("-")[0])
        stmts.append(
            (CURSOR_SET_SQL, (org, SYSTEM_PRINCIPAL, JOURNAL_OP, response, created), False)
        )
        if batch.transitions and not copy:
            stmts.append(self._bulk(TRANSITION_TABLE, batch.transitions, TRANSITION_CONFLICT))
        if batch.events:
            if not self._sqlite:
                stmts.append((LOCK_SQL, (f"events:{org}",), False))
            if not copy:
                stmts.append(self._bulk(EVENT_TABLE, batch.events, EVENT_CONFLICT))
        if self._sqlite:
            self._execute(conn, stmts)
            return
        pg = conn.connection.driver_connection
        assert pg is not None
        with pg.cursor() as cur:
            self._execute(conn, stmts, cur)
            if copy:
                copies = (
                    (LEASE_TABLE, [lease_row(org, f) for f in fresh]),
                    (TRANSITION_TABLE, batch.transitions),
                    (EVENT_TABLE, batch.events),
                )
                for table, rows in copies:
                    if rows:
                        with cur.copy(table.copy_sql) as cp:
                            for row in rows:
                                cp.write_row(row)

    def _execute(
        self, conn: Connection, stmts: Sequence[tuple[str, Any, bool]], cur: Any = None
    ) -> None:
        """Run ``stmts`` (``(sql, params, many)`` from :meth:`_bulk` and the like):
        SQLite one by one, PostgreSQL in one pipeline on ``cur`` (a new cursor if none)."""
        if self._sqlite:
            for sql, params, many in stmts:
                self._sqlite_run(conn, sql, params if many else tuple(params), many=many)
            return
        if cur is None:
            pg = conn.connection.driver_connection
            assert pg is not None
            with pg.cursor() as own:
                self._execute(conn, stmts, own)
            return
        with cur.connection.pipeline():
            for sql, params, _many in stmts:
                cur.execute(sql, params)

    def _write_fault(
        self,
        conn: Connection,
        org: str,
        cursor: tuple[str, str],
        p: dict[str, Any],
        error: str,
    ) -> dict[str, Any]:
        """Record journal entry ``p`` (at ``cursor``: ``(incarnation id, entry id)``) as a
        fault the ledger refused: its transitions only (insert-or-ignore; they carry its
        epochs, so ``baton audit`` sees them next to the generations they clash with), one
        entry in the org's :data:`FAULT_OP` row, and the cursor moved past it. Its lease
        rows, receipts, events and handoff acceptance are not written. Returns the fault."""
        at = int(p["at"])
        actor = str(p["ac"])
        batch = Batch()
        gens: list[dict[str, Any]] = []
        for item in p["it"]:
            new = gen_fields(item["n"])
            x = item.get("x")
            if x:
                ended = gen_fields(x)
                batch.transition(org, ended, ended[8], at, actor)
            batch.transition(org, new, str(item["a"]), at, actor)
            gens.append(
                {"lease_id": new[0], "resource": f"{new[1]}/{new[2]}", "epoch": int(new[7])}
            )
        inc, eid = cursor
        fault = {"entry": eid, "incarnation": inc, "at_ms": at, "generations": gens}
        fault["error"] = error[:500]
        old = self._system_row(conn, org, FAULT_OP) or {}
        faults = [*old.get("faults", []), fault][-MAX_FAULTS:]
        self._set_system_row(conn, org, FAULT_OP, {"faults": faults}, at)
        stmts: list[tuple[str, Any, bool]] = []
        if org not in self._known_orgs:
            stmts.append((ORG_SQL, (org, at), False))
        stmts.append(self._principals(org, [(actor, str(p["ro"]))], at))
        stmts.append(self._bulk(TRANSITION_TABLE, batch.transitions, TRANSITION_CONFLICT))
        response = json.dumps({"inc": inc, "id": eid})
        created = int(eid.partition("-")[0])
        stmts.append(
            (CURSOR_SET_SQL, (org, SYSTEM_PRINCIPAL, JOURNAL_OP, response, created), False)
        )
        self._execute(conn, stmts)
        return fault

    def _committed(self, org: str, batch: Batch) -> None:
        """Remember the org and actors of ``batch``, whose transaction has committed: later
        batches do not register them again."""
        self._known_orgs.add(org)
        self._known_actors.update(((org, name), role) for name, role in batch.actors.items())

    def _principals(
        self, org: str, actors: list[tuple[str, str]], at: int
    ) -> tuple[str, Any, bool]:
        """The statement registering ``actors`` (``(name, role)`` pairs) in ``org``: insert,
        or set the role where it differs."""
        return self._bulk(
            PRINCIPAL_TABLE,
            [(org, name, role, at) for name, role in actors],
            f"ON CONFLICT (org_id, name) DO UPDATE SET role = excluded.role "
            f"WHERE {PRINCIPALS}.role <> excluded.role",
        )

    def _bulk(
        self, table: BulkTable, rows: Sequence[tuple[Any, ...]], conflict: str
    ) -> tuple[str, Any, bool]:
        """The statement inserting ``rows`` (tuples in ``table``'s column order) with the
        ``ON CONFLICT`` clause ``conflict``, in row order (serial ``seq`` columns follow it).

        PostgreSQL: one statement for the whole list (``INSERT ... SELECT FROM unnest`` of
        one binary array per column, ordered by position; binary arrays cost the server
        less to read than text ones). SQLite: one prepared statement for ``executemany``."""
        if self._sqlite:
            return table.sqlite_sql + " " + conflict, list(rows), True
        return table.pg_sql + " " + conflict, tuple(map(list, zip(*rows, strict=True))), False

    def _accept_handoff(
        self, conn: Connection, org: str, ho: dict[str, Any], gen: list[str], at: int
    ) -> list[tuple[str, str, dict[str, Any]]]:
        lease_id, epoch = gen[0], int(gen[7])
        hid = str(ho["id"])
        row = conn.execute(select(HandoffRow).where(col(HandoffRow.handoff_id) == hid)).first()
        if row is None or row.org_id != org or row.status != "pending":
            if row is None or row.accepted_lease_id != lease_id:
                log.warning("journal accepts handoff %s, which is not pending in the ledger", hid)
            return []
        conn.execute(
            update(HandoffRow)
            .where(col(HandoffRow.handoff_id) == hid, col(HandoffRow.status) == "pending")
            .values(
                status="accepted",
                note=ho.get("nt"),
                resolved_at_ms=at,
                accepted_lease_id=lease_id,
            )
        )
        payload = handoff_payload(row, accepted_lease_id=lease_id, epoch=epoch)
        return [("handoff.accepted", str(row.subject_id), payload)]
