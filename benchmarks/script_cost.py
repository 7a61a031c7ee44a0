"""Redis server cost of a lease operation in instructions, counted by callgrind.

Wall-clock figures on a shared 2-vCPU machine move with the load and with the time a sleeping
process takes to wake; an instruction count does not. This script starts a private
``redis-server`` under ``valgrind --tool=callgrind`` on a free loopback port (stopped by its
process id at the end), warms each variant up, then counts the server's instructions over
``--pairs`` acquire+release pairs (and ``--batches`` ``acquire_many`` calls of 100) with
``callgrind_control`` (zero, run, dump). Everything the server does for the calls is counted:
reading and parsing the commands, the scripts, the replies.

Variants: the floor of benchmarks/leases.py (``SET NX PX`` + a Lua compare-and-delete),
prefect-baton through the function library (``FCALL``) and through the scripts
(``EVALSHA``), the same with every acquire under an execution key of its own (``keyed``: a
receipt looked up, missed and kept), ``acquire_many`` of 100 (both paths) against 100
``SET NX PX``.

Usage::

    python benchmarks/script_cost.py [--pairs 1000] [--batches 20] [--port PORT]

``--port``: the server's loopback port (default: any free one).

Needs ``valgrind`` (``callgrind_control``) and ``redis-server`` on the PATH. Prints a table
and one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import redis
from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect

CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Counted:
    """A ``redis-server`` under callgrind on ``127.0.0.1:<port>``."""

    def __init__(self, workdir: str, port: int = 0) -> None:
        self.port = port or _free_port()
        self.out = os.path.join(workdir, "callgrind.%p.out")
        self.proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={self.out}",
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.workdir = workdir
        deadline = time.monotonic() + 60
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def count(self, run: Callable[[], None]) -> int:
        """Instructions the server ran while ``run()`` ran."""
        pid = str(self.proc.pid)
        subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
        run()
        before = set(glob.glob(os.path.join(self.workdir, "callgrind.*")))
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
        deadline = time.monotonic() + 30
        while True:
            new = set(glob.glob(os.path.join(self.workdir, "callgrind.*"))) - before
            for path in new:
                with open(path) as f:
                    m = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
                if m:
                    return int(m.group(1))
            if time.monotonic() > deadline:
                raise RuntimeError("no callgrind dump")
            time.sleep(0.1)

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="baton-cg-")
    server = Counted(workdir, args.port)
    try:
        r = connect(server.url)
        cad = r.register_script(CAD)

        def floor_pairs(n: int, base: int = 0) -> None:
            for i in range(base, base + n):
                key, token = f"floor:{i % 100}", uuid.uuid4().hex
                r.set(key, token, nx=True, px=30_000)
                cad(keys=[key], args=[token])

        def floor_sets(n: int, tag: str) -> None:
            for i in range(n):
                r.set(f"fs:{tag}:{i}", "x", nx=True, px=30_000)

        store = LedgerStore(f"sqlite:///{os.path.join(workdir, 'ledger.db')}")
        batons: dict[str, Baton] = {}
        for name, functions in (("functions (FCALL)", True), ("scripts (EVALSHA)", False)):
            try:
                auth = RedisAuthority(
                    connect(server.url), store, reconcile_in_client=False, functions=functions
                )
            except TypeError:  # a version before the function library: scripts only
                if functions:
                    continue
                auth = RedisAuthority(connect(server.url), store, reconcile_in_client=False)
            if hasattr(auth, "max_lag_entries"):
                auth.max_lag_entries = 0  # nothing drains here: no lag checks, scripts only
            batons[name] = Baton(
                org=f"cg-{uuid.uuid4().hex[:8]}",
                principal="bench",
                store=store,
                lease_authority=auth,
            )

        keys = iter(range(10**9))  # execution keys of the keyed pairs, never used twice

        def baton_pairs(b: Baton, n: int, keyed: bool = False) -> None:
            for i in range(n):
                key = f"k{next(keys)}" if keyed else None
                lease = b.leases.acquire("res", f"r{i % 100}", ttl_seconds=30, idempotency_key=key)
                b.leases.release(lease)

        def baton_many(b: Baton, n: int, tag: str) -> None:
            for j in range(n):
                b.leases.acquire_many([("m", f"{tag}:{j}:{k}") for k in range(100)], ttl_seconds=30)

        floor_pairs(200, 10_000)
        for b in batons.values():
            baton_pairs(b, 200)
            baton_pairs(b, 200, keyed=True)
            baton_many(b, 2, "warm")
        out: dict[str, float] = {}
        out["floor pair"] = server.count(lambda: floor_pairs(args.pairs)) / args.pairs
        for name, b in batons.items():
            out[f"prefect-baton pair, {name}"] = (
                server.count(lambda b=b: baton_pairs(b, args.pairs)) / args.pairs
            )
            out[f"prefect-baton keyed pair, {name}"] = (
                server.count(lambda b=b: baton_pairs(b, args.pairs, keyed=True)) / args.pairs
            )
        out["floor 100 x SET NX PX"] = (
            server.count(lambda: floor_sets(100 * args.batches, "a")) / args.batches
        )
        for name, b in batons.items():
            out[f"prefect-baton acquire_many(100), {name}"] = (
                server.count(lambda b=b, name=name: baton_many(b, args.batches, name))
                / args.batches
            )
    finally:
        server.stop()
    floor_pair, floor_100 = out["floor pair"], out["floor 100 x SET NX PX"]
    print("\nRedis server instructions (callgrind)")
    print(f"{'variant':58s} {'instructions':>13s} {'x floor':>8s}")
    for name, v in out.items():
        ref = floor_100 if "100" in name else floor_pair
        print(f"{name:58s} {v:13,.0f} {v / ref:8.2f}")
    result = {
        "pairs": args.pairs,
        "batches": args.batches,
        "python": sys.version.split()[0],
        "redis_py": redis.__version__,
        "instructions": {k: round(v) for k, v in out.items()},
    }
    print("\n" + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
