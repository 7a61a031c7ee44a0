"""Draining the Redis lease journal into the ledger (``baton reconcile``).

With Redis as the lease authority every transition is appended to a per-org Redis stream;
:func:`run_reconciler` applies those entries to the ledger in order and idempotently, and
reports the lag. A client with ``ack="redis"`` already drains its own org on a thread; run
``baton reconcile --follow`` (or :func:`run_reconciler` with ``follow=True``) as a service to
keep the ledger current when clients come and go.
"""

from __future__ import annotations

from prefect_baton._stores.redis.reconciler import (
    DEFAULT_BATCH,
    Lag,
    Reconciler,
    ReconcileReport,
    registered_orgs,
    run_reconciler,
)

__all__ = [
    "DEFAULT_BATCH",
    "Lag",
    "ReconcileReport",
    "Reconciler",
    "registered_orgs",
    "run_reconciler",
]
