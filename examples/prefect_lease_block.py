"""``with lease(...)`` inside a Prefect task: run identity, a retry that replays its lease,
and a run that ends ``Skipped`` while someone else holds the resource.

``migrate`` is a ``@task(retries=1)`` that holds ``db/<table>`` for a block of its body. The
block acts as the flow (principal ``baton-example-lease-block``) under the task run id, so
when the first attempt fails Prefect's retry replays the very same lease (same ``lease_id``
and epoch). While a database administrator (``dba``) holds the table, the next run does not
wait or fail: ``on_conflict="skip"`` enters the block with ``None`` and the task returns
``block.skip_state``, so the run ends ``Completed(name="Skipped")`` with the reason.

Run it with ``python examples/prefect_lease_block.py`` (on ``PREFECT_API_URL``, or Prefect's
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

from prefect_baton import Baton
from prefect_baton.prefect import current_baton, lease


@task(retries=1, retry_delay_seconds=0)
def migrate(table: str) -> Any:
    """Migrate ``table`` under its lease; the first attempt fails on purpose."""
    block = lease("db", table, ttl_seconds=60, purpose="migrate", on_conflict="skip")
    with block as held:
        if held is None:
            return block.skip_state  # Completed(name="Skipped"), with the reason
        ctx, b = TaskRunContext.get(), current_baton()
        assert ctx is not None
        assert b is not None
        if ctx.task_run.run_count == 1:
            raise RuntimeError("lock wait timeout (transient)")
        b.checkpoints.save(table, "migration", {"done": True}, fence=held)
        return {
            "owner": held.owner,
            "lease_id": held.lease_id,
            "epoch": held.epoch,
            "replayed": held.lease.replayed,
        }


@flow(name="baton-example-lease-block")
def nightly(table: str) -> Any:
    """Migrate one table; returns the task's final state."""
    return migrate(table, return_state=True)


def main() -> dict[str, Any]:
    """Run the flow twice: once free (with a retry), once while ``dba`` holds the table."""
    table = f"orders-{uuid.uuid4().hex[:6]}"
    done = nightly(table)
    with Baton.from_settings(principal="dba").lease("db", table, ttl_seconds=60):
        skipped = nightly(table)
    return {
        "done": {"state": done.name, "result": done.result()},
        "skipped": {"state": skipped.name, "message": skipped.message},
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
