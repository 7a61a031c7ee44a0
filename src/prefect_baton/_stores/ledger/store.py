"""The ledger store: applies the core's decisions to the SQL ledger, one transaction each.

Every mutation runs in one database transaction that (1) takes its locks up front (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: transaction advisory locks on the resource, on the org's
write scopes when scopes are involved, and on the org's event stream just before the outbox
insert, so event sequence numbers are handed out in commit order), (2) reads the database
clock, (3) checks the idempotency receipt, (4) decides with :mod:`prefect_baton._rules.core`,
(5) writes the rows, the transition history, the events and the receipt, and commits.
"""

from __future__ import annotations

from prefect_baton._stores.ledger.base import (
    DEFAULT_RECEIPT_RETENTION_SECONDS,
    MAX_ATTEMPTS,
    PRUNE_BATCH,
    PRUNE_EVERY_WRITES,
    Fence,
    Tx,
)
from prefect_baton._stores.ledger.convert import (
    checkpoint_model,
    handoff_model,
    holding_to_lease,
    lease_payload,
    new_id,
    outcome_model,
    resource_key,
    row_to_holding,
)
from prefect_baton._stores.ledger.records import RecordOps

__all__ = [
    "DEFAULT_RECEIPT_RETENTION_SECONDS",
    "MAX_ATTEMPTS",
    "PRUNE_BATCH",
    "PRUNE_EVERY_WRITES",
    "Fence",
    "LedgerStore",
    "Tx",
    "checkpoint_model",
    "handoff_model",
    "holding_to_lease",
    "lease_payload",
    "new_id",
    "outcome_model",
    "resource_key",
    "row_to_holding",
]


class LedgerStore(RecordOps):
    """The SQL ledger and the embedded lease authority.

    Args:
        url: SQLAlchemy URL, ``sqlite:///path`` or ``postgresql://...`` (psycopg 3).
        receipt_retention_seconds: how long idempotency receipts are kept (default 24 h).
        state_max_bytes: the checkpoint state cap in bytes (default 1 MiB).
        migrate: apply the shipped Alembic migrations on first use (default ``True``).

    Raises:
        ValidationError: a malformed URL. UnavailableError: the database cannot be reached.
    """
