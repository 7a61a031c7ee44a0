"""The ledger store: applies the core's decisions to the SQL ledger, one transaction each.

Every mutation runs in one database transaction that (1) takes its locks up front (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: transaction advisory locks on the resource, on the org's
write scopes when scopes are involved, and on the org's event stream just before the outbox
insert, so event sequence numbers are handed out in commit order), (2) reads the database
clock, (3) checks the idempotency receipt, (4) decides with :mod:`prefect_baton._rules.core`,
(5) writes the rows, the transition history, the events and the receipt, and commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prefect_baton._rules.digests import resource_key
from prefect_baton._stores.ledger.base import (
    DEFAULT_RECEIPT_RETENTION_SECONDS,
    MAX_ATTEMPTS,
    PRUNE_BATCH,
    PRUNE_EVERY_WRITES,
    Tx,
)
from prefect_baton._stores.ledger.convert import (
    checkpoint_model,
    generation_to_lease,
    handoff_model,
    lease_payload,
    new_id,
    outcome_model,
    row_to_generation,
)
from prefect_baton._stores.ledger.many import ledger_acquire_many
from prefect_baton._stores.ledger.records import RecordOps
from prefect_baton._stores.protocol import (
    MAX_MANY,
    AcquireRequest,
    Caller,
    Execution,
    Fence,
)
from prefect_baton.errors import ValidationError
from prefect_baton.models import Lease

if TYPE_CHECKING:
    from prefect_baton._settings import BatonSettings

__all__ = [
    "DEFAULT_RECEIPT_RETENTION_SECONDS",
    "MAX_ATTEMPTS",
    "PRUNE_BATCH",
    "PRUNE_EVERY_WRITES",
    "Fence",
    "LedgerStore",
    "Tx",
    "checkpoint_model",
    "generation_to_lease",
    "handoff_model",
    "lease_payload",
    "new_id",
    "outcome_model",
    "resource_key",
    "row_to_generation",
]


class LedgerStore(RecordOps):
    """The SQL ledger and the embedded lease authority.

    Args:
        url: SQLAlchemy URL, ``sqlite:///path`` or ``postgresql://...`` (psycopg 3).
        receipt_retention_seconds: how long idempotency receipts are kept (default 24 h).
        state_max_bytes: the checkpoint state cap in bytes (default 1 MiB).
        migrate: apply the shipped Alembic migrations on first use (default ``True``).
        clock: where the store reads "now": a callable returning epoch milliseconds
            (``int``), called once per transaction. Default ``None``: the database clock,
            read inside the transaction. Meant for tests (see :mod:`prefect_baton.testing`);
            every process sharing a ledger must read the same clock.

    Raises:
        ValidationError: a malformed URL. UnavailableError: the database cannot be reached.
    """

    @classmethod
    def from_settings(cls, settings: BatonSettings, url: str | None = None) -> LedgerStore:
        """Open the ledger ``settings`` name (``BATON_LEDGER_URL``, receipt retention and
        state cap), or the one at ``url`` (``str``, SQLAlchemy URL) with those settings.

        Raises:
            ValidationError: a malformed URL. UnavailableError: the database cannot be
                reached.
        """
        return cls(
            url or settings.ledger_url,
            receipt_retention_seconds=settings.receipt_retention_seconds,
            state_max_bytes=settings.state_max_bytes,
        )

    def bound_caller(self) -> Caller | None:
        """``None``: the ledger acts as the caller it is given."""
        return None

    def acquire_many(
        self, caller: Caller, requests: Sequence[AcquireRequest], execution: Execution
    ) -> list[Lease]:
        """Acquire every request in one ledger transaction, or none, under ``execution``
        (see :func:`prefect_baton._stores.ledger.many.ledger_acquire_many`).

        Returns:
            The leases in request order.

        Raises:
            The error :meth:`acquire` would raise for the first refused request, its message
            naming the request (``(acquire_many item <index>: <type>/<id>)``); then nothing
            is written. ValidationError: no request, or more than 1,000.
            UnavailableError: the database cannot be reached.
        """
        if not 1 <= len(requests) <= MAX_MANY:
            raise ValidationError(f"acquire_many takes 1 to {MAX_MANY} resources")
        return ledger_acquire_many(self, caller, requests, execution)

    def fence(self, caller: Caller, lease: Lease) -> Fence:
        """The plain fence of ``lease`` (its id and epoch): the ledger judges it in the
        write transaction against its own lease rows. Raises nothing."""
        return Fence(lease.lease_id, lease.epoch)

    def ledger_barrier(self, caller: Caller) -> None:
        """Nothing to wait for: the ledger is its own record store."""
