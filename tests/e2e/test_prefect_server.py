"""Issue #14 §7: prefect-baton proven on a real Prefect server with served deployments.

A real ``prefect server start`` (see ``conftest.py``), the flows of ``served_flows.py``
served by ``prefect.serve`` in a subprocess, runs started through the Prefect client: two
runs of one deployment contend for a resource, a handoff between two deployments is
accepted and resumed from its checkpoint, a rejected handoff frees the resource, an
Automation on ``prefect-baton.handoff.created`` starts the recipient deployment, and a run
that handed its lease off and failed ends ``HandedOff`` when retried, in its own process or
re-run in a new one, without running its body again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from prefect_baton import Baton
from prefect_baton.prefect import wait_for_run

from .conftest import Served
from .served_flows import CONTEND, FLAKY, RECEIVER, RERUN, SENDER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RUN_TIMEOUT = 240.0


def _start(served: Served, deployment: str, **parameters: Any) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            served.deployment_ids[deployment], parameters=parameters
        )


def _receiver_run(served: Served, match: Callable[[dict[str, Any]], bool]) -> Any:
    """Wait for the receiver deployment's run whose parameters satisfy ``match`` (started
    by ``handoff_to`` or an Automation, not by the test) to end; returns it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + RUN_TIMEOUT
    with get_client(sync_client=True) as client:
        while True:
            runs = [
                r
                for r in client.read_flow_runs(
                    deployment_filter=DeploymentFilter(
                        id=DeploymentFilterId(any_=[served.deployment_ids[RECEIVER]])
                    )
                )
                if match(r.parameters)
            ]
            if runs:
                assert len(runs) == 1, runs
                return wait_for_run(runs[0].id, timeout_seconds=RUN_TIMEOUT)
            assert time.monotonic() < deadline, "the receiver deployment was not started"
            time.sleep(0.5)


def _completed(run: Any) -> None:
    assert run.state.type.value == "COMPLETED", (run.name, run.state)


def test_two_runs_of_one_deployment_contend_one_is_skipped(served: Served) -> None:
    first = _start(served, CONTEND, item="nightly")
    second = _start(served, CONTEND, item="nightly")
    runs = [wait_for_run(r.id, timeout_seconds=RUN_TIMEOUT) for r in (first, second)]

    for run in runs:
        _completed(run)
    assert sorted(r.state.name for r in runs) == ["Completed", "Skipped"]
    worked = next(r for r in runs if r.state.name == "Completed")
    skipped = next(r for r in runs if r.state.name == "Skipped")
    assert "e2e-job/nightly" in (skipped.state.message or "")

    b = served.baton(CONTEND)
    saved = b.checkpoints.get("nightly", "worked")
    assert saved is not None
    assert saved.state == {"run": str(worked.id)}  # only the winner did the work
    assert not b.leases.inspect("e2e-job", "nightly").held  # released at the end


def test_handoff_between_deployments_is_accepted_and_resumed(served: Served) -> None:
    sender = wait_for_run(_start(served, SENDER, report="q3").id, timeout_seconds=RUN_TIMEOUT)
    _completed(sender)
    received = _receiver_run(served, lambda p: p.get("report") == "q3")
    _completed(received)

    handoff_id = received.parameters["handoff_id"]
    b = served.baton(RECEIVER)
    handoff = b.handoffs.get(handoff_id)
    assert handoff.status == "accepted"
    assert handoff.from_principal == SENDER
    resumed = b.checkpoints.get("q3", "progress")
    assert resumed is not None
    assert resumed.state == {"sections_done": 3}  # the sender's checkpoint said 2
    [outcome] = b.outcomes.list("q3")
    assert (outcome.status, outcome.principal) == ("succeeded", RECEIVER)
    assert outcome.handoff_id == handoff_id
    assert outcome.fence_epoch == 2  # the lease moved on: one more than the sender's
    assert not b.leases.inspect("e2e-report", "q3").held  # the recipient released it


def test_rejected_handoff_frees_the_resource(served: Served) -> None:
    sender = wait_for_run(
        _start(served, SENDER, report="q4", reject=True).id, timeout_seconds=RUN_TIMEOUT
    )
    _completed(sender)
    received = _receiver_run(served, lambda p: p.get("report") == "q4")
    _completed(received)

    b = served.baton(RECEIVER)
    handoff = b.handoffs.get(received.parameters["handoff_id"])
    assert handoff.status == "rejected"
    assert handoff.lease_id is not None  # the sender's lease rode on it
    # The sender's block ended before the rejection: the carried lease must not stay held
    # until its TTL (300 s) runs out.
    assert not b.leases.inspect("e2e-report", "q4").held
    other = served.baton("someone-else").leases.acquire("e2e-report", "q4", ttl_seconds=30)
    assert other.epoch == 2


def test_automation_on_handoff_created_starts_the_recipient(served: Served) -> None:
    from prefect.automations import Automation
    from prefect.events.actions import RunDeployment
    from prefect.events.schemas.automations import EventTrigger, Posture

    to = f"e2e-triage-{uuid.uuid4().hex[:8]}"
    automation = Automation(
        name=f"baton-e2e-{to}",
        trigger=EventTrigger(
            expect={"prefect-baton.handoff.created"},
            match={
                "prefect.resource.id": "prefect-baton.handoff.*",
                "prefect-baton.to-principal": to,
            },
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            RunDeployment(
                source="selected",
                deployment_id=served.deployment_ids[RECEIVER],
                parameters={"handoff_id": "{{ event.payload.handoff_id }}", "as_principal": to},
            )
        ],
    ).create()
    try:
        sender = wait_for_run(
            _start(served, SENDER, report="q5", automation_to=to).id,
            timeout_seconds=RUN_TIMEOUT,
        )
        _completed(sender)
        received = _receiver_run(served, lambda p: p.get("as_principal") == to)
        _completed(received)
    finally:
        automation.delete()

    b = served.baton(to)
    handoff = b.handoffs.get(received.parameters["handoff_id"])
    assert (handoff.status, handoff.subject_id, handoff.to_principal) == ("accepted", "q5", to)
    [outcome] = b.outcomes.list("q5")
    assert (outcome.status, outcome.principal) == ("succeeded", to)
    resumed = b.checkpoints.get("q5", "progress")
    assert resumed is not None
    assert resumed.state == {"sections_done": 3}


def _logs_until_handed_off(run: Any, since: datetime | None) -> list[str]:
    """The messages of ``run``'s logs from ``since`` on (all with ``None``), read once its
    "Finished in state HandedOff" line and whatever the engine logged after it reached the
    API (the runner's subprocess ships logs in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp

    log_filter = LogFilter(
        flow_run_id=LogFilterFlowRunId(any_=[run.id]),
        timestamp=LogFilterTimestamp(after_=since),
    )
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            messages = [log.message for log in client.read_logs(log_filter=log_filter)]
            finished = any("Finished in state HandedOff" in m for m in messages)
            if finished or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(3)  # the batch after the last line
        return [log.message for log in client.read_logs(log_filter=log_filter)]


def _after_engine_error(run: Any) -> datetime:
    """Just after the last log line of ``run``'s failed first attempt. The engine logs
    "Engine execution exited with unexpected exception" after it set the run's FAILED
    state, so the line can reach the API after the test saw FAILED; the re-run's logs are
    read from this instant on."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(log_filter=log_filter)
            if any("Engine execution exited" in log.message for log in logs):
                break
            assert time.monotonic() < deadline, [log.message for log in logs]
            time.sleep(0.5)
        time.sleep(2)  # the batch after the engine's last line
        logs = client.read_logs(log_filter=log_filter)
    return max(log.timestamp for log in logs) + timedelta(milliseconds=1)


def _handed_off_once(
    served: Served, deployment: str, run: Any, report: str, since: datetime | None = None
) -> None:
    """``run`` ended ``HandedOff``, its body ran once, nothing acquired the resource after
    the recipient, and its logs from ``since`` on have no engine error."""
    assert (run.state.type.value, run.state.name) == ("COMPLETED", "HandedOff"), run.state
    assert run.run_count == 2
    assert f"e2e-report/{report}" in (run.state.message or "")
    ran = served.baton(deployment).checkpoints.get(report, "ran")
    assert ran is not None
    assert (ran.version, ran.state) == (1, {"run_count": 1})  # the retry did not run the body
    admin = Baton(ledger_url=served.ledger_url, org=served.org, principal="admin", role="owner")
    rows = admin.leases.list(resource_type="e2e-report", owner="*", include_ended=True)
    generations = sorted((g.epoch, g.status) for g in rows if g.resource_id == report)
    assert generations == [(1, "transferred"), (2, "released")]
    messages = _logs_until_handed_off(run, since)
    assert any("Finished in state HandedOff" in m for m in messages)
    assert not any("Engine execution exited with unexpected exception" in m for m in messages)


def test_retry_after_a_handoff_ends_handed_off_without_an_engine_error(served: Served) -> None:
    """Prefect retries the run that handed its lease off and failed, in the same process:
    it ends ``HandedOff`` and its logs have no "Engine execution exited with unexpected
    exception" carrying the failed attempt's traceback."""
    run = wait_for_run(_start(served, FLAKY, report="q6").id, timeout_seconds=RUN_TIMEOUT)
    _handed_off_once(served, FLAKY, run, "q6")


def test_rerun_in_a_new_process_after_a_handoff_ends_handed_off(served: Served) -> None:
    """The run that handed its lease off and failed is re-run (as the UI's Retry does): the
    runner starts it in a new process (run count 2), which finds the lease transferred in
    the ledger and ends ``HandedOff`` without acquiring the resource or running the body."""
    from prefect.client.orchestration import get_client
    from prefect.states import AwaitingRetry

    first = wait_for_run(_start(served, RERUN, report="q7").id, timeout_seconds=RUN_TIMEOUT)
    assert first.state.type.value == "FAILED", first.state
    since = _after_engine_error(first)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(first.id, AwaitingRetry(), force=True)
    again = wait_for_run(first.id, timeout_seconds=RUN_TIMEOUT)
    _handed_off_once(served, RERUN, again, "q7", since)
