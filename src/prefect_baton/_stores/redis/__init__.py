"""The Redis fast path for leases: :class:`RedisAuthority` (one Lua script per operation,
expiry on Redis ``TIME``), its journal and :mod:`reconciler <.reconciler>` into the ledger,
and the rebuild after Redis data loss (:mod:`.rebuild`).

Use it through ``Baton(..., redis_url="redis://127.0.0.1:6379/0")`` or ``BATON_REDIS_URL``;
without a Redis URL nothing of this package is used.
"""

from __future__ import annotations

from prefect_baton._stores.redis.authority import AcquireRequest, RedisAuthority, connect
from prefect_baton._stores.redis.reconciler import Lag, Reconciler, ReconcileReport, run_reconciler

__all__ = [
    "AcquireRequest",
    "Lag",
    "ReconcileReport",
    "Reconciler",
    "RedisAuthority",
    "connect",
    "run_reconciler",
]
