"""Added wall time per task run: ``@leased`` vs Prefect's own ``concurrency()``.

One flow run executes, in turn, N plain ``@task`` runs, N ``@task`` runs under ``@leased``
(SQLite ledger, one lease acquired and released per run) and N ``@task`` runs whose body
takes a slot of a Prefect global concurrency limit with ``concurrency()``. Each call is timed
from the flow; the *added* time of a variant is its median minus the plain task's median.

Usage: ``python benchmarks/prefect_overhead.py [--tasks 200] [--json-only]`` (on
``PREFECT_API_URL``, or Prefect's embedded server started for the run). Prints a table, then
one JSON object with the figures and the ratio ``leased_added / concurrency_added``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from prefect import flow, task
from prefect.concurrency.sync import concurrency

from prefect_baton import Baton
from prefect_baton.prefect import leased, prefect_api

LIMIT_NAME = f"baton-bench-{uuid.uuid4().hex[:6]}"


def _timed(call: Callable[[int], Any], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t0)
    return out


def run(n: int) -> dict[str, Any]:
    """Run the three variants ``n`` times each inside one flow run; return the figures."""
    ledger = os.path.join(tempfile.mkdtemp(prefix="baton-bench-"), "ledger.db")
    base = Baton(ledger_url=f"sqlite:///{ledger}", org="bench", principal="bench")

    @task
    def plain(i: int) -> int:
        return i

    @task
    @leased("bench", "{i}", ttl_seconds=60, baton=lambda p: base.as_principal(p))
    def with_lease(i: int) -> int:
        return i

    @task
    def with_concurrency(i: int) -> int:
        with concurrency(LIMIT_NAME, occupy=1):
            return i

    @flow(name="baton-bench-overhead")
    def bench() -> dict[str, list[float]]:
        for warm in (plain, with_lease, with_concurrency):  # warm caches and connections
            warm(-1)
        return {
            "plain": _timed(plain, n),
            "leased": _timed(with_lease, n),
            "concurrency": _timed(with_concurrency, n),
        }

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=LIMIT_NAME, limit=10)
        )
    try:
        samples = bench()
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(LIMIT_NAME)
    s = samples
    med = {k: statistics.median(v) * 1000 for k, v in s.items()}
    leased_added = med["leased"] - med["plain"]
    conc_added = med["concurrency"] - med["plain"]
    return {
        "tasks_per_variant": n,
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "p90_ms": {
            k: round(statistics.quantiles(v, n=10)[-1] * 1000, 2) for k, v in samples.items()
        },
        "added_ms": {"leased": round(leased_added, 2), "concurrency": round(conc_added, 2)},
        "ratio_leased_to_concurrency": round(leased_added / conc_added, 4) if conc_added else None,
        "target_ratio_max": 0.1,
        "ledger": "sqlite",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    """Parse arguments, run, print the table and the JSON."""
    p = argparse.ArgumentParser(description="@leased overhead vs Prefect concurrency()")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--json-only", action="store_true")
    a = p.parse_args()
    with prefect_api():
        res = run(a.tasks)
    if not a.json_only:
        print(f"{'variant':<14}{'median ms':>12}{'p90 ms':>10}{'added ms':>10}")
        for k in ("plain", "leased", "concurrency"):
            added = res["added_ms"].get(k, 0.0)
            print(f"{k:<14}{res['median_ms'][k]:>12.2f}{res['p90_ms'][k]:>10.2f}{added:>10.2f}")
        print(f"ratio leased/concurrency added time: {res['ratio_leased_to_concurrency']}")
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
