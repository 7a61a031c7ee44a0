"""A Prefect task that writes to your own database under a lease, fenced where it lands.

``deploy`` is a ``@task`` under ``@leased("deploy", "{service}")``: inside, it records the
deployed version in *your* table ``deploys``, in a transaction that first calls
``fencing.guard(conn, lease)``. The flow deploys twice; each task run holds its own lease
generation, so the second holds a higher epoch (fencing token). Then the first run's lease
writes again, as a run that was paused (a GC pause, a suspended VM) and wakes up after the
next holder wrote: the guard refuses it with ``STALE_FENCE`` and the table keeps the newer
version. Without the guard that late write would silently roll the deployment back.

Run it with ``python examples/prefect_fencing.py`` (on ``PREFECT_API_URL``, or Prefect's
embedded server). The ledger is ``BATON_LEDGER_URL`` (default ``./.baton/ledger.db``); your
database is ``APP_DATABASE_URL`` (default: a SQLite file in a new temporary directory).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from typing import Any

# Prefect's temporary server must not send telemetry off this machine (set before
# Prefect is imported; an explicit setting wins).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, task
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, delete, insert

from prefect_baton import Lease
from prefect_baton.fencing import StaleFenceError, ensure_fence_table, guard
from prefect_baton.prefect import current_lease, leased

APP_DATABASE_URL = os.environ.get("APP_DATABASE_URL") or (
    f"sqlite:///{tempfile.mkdtemp(prefix='baton-app-')}/app.db"
)
engine = create_engine(APP_DATABASE_URL)
metadata = MetaData()
deploys = Table(
    "deploys",
    metadata,
    Column("service", String(200), primary_key=True),
    Column("version", String(50), nullable=False),
    Column("epoch", Integer, nullable=False),
)
ensure_fence_table(metadata)  # baton_fences lives beside your tables (and in Alembic)
metadata.create_all(engine)


def record_deploy(fence: Any, service: str, version: str) -> None:
    """Write ``version`` for ``service`` in one transaction, fenced by ``fence``.

    Raises:
        StaleFenceError: a newer holder of ``deploy/<service>`` has written already.
    """
    with engine.begin() as conn:
        guard(conn, fence)  # the check and the write below commit together
        conn.execute(delete(deploys).where(deploys.c.service == service))
        conn.execute(insert(deploys).values(service=service, version=version, epoch=fence.epoch))


@task
@leased("deploy", "{service}", ttl_seconds=60, purpose="roll out a service")
def deploy(service: str, version: str) -> Lease:
    """Record ``version`` of ``service`` in the app's database, under the lease."""
    held = current_lease()
    assert held is not None
    record_deploy(held, service, version)
    return held.lease


@flow(name="baton-example-fencing")
def release_train(service: str) -> list[Lease]:
    """Deploy two versions, one task run (one lease generation) each."""
    return [deploy(service, "1.4.1"), deploy(service, "1.4.2")]


def current(service: str) -> dict[str, Any]:
    """The row of ``service`` in the app's table."""
    with engine.connect() as conn:
        row = conn.execute(deploys.select().where(deploys.c.service == service)).one()
    return {"version": row.version, "epoch": row.epoch}


def main() -> dict[str, Any]:
    """Run the flow, then replay the first run's write as a late, paused holder."""
    service = f"checkout-{uuid.uuid4().hex[:6]}"
    first, second = release_train(service=service)
    try:
        record_deploy(first, service, "1.4.1")  # the first run wakes up and writes again
        late = "written"
    except StaleFenceError as err:
        late = err.code
    return {
        "epochs": [first.epoch, second.epoch],
        "late_write": late,
        "deployed": current(service),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
