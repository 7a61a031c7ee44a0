"""Server cost of one REST acquire+release pair (issue #16, target 2), measured in ways the
machine's load does not move: Python function calls per pair in the server, by package,
and the server's CPU per pair with one sequential client.

The script serves the app (``python -m prefect_baton.rest``, one worker, a temporary SQLite
ledger, a free 127.0.0.1 port) twice, one after the other:

* **calls**: the server process counts every Python function call (``sys.setprofile`` and
  ``threading.setprofile``, installed before uvicorn starts, so every thread is counted)
  while counting is switched on (``SIGUSR1`` on, ``SIGUSR2`` off and write the counts).
  One client does ``--warmup`` pairs (``POST /v1/leases`` + ``DELETE /v1/leases/{id}`` over
  one keep-alive ``httpx.Client``), then ``--pairs`` pairs counted;
* **cpu**: the server without the profile hook; after ``--warmup`` pairs, the user+system
  CPU time of the server process (``/proc``) over ``--cpu-pairs`` pairs, divided by them.

Usage::

    PYTHONPATH=src python benchmarks/rest_calls.py [--pairs 200] [--warmup 50] \\
        [--cpu-pairs 1000]

Prints one JSON object and a table. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from rest import Server, _cpu_seconds  # benchmarks/rest.py (this script's directory)

#: Calls are counted by the package of the called function's file.
PACKAGES = (
    "h11",
    "httptools",
    "uvicorn",
    "fastapi",
    "starlette",
    "anyio",
    "pydantic",
    "sqlalchemy",
    "sqlmodel",
    "prefect_baton",
    "asyncio",
    "logging",
)


def _package(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    for name in reversed(parts[:-1]):
        if name in PACKAGES:
            return name
    stem = parts[-1].rsplit(".", 1)[0]
    return stem if stem in PACKAGES else f"other:{stem}"


def _serve_counted(out_path: str, argv: list[str]) -> None:
    """The server process of the calls phase: the profile hook, then the server."""
    counts: Counter[str] = Counter()
    by_file: dict[str, str] = {}
    on = [False]
    lock = threading.Lock()

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and on[0]:
            filename = frame.f_code.co_filename
            pkg = by_file.get(filename)
            if pkg is None:
                pkg = by_file[filename] = _package(filename)
            with lock:
                counts[pkg] += 1

    def start(_sig: int, _frame: Any) -> None:
        counts.clear()
        on[0] = True

    def stop(_sig: int, _frame: Any) -> None:
        on[0] = False
        with open(out_path + ".tmp", "w") as f:
            json.dump(dict(counts), f)
        os.replace(out_path + ".tmp", out_path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    threading.setprofile(hook)
    sys.setprofile(hook)
    from prefect_baton.rest.__main__ import main

    main(argv)


def _server(ledger_url: str, tmp: str, counted_out: str | None) -> Server:
    """The server of one phase: with ``counted_out``, the counting one (this script with
    ``--serve-counted``), writing its counts there."""
    launcher = None
    if counted_out is not None:
        launcher = [sys.executable, __file__, "--serve-counted", counted_out, "--"]
    log = os.path.join(tmp, f"server-{counted_out is not None}.log")
    return Server(ledger_url, None, log, workers=1, launcher=launcher)


def _pairs(client: Any, n: int, resource: str) -> None:
    body = {"resource_type": "rest", "resource_id": resource, "ttl_seconds": 60}
    for _ in range(n):
        r = client.post("/v1/leases", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"acquire {r.status_code}: {r.text[:200]}")
        r = client.delete(f"/v1/leases/{r.json()['data']['lease_id']}")
        if r.status_code != 200:
            raise RuntimeError(f"release {r.status_code}: {r.text[:200]}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both phases; returns the calls per pair by package and the CPU ms per pair."""
    import httpx

    from prefect_baton.rest.keys import create_key

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="baton-rest-calls-") as tmp:
        ledger_url = f"sqlite:///{os.path.join(tmp, 'ledger.db')}"
        secret = create_key(ledger_url, org="calls", principal="bench")[0]
        headers = {"Authorization": f"Bearer {secret}"}

        counted = os.path.join(tmp, "counts.json")
        server = _server(ledger_url, tmp, counted)
        try:
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as c:
                _pairs(c, args.warmup, "calls")
                server.proc.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                _pairs(c, args.pairs, "calls")
                time.sleep(0.5)
                server.proc.send_signal(signal.SIGUSR2)
                deadline = time.time() + 30
                while not os.path.exists(counted) and time.time() < deadline:
                    time.sleep(0.1)
        finally:
            server.stop()
        with open(counted) as f:
            counts = json.load(f)
        grouped: Counter[str] = Counter()
        others: Counter[str] = Counter()
        for key, n in counts.items():
            grouped[key.split(":", 1)[0]] += n
            if key.startswith("other:"):
                others[key.split(":", 1)[1]] += n
        out["calls_per_pair"] = round(sum(counts.values()) / args.pairs)
        out["calls_per_pair_by_package"] = {
            k: round(v / args.pairs) for k, v in sorted(grouped.items())
        }
        out["other_calls_per_pair_by_module"] = {
            k: round(v / args.pairs) for k, v in others.most_common(12)
        }

        server = _server(ledger_url, tmp, None)
        try:
            with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as c:
                _pairs(c, args.warmup, "cpu")
                cpu0, t0 = _cpu_seconds(server.proc.pid), time.perf_counter()
                _pairs(c, args.cpu_pairs, "cpu")
                cpu1, t1 = _cpu_seconds(server.proc.pid), time.perf_counter()
        finally:
            server.stop()
        out["server_cpu_ms_per_pair"] = round((cpu1 - cpu0) * 1000 / args.cpu_pairs, 3)
        out["pairs_per_second_one_client"] = round(args.cpu_pairs / (t1 - t0), 1)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (``list[str]``; default ``sys.argv[1:]``), run, print the result."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-counted"]:
        _serve_counted(argv[1], argv[3:])
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200, help="pairs counted")
    parser.add_argument("--warmup", type=int, default=50, help="pairs before measuring")
    parser.add_argument("--cpu-pairs", type=int, default=1000, help="pairs timed for CPU")
    args = parser.parse_args(argv)
    res = run(args)
    print(json.dumps(res, sort_keys=True))
    print(f"calls per pair: {res['calls_per_pair']}")
    for pkg, n in sorted(res["calls_per_pair_by_package"].items(), key=lambda kv: -kv[1]):
        print(f"  {pkg:<14} {n:>6}")
    print("  other, by module:")
    for mod, n in res["other_calls_per_pair_by_module"].items():
        print(f"    {mod:<16} {n:>6}")
    print(f"server CPU per pair: {res['server_cpu_ms_per_pair']} ms")
    print(f"pairs/s, one client: {res['pairs_per_second_one_client']}")
    return res


if __name__ == "__main__":
    main()
