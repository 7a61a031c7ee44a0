"""Flow-level handoff between two Prefect deployments.

The sender flow holds the lease on ``report/<name>`` (``@leased``), saves its progress as a
checkpoint and hands the report to the receiver's deployment: ``handoff_to`` records the
handoff with the lease attached and starts the receiver with ``handoff_id``. The receiver
accepts it (the lease moves to the receiver's flow run, epoch + 1), resumes from the
checkpoint and finishes. The sender, still running, then tries one more fenced write with
its old lease: the ledger rejects it with ``StaleFenceError``.

Run it with ``python examples/prefect_handoff.py``: it serves both deployments from this
process (on ``PREFECT_API_URL``, or on Prefect's embedded server started for the run) and
prints a JSON summary. The ledger is ``BATON_LEDGER_URL`` (default ``./.baton/ledger.db``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow
from prefect.deployments import run_deployment
from prefect.runtime import flow_run

from prefect_baton import StaleFenceError
from prefect_baton.prefect import (
    accept_handoff,
    current_baton,
    current_lease,
    handoff_to,
    leased,
    prefect_api,
    serving,
    wait_for_run,
)

SENDER = "baton-example-sender/sender"
RECEIVER = "baton-example-receiver/receiver"


@flow(name="baton-example-sender", persist_result=True)
@leased("report", "{report}", ttl_seconds=60, purpose="draft the report")
def sender(report: str = "weekly", accept_timeout_seconds: float = 180.0) -> dict[str, Any]:
    """Draft half the report, then hand it (and its lease) to the receiver's deployment."""
    b, lease = current_baton(), current_lease()
    assert b is not None
    assert lease is not None
    ck = b.checkpoints.save(report, "progress", {"sections_done": 2, "next": "charts"}, fence=lease)
    sent = handoff_to(
        None,  # the receiver's principal is its deployment name
        report,
        checkpoint=ck,
        message="Sections 1-2 done; please add the charts.",
        lease=lease,
        deployment=RECEIVER,
        parameters={"report": report},
    )
    deadline = time.monotonic() + accept_timeout_seconds
    while b.handoffs.get(sent.handoff_id).status == "pending" and time.monotonic() < deadline:
        time.sleep(0.5)
    try:  # one more write with the old lease: the new holder's epoch fences it out
        b.checkpoints.save(report, "progress", {"sections_done": 2, "late": True}, fence=lease)
        stale_write_rejected = False
    except StaleFenceError:
        stale_write_rejected = True
    return {
        "principal": b.principal,
        "flow_run_id": str(flow_run.id),
        "lease_id": lease.lease_id,
        "epoch": lease.epoch,
        "handoff_id": sent.handoff_id,
        "receiver_flow_run_id": str(sent.flow_run.id) if sent.flow_run else None,
        "stale_write_rejected": stale_write_rejected,
    }


@flow(name="baton-example-receiver", persist_result=True)
def receiver(handoff_id: str | None = None, report: str = "weekly") -> dict[str, Any]:
    """Accept the handoff, take over the lease, resume from the checkpoint and finish."""
    if handoff_id is None:
        return {"status": "nothing to do: no handoff_id"}
    with accept_handoff(handoff_id) as h:
        b, lease = current_baton(), h.lease
        assert b is not None
        assert lease is not None
        assert h.state is not None
        done = int(h.state["sections_done"]) + 1
        b.checkpoints.save(report, "progress", {"sections_done": done, "next": None}, fence=lease)
        return {
            "principal": b.principal,
            "flow_run_id": str(flow_run.id),
            "resumed_from": h.state,
            "sections_done": done,
            "lease_id": lease.lease_id,
            "lease_owner": lease.owner,
            "lease_execution_key": lease.execution_key,
            "epoch": lease.epoch,
        }


def main(report: str | None = None) -> dict[str, Any]:
    """Serve both deployments, run the sender, wait for both runs, return a summary."""
    report = report or f"weekly-{uuid.uuid4().hex[:6]}"
    with (
        prefect_api(),
        serving(sender.to_deployment(name="sender"), receiver.to_deployment(name="receiver")),
    ):
        sent_run = run_deployment(SENDER, parameters={"report": report}, timeout=300)
        out: dict[str, Any] = {"sender": sent_run.state.result() if sent_run.state else None}
        rid = out["sender"]["receiver_flow_run_id"]
        recv_run = wait_for_run(rid, timeout_seconds=300)
        out["receiver"] = recv_run.state.result() if recv_run.state else None
        out["states"] = {
            "sender": sent_run.state.name if sent_run.state else None,
            "receiver": recv_run.state.name if recv_run.state else None,
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=2, sort_keys=True, default=str))
