"""The reconciler's ledger writes: journal entries turned into rows, and the bulk SQL.

:class:`LedgerWriter` gathers the rows of a batch of journal entries in journal order
(:meth:`~LedgerWriter._collect` into a :class:`Batch`: each lease's newest state, the
transitions, the events with ids derived from the entry, the acquire receipts, a handoff's
acceptance) and writes them in one transaction (:meth:`~LedgerWriter._flush`): lease rows
as an upsert that only moves towards a newer state, transitions and events as
insert-or-ignore, receipts as an upsert; each kind is one statement (PostgreSQL:
``INSERT ... SELECT FROM unnest``) or one ``executemany`` (SQLite). It also keeps the
authority's own records (the journal cursor) in the receipts table under
:data:`SYSTEM_PRINCIPAL`. The drain loop that drives it is
:class:`prefect_baton._redis.reconciler.Reconciler`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
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
from .codec import from_gen

__all__ = ["FOREVER_MS", "SYSTEM_PRINCIPAL", "Batch", "LedgerWriter"]

log = logging.getLogger("prefect_baton.reconciler")

SYSTEM_PRINCIPAL = "__baton_authority__"
"""The principal name under which the authority keeps its own records in the ledger's
receipts table (the journal cursor and the incarnation counter); never a real caller."""
FOREVER_MS = 2**53 - 1

_KIND = {
    "acquire": "lease.acquired",
    "takeover": "lease.acquired",
    "supersede": "lease.acquired",
    "renew": "lease.renewed",
    "transfer": "lease.transferred",
    "release": "lease.released",
    "force_release": "lease.released",
}


class LedgerWriter:
    """The ledger side of a drain: row gathering and bulk writes into ``store``
    (:class:`prefect_baton._ledger.store.LedgerStore`), in a transaction the caller opens."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._sqlite = store.engines.is_sqlite
        self._insert = sqlite_insert if self._sqlite else pg_insert

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
        self, conn: Connection, org: str, eid: str, p: dict[str, Any], batch: Batch
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

    def _flush(self, conn: Connection, org: str, batch: Batch) -> None:
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
class Batch:
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
