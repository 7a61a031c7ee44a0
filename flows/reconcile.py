"""Deployable flow ``baton-reconcile``: drain the Redis lease journal into the ledger.

With no Redis authority configured (``BATON_REDIS_URL`` unset) the ledger itself is the lease
authority and there is nothing to reconcile: the flow says so and completes.

Run once: ``python flows/reconcile.py``; serve it: ``python flows/reconcile.py --serve``.
"""

from __future__ import annotations

import os
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger

from prefect_baton import BatonSettings
from prefect_baton.prefect._logs import expected_errors
from prefect_baton.prefect._serve import flow_main

NO_REDIS = (
    "No Redis authority is configured (BATON_REDIS_URL is unset): the ledger is the lease "
    "authority, so there is no journal to reconcile."
)


@flow(name="baton-reconcile", persist_result=True)
def reconcile(orgs: list[str] | None = None, batch_size: int = 500) -> dict[str, Any]:
    """Drain every org's Redis journal (or ``orgs``) into the ledger once.

    Args:
        orgs: organizations to drain (default: every org known to Redis).
        batch_size: journal entries per ledger transaction.

    Returns:
        ``{"status": "skipped", "reason": ...}`` without Redis, else ``{"status": "ok",
        "applied": int, "lag": {org: {"entries": int, "seconds": float}}}``.

    Raises:
        UnavailableError: Redis or the ledger cannot be reached.
    """
    with expected_errors():
        log = get_run_logger()
        settings = BatonSettings()
        if settings.redis_url is None:
            log.info(NO_REDIS)
            return {"status": "skipped", "reason": NO_REDIS}
        from prefect_baton._stores.redis.reconciler import run_reconciler

        report = run_reconciler(
            settings.redis_url.get_secret_value(),
            settings.ledger_url,
            orgs=orgs,
            batch_size=batch_size,
        )
        lag = {org: {"entries": v.entries, "seconds": v.seconds} for org, v in report.lag.items()}
        log.info("applied %d journal entries for %d orgs", report.applied, len(report.orgs))
        return {"status": "ok", "applied": report.applied, "orgs": report.orgs, "lag": lag}


if __name__ == "__main__":
    flow_main(reconcile, name="reconcile", doc=__doc__, interval_seconds=60)
