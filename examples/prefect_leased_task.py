"""A Prefect task holding a lease, with retries that replay their own acquire.

``deploy`` is a ``@task(retries=2)`` whose first attempt fails. ``@leased`` acquires the
lease on ``deploy/<service>`` under the task run id (the execution key) and, because a retry
follows, keeps it held across the failure: the retry replays its acquire and gets the very
same lease (same ``lease_id``, same epoch: the fencing token). The task passes the lease as
``fence=`` to its checkpoint, so a stale holder's write would be rejected.

Run it with ``python examples/prefect_leased_task.py`` (on ``PREFECT_API_URL``, or Prefect's
embedded server). The ledger is ``BATON_LEDGER_URL`` (default ``./.baton/ledger.db``).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, task
from prefect.context import TaskRunContext

from prefect_baton.prefect import current_baton, current_lease, leased

attempts: list[dict[str, Any]] = []


@task(retries=2, retry_delay_seconds=0)
@leased("deploy", "{service}", ttl_seconds=60, purpose="roll out a service")
def deploy(service: str, version: str) -> dict[str, Any]:
    """Roll ``version`` out to ``service``; the first attempt fails on purpose."""
    held, b, ctx = current_lease(), current_baton(), TaskRunContext.get()
    assert held is not None
    assert b is not None
    assert ctx is not None
    attempt = {
        "run_count": ctx.task_run.run_count,
        "lease_id": held.lease_id,
        "epoch": held.epoch,
        "replayed": held.lease.replayed,
    }
    attempts.append(attempt)
    if ctx.task_run.run_count == 1:
        raise RuntimeError("registry timed out (transient)")
    b.checkpoints.save(service, "rollout", {"version": version, "done": True}, fence=held)
    return attempt


@flow(name="baton-example-leased-task")
def release_train(service: str = "checkout", version: str = "1.4.2") -> dict[str, Any]:
    """Deploy one service under its lease."""
    return deploy(service, version)


def main() -> dict[str, Any]:
    """Run the flow and return what each attempt saw."""
    final = release_train(service=f"checkout-{uuid.uuid4().hex[:6]}")
    return {"attempts": attempts, "final": final}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
