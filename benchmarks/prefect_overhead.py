"""Added wall time per task run: ``@leased`` vs Prefect's own ``concurrency()``.

One flow run executes each variant N times:

- ``plain``: a plain ``@task`` run;
- ``leased``: a ``@task`` run under ``@leased`` on the SQLite ledger, configured the default
  way (``BATON_*`` settings, ``baton=None``): one lease acquired and released per run;
- ``leased_block``: the same with ``baton="baton/<block name>"`` (a saved ``BatonBlock``);
- ``leased_redis``: the same on the Redis authority (a ``Baton`` passed as ``baton=``; when
  ``--redis-url`` answers);
- ``concurrency_task``: a ``@task`` run whose body enters ``concurrency()`` on a Prefect
  global concurrency limit (inside a task run Prefect's client retries after the server
  answers 503 to ``increment-with-lease``, which makes this about 2 s); run after the
  others, ``--task-concurrency-calls`` times;
- ``concurrency_bare``: ``with concurrency(...): pass`` in the flow itself, no task run: the
  cost of one bare slot lease, the fair comparison. Measured in a row after the task
  variants (one warm-up call first): the first ``concurrency()`` after a task run takes
  about 2 s, like the one inside a task, and interleaved with task runs every call did.

Each call is timed from the flow, the task variants interleaved (call ``i`` of each, then
``i + 1``) so that the machine's load weighs on all alike; the *added* time of a task
variant is its median minus the plain task's median, and ``concurrency_bare`` is its own
median (nothing to subtract).

Usage: ``python benchmarks/prefect_overhead.py [--tasks 200] [--task-concurrency-calls 50]
[--redis-url URL] [--json-only]`` (on
``PREFECT_API_URL``, or Prefect's embedded server started for the run; the JSON's
``prefect_server`` says which). Prints a table, then
one JSON object with the figures, the ratios ``added / concurrency_bare`` (the targets of
issue #14: at most 1/10 on the SQLite ledger, 1/30 on Redis), ``added / concurrency_task
added``, the added milliseconds against their targets (issue #16: at most 1 ms on the SQLite
ledger, 0.5 ms on Redis) and ``failed_calls``: ``concurrency()`` calls that Prefect's client
gave up on (503 answers on a loaded machine), counted and left out of the timings.
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
from prefect_baton.prefect import BatonBlock, leased, prefect_api

LIMIT_NAME = f"baton-bench-{uuid.uuid4().hex[:6]}"


def _timed(
    variants: dict[str, Callable[[int], Any]], n: int, failed: dict[str, int] | None = None
) -> dict[str, list[float]]:
    """Seconds per call of each variant, interleaved (call ``i`` of every variant, then
    ``i + 1``), so that a change of the machine's load affects every variant alike.

    With ``failed`` a call that raises is counted there (by variant) and not timed: on a
    loaded machine Prefect's client gives up on ``concurrency()`` after the server answered
    503 a few times."""
    out: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(n):
        for name, call in variants.items():
            t0 = time.perf_counter()
            try:
                call(i)
            except Exception:
                if failed is None:
                    raise
                failed[name] = failed.get(name, 0) + 1
                continue
            out[name].append(time.perf_counter() - t0)
    return out


def _redis_answers(url: str | None) -> bool:
    if not url:
        return False
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except Exception:
        return False


def run(n: int, redis_url: str | None = None, n_task_concurrency: int = 50) -> dict[str, Any]:
    """Run the variants ``n`` times each inside one flow run (``concurrency_task``
    ``n_task_concurrency`` times, after the others); return the figures."""
    tmp = tempfile.mkdtemp(prefix="baton-bench-")
    org = f"bench-{uuid.uuid4().hex[:6]}"
    os.environ["BATON_LEDGER_URL"] = f"sqlite:///{tmp}/ledger.db"
    os.environ["BATON_ORG"] = org
    block = f"bench-{uuid.uuid4().hex[:6]}"
    BatonBlock(ledger_url=f"sqlite:///{tmp}/ledger-b.db", org=org).save(block)
    rbase = (
        Baton(
            ledger_url=f"sqlite:///{tmp}/ledger-r.db", org=org, principal="b", redis_url=redis_url
        )
        if _redis_answers(redis_url)
        else None
    )

    @task
    def plain(i: int) -> int:
        return i

    @task
    @leased("bench", "{i}", ttl_seconds=60)
    def with_lease(i: int) -> int:
        return i

    @task
    @leased("bench", "{i}", ttl_seconds=60, baton=f"baton/{block}")
    def with_lease_block(i: int) -> int:
        return i

    @task
    @leased("bench", "{i}", ttl_seconds=60, baton=rbase)
    def with_lease_redis(i: int) -> int:
        return i

    @task
    def with_concurrency(i: int) -> int:
        with concurrency(LIMIT_NAME, occupy=1):
            return i

    def bare_concurrency(i: int) -> int:
        with concurrency(LIMIT_NAME, occupy=1):
            return i

    failed: dict[str, int] = {}

    @flow(name="baton-bench-overhead")
    def bench() -> dict[str, list[float]]:
        variants: dict[str, Any] = {
            "plain": plain,
            "leased": with_lease,
            "leased_block": with_lease_block,
        }
        if rbase is not None:
            variants["leased_redis"] = with_lease_redis
        for warm in variants.values():  # warm caches and connections
            warm(-1)
        samples = _timed(variants, n)
        # Each concurrency() variant alone, in a row: the first bare concurrency() after a
        # task run takes about 2 s (like concurrency() inside a task), the next ones ~45 ms.
        _timed({"warm-up": bare_concurrency}, 1, failed)
        samples.update(_timed({"concurrency_bare": bare_concurrency}, n, failed))
        samples.update(_timed({"concurrency_task": with_concurrency}, n_task_concurrency, failed))
        return samples

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
    added = {k: v - med["plain"] for k, v in med.items() if k not in ("plain", "concurrency_bare")}
    added["concurrency_bare"] = med["concurrency_bare"]  # no task run to subtract
    bare, in_task = added["concurrency_bare"], added["concurrency_task"]
    ours = {k: v for k, v in added.items() if k.startswith("leased")}
    return {
        "tasks_per_variant": n,
        "concurrency_task_calls": n_task_concurrency,
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "p90_ms": {k: round(statistics.quantiles(v, n=10)[-1] * 1000, 2) for k, v in s.items()},
        "added_ms": {k: round(v, 2) for k, v in added.items()},
        "ratio_to_concurrency_bare": {k: round(v / bare, 4) for k, v in ours.items()},
        "ratio_to_concurrency_task": {k: round(v / in_task, 4) for k, v in ours.items()},
        "target_ratio_max": {"leased": 0.1, "leased_block": 0.1, "leased_redis": 1 / 30},
        "target_added_ms_max": {"leased": 1.0, "leased_block": 1.0, "leased_redis": 0.5},
        "failed_calls": failed,
        "redis": rbase is not None,
        "ledger": "sqlite",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    """Parse arguments, run, print the table and the JSON."""
    p = argparse.ArgumentParser(description="@leased overhead vs Prefect concurrency()")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument(
        "--task-concurrency-calls",
        type=int,
        default=50,
        help="calls of the concurrency_task variant (about 2 s each), run after the others",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("BATON_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15"),
        help="Redis for the leased_redis variant (skipped when it does not answer)",
    )
    p.add_argument("--json-only", action="store_true")
    a = p.parse_args()
    # A separate server (PREFECT_API_URL) is how flows run in production; the embedded one
    # runs in this process and its threads compete with the flow's for the GIL.
    server = os.environ.get("PREFECT_API_URL") or "embedded (started in this process)"
    with prefect_api():
        res = run(a.tasks, a.redis_url, a.task_concurrency_calls)
    res["prefect_server"] = server
    if not a.json_only:
        head = f"{'variant':<18}{'median ms':>11}{'p90 ms':>10}{'added ms':>10}"
        print(f"{head}{'/ bare':>9}{'/ in task':>11}")
        for k in res["median_ms"]:
            added = res["added_ms"].get(k, 0.0)
            bare = res["ratio_to_concurrency_bare"].get(k, "")
            in_task = res["ratio_to_concurrency_task"].get(k, "")
            print(
                f"{k:<18}{res['median_ms'][k]:>11.2f}{res['p90_ms'][k]:>10.2f}"
                f"{added:>10.2f}{bare!s:>9}{in_task!s:>11}"
            )
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
