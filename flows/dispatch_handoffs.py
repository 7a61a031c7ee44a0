"""Deployable flow ``baton-dispatch-handoffs``: start the recipient of each pending handoff.

A handoff's recipient principal is, for a Prefect recipient, its deployment's full name
``"<flow>/<deployment>"`` (the principal its runs act as). For every pending handoff the flow
starts that deployment with the parameters stored with the handoff (``handoff_to(...,
parameters=...)``) and ``handoff_id``, using the handoff id as Prefect's idempotency key, so
dispatching twice starts one run; a handoff whose run exists already is reported as
``already started (state X)`` and left alone while that run has not ended. A run that
ended (Completed, Failed, Crashed, Cancelled) with its handoff still pending left the
handoff stuck (its lease held by nobody until the TTL): the flow lists it under ``ended``
and logs a warning naming the handoff, the run and its state, and what to do: reject the
handoff to free its lease, or start the recipient again by hand (dispatching starts no
second run: the idempotency key returns the ended one; the warning gives the ``prefect
deployment run ... --params`` command with the run's parameters). Useful when the sender
did not name a deployment, or its start failed. The recipient's flow must take
``handoff_id`` and each key of the stored parameters (a flow taking ``**kwargs`` gets the
names it does not declare packed into it, as ``handoff_to`` starts it), and require no
other: a deployment that refuses them is skipped with a ValidationError naming it, the
parameters given and Prefect's reason. It reads the org's pending handoffs as the principal
``prefect-baton.dispatcher`` with the ``owner`` role (listing everyone's handoffs needs it).

Run once: ``python flows/dispatch_handoffs.py``; serve it: add ``--serve``.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger

from prefect_baton import Baton, Handoff
from prefect_baton.prefect import start_recipient
from prefect_baton.prefect._handoff import recipient_run_parameters
from prefect_baton.prefect._logs import expected_errors
from prefect_baton.prefect._serve import flow_main, reading_baton


def pending_handoffs(b: Baton, page_size: int = 1000) -> dict[str, list[Handoff]]:
    """Every pending handoff of ``b``'s org, by recipient principal (oldest first).

    Reads the handoff list itself (``b.handoffs.list(party="*")``, paged with its cursor),
    so every pending handoff is found however long the org's event history is.

    Args:
        b: a client with the ``owner`` or ``admin`` role (listing everyone's handoffs).
        page_size: handoffs per page (1..10,000).

    Raises:
        ForbiddenError: ``b`` has the ``agent`` role.
    """
    by_recipient: dict[str, list[Handoff]] = {}
    cursor: str | None = None
    while True:
        page = b.handoffs.list(party="*", status="pending", limit=page_size, cursor=cursor)
        for h in page:
            by_recipient.setdefault(h.to_principal, []).append(h)
        cursor = page.next_cursor
        if cursor is None:
            return by_recipient


def run_has_ended(run: Any) -> bool:
    """Whether a Prefect flow run is in a final state (Completed, Failed, Crashed,
    Cancelled): it will not resolve its handoff any more."""
    return run.state is not None and bool(run.state.is_final())


def stuck_warning(h: Handoff, run: Any, state: str, parameters: dict[str, Any]) -> str:
    """The warning for a pending handoff ``h`` whose recipient ``run`` ended in ``state``
    (``str``): it names both and says what to do, with the command that starts the
    recipient again with ``parameters`` (the run's, from ``recipient_run_parameters``:
    ``handoff_id`` and the handoff's parameters, packed into a ``**kwargs`` parameter
    when its flow takes one)."""
    command = shlex.join(
        ["prefect", "deployment", "run", h.to_principal, "--params", json.dumps(parameters)]
    )
    return (
        f"handoff {h.handoff_id} of {h.subject_id!r} is stuck: its recipient run {run.id} "
        f"ended (state {state}) and left it pending"
        + (", its lease held by nobody until the TTL" if h.lease_id else "")
        + f". Reject it to free its lease (baton --principal '{h.to_principal}' handoff "
        f"resolve {h.handoff_id} rejected), or start the recipient again ({command})"
    )


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
        recipients: recipient principals (deployment names) to serve; default: the
            recipient of every pending handoff of the org.

    Returns:
        ``{"started": [{"handoff_id", "deployment", "flow_run_id"}], "running": [{"handoff_id",
        "flow_run_id", "state"}], "ended": [{"handoff_id", "flow_run_id", "state"}],
        "skipped": [{"handoff_id", "reason"}]}``: ``running`` lists handoffs whose recipient
        run exists already and has not ended (not started again); ``ended`` those whose
        recipient run ended (Completed, Failed, Crashed, Cancelled) leaving the handoff
        pending, each also logged as a warning (see :func:`stuck_warning`); a handoff
        resolved while the flow ran is left out.

    Raises:
        UnavailableError: the ledger cannot be reached. NotFoundError: no ledger file at
        a SQLite ``BATON_LEDGER_URL`` (none is created).
    """
    with expected_errors():
        log = get_run_logger()
        # the owner role lists everyone's pending handoffs (the dispatcher starts any recipient)
        b = reading_baton(principal="prefect-baton.dispatcher", role="owner")
        started: list[dict[str, str]] = []
        running: list[dict[str, str]] = []
        ended: list[dict[str, str]] = []
        skipped: list[dict[str, str]] = []
        pending = pending_handoffs(b)
        for name in recipients or sorted(pending):
            inbox = pending.get(name, [])
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
                        row = {
                            "handoff_id": h.handoff_id,
                            "flow_run_id": str(run.id),
                            "state": state,
                        }
                        if not run_has_ended(run):
                            log.info(
                                "handoff %s: recipient run %s already started (state %s)",
                                h.handoff_id,
                                run.id,
                                state,
                            )
                            running.append(row)
                        elif b.handoffs.get(h.handoff_id).status == "pending":
                            params = recipient_run_parameters(h.handoff_id, name, h.parameters)
                            log.warning(stuck_warning(h, run, state, params))
                            ended.append(row)
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
        if started or skipped or not (running or ended):
            log.info("started %d recipient runs, skipped %d handoffs", len(started), len(skipped))
        return {"started": started, "running": running, "ended": ended, "skipped": skipped}


if __name__ == "__main__":
    flow_main(dispatch_handoffs, name="dispatch-handoffs", doc=__doc__, interval_seconds=60)
