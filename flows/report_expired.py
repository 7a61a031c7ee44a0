"""Deployable flow ``baton-report-expired``: report leases found past their TTL.

A crashed holder's lease stays ``active`` in the ledger until someone acts on the resource
(no sweeper is needed for correctness: DESIGN.md "Leases"). This flow calls
``b.leases.report_expired()``, which records ``lease.expired`` in the ledger's event stream
once for each such lease, with ``reason: "lapsed"`` (a later takeover does not record it
again) and changes nothing else; it also emits ``prefect-baton.lease.expired`` for each
(same payload) and adds a table artifact. The same call ends pending handoffs that expired
unaccepted, releasing the leases they carry (``lease.released``, ``reason:
"handoff_expired"``), which the relay delivers.

Run once: ``python flows/report_expired.py``; serve it: ``python flows/report_expired.py --serve``.
"""

from __future__ import annotations

import os
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from prefect_baton._rules.events import EXPIRY_LAPSED, expired_payload, lease_payload
from prefect_baton.prefect._events import emit_ledger_event
from prefect_baton.prefect._logs import expected_errors
from prefect_baton.prefect._serve import flow_main, reading_baton

REPORTER = "prefect-baton.report-expired"


@flow(name="baton-report-expired", persist_result=True)
def report_expired(limit: int = 10_000) -> dict[str, Any]:
    """Record `lease.expired` once for each active lease of the org (``BATON_ORG``) whose
    TTL has passed.

    Args:
        limit: at most this many leases per run (1..10,000), oldest expiry first.

    Returns:
        ``{"expired": [{"lease_id", "resource", "owner", "epoch", "expired_at"}, ...]}``.

    Raises:
        UnavailableError: the ledger cannot be reached. NotFoundError: no ledger file at
        a SQLite ``BATON_LEDGER_URL`` (none is created).
    """
    with expected_errors():
        log = get_run_logger()
        b = reading_baton(principal=REPORTER, role="admin")
        expired = b.leases.report_expired(limit=limit)
        found = []
        for lease in expired:
            payload = expired_payload(
                lease_payload(
                    lease.lease_id,
                    lease.resource_type,
                    lease.resource_id,
                    lease.owner,
                    lease.version,
                    lease.epoch,
                    round(lease.expires_at.timestamp() * 1000),
                ),
                EXPIRY_LAPSED,
            )
            emit_ledger_event(
                "lease.expired",
                f"{lease.resource_type}/{lease.resource_id}",
                payload,
                org=b.org,
                principal=REPORTER,
            )
            found.append(
                {
                    "lease_id": lease.lease_id,
                    "resource": f"{lease.resource_type}/{lease.resource_id}",
                    "owner": lease.owner,
                    "epoch": lease.epoch,
                    "expired_at": lease.expires_at.isoformat(timespec="seconds"),
                }
            )
        log.info("%d expired leases reported", len(found))
        if found:
            create_table_artifact(
                table=found, key="baton-expired-leases", description="Leases past their TTL"
            )
        return {"expired": found}


if __name__ == "__main__":
    flow_main(report_expired, name="report-expired", doc=__doc__, interval_seconds=300)
