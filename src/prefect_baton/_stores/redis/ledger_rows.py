"""The rows and statements of the reconciler's ledger writes: the tables' columns, the SQL of
each bulk statement, a journal entry's fields turned into rows, and :class:`Batch` (the rows
of one drained batch, in journal order). :mod:`prefect_baton._stores.redis.ledger_writes` writes
them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from prefect_baton._rules.events import lease_payload
from prefect_baton._stores.ledger.tables import (
    EventRow,
    GenerationRow,
    LeaseTransition,
    Organization,
    Principal,
    ReceiptRow,
)
from prefect_baton._stores.redis.codec import encode_gen, from_gen

__all__ = [
    "CURSOR_SET_SQL",
    "CURSOR_SQL",
    "EVENT_CONFLICT",
    "EVENT_TABLE",
    "FOREVER_MS",
    "LEASE_CONFLICT",
    "LEASE_TABLE",
    "LOCK_SQL",
    "ORG_SQL",
    "PRINCIPALS",
    "PRINCIPAL_TABLE",
    "RECEIPT_CONFLICT",
    "RECEIPT_TABLE",
    "TRANSITION_CONFLICT",
    "TRANSITION_TABLE",
    "Batch",
    "BulkTable",
    "event_digest",
    "event_payload",
    "gen_fields",
    "lease_row",
]

FOREVER_MS = 2**53 - 1
"""An expiry that never comes (the largest integer a script handles exactly)."""


class BulkTable:
    """A bulk-written table: its columns in tuple order, which are integers, and the
    ``INSERT`` text (without the conflict clause) for PostgreSQL and SQLite."""

    def __init__(self, model: Any, cols: tuple[str, ...]) -> None:
        from sqlalchemy.dialects import postgresql

        name = model.__tablename__
        columns = model.__table__.c
        self.cols = cols
        self.is_int = tuple(columns[c].type.python_type is int for c in cols)
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        types = [columns[c].type.compile(dialect=dialect) for c in cols]
        names = ", ".join(cols)
        arrays = ", ".join(f"%b::{t}[]" for t in types)
        self.pg_sql = (
            f"INSERT INTO {name} ({names}) SELECT {names} "
            f"FROM unnest({arrays}) WITH ORDINALITY AS u({names}, n) ORDER BY n"
        )
        self.sqlite_sql = f"INSERT INTO {name} ({names}) VALUES ({', '.join('?' * len(cols))})"
        self.copy_sql = f"COPY {name} ({names}) FROM STDIN"


LEASE_TABLE = BulkTable(
    GenerationRow,
    (
        "lease_id",
        "org_id",
        "resource_type",
        "resource_id",
        "owner",
        "execution_key",
        "purpose",
        "scopes",
        "has_scopes",
        "version",
        "epoch",
        "status",
        "acquired_at_ms",
        "expires_at_ms",
        "ttl_ms",
        "ended_at_ms",
        "ended_by",
    ),
)
TRANSITION_TABLE = BulkTable(
    LeaseTransition,
    (
        "org_id",
        "resource_type",
        "resource_id",
        "lease_id",
        "action",
        "version",
        "epoch",
        "owner",
        "execution_key",
        "status",
        "at_ms",
        "expires_at_ms",
        "actor",
    ),
)
EVENT_TABLE = BulkTable(
    EventRow,
    (
        "event_id",
        "org_id",
        "kind",
        "principal",
        "subject",
        "payload",
        "occurred_at_ms",
        "lease_id",
    ),
)
PRINCIPAL_TABLE = BulkTable(Principal, ("org_id", "name", "role", "created_at_ms"))
RECEIPT_TABLE = BulkTable(
    ReceiptRow,
    (
        "org_id",
        "principal",
        "operation",
        "idem_key",
        "scope_key",
        "request_digest",
        "response",
        "created_at_ms",
        "expires_at_ms",
    ),
)

_UPDATED = ("version", "expires_at_ms", "ttl_ms", "status", "ended_at_ms", "ended_by")
_LEASES = GenerationRow.__tablename__
PRINCIPALS = Principal.__tablename__
_RECEIPTS = ReceiptRow.__tablename__
_RECEIPT_KEY = "(org_id, principal, operation, idem_key, scope_key)"
LEASE_CONFLICT = (
    "ON CONFLICT (lease_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _UPDATED)
    # only towards a newer state: a higher version, or the end of the same version
    + f" WHERE {_LEASES}.version < excluded.version OR ({_LEASES}.version = "
    f"excluded.version AND {_LEASES}.status = 'active' AND excluded.status <> 'active')"
)
TRANSITION_CONFLICT = "ON CONFLICT (lease_id, version, action) DO NOTHING"
EVENT_CONFLICT = "ON CONFLICT (event_id) DO NOTHING"
RECEIPT_CONFLICT = f"ON CONFLICT {_RECEIPT_KEY} DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in ("request_digest", "response", "created_at_ms", "expires_at_ms")
)
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
ORG_SQL = (
    f"INSERT INTO {Organization.__tablename__} (org_id, created_at_ms) VALUES (%s, %s) "
    "ON CONFLICT DO NOTHING"
)
CURSOR_SQL = (
    f"SELECT response FROM {_RECEIPTS} WHERE org_id = %s AND principal = %s "
    "AND operation = %s AND idem_key = 'state' AND scope_key = ''"
)
CURSOR_SET_SQL = (
    f"INSERT INTO {_RECEIPTS} (org_id, principal, operation, idem_key, scope_key, "
    "request_digest, response, created_at_ms, expires_at_ms) "
    f"VALUES (%s, %s, %s, 'state', '', '-', %s, %s, {FOREVER_MS}) "
    f"ON CONFLICT {_RECEIPT_KEY} DO UPDATE SET response = excluded.response, "
    "expires_at_ms = excluded.expires_at_ms"
)


def gen_fields(raw: Any) -> list[str]:
    """A generation's 17 fields (a journal entry's generations are field lists already;
    an earlier JSON form is converted)."""
    if isinstance(raw, list):
        return raw
    return encode_gen(from_gen(raw)).split("\x00")


def event_payload(f: list[str]) -> dict[str, Any]:
    """The lease part of an event payload of generation fields ``f`` (built by
    :func:`prefect_baton._rules.events.lease_payload`, as the ledger store's)."""
    return lease_payload(f[0], f[1], f[2], f[4], int(f[6]), int(f[7]), int(f[10]))


def lease_row(org: str, f: list[str]) -> tuple[Any, ...]:
    """The ``baton_leases`` row of a generation's fields (in :data:`LEASE_TABLE` order)."""
    scopes = json.loads(f[12]) if f[12] else None
    if not scopes or not isinstance(scopes, list):
        scopes = None
    return (
        f[0],
        org,
        f[1],
        f[2],
        f[4],
        f[5] or None,
        f[13][1:] if f[13] else None,
        "[]" if scopes is None else json.dumps(scopes),
        0 if scopes is None else 1,
        int(f[6]),
        int(f[7]),
        f[8],
        int(f[9]),
        int(f[10]),
        int(f[11]),
        int(f[14]) if f[14] else None,
        f[15] or None,
    )


@dataclass
class Batch:
    """The rows of one drain transaction, gathered in journal order: each lease's newest
    state (a generation's 17 fields), the transitions, events and receipts (tuples in the
    bulk column order), the actors to register."""

    leases: dict[str, list[str]] = field(default_factory=dict)
    transitions: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    receipts: dict[tuple[str, str, str], tuple[str, str, int, int]] = field(default_factory=dict)
    actors: dict[str, str] = field(default_factory=dict)
    first_at: int | None = None
    created: set[str] = field(default_factory=set)
    """Ids of the leases an entry of this batch created (acquire, takeover, supersede)."""

    def lease(self, f: list[str]) -> None:
        """Keep generation ``f`` if it is newer than the state already gathered for its
        lease: a higher version, or the end of the same version (states only move that
        way)."""
        cur = self.leases.get(f[0])
        if cur is not None:
            version, cur_version = int(f[6]), int(cur[6])
            if version < cur_version or (
                version == cur_version and (cur[8] != "active" or f[8] == "active")
            ):
                return
        self.leases[f[0]] = f

    def transition(self, org: str, f: list[str], action: str, at: int, actor: str) -> None:
        """Add the transition row of generation ``f``."""
        self.transitions.append(
            (
                org,
                f[1],
                f[2],
                f[0],
                action,
                int(f[6]),
                int(f[7]),
                f[4],
                f[5] or None,
                f[8],
                at,
                int(f[10]),
                actor,
            )
        )


def event_digest(inc: str, eid: str, n: int) -> str:
    """The id part of the ``n``-th event of journal entry ``eid`` of incarnation ``inc``
    (32 hex digits), the same on every drain of that entry."""
    return hashlib.sha256(f"{inc}\x00{eid}\x00{n}".encode()).hexdigest()[:32]
