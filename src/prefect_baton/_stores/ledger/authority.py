"""Which lease authority decides an organization's leases: the ledger, or Redis.

DESIGN.md "Storage": with Redis as the lease authority the ledger's copy of the leases lags
Redis (the reconciler drains the journal into it), so a client without a Redis URL that
decided on that copy could grant a resource a Redis client holds, and hand out a fencing
token twice. The ledger therefore records, per organization, that Redis decides its leases:
the row of the incarnation counter (:data:`INCARNATION_OP`) that a Redis client writes when
it first builds the organization's Redis state from the ledger
(:func:`prefect_baton._stores.redis.rebuild.bump_incarnation`). While that row is present,
every lease decision the ledger would apply itself is refused
(``StoreBase._check_ledger_authority``, called by ``LeaseOps._apply`` for every decision),
in the same transaction and, on PostgreSQL, under a shared lock on the same key as the
counter's update (:func:`authority_lock`): a ledger grant either commits before the counter
is written, and the Redis state built after it contains it, or sees the counter and is
refused.

``baton reconcile --return-to-ledger`` hands an organization back to the ledger
(:func:`prefect_baton._stores.redis.rebuild.return_to_ledger`): the journal is drained, the
organization's Redis state removed and the row moved aside (:data:`RETURNED_KEY`), keeping
the incarnation count so that fencing tokens keep rising when Redis is used again. The
ledger's own grants then take epochs above that incarnation's ceiling
(:func:`~prefect_baton._rules.core.incarnation_epochs`): grants Redis made and lost before
they reached the ledger (a loss of Redis data) were all below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, bindparam, literal_column, select
from sqlalchemy.dialects import sqlite
from sqlmodel import col

from prefect_baton._stores.ledger.tables import ReceiptRow
from prefect_baton.errors import ForbiddenError

__all__ = [
    "INCARNATION_OP",
    "RETURNED_KEY",
    "SHARED_LOCK_PREFIX",
    "STATE_KEY",
    "SYSTEM_PRINCIPAL",
    "authority_lock",
    "redis_authority_sql",
    "redis_decides_error",
    "system_where",
]

SYSTEM_PRINCIPAL = "__baton_authority__"
"""The principal name under which the authority keeps its own records in the ledger's
receipts table (the journal cursor and the incarnation counter); never a real caller."""

INCARNATION_OP = "redis.incarnation"
"""The receipts-table operation of an organization's Redis incarnation counter."""

STATE_KEY = "state"
"""The ``idem_key`` of the counter while Redis decides the organization's leases."""

RETURNED_KEY = "returned"
"""The ``idem_key`` the counter is moved to when the organization is handed back to the
ledger (``baton reconcile --return-to-ledger``)."""

SHARED_LOCK_PREFIX = "shared:"
"""A lock key with this prefix is taken shared (PostgreSQL ``pg_advisory_xact_lock_shared``
on the key without the prefix); others exclusively."""


def redis_decides_error(org: str) -> ForbiddenError:
    """The refusal (:class:`ForbiddenError`) of a ledger-only client acting as the lease
    authority of ``org`` (``str``), whose leases Redis decides; it names the remedies."""
    return ForbiddenError(
        f"the leases of org {org!r} are decided by Redis (a client with a Redis URL has "
        "used it), and this client has none: set BATON_REDIS_URL (or Baton(redis_url=...); "
        "a Prefect BatonBlock's own redis_url, which BATON_REDIS_URL does not fill in) "
        "like every other client of the org, or hand the org back to the ledger with "
        "'baton reconcile --return-to-ledger'"
    )


def authority_lock(org: str) -> str:
    """The lock key of ``org``'s incarnation counter (``str``): taken exclusively by the
    counter's update, shared by every lease transition the ledger decides."""
    return f"incarnation:{org}"


def system_where(
    org: Any, operation: Any, keys: Sequence[Any], principal: Any = SYSTEM_PRINCIPAL
) -> list[Any]:
    """The conditions (SQLAlchemy expressions, to be ANDed) that select the authority's own
    record ``operation`` of ``org`` in the receipts table: its principal (default
    :data:`SYSTEM_PRINCIPAL`), its ``idem_key`` (one of ``keys``, e.g. ``(STATE_KEY,)``)
    and no scope key. Each value may be a bound parameter (:func:`redis_authority_sql`).
    """
    key = col(ReceiptRow.idem_key)
    return [
        col(ReceiptRow.org_id) == org,
        col(ReceiptRow.principal) == principal,
        col(ReceiptRow.operation) == operation,
        key == keys[0] if len(keys) == 1 else key.in_(keys),
        col(ReceiptRow.scope_key) == literal_column("''"),
    ]


def redis_authority_sql() -> str:
    """The statement (``?`` placeholders: org, principal, operation, :data:`STATE_KEY`,
    :data:`RETURNED_KEY`) that returns the organization's incarnation counter rows
    ``(idem_key, response)``: one under :data:`STATE_KEY` while Redis decides its leases,
    one under :data:`RETURNED_KEY` once it was handed back."""
    org, principal, operation, state, returned = (
        bindparam(name, type_=String)
        for name in ("org", "principal", "operation", "state", "returned")
    )
    where = system_where(org, operation, (state, returned), principal=principal)
    stmt = select(col(ReceiptRow.idem_key), col(ReceiptRow.response)).where(*where)
    return str(stmt.compile(dialect=sqlite.dialect()))
