"""The reconciler: drains each org's Redis journal into the ledger, in order, idempotently.

Every Redis script that changes a lease appends one entry to the org's journal stream (all
the transitions of that call, the actor and the Redis time). Draining applies entries in
journal order, a batch per ledger transaction:

1. take the org's journal lock (``journal:<org>``: a PostgreSQL advisory lock; SQLite's
   ``BEGIN IMMEDIATE`` write lock), read the org's cursor (the last applied entry id and the
   journal's incarnation id) from the ledger;
2. read the entries after the cursor from Redis, and for each: upsert the lease rows
   (insert-or-ignore, then update only towards a newer state: a higher version, or the end
   of an active generation), insert the transitions (insert-or-ignore on the unique
   ``(lease_id, version, action)``), the acquire receipts, the handoff acceptance and the
   events (with ids derived from the entry, insert-or-ignore), as the ledger store itself
   writes them;
3. move the cursor and commit; only then trim the applied entries from the stream.

Applying an entry twice changes nothing, and entries are applied in the order Redis made
them, so the history's versions and epochs rise as on the ledger authority. The lag (how many
entries are not applied yet and how old the oldest one is) is :meth:`Reconciler.lag`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import Connection, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import OperationalError
from sqlmodel import col

from .._core import Holding, canonical_json
from .._ledger.store import LedgerStore, holding_to_lease, lease_payload, resource_key
from .._ledger.tables import (
    EventRow,
    HandoffRow,
    LeaseRow,
    LeaseTransition,
    Organization,
    Principal,
    ReceiptRow,
)
from ..errors import UnavailableError
from .cluster import RedisClient, node_time_ms
from .codec import from_gen, journal_payload
from .keys import ORGS_KEY, org_keys

__all__ = ["Lag", "ReconcileReport", "Reconciler", "run_reconciler"]

log = logging.getLogger("prefect_baton.reconciler")

SYSTEM_PRINCIPAL = "__baton_authority__"
"""The principal name under which the authority keeps its own records in the ledger's
receipts table (the journal cursor and the incarnation counter); never a real caller."""
FOREVER_MS = 2**53 - 1
DEFAULT_BATCH = 2000

_KIND = {
    "acquire": "lease.acquired",
    "takeover": "lease.acquired",
    "supersede": "lease.acquired",
    "renew": "lease.renewed",
    "transfer": "lease.transferred",
    "release": "lease.released",
    "force_release": "lease.released",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_tuple(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"<ms>-<seq>"`` as a comparable tuple of ints."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _payload(fields: Any) -> dict[str, Any]:
    return journal_payload(fields[b"p"] if b"p" in fields else fields["p"])


def _unavailable(exc: Exception) -> UnavailableError:
    return UnavailableError(f"Redis unavailable to the reconciler: {exc}")


@dataclass(frozen=True)
class Lag:
    """How far the ledger is behind an org's journal.

    Attributes:
        entries: journal entries not yet trimmed (``int``; applied-but-untrimmed entries,
            at most one batch, count too).
        seconds: age of the oldest of them on the Redis clock (``float``, 0 when none).
        oldest_id: its stream id (``str``) or ``None``.
    """

    entries: int
    seconds: float
    oldest_id: str | None = None


@dataclass
class ReconcileReport:
    """What :func:`run_reconciler` did: ``applied`` entries (``int``) per org in ``orgs``
    and the final ``lag`` of each (:class:`Lag`)."""

    orgs: list[str] = field(default_factory=list)
    applied: int = 0
    lag: dict[str, Lag] = field(default_factory=dict)


class Reconciler:
    """Drains Redis journals into one ledger.

    Args:
        client: the Redis client of the authority (``redis.Redis`` or
            ``redis.cluster.RedisCluster``).
        store: the ledger (:class:`prefect_baton._ledger.store.LedgerStore`).
        batch_size: entries per ledger transaction (``int``, default 2,000).

    Every method may raise :class:`UnavailableError` when Redis or the ledger cannot be
    reached; nothing is acknowledged (trimmed) that the ledger has not committed.
    """

    def __init__(self, client: RedisClient, store: LedgerStore, *, batch_size: int = DEFAULT_BATCH):
        self.client = client
        self.store = store
        self.batch_size = max(1, int(batch_size))
        self._sqlite = store.engines.is_sqlite
        self._insert = sqlite_insert if self._sqlite else pg_insert

    # ------------------------------------------------------------------ public

    def drain(self, org: str, *, until: str | None = None, max_batches: int | None = None) -> int:
        """Apply the org's pending journal entries; returns how many were applied (``int``).

        Args:
            org: the organization.
            until: stop once this entry id (``"<ms>-<seq>"``) is applied (``None``: drain
                everything pending).
            max_batches: stop after this many batches (``None``: no limit).

        A batch shorter than ``batch_size`` reached the end of the journal: the drain stops
        there (entries appended since are left for the next drain).
        """
        if until is not None and self._applied(org, until):
            return 0
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            n, last = self.drain_once(org)
            total += n
            batches += 1
            if n < self.batch_size:
                break
            if until is not None and last is not None and id_tuple(last) >= id_tuple(until):
                break
        return total

    def drain_once(self, org: str) -> tuple[int, str | None]:
        """Apply one batch (at most ``batch_size`` entries) in one ledger transaction.

        Returns ``(applied, last applied entry id or None)``.
        """
        journal = org_keys(org).journal
        try:
            with self.store.engines.write.begin() as conn:
                self._lock(conn, f"journal:{org}")
                cursor = self._cursor(conn, org)
                first = self.client.xrange(journal, count=1)
                if not first:
                    return 0, None
                stream_inc = str(_payload(first[0][1])["i"])
                start = "-"
                if cursor is not None and cursor[0] == stream_inc:
                    start = "(" + cursor[1]
                entries = self.client.xrange(journal, min=start, count=self.batch_size)
                if not entries:
                    return 0, None
                batch = _Batch()
                for raw_id, fields in entries:
                    self._collect(conn, org, _text(raw_id), _payload(fields), batch)
                self._flush(conn, org, batch)
                last = _text(entries[-1][0])
                self._set_cursor(conn, org, stream_inc, last)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        except OperationalError as exc:
            raise UnavailableError(f"ledger database unavailable: {exc.orig}") from exc
        ms, seq = id_tuple(last)
        try:
            self.client.xtrim(journal, minid=f"{ms}-{seq + 1}", approximate=False)
        except RedisError as exc:  # applied and committed; trimmed by the next drain
            log.info("could not trim the journal of %s: %s", org, exc)
        return len(entries), last

    def lag(self, org: str) -> Lag:
        """The org's current :class:`Lag` (two Redis commands)."""
        journal = org_keys(org).journal
        try:
            n = int(self.client.xlen(journal))
            if n == 0:
                return Lag(0, 0.0, None)
            first = self.client.xrange(journal, count=1)
            now_ms = node_time_ms(self.client, journal)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        if not first:
            return Lag(0, 0.0, None)
        oldest = _text(first[0][0])
        return Lag(n, max(0.0, (now_ms - id_tuple(oldest)[0]) / 1000.0), oldest)

    # ------------------------------------------------------------------ internals

    def _applied(self, org: str, entry_id: str) -> bool:
        try:
            first = self.client.xrange(org_keys(org).journal, count=1)
        except RedisError as exc:
            raise _unavailable(exc) from exc
        return not first or id_tuple(_text(first[0][0])) > id_tuple(entry_id)

    def _lock(self, conn: Connection, key: str) -> None:
        if not self._sqlite:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": key})

    def _system_row(self, conn: Connection, org: str, operation: str) -> dict[str, Any] | None:
        raw = conn.execute(
            select(col(ReceiptRow.response)).where(
                col(ReceiptRow.org_id) == org,
                col(ReceiptRow.principal) == SYSTEM_PRINCIPAL,
                col(ReceiptRow.operation) == operation,
                col(ReceiptRow.idem_key) == "state",
                col(ReceiptRow.scope_key) == "",
            )
        ).scalar_one_or_none()
        return None if raw is None else dict(json.loads(raw))

    def _set_system_row(
        self, conn: Connection, org: str, operation: str, value: dict[str, Any], now_ms: int
    ) -> None:
        response = json.dumps(value)
        stmt = self._insert(ReceiptRow).values(
            org_id=org,
            principal=SYSTEM_PRINCIPAL,
            operation=operation,
            idem_key="state",
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

    def _cursor(self, conn: Connection, org: str) -> tuple[str, str] | None:
        row = self._system_row(conn, org, "redis.journal")
        return None if row is None else (str(row["inc"]), str(row["id"]))

    def _set_cursor(self, conn: Connection, org: str, inc: str, entry_id: str) -> None:
        self._set_system_row(
            conn, org, "redis.journal", {"inc": inc, "id": entry_id}, id_tuple(entry_id)[0]
        )

    def _expiry_reported(self, conn: Connection, h: Holding) -> bool:
        """Whether ``report_expired`` already recorded ``lease.expired`` for this generation."""
        found = conn.execute(
            select(col(LeaseTransition.seq)).where(
                col(LeaseTransition.lease_id) == h.lease_id,
                col(LeaseTransition.version) == h.version,
                col(LeaseTransition.action) == "expired",
            )
        ).first()
        return found is not None

    def _collect(
        self, conn: Connection, org: str, eid: str, p: dict[str, Any], batch: _Batch
    ) -> None:
        """Add one journal entry's rows to ``batch`` (in journal order); nothing is written
        yet except what :meth:`_accept_handoff` reads."""
        at = int(p["at"])
        actor = str(p["ac"])
        batch.actors[actor] = str(p["ro"])
        batch.first_at = at if batch.first_at is None else batch.first_at
        events: list[tuple[str, str, dict[str, Any]]] = []
        last: Holding | None = None
        for item in p["it"]:
            new = from_gen(item["n"])
            resource = (new.resource_type, new.resource_id)
            subject = f"{resource[0]}/{resource[1]}"
            ended = from_gen(item["x"]) if item.get("x") else None
            action = str(item["a"])
            if ended is not None:
                batch.lease(ended)
                batch.transition(org, ended, ended.status, at, actor)
                if ended.status == "taken_over" and not self._expiry_reported(conn, ended):
                    events.append(("lease.expired", subject, lease_payload(ended, resource)))
            batch.lease(new)
            batch.transition(org, new, action, at, actor)
            payload = lease_payload(new, resource)
            if action in ("takeover", "supersede"):
                payload["previous_lease_id"] = ended.lease_id if ended else None
            if action in ("release", "force_release"):
                payload["status"] = new.status
                if new.ended_by:
                    payload["forced_by"] = new.ended_by
            events.append((_KIND[action], subject, payload))
            rc = item.get("rc")
            if rc and new.execution_key is not None:
                batch.receipts[
                    (actor, new.execution_key, resource_key(new.resource_type, new.resource_id))
                ] = {
                    "request_digest": str(rc["d"]),
                    "response": json.dumps(holding_to_lease(new).model_dump(mode="json")),
                    "created_at_ms": at,
                    "expires_at_ms": int(rc["ex"]),
                }
            last = new
        ho = p.get("ho")
        if ho and last is not None:
            events += self._accept_handoff(conn, org, ho, last, at)
        for n, (kind, subject, payload) in enumerate(events):
            batch.events.append(
                {
                    "event_id": "evt_" + _event_digest(str(p["i"]), eid, n),
                    "org_id": org,
                    "kind": kind,
                    "principal": actor,
                    "subject": subject,
                    "payload": canonical_json(payload),
                    "occurred_at_ms": at,
                }
            )

    def _flush(self, conn: Connection, org: str, batch: _Batch) -> None:
        """Write a batch: principals, lease rows (update towards the newer state, then
        insert-or-ignore), transitions and events (insert-or-ignore, in journal order),
        receipts (upsert). Each kind is one executemany."""
        at = batch.first_at or 0
        conn.execute(
            self._insert(Organization).values(org_id=org, created_at_ms=at).on_conflict_do_nothing()
        )
        for actor, role in batch.actors.items():
            conn.execute(
                self._insert(Principal)
                .values(org_id=org, name=actor, role=role, created_at_ms=at)
                .on_conflict_do_nothing()
            )
            conn.execute(
                update(Principal)
                .where(col(Principal.org_id) == org, col(Principal.name) == actor)
                .where(col(Principal.role) != role)
                .values(role=role)
            )
        self._bulk(
            conn,
            LeaseRow,
            [_insert_params(org, h) for h in batch.leases.values()],
            "ON CONFLICT (lease_id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in _UPDATED)
            # only towards a newer state: a higher version, or the end of the same version
            + f" WHERE {_LEASES}.version < excluded.version OR ({_LEASES}.version = "
            f"excluded.version AND {_LEASES}.status = 'active' AND excluded.status <> 'active')",
        )
        self._bulk(
            conn,
            LeaseTransition,
            batch.transitions,
            "ON CONFLICT (lease_id, version, action) DO NOTHING",
        )
        if batch.receipts:
            stmt = self._insert(ReceiptRow)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["org_id", "principal", "operation", "idem_key", "scope_key"],
                    set_={
                        "request_digest": stmt.excluded.request_digest,
                        "response": stmt.excluded.response,
                        "created_at_ms": stmt.excluded.created_at_ms,
                        "expires_at_ms": stmt.excluded.expires_at_ms,
                    },
                ),
                [
                    {
                        "org_id": org,
                        "principal": actor,
                        "operation": "acquire",
                        "idem_key": key,
                        "scope_key": scope,
                        **values,
                    }
                    for (actor, key, scope), values in batch.receipts.items()
                ],
            )
        if batch.events:
            self._lock(conn, f"events:{org}")
            self._bulk(conn, EventRow, batch.events, "ON CONFLICT (event_id) DO NOTHING")

    def _bulk(
        self, conn: Connection, table: Any, rows: list[dict[str, Any]], conflict: str
    ) -> None:
        """Insert ``rows`` (dicts with the same keys, in this order) into ``table`` with the
        ``ON CONFLICT`` clause ``conflict``, in row order (serial ``seq`` columns follow it).

        PostgreSQL: one statement for the whole list (``INSERT ... SELECT FROM unnest`` of
        one array per column, ordered by position). SQLite: one prepared statement run by
        the driver's ``executemany``."""
        if not rows:
            return
        cols = list(rows[0])
        name = table.__tablename__
        columns = table.__table__.c
        if self._sqlite:
            marks = ", ".join("?" * len(cols))
            sql = f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({marks}) {conflict}"
            conn.exec_driver_sql(sql, list(map(itemgetter(*cols), rows)))
            return
        dialect = conn.dialect
        arrays = ", ".join(f"%b::{columns[c].type.compile(dialect=dialect)}[]" for c in cols)
        sql = (
            f"INSERT INTO {name} ({', '.join(cols)}) SELECT {', '.join(cols)} "
            f"FROM unnest({arrays}) WITH ORDINALITY AS u({', '.join(cols)}, n) "
            f"ORDER BY n {conflict}"
        )
        with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
            cur.execute(sql, tuple(list(map(itemgetter(c), rows)) for c in cols), binary=True)

    def _accept_handoff(
        self, conn: Connection, org: str, ho: dict[str, Any], lease: Holding, at: int
    ) -> list[tuple[str, str, dict[str, Any]]]:
        hid = str(ho["id"])
        row = conn.execute(select(HandoffRow).where(col(HandoffRow.handoff_id) == hid)).first()
        if row is None or row.org_id != org or row.status != "pending":
            if row is None or row.accepted_lease_id != lease.lease_id:
                log.warning("journal accepts handoff %s, which is not pending in the ledger", hid)
            return []
        conn.execute(
            update(HandoffRow)
            .where(col(HandoffRow.handoff_id) == hid, col(HandoffRow.status) == "pending")
            .values(
                status="accepted",
                note=ho.get("nt"),
                resolved_at_ms=at,
                accepted_lease_id=lease.lease_id,
            )
        )
        payload = {
            "handoff_id": row.handoff_id,
            "from_principal": row.from_principal,
            "to_principal": row.to_principal,
            "checkpoint_id": row.checkpoint_id,
            "lease_id": row.lease_id,
            "accepted_lease_id": lease.lease_id,
            "epoch": lease.epoch,
        }
        return [("handoff.accepted", str(row.subject_id), payload)]


_UPDATED = ("version", "expires_at_ms", "ttl_ms", "status", "ended_at_ms", "ended_by")
_LEASES = LeaseRow.__tablename__


def _insert_params(org: str, h: Holding) -> dict[str, Any]:
    return {
        "lease_id": h.lease_id,
        "org_id": org,
        "resource_type": h.resource_type,
        "resource_id": h.resource_id,
        "owner": h.owner,
        "execution_key": h.execution_key,
        "purpose": h.purpose,
        "scopes": json.dumps(list(h.scopes)),
        "has_scopes": 1 if h.scopes else 0,
        "version": h.version,
        "epoch": h.epoch,
        "status": h.status,
        "acquired_at_ms": h.acquired_at_ms,
        "expires_at_ms": h.expires_at_ms,
        "ttl_ms": h.ttl_ms,
        "ended_at_ms": h.ended_at_ms,
        "ended_by": h.ended_by,
    }


@dataclass
class _Batch:
    """The rows of one drain transaction, gathered in journal order: each lease's newest
    state, the transitions, events and receipts, the actors to register."""

    leases: dict[str, Holding] = field(default_factory=dict)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    receipts: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    actors: dict[str, str] = field(default_factory=dict)
    first_at: int | None = None

    def lease(self, h: Holding) -> None:
        """Keep ``h`` if it is newer than the state already gathered for its lease: a
        higher version, or the end of the same version (states only move that way)."""
        cur = self.leases.get(h.lease_id)
        if (
            cur is None
            or h.version > cur.version
            or (h.version == cur.version and cur.status == "active" and h.status != "active")
        ):
            self.leases[h.lease_id] = h

    def transition(self, org: str, h: Holding, action: str, at: int, actor: str) -> None:
        """Add the transition row of ``h``."""
        self.transitions.append(
            {
                "org_id": org,
                "resource_type": h.resource_type,
                "resource_id": h.resource_id,
                "lease_id": h.lease_id,
                "action": action,
                "version": h.version,
                "epoch": h.epoch,
                "owner": h.owner,
                "execution_key": h.execution_key,
                "status": h.status,
                "at_ms": at,
                "expires_at_ms": h.expires_at_ms,
                "actor": actor,
            }
        )


def _event_digest(inc: str, eid: str, n: int) -> str:
    return hashlib.sha256(f"{inc}\x00{eid}\x00{n}".encode()).hexdigest()[:32]


def registered_orgs(client: RedisClient) -> list[str]:
    """The orgs whose Redis lease state was ever set up (the ``baton:orgs`` set)."""
    try:
        return sorted(_text(m) for m in client.smembers(ORGS_KEY))
    except RedisError as exc:
        raise _unavailable(exc) from exc


def run_reconciler(
    redis_url: str | None = None,
    ledger_url: str | None = None,
    *,
    orgs: Sequence[str] | None = None,
    follow: bool = False,
    interval_seconds: float = 0.5,
    batch_size: int = DEFAULT_BATCH,
    stop: threading.Event | None = None,
    on_batch: Callable[[str, int, Lag], None] | None = None,
    client: RedisClient | None = None,
    store: LedgerStore | None = None,
) -> ReconcileReport:
    """Drain Redis lease journals into the ledger (what ``baton reconcile`` runs).

    Args:
        redis_url: Redis URL (default ``BATON_REDIS_URL``).
        ledger_url: ledger URL (default ``BATON_LEDGER_URL`` or the SQLite default).
        orgs: the orgs to drain (default: every org registered in ``baton:orgs``, re-read
            each round when following).
        follow: keep draining until ``stop`` is set (or the process is interrupted);
            otherwise drain what is pending once and return.
        interval_seconds: pause between rounds that applied less than one batch per org
            (``float``, seconds): entries gather into larger batches meanwhile.
        batch_size: entries per ledger transaction.
        stop: an event that ends ``follow`` mode.
        on_batch: called as ``on_batch(org, applied, lag)`` after each round of an org that
            applied something.
        client, store: use these instead of connecting from URLs.

    Returns:
        A :class:`ReconcileReport` with what was applied and the final lag of each org.

    Raises:
        ValidationError: no Redis URL configured. UnavailableError: Redis or the ledger
            is unreachable (in ``follow`` mode only when it is so at start).
    """
    from .._settings import BatonSettings
    from ..errors import ValidationError
    from .authority import connect

    settings = BatonSettings()
    own_store = store is None
    if client is None:
        url = redis_url or (settings.redis_url.get_secret_value() if settings.redis_url else None)
        if not url:
            raise ValidationError("no Redis URL: pass redis_url or set BATON_REDIS_URL")
        client = connect(url)
    if store is None:
        store = LedgerStore(
            ledger_url or settings.ledger_url,
            receipt_retention_seconds=settings.receipt_retention_seconds,
        )
    rec = Reconciler(client, store, batch_size=batch_size)
    report = ReconcileReport()
    stop = stop or threading.Event()
    try:
        while True:
            targets: Iterable[str] = orgs if orgs is not None else registered_orgs(client)
            busy = False
            for org in targets:
                if org not in report.orgs:
                    report.orgs.append(org)
                try:
                    n = rec.drain(org)
                except UnavailableError as exc:
                    if not follow:
                        raise
                    log.warning("reconcile of %s failed, will retry: %s", org, exc)
                    continue
                report.applied += n
                busy = busy or n >= rec.batch_size
                if n and on_batch is not None:
                    on_batch(org, n, rec.lag(org))
            if not follow or stop.is_set():
                break
            if not busy:
                stop.wait(interval_seconds)
            if stop.is_set():
                break
        for org in report.orgs:
            try:
                report.lag[org] = rec.lag(org)
            except UnavailableError:
                pass
    finally:
        if own_store:
            store.close()
    return report


class Drainer:
    """A daemon thread that keeps draining the orgs it was given (``ack="redis"``).

    Args:
        reconciler: the :class:`Reconciler` to drive.
        interval_seconds: pause after a round that caught up with every journal
            (``float``, default 0.05 s).
    """

    def __init__(self, reconciler: Reconciler, *, interval_seconds: float = 0.05) -> None:
        self.reconciler = reconciler
        self.interval = interval_seconds
        self.orgs: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baton-reconciler", daemon=True)
        self._thread.start()

    def add(self, org: str) -> None:
        """Drain ``org`` too from now on (waking the thread the first time only, so that
        entries accumulate into batches between rounds)."""
        if org not in self.orgs:
            self.orgs.add(org)
            self._wake.set()

    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        backoff = self.interval
        while not self._stop.is_set():
            busy = False
            failed = False
            for org in list(self.orgs):
                try:
                    n = self.reconciler.drain(org, max_batches=8)
                    busy = busy or n >= 8 * self.reconciler.batch_size
                except Exception as exc:
                    failed = True
                    log.warning("background reconcile of %s failed: %s", org, exc)
            if failed:
                backoff = min(max(backoff * 2, 0.1), 5.0)
                self._stop.wait(backoff)
                continue
            backoff = self.interval
            if not busy:
                self._wake.wait(self.interval)
                self._wake.clear()

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the thread (after the round in progress) and wait up to ``timeout`` s."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
