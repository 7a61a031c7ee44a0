"""Deployable flow ``baton-relay-events``: mirror the ledger's event stream as Prefect events.

``@leased``, ``handoff_to`` and ``accept_handoff`` emit the transitions they make inside a
run right away. Everything else (renewals, checkpoints, outcomes, and anything written outside
a Prefect run by the CLI or plain Python agents) reaches Prefect through this relay, at least
once, with the same deterministic event ids (so Automations see each transition once).

Run once: ``python flows/relay_events.py``; serve it: ``python flows/relay_events.py --serve``.
"""

from __future__ import annotations

import os
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger

from prefect_baton.prefect import relay_events
from prefect_baton.prefect._logs import expected_errors
from prefect_baton.prefect._serve import flow_main, reading_baton


@flow(name="baton-relay-events", persist_result=True)
def relay(max_events: int = 10_000) -> dict[str, Any]:
    """Relay the org's (``BATON_ORG``) ledger events after the stored cursor.

    Args:
        max_events: stop after this many events (``int``); the next run goes on.

    Returns:
        ``{"emitted": int, "cursor": int}``.

    Raises:
        UnavailableError: the ledger cannot be reached. NotFoundError: no ledger file at
        a SQLite ``BATON_LEDGER_URL`` (none is created).
    """
    with expected_errors():
        result = relay_events(reading_baton(), max_events=max_events)
        get_run_logger().info("relayed %d ledger events (cursor %d)", result.emitted, result.cursor)
        return {"emitted": result.emitted, "cursor": result.cursor}


if __name__ == "__main__":
    flow_main(relay, name="relay-events", doc=__doc__, interval_seconds=30)
