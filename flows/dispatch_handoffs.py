"""Deployable flow ``baton-dispatch-handoffs``: start the recipient of each pending handoff.

A handoff's recipient principal is, for a Prefect recipient, its deployment's full name
``"<flow>/<deployment>"`` (the principal its runs act as). For every pending handoff the flow
starts that deployment with the parameters stored with the handoff (``handoff_to(...,
parameters=...)``) and ``handoff_id``, using the handoff id as Prefect's idempotency key, so
dispatching twice starts one run; a handoff whose run exists already is reported as
``already started (state X)`` and left alone. Useful when the sender did not name a
deployment, or its start failed.

Run once: ``python flows/dispatch_handoffs.py``; serve it: add ``--serve``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger

from prefect_baton import Baton
from prefect_baton.prefect import start_recipient


def recipients_from_events(b: Baton, scan_limit: int = 10_000) -> list[str]:
    """Every principal a handoff was ever addressed to in ``b``'s org (from the events)."""
    names: set[str] = set()
    after = 0
    while after < scan_limit:
        page = b.events.list(after_seq=after, limit=1000, kind="handoff.created")
        if not page:
            break
        for ev in page:
            to = ev.payload.get("to_principal")
            if isinstance(to, str):
                names.add(to)
        after = page[-1].seq
    return sorted(names)


def existing_run(handoff_id: str) -> Any:
    """The flow run already started for ``handoff_id`` (Prefect idempotency key), or
    ``None``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterIdempotencyKey

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                idempotency_key=FlowRunFilterIdempotencyKey(any_=[handoff_id])
            ),
            limit=1,
        )
    return runs[0] if runs else None


@flow(name="baton-dispatch-handoffs", persist_result=True)
def dispatch_handoffs(recipients: list[str] | None = None) -> dict[str, Any]:
    """Start the deployment of every pending handoff's recipient.

    Args:
        recipients: recipient principals (deployment names) to serve; default: every
            recipient found in the org's ``handoff.created`` events.

    Returns:
        ``{"started": [{"handoff_id", "deployment", "flow_run_id"}], "running": [{"handoff_id",
        "flow_run_id", "state"}], "skipped": [{"handoff_id", "reason"}]}``: ``running`` lists
        handoffs whose recipient run exists already (not started again).

    Raises:
        UnavailableError: the ledger cannot be reached.
    """
    log = get_run_logger()
    b = Baton.from_settings(principal="prefect-baton.dispatcher")
    started: list[dict[str, str]] = []
    running: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    for name in recipients or recipients_from_events(b):
        inbox = b.as_principal(name).handoffs.inbox(limit=1000)
        if inbox and "/" not in name:
            skipped += [
                {"handoff_id": h.handoff_id, "reason": f"{name!r} names no deployment"}
                for h in inbox
            ]
            continue
        for h in inbox:
            try:
                run = existing_run(h.handoff_id)
                if run is not None:
                    state = run.state.name if run.state is not None else "unknown"
                    log.info(
                        "handoff %s: recipient run %s already started (state %s)",
                        h.handoff_id,
                        run.id,
                        state,
                    )
                    running.append(
                        {"handoff_id": h.handoff_id, "flow_run_id": str(run.id), "state": state}
                    )
                    continue
                run = start_recipient(h.handoff_id, name, h.parameters)
            except Exception as exc:  # unknown deployment, API error: report, go on
                skipped.append(
                    {"handoff_id": h.handoff_id, "reason": f"{type(exc).__name__}: {exc}"}
                )
                continue
            started.append(
                {"handoff_id": h.handoff_id, "deployment": name, "flow_run_id": str(run.id)}
            )
    if started or skipped or not running:
        log.info("started %d recipient runs, skipped %d handoffs", len(started), len(skipped))
    return {"started": started, "running": running, "skipped": skipped}


if __name__ == "__main__":
    if "--serve" in sys.argv:
        dispatch_handoffs.serve(name="dispatch-handoffs", interval=60)
    else:
        print(dispatch_handoffs())
