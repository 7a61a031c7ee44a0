"""REST vs in-process benchmark (issue #6): acquire+release pairs per second through the
REST API with 16 concurrent clients, against the same operations through the Python client
in-process, on the SQLite ledger authority and on the Redis authority, in one run.

For each authority the script serves the app with uvicorn in a process of its own
(``python -m prefect_baton.rest``, one worker, on a free 127.0.0.1 port) over a temporary
SQLite ledger, the second time with ``--redis-url`` (``ack="redis"``, the journal drained by
the server's own thread, the default). Then, in every round and for every authority, two
phases of ``--seconds`` each, in alternating order:

* ``rest``: ``--clients`` client processes, one ``httpx.Client`` each (keep-alive, its own
  bearer key), each doing ``POST /v1/leases`` + ``DELETE /v1/leases/{lease_id}`` on a
  resource of its own (uncontended);
* ``inproc``: the same number of processes, one ``Baton`` each (same ledger kind, same
  Redis, ``ack="redis"`` with the client's own drain thread, the default), doing
  ``b.leases.acquire`` + ``b.leases.release`` on a resource of its own.

Clients are processes, not threads: 16 agents are 16 processes in practice, and threads
would put every client's Python work under one GIL, so the in-process arm would be capped at
one core and the comparison would measure the GIL rather than the REST path. The client
processes start once and serve every phase; each phase builds its clients, warms them up,
then all start together. Reported per authority: medians over rounds of pairs/s and of the
per-round p50/p99 latency of a pair, errors, and the REST/in-process ratio taken within each
round.

Usage::

    python benchmarks/rest.py [--seconds 10] [--clients 16] [--rounds 3] \\
        [--redis-url redis://127.0.0.1:6379/13] [--only ledger,redis] [--servers 1]

``--servers N`` runs N server processes of one worker each on ports of their own, client
``i`` talking to server ``i % N``. (Not ``uvicorn --workers N``: uvicorn 0.54's
multi-process mode leaves Nagle's algorithm on for accepted sockets, Kludex/uvicorn#3149,
which adds about 40 ms to every keep-alive request here.)

Loopback servers only. The Redis database given is flushed at the start and at the end.
"""

from __future__ import annotations

import argparse
import array
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from importlib.metadata import version
from multiprocessing.connection import Connection
from typing import Any

import httpx

import redis
from prefect_baton import Baton, BatonError
from prefect_baton.rest.keys import create_key

AUTHORITIES = ("ledger", "redis")
TTL = 60


# --------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m prefect_baton.rest`` (uvicorn, one worker) in a process of its own on a
    free loopback port; :meth:`stop` ends it by its process id."""

    def __init__(
        self, ledger_url: str, redis_url: str | None, log_path: str, *, baton_serve: bool = False
    ) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        if baton_serve:  # the ``baton`` command of this Python's environment
            cmd = [os.path.join(os.path.dirname(sys.executable), "baton")]
            cmd += ["--ledger-url", ledger_url]
            cmd += ["--redis-url", redis_url] if redis_url else []
            cmd += ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "prefect_baton.rest", "--host", "127.0.0.1"]
            cmd += ["--port", str(self.port), "--ledger-url", ledger_url]
            cmd += ["--redis-url", redis_url] if redis_url else []
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        env["BATON_REDIS_ACK"] = "redis"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self._tail()}")
            try:
                if httpx.get(self.base_url + "/openapi.json", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"server did not answer within 60 s: {self._tail()}")
            time.sleep(0.2)

    def _tail(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-2000:].decode("utf-8", "replace")

    def stop(self) -> None:
        """Terminate the server process (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


# --------------------------------------------------------------------------- clients


class RestClient:
    """acquire+release through the REST API with one keep-alive ``httpx.Client``."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.http = httpx.Client(
            base_url=cfg["base_url"],
            headers={"Authorization": f"Bearer {cfg['secret']}"},
            timeout=30,
        )
        self.body = {"resource_type": "rest", "resource_id": cfg["resource"], "ttl_seconds": TTL}

    def pair(self) -> str | None:
        """One acquire+release; ``None`` when both succeeded, else an error label."""
        try:
            r = self.http.post("/v1/leases", json=self.body)
            if r.status_code != 201:
                return f"acquire {r.status_code} {_code(r)}"
            lease_id = r.json()["data"]["lease_id"]
            r = self.http.delete(f"/v1/leases/{lease_id}")
            if r.status_code != 200:
                return f"release {r.status_code} {_code(r)}"
        except httpx.HTTPError as exc:
            return f"transport {type(exc).__name__}"
        return None

    def close(self) -> None:
        """Close the connection."""
        self.http.close()


def _code(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


class InprocClient:
    """acquire+release through :class:`prefect_baton.Baton` in this process."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.b = Baton(
            ledger_url=cfg["ledger_url"],
            org=cfg["org"],
            principal=cfg["principal"],
            redis_url=cfg["redis_url"],
            ack="redis" if cfg["redis_url"] else None,
        )
        self.resource = cfg["resource"]

    def pair(self) -> str | None:
        """One acquire+release; ``None`` when both succeeded, else an error label."""
        try:
            lease = self.b.leases.acquire("inproc", self.resource, ttl_seconds=TTL)
        except BatonError as exc:
            return f"acquire {exc.code}"
        try:
            self.b.leases.release(lease)
        except BatonError as exc:
            return f"release {exc.code}"
        return None

    def close(self) -> None:
        """Close the client (and its drain thread)."""
        self.b.close()


def _worker(conn: Connection) -> None:
    """One client process: per phase, build the client, warm it up, report ``ready``, wait
    for ``(start, end)`` epoch seconds, run pairs from start until end, report the pairs
    completed by ``end``, their latencies and the errors. ``None`` ends the process."""
    while True:
        cfg = conn.recv()
        if cfg is None:
            return
        client: RestClient | InprocClient
        client = RestClient(cfg) if cfg["arm"] == "rest" else InprocClient(cfg)
        for _ in range(3):
            client.pair()
        conn.send("ready")
        start, end = conn.recv()
        time.sleep(max(0.0, start - time.time()))
        ok = 0
        errors: Counter[str] = Counter()
        lat = array.array("d")
        while time.time() < end:
            t0 = time.perf_counter()
            err = client.pair()
            if time.time() > end:
                break  # count only pairs completed within the window
            if err is None:
                lat.append(time.perf_counter() - t0)
                ok += 1
            else:
                errors[err] += 1
        client.close()
        conn.send({"ok": ok, "errors": dict(errors), "lat": lat.tobytes()})


class Pool:
    """``n`` client processes (spawned once), driven phase by phase."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def phase(self, cfgs: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        """Run one phase (``cfgs[i]`` for client ``i``) for ``seconds``; pairs/s, errors,
        p50/p99 latency of a successful pair in ms."""
        for conn, cfg in zip(self.conns, cfgs, strict=True):
            conn.send(cfg)
        for conn in self.conns:
            if not conn.poll(120) or conn.recv() != "ready":
                raise RuntimeError("a client did not get ready")
        start = time.time() + 0.3
        for conn in self.conns:
            conn.send((start, start + seconds))
        results = []
        for conn in self.conns:
            if not conn.poll(seconds + 120):
                raise RuntimeError("a client did not report")
            results.append(conn.recv())
        lat: list[float] = []
        errors: Counter[str] = Counter()
        for r in results:
            a = array.array("d")
            a.frombytes(r["lat"])
            lat.extend(a)
            errors.update(r["errors"])
        lat.sort()
        ok = sum(r["ok"] for r in results)
        return {
            "pairs_per_s": ok / seconds,
            "p50_ms": _quantile(lat, 0.50) * 1e3,
            "p99_ms": _quantile(lat, 0.99) * 1e3,
            "errors": dict(errors),
        }

    def close(self) -> None:
        """End the client processes (by their process ids if they do not exit)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(10)


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# --------------------------------------------------------------------------- run


class Setup:
    """One authority: its temporary SQLite ledger, its REST server, the bearer keys of the
    REST clients, and one org per arm (so the server's drain thread never drains the
    in-process arm's journal)."""

    def __init__(self, authority: str, args: argparse.Namespace, tmp: str) -> None:
        self.authority = authority
        self.ledger_url = f"sqlite:///{os.path.join(tmp, authority + '.db')}"
        self.redis_url = args.redis_url if authority == "redis" else None
        tag = uuid.uuid4().hex[:8]
        self.org = {"rest": f"bench-rest-{tag}", "inproc": f"bench-lib-{tag}"}
        self.secrets = [
            create_key(self.ledger_url, org=self.org["rest"], principal=f"rest-{i}")[0]
            for i in range(args.clients)
        ]
        self.servers = [
            Server(self.ledger_url, self.redis_url, os.path.join(tmp, f"{authority}-{n}.log"))
            for n in range(args.servers)
        ]

    def cfgs(self, arm: str, clients: int) -> list[dict[str, Any]]:
        """The per-client configuration of ``arm`` (``rest`` or ``inproc``)."""
        return [
            {
                "arm": arm,
                "base_url": self.servers[i % len(self.servers)].base_url,
                "secret": self.secrets[i],
                "ledger_url": self.ledger_url,
                "redis_url": self.redis_url,
                "org": self.org[arm],
                "principal": f"{arm}-{i}",
                "resource": f"r{i}",
            }
            for i in range(clients)
        ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All rounds: per round and authority, the two arms in alternating order."""
    tmp = tempfile.mkdtemp(prefix="baton-bench-rest-")
    setups: list[Setup] = []
    pool: Pool | None = None
    per_round: dict[str, dict[str, list[dict[str, Any]]]] = {
        a: {"rest": [], "inproc": []} for a in args.only
    }
    try:
        for authority in args.only:
            setups.append(Setup(authority, args, tmp))
        pool = Pool(args.clients)
        for rnd in range(args.rounds):
            arms = ("rest", "inproc") if rnd % 2 == 0 else ("inproc", "rest")
            for s in setups:
                for arm in arms:
                    row = pool.phase(s.cfgs(arm, args.clients), args.seconds)
                    per_round[s.authority][arm].append(row)
                    print(
                        f"round {rnd + 1} {s.authority:6s} {arm:6s} "
                        f"{row['pairs_per_s']:8.1f} pairs/s  p50 {row['p50_ms']:.2f} ms  "
                        f"p99 {row['p99_ms']:.2f} ms  errors {sum(row['errors'].values())}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if pool is not None:
            pool.close()
        for s in setups:
            for server in s.servers:
                server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return _summarise(per_round)


def _summarise(per_round: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for authority, arms in per_round.items():
        row: dict[str, Any] = {}
        for arm, rounds in arms.items():
            errors: Counter[str] = Counter()
            for r in rounds:
                errors.update(r["errors"])
            row[arm] = {
                "pairs_per_s": round(statistics.median(r["pairs_per_s"] for r in rounds), 1),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in rounds), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in rounds), 2),
                "pairs_per_s_per_round": [round(r["pairs_per_s"], 1) for r in rounds],
                "errors": dict(errors),
            }
        ratios = [
            r["pairs_per_s"] / i["pairs_per_s"] if i["pairs_per_s"] else float("nan")
            for r, i in zip(arms["rest"], arms["inproc"], strict=True)
        ]
        row["ratio_rest_to_inproc"] = round(statistics.median(ratios), 3)
        row["ratio_per_round"] = [round(x, 3) for x in ratios]
        out[authority] = row
    return out


LABEL = {"ledger": "SQLite ledger", "redis": 'Redis `ack="redis"` (ledger SQLite)'}


def _print_table(res: dict[str, Any]) -> None:
    print("| authority | path | pairs/s | p50 ms | p99 ms | errors | REST / in-process |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for authority, row in res["results"].items():
        for arm, name in (("inproc", "in-process `Baton`"), ("rest", "REST (httpx)")):
            a = row[arm]
            ratio = f"{row['ratio_rest_to_inproc']:.3f}" if arm == "rest" else ""
            print(
                f"| {LABEL[authority]} | {name} | {a['pairs_per_s']:,.0f} | {a['p50_ms']:.2f} "
                f"| {a['p99_ms']:.2f} | {sum(a['errors'].values())} | {ratio} |"
            )


def _source() -> dict[str, Any]:
    """Where ``prefect_baton`` was imported from and the git commit of this checkout."""
    import prefect_baton

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"commit": commit, "package": os.path.dirname(prefect_baton.__file__)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (``list[str]``; default ``sys.argv[1:]``), run the benchmark, print a
    markdown table and one JSON line to stdout (progress to stderr) and return the results.

    Raises:
        SystemExit: a non-loopback Redis URL, an unknown ``--only`` name, or bad numbers.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    ap.add_argument("--clients", type=int, default=16, help="client processes per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--only", default=",".join(AUTHORITIES), help="ledger,redis")
    ap.add_argument(
        "--servers", type=int, default=1, help="server processes; client i uses server i %% N"
    )
    args = ap.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    if not args.only or any(x not in AUTHORITIES for x in args.only):
        ap.error(f"--only takes a comma-separated subset of {','.join(AUTHORITIES)}")
    if args.seconds <= 0 or args.clients < 1 or args.rounds < 1 or args.servers < 1:
        ap.error("--seconds, --clients, --rounds and --servers must be positive")
    r: redis.Redis | None = None
    if "redis" in args.only:
        host = redis.Redis.from_url(args.redis_url).connection_pool.connection_kwargs.get("host")
        if host not in ("127.0.0.1", "localhost", "::1"):
            ap.error("benchmarks run against loopback servers only")
        r = redis.Redis.from_url(args.redis_url)
        r.flushdb()
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    source = _source()
    try:
        results = run(args)
    finally:
        if r is not None:
            r.flushdb()
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "concurrency": "processes",
        "server": f"python -m prefect_baton.rest (uvicorn, 1 worker) x {args.servers}",
        "versions": {p: version(p) for p in ("fastapi", "uvicorn", "httpx", "redis")},
        "args": vars(args),
        "prefect_baton": source,
        "seconds_total": round(time.perf_counter() - t0, 1),
        "loadavg_1min": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
        "results": results,
    }
    if r is not None:
        out["redis_server"] = r.info("server")["redis_version"]
    _print_table(out)
    print(json.dumps(out, sort_keys=True))
    return out


if __name__ == "__main__":
    main()
