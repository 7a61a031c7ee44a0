"""The deployments the end-to-end test serves against a real Prefect server.

Run as a script (``python tests/e2e/served_flows.py``) it serves every flow below with
``prefect.serve``; the test starts it as a subprocess with ``PREFECT_API_URL``,
``BATON_LEDGER_URL`` and ``BATON_ORG`` in its environment, so every flow run (a subprocess
of the runner) acts on the test's ledger and organization through ``Baton.from_settings()``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, serve
from prefect.runtime import deployment, flow_run

from prefect_baton import Baton
from prefect_baton.prefect import (
    HandoffRejected,
    accept_handoff,
    current_baton,
    current_lease,
    handoff_to,
    leased,
)

CONTEND = "baton-e2e-contend/contend"
SENDER = "baton-e2e-sender/sender"
RECEIVER = "baton-e2e-receiver/receiver"
FLAKY = "baton-e2e-flaky/flaky"
RERUN = "baton-e2e-rerun/rerun"
REVIEWER = "e2e-reviewer"


def _other_runs_final(item: str, timeout_seconds: float = 180.0) -> None:
    """Wait until every other run of this deployment for ``item`` is final (the loser of
    the contention has been skipped), so the winner holds the lease while it is refused."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    me = str(flow_run.id)
    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id])
                )
            )
            others = [r for r in runs if str(r.id) != me and r.parameters.get("item") == item]
            if others and all(r.state is not None and r.state.is_final() for r in others):
                return
            time.sleep(0.5)
    raise TimeoutError(f"the other run for {item} did not finish")


@flow(name="baton-e2e-contend")
@leased("e2e-job", "{item}", ttl_seconds=120, on_conflict="skip")
def contend(item: str) -> int:
    """Holds ``e2e-job/<item>`` until the other run of ``item`` has ended; returns the
    epoch."""
    _other_runs_final(item)
    held = current_lease()
    current_baton().checkpoints.save(item, "worked", {"run": str(flow_run.id)}, fence=held)
    return held.epoch


@flow(name="baton-e2e-sender")
@leased("e2e-report", "{report}", ttl_seconds=300)
def sender(report: str, reject: bool = False, automation_to: str | None = None) -> str:
    """Save sections 1-2 as the handoff's checkpoint and hand the report (and the lease)
    to the receiver deployment; with ``automation_to``, hand it to that principal without a
    deployment (an Automation starts the recipient)."""
    if automation_to is not None:
        return handoff_to(automation_to, report, checkpoint={"sections_done": 2}).handoff_id
    sent = handoff_to(
        None,
        report,
        checkpoint={"sections_done": 2},
        message="sections 1-2 done",
        lease=current_lease(),
        deployment=RECEIVER,
        parameters={"report": report, "reject": reject},
    )
    return sent.handoff_id


@flow(name="baton-e2e-receiver")
def receiver(
    handoff_id: str,
    report: str | None = None,
    reject: bool = False,
    as_principal: str | None = None,
) -> dict[str, Any]:
    """Accept the handoff (or reject it), resume from its checkpoint and record the
    outcome."""
    with accept_handoff(handoff_id, defer=True, principal=as_principal) as h:
        if reject:
            raise HandoffRejected("the e2e receiver says no")
        h.accept()
        assert h.handoff is not None
        subject = h.handoff.subject_id
        state = h.state or {}
        done = int(state["sections_done"]) + 1
        # current_baton() is None in an accept_handoff block without a lease (the
        # Automation case: nothing rode on the handoff), so act as its recipient then.
        b = current_baton() or Baton.from_settings(principal=h.handoff.to_principal)
        saved = b.checkpoints.save(subject, "progress", {"sections_done": done}, fence=h.lease)
        b.outcomes.record(
            subject,
            "succeeded",
            evidence=[{"kind": "note", "uri": f"prefect-flow-run:{flow_run.id}"}],
            fence=h.lease,
            handoff_id=handoff_id,
            checkpoint_id=saved.checkpoint_id,
        )
        return {"sections_done": done, "epoch": h.lease.epoch if h.lease else None}
    return {"rejected": handoff_id}


def _hand_off_then_fail(report: str) -> None:
    """Count the run of the body (the checkpoint ``(report, "ran")`` gets a version per
    run), hand the lease to ``e2e-reviewer``, which accepts and finishes at once, then
    fail."""
    held = current_lease()
    current_baton().checkpoints.save(report, "ran", {"run_count": flow_run.run_count}, fence=held)
    sent = handoff_to(REVIEWER, report, lease=held)
    reviewer = Baton.from_settings(principal=REVIEWER)
    accepted = reviewer.handoffs.resolve(sent.handoff_id, "accepted")
    assert accepted.lease is not None
    reviewer.leases.release(accepted.lease)
    raise RuntimeError("crash after handing off")


@flow(name="baton-e2e-flaky", retries=1, retry_delay_seconds=0)
@leased("e2e-report", "{report}", ttl_seconds=300)
def flaky(report: str) -> None:
    """Hands off, then fails; Prefect retries it in the same process."""
    _hand_off_then_fail(report)


@flow(name="baton-e2e-rerun")
@leased("e2e-report", "{report}", ttl_seconds=300)
def rerun(report: str) -> None:
    """Hands off, then fails (no retries: the test re-runs the flow run, in a new
    process)."""
    _hand_off_then_fail(report)


if __name__ == "__main__":
    serve(
        contend.to_deployment(name="contend"),
        sender.to_deployment(name="sender"),
        receiver.to_deployment(name="receiver"),
        flaky.to_deployment(name="flaky"),
        rerun.to_deployment(name="rerun"),
        limit=None,
    )
