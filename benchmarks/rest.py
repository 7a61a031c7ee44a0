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

With ``--compare-url URL --compare-key KEY`` a third server, the **seed service** (or any
server of the same ``/v1/leases`` API; ``benchmarks/seed_service.py`` starts one on a loopback
port and prints its URL and key), is measured in the same rounds: a ``rest`` phase whose
clients all present ``KEY`` (each on a resource of its own), and every authority's REST rate
is also reported as a ratio to it, taken within each round (``ratio_rest_to_compare``), with
the p99 of both. ``--clients 1,16`` measures every client count in each round. ``--rest-only``
skips the in-process arms.

Usage::

    python benchmarks/rest.py [--seconds 10] [--clients 16] [--rounds 3] \\
        [--redis-url redis://127.0.0.1:6379/13] [--only ledger,redis] [--servers 1] \\
        [--workers N] [--compare-url URL --compare-key KEY] [--rest-only]

``--workers N`` is passed to ``python -m prefect_baton.rest`` (worker processes of one
server; default: what ``baton serve`` picks). ``--servers N`` runs N such servers on ports of
their own, client ``i`` talking to server ``i % N``.

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
COMPARE = "compare"
TTL = 60
#: Seconds a client process may take to start, warm up or report (a loaded machine).
READY_SECONDS = 900


# --------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m prefect_baton.rest`` (uvicorn, ``workers`` processes; ``None``: its
    default; or ``launcher``, a command taking the same arguments) in a process of its own
    on a free loopback port; :meth:`stop` ends it by its process id."""

    def __init__(
        self,
        ledger_url: str,
        redis_url: str | None,
        log_path: str,
        workers: int | None = None,
        *,
        baton_serve: bool = False,
        launcher: list[str] | None = None,
    ) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        if baton_serve:  # the ``baton`` command of this Python's environment
            cmd = [os.path.join(os.path.dirname(sys.executable), "baton")]
            cmd += ["--ledger-url", ledger_url]
            cmd += ["--redis-url", redis_url] if redis_url else []
            cmd += ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            cmd = launcher or [sys.executable, "-m", "prefect_baton.rest"]
            cmd = [*cmd, "--host", "127.0.0.1"]
            cmd += ["--port", str(self.port), "--ledger-url", ledger_url]
            cmd += ["--redis-url", redis_url] if redis_url else []
        if workers is not None:
            cmd += ["--workers", str(workers)]
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
        self.body = {
            "resource_type": "rest",
            "resource_id": cfg["resource"],
            "ttl_seconds": TTL,
            "purpose": "bench",  # the seed service requires one
        }

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
        cpu0 = time.process_time()
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
        cpu = time.process_time() - cpu0
        client.close()
        conn.send({"ok": ok, "errors": dict(errors), "lat": lat.tobytes(), "cpu": cpu})


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
        """Run one phase (``cfgs[i]`` for client ``i``, the first ``len(cfgs)`` client
        processes) for ``seconds``; pairs/s, errors, p50/p99 latency of a successful pair
        in ms, and the client processes' CPU seconds (user + system) over the phase."""
        conns = self.conns[: len(cfgs)]
        for conn, cfg in zip(conns, cfgs, strict=True):
            conn.send(cfg)
        for conn in conns:
            if not conn.poll(READY_SECONDS) or conn.recv() != "ready":
                raise RuntimeError("a client did not get ready")
        start = time.time() + 0.3
        for conn in conns:
            conn.send((start, start + seconds))
        results = []
        for conn in conns:
            if not conn.poll(seconds + READY_SECONDS):
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
            "client_cpu_s": sum(r["cpu"] for r in results),
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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (Linux
    ``/proc``; 0 for a process that is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, IndexError, ValueError):
            continue
    return total


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# --------------------------------------------------------------------------- run


class Setup:
    """One authority: its temporary SQLite ledger, its REST server, the bearer keys of the
    REST clients, and one org per arm (so the server's drain thread never drains the
    in-process arm's journal). The ``compare`` authority is the server at
    ``--compare-url``: every client presents ``--compare-key``, on a resource of its own."""

    def __init__(self, authority: str, args: argparse.Namespace, tmp: str) -> None:
        self.authority = authority
        tag = uuid.uuid4().hex[:8]
        self.tag = tag
        self.servers: list[Server] = []
        n = max(args.clients)
        self.pids: list[int] = []
        if authority == COMPARE:
            self.pids = [args.compare_pid] if args.compare_pid else []
            self.arms: tuple[str, ...] = ("rest",)
            self.base_urls = [args.compare_url.rstrip("/")]
            self.secrets = [args.compare_key] * n
            self.ledger_url = self.redis_url = None
            self.org = {"rest": "compare"}
            return
        self.arms = ("rest",) if args.rest_only else ("rest", "inproc")
        self.ledger_url = f"sqlite:///{os.path.join(tmp, authority + '.db')}"
        self.redis_url = args.redis_url if authority == "redis" else None
        self.org = {"rest": f"bench-rest-{tag}", "inproc": f"bench-lib-{tag}"}
        self.secrets = [
            create_key(self.ledger_url, org=self.org["rest"], principal=f"rest-{i}")[0]
            for i in range(n)
        ]
        self.servers = [
            Server(
                self.ledger_url,
                self.redis_url,
                os.path.join(tmp, f"{authority}-{k}.log"),
                args.workers,
            )
            for k in range(args.servers)
        ]
        self.base_urls = [server.base_url for server in self.servers]
        self.pids = [server.proc.pid for server in self.servers]

    def cfgs(self, arm: str, clients: int, rnd: int) -> list[dict[str, Any]]:
        """The per-client configuration of ``arm`` (``rest`` or ``inproc``) in round
        ``rnd`` (resources are new in every phase)."""
        return [
            {
                "arm": arm,
                "base_url": self.base_urls[i % len(self.base_urls)],
                "secret": self.secrets[i],
                "ledger_url": self.ledger_url,
                "redis_url": self.redis_url,
                "org": self.org[arm],
                "principal": f"{arm}-{i}",
                "resource": f"{self.tag}-{rnd}-{clients}-r{i}",
            }
            for i in range(clients)
        ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All rounds: per round, client count and authority, the arms in alternating order
    (and the authorities in alternating order too)."""
    tmp = tempfile.mkdtemp(prefix="baton-bench-rest-")
    setups: list[Setup] = []
    pool: Pool | None = None
    names = list(args.only) + ([COMPARE] if args.compare_url else [])
    per_round: dict[int, dict[str, dict[str, list[dict[str, Any]]]]] = {
        n: {a: {"rest": [], "inproc": []} for a in names} for n in args.clients
    }
    try:
        for authority in names:
            setups.append(Setup(authority, args, tmp))
        pool = Pool(max(args.clients))
        for rnd in range(args.rounds):
            order = setups if rnd % 2 == 0 else setups[::-1]
            for n in args.clients:
                for s in order:
                    arms = s.arms if rnd % 2 == 0 else s.arms[::-1]
                    for arm in arms:
                        cpu = sum(_cpu_seconds(p) for p in s.pids)
                        row = pool.phase(s.cfgs(arm, n, rnd), args.seconds)
                        cpu = sum(_cpu_seconds(p) for p in s.pids) - cpu
                        pairs = row["pairs_per_s"] * args.seconds
                        row["server_cpu_ms_per_pair"] = (
                            cpu * 1e3 / pairs if arm == "rest" and s.pids and pairs else None
                        )
                        row["client_cpu_ms_per_pair"] = (
                            row.pop("client_cpu_s") * 1e3 / pairs if pairs else None
                        )
                        per_round[n][s.authority][arm].append(row)
                        print(
                            f"round {rnd + 1} clients {n:3d} {s.authority:7s} {arm:6s} "
                            f"{row['pairs_per_s']:8.1f} pairs/s  p50 {row['p50_ms']:.2f} ms  "
                            f"p99 {row['p99_ms']:.2f} ms  "
                            f"errors {sum(row['errors'].values())}  "
                            f"server CPU/pair {_ms(row['server_cpu_ms_per_pair'])} ms  "
                            f"client CPU/pair {_ms(row['client_cpu_ms_per_pair'])} ms",
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
    return {str(n): _summarise(rows) for n, rows in per_round.items()}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    return [
        x["pairs_per_s"] / y["pairs_per_s"] if y["pairs_per_s"] else float("nan")
        for x, y in zip(a, b, strict=True)
    ]


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _summarise(per_round: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    compare = per_round.get(COMPARE, {}).get("rest")
    for authority, arms in per_round.items():
        row: dict[str, Any] = {}
        for arm, rounds in arms.items():
            if not rounds:
                continue
            errors: Counter[str] = Counter()
            for r in rounds:
                errors.update(r["errors"])
            row[arm] = {
                "pairs_per_s": round(statistics.median(r["pairs_per_s"] for r in rounds), 1),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in rounds), 2),
                "p99_ms": round(statistics.median(r["p99_ms"] for r in rounds), 2),
                "pairs_per_s_per_round": [round(r["pairs_per_s"], 1) for r in rounds],
                "p99_ms_per_round": [round(r["p99_ms"], 2) for r in rounds],
                "server_cpu_ms_per_pair": _median_or_none(
                    [r["server_cpu_ms_per_pair"] for r in rounds]
                ),
                "client_cpu_ms_per_pair": _median_or_none(
                    [r["client_cpu_ms_per_pair"] for r in rounds]
                ),
                "errors": dict(errors),
            }
        if arms["inproc"]:
            ratios = _ratios(arms["rest"], arms["inproc"])
            row["ratio_rest_to_inproc"] = round(statistics.median(ratios), 3)
            row["ratio_per_round"] = [round(x, 3) for x in ratios]
        if compare and authority != COMPARE:
            ratios = _ratios(arms["rest"], compare)
            row["ratio_rest_to_compare"] = round(statistics.median(ratios), 3)
            row["ratio_to_compare_per_round"] = [round(x, 3) for x in ratios]
        out[authority] = row
    return out


LABEL = {
    "ledger": "SQLite ledger",
    "redis": 'Redis `ack="redis"` (ledger SQLite)',
    COMPARE: "compare server",
}


def _print_table(res: dict[str, Any]) -> None:
    print(
        "| clients | authority | path | pairs/s | p50 ms | p99 ms | errors "
        "| server CPU ms/pair | client CPU ms/pair | REST / in-process | REST / compare |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for clients, rows in res["results"].items():
        for authority, row in rows.items():
            for arm, name in (("inproc", "in-process `Baton`"), ("rest", "REST (httpx)")):
                if arm not in row:
                    continue
                a = row[arm]
                inproc = row.get("ratio_rest_to_inproc") if arm == "rest" else None
                compare = row.get("ratio_rest_to_compare") if arm == "rest" else None
                print(
                    f"| {clients} | {LABEL[authority]} | {name} | {a['pairs_per_s']:,.0f} "
                    f"| {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | {sum(a['errors'].values())} "
                    f"| {_ms(a['server_cpu_ms_per_pair'])} | {_ms(a['client_cpu_ms_per_pair'])} "
                    f"| {'' if inproc is None else f'{inproc:.3f}'} "
                    f"| {'' if compare is None else f'{compare:.3f}'} |"
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
    ap.add_argument(
        "--clients", default="16", help="client processes per phase (comma-separated: each)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--only", default=",".join(AUTHORITIES), help="ledger,redis")
    ap.add_argument(
        "--servers", type=int, default=1, help="server processes; client i uses server i %% N"
    )
    ap.add_argument("--workers", type=int, default=None, help="worker processes per server")
    ap.add_argument("--compare-url", default=None, help="a seed-service URL to measure too")
    ap.add_argument("--compare-key", default=None, help="its bearer key")
    ap.add_argument("--compare-pid", type=int, default=None, help="its process id (CPU)")
    ap.add_argument("--rest-only", action="store_true", help="skip the in-process arms")
    args = ap.parse_args(argv)
    try:
        args.clients = [int(x) for x in str(args.clients).split(",") if x.strip()]
    except ValueError:
        ap.error("--clients takes integers, comma-separated")
    if bool(args.compare_url) != bool(args.compare_key):
        ap.error("--compare-url and --compare-key go together")
    if args.compare_url and httpx.URL(args.compare_url).host not in ("127.0.0.1", "localhost"):
        ap.error("benchmarks run against loopback servers only")
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    if not args.only or any(x not in AUTHORITIES for x in args.only):
        ap.error(f"--only takes a comma-separated subset of {','.join(AUTHORITIES)}")
    if args.workers is not None and args.workers < 1:
        ap.error("--workers must be positive")
    if args.seconds <= 0 or min(args.clients, default=0) < 1 or args.rounds < 1 or args.servers < 1:
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
        "server": f"python -m prefect_baton.rest --workers {args.workers or 'default'} "
        f"x {args.servers}",
        "versions": {p: version(p) for p in ("fastapi", "uvicorn", "httpx", "redis")},
        "args": {**vars(args), "compare_key": "[given]" if args.compare_key else None},
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
