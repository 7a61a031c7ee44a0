"""An Automation that starts a deployment whenever prefect-baton records a handoff.

Every ledger event is mirrored as a Prefect event (``prefect-baton.handoff.created`` for a
new handoff, with the handoff id in the payload and the resource labels). This Automation
reacts to it with a ``RunDeployment`` action, passing the handoff id as the ``handoff_id``
parameter, so the recipient's deployment runs without the sender starting it.

``create_handoff_automation(deployment_id, to_principal=...)`` creates it; run this file
(``python examples/prefect_automation.py``) to serve a recipient deployment, create the
Automation, record a handoff from a flow run and watch the recipient run start and accept
it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from typing import Any
from uuid import UUID

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow
from prefect.automations import Automation
from prefect.events.actions import RunDeployment
from prefect.events.schemas.automations import EventTrigger, Posture

from prefect_baton import Baton
from prefect_baton.prefect import accept_handoff, handoff_to, prefect_api, serving, wait_for_run


def create_handoff_automation(
    deployment_id: UUID, *, to_principal: str | None = None, name: str | None = None
) -> Automation:
    """Create an Automation: on ``prefect-baton.handoff.created`` (to ``to_principal``, or
    to anyone) run ``deployment_id`` with ``handoff_id`` and ``principal`` (the recipient)
    from the event payload."""
    match: dict[str, Any] = {"prefect.resource.id": "prefect-baton.handoff.*"}
    if to_principal is not None:
        match["prefect-baton.to-principal"] = to_principal
    return Automation(
        name=name or f"baton-handoff-to-{to_principal or 'anyone'}",
        trigger=EventTrigger(
            expect={"prefect-baton.handoff.created"},
            match=match,
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            RunDeployment(
                source="selected",
                deployment_id=deployment_id,
                parameters={
                    "handoff_id": "{{ event.payload.handoff_id }}",
                    "principal": "{{ event.payload.to_principal }}",
                },
            )
        ],
    ).create()


@flow(name="baton-example-inbox")
def inbox(handoff_id: str | None = None, principal: str | None = None) -> str | None:
    """The recipient: accepts the handoff it was started for, as ``principal`` (default: the
    run's principal, its deployment name), and returns the handoff's status."""
    if handoff_id is None:
        return None
    with accept_handoff(handoff_id, principal=principal) as h:
        return h.status


@flow(name="baton-example-outbox")
def outbox(to_principal: str) -> str:
    """Record a handoff (no deployment named: the Automation starts the recipient)."""
    sent = handoff_to(to_principal, "ticket-42", message="please triage")
    return sent.handoff_id


def main() -> dict[str, Any]:
    """Serve ``inbox``, create the Automation, hand off, wait for the started run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    to = f"triage-{uuid.uuid4().hex[:6]}"
    with prefect_api(), serving(inbox.to_deployment(name="inbox")):
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name("baton-example-inbox/inbox")
        automation = create_handoff_automation(dep.id, to_principal=to)
        handoff_id = outbox(to)
        runs: list[Any] = []
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                runs = [
                    r
                    for r in client.read_flow_runs(
                        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
                    )
                    if r.parameters.get("handoff_id") == handoff_id
                ]
                if runs:
                    break
                time.sleep(0.5)
        automation.delete()
        finished = [wait_for_run(r.id, timeout_seconds=120) for r in runs]
    return {
        "handoff_id": handoff_id,
        "recipient_runs": [str(r.id) for r in runs],
        "recipient_states": [r.state.type.value if r.state else None for r in finished],
        "ledger": Baton.from_settings(principal=to).handoffs.get(handoff_id).status,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
