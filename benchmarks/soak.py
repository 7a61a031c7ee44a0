"""Soak test of ``baton serve`` (issue #16, target 5): 16 clients mixing every operation for
``--minutes`` on each ledger arm, with the server's memory sampled throughout.

For each arm (``sqlite``: a temporary SQLite ledger; ``postgresql``: the database of
``--pg-url``; ``redis``: a temporary SQLite ledger with Redis of ``--redis-url`` as the lease
authority) the script starts ``baton serve`` on a free 127.0.0.1 port (stopped by its
process id at the end), makes two bearer keys per client (principals ``c<i>a`` and
``c<i>b`` of a new organization) and starts ``--clients`` client processes, each with one
``Baton(api_url=..., api_key=...)`` per key. Each client repeats one round of:

* ``acquire`` on a resource shared by all clients (``CONFLICT`` when another holds it: the
  one expected error), then ``renew`` and ``release`` of what it got;
* ``acquire`` (with an execution key) of its own resource, ``renew``, ``checkpoint.save``
  fenced by the lease, ``checkpoint.get``, ``outcome.record`` fenced by the lease;
* ``transfer`` of that lease to its second principal, who ``release``\\ s it;
* ``acquire`` again, ``handoff.create`` of the lease and the checkpoint to the second
  principal, ``handoff.resolve`` (accepted) by it, ``release`` of the lease it got;
* ``events.list`` from where it last read.

Every call is timed (per operation: count, p50, p99 in ms); every error other than the
shared acquire's ``CONFLICT`` is counted as an error. The server's resident memory (its
process and every child, from ``/proc``) is sampled every ``--sample-seconds``. At the end:
``baton audit`` of the organization (after ``baton reconcile`` on the Redis arm), RSS at
the end of the warm-up (the first 20 % of the run) and at the end, the growth over the
last 80 %, the largest RSS. Targets: 0 errors, audit clean, RSS growth after warm-up under
10 % and RSS under 300 MB.

Usage::

    python benchmarks/soak.py [--minutes 10] [--clients 16] [--only sqlite,postgresql,redis] \\
        [--pg-url postgresql://postgres@127.0.0.1:5432/baton_soak] \\
        [--redis-url redis://127.0.0.1:6379/14]

Prints progress to stderr and one JSON summary line to stdout. Loopback servers only; the
Redis database given is flushed at the start and at the end of the Redis arm. Not part of
``make test``.
"""

from __future__ import annotations

import argparse
import array
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

import httpx

from rest import Server

ARMS = ("sqlite", "postgresql", "redis")
#: Lease TTL in seconds: long enough that no lease expires within a round however loaded the
#: machine (a round of 30 s TTLs saw calls of 10 to 15 s at p99 on a load average of 30).
TTL = 300
SHARED_RESOURCES = 8
WARMUP_FRACTION = 0.2
TARGET_GROWTH = 0.10
TARGET_RSS_MB = 300.0
#: How long the clients may take to start (spawn, import, two clients each) on a busy machine.
READY_SECONDS = 900


# --------------------------------------------------------------------------- server


def _baton() -> list[str]:
    """The ``baton`` command of this Python's environment."""
    return [os.path.join(os.path.dirname(sys.executable), "baton")]


def _env(redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    if redis_url:
        env["BATON_REDIS_ACK"] = "redis"
    return env


def _rss_mb(pid: int) -> tuple[float, float, int, float]:
    """Resident memory of process ``pid`` and its descendants: total RSS in MB, the largest
    process's RSS in MB, the number of processes, and their total PSS in MB (proportional
    set size: a page shared by n of them counts 1/n in each, so with worker processes
    the total is not inflated by the libraries they share)."""
    tree = _tree(pid)
    sizes = [kb for kb in map(_rss_kb, tree) if kb is not None]
    pss = [kb for kb in map(_pss_kb, tree) if kb is not None]
    return sum(sizes) / 1024, max(sizes, default=0) / 1024, len(sizes), sum(pss) / 1024


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _pss_kb(pid: int) -> int | None:
    return _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")


def _rss_kb(pid: int) -> int | None:
    return _proc_kb(f"/proc/{pid}/status", "VmRSS:")


def _proc_kb(path: str, field: str) -> int | None:
    """The kB value of the line starting with ``field`` in the ``/proc`` file ``path``
    (``None`` when the process is gone or the line is missing)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------- clients


class Client:
    """One client process's two principals (``a`` and ``b``) over the REST API, and its
    per-operation latencies and errors."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from prefect_baton import Baton

        self.i = int(cfg["index"])
        self.a = Baton(api_url=cfg["base_url"], api_key=cfg["secret_a"])
        self.b = Baton(api_url=cfg["base_url"], api_key=cfg["secret_b"])
        self.b_name = cfg["principal_b"]
        self.n = 0
        self.after_seq = 0
        self.lat: dict[str, array.array[float]] = {}
        self.errors: Counter[str] = Counter()
        self.conflicts = 0

    def _call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` timed as operation ``op``; ``None`` (counted as an error) when it
        raised."""
        from prefect_baton import BatonError

        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BatonError as exc:
            self.errors[f"{op} {exc.code}"] += 1
            return None
        except Exception as exc:  # a transport error the client did not map
            self.errors[f"{op} {type(exc).__name__}"] += 1
            return None
        self.lat.setdefault(op, array.array("d")).append(time.perf_counter() - t0)
        return result

    def round(self) -> None:
        """One round of every operation (see the module docstring)."""
        from prefect_baton import ConflictError

        a, b, i = self.a, self.b, self.i
        self.n += 1
        n = self.n
        # contended: a resource shared by every client
        t0 = time.perf_counter()
        try:
            shared = a.leases.acquire("soak", f"shared-{n % SHARED_RESOURCES}", ttl_seconds=TTL)
        except ConflictError:
            self.conflicts += 1
            self.lat.setdefault("acquire", array.array("d")).append(time.perf_counter() - t0)
            shared = None
        except Exception as exc:
            self.errors[f"acquire {getattr(exc, 'code', type(exc).__name__)}"] += 1
            shared = None
        else:
            self.lat.setdefault("acquire", array.array("d")).append(time.perf_counter() - t0)
        if shared is not None:
            renewed = self._call("renew", a.leases.renew, shared, ttl_seconds=TTL)
            self._call("release", a.leases.release, renewed or shared)
        # own resource: lease, renew, fenced checkpoint and outcome
        own = f"own-{i}"
        lease = self._call(
            "acquire", a.leases.acquire, "soak", own, ttl_seconds=TTL, idempotency_key=f"x{n}"
        )
        if lease is None:
            return
        lease = self._call("renew", a.leases.renew, lease, ttl_seconds=TTL) or lease
        ckpt = self._call(
            "checkpoint.save", a.checkpoints.save, own, "progress", {"n": n}, fence=lease
        )
        self._call("checkpoint.get", a.checkpoints.get, own, "progress")
        self._call(
            "outcome.record",
            a.outcomes.record,
            f"{own}-{n}",
            "succeeded",
            fence=lease,
            evidence=[{"kind": "log", "uri": f"soak://{own}/{n}"}],
        )
        # transfer to the second principal, who releases it
        moved = self._call(
            "transfer",
            a.leases.transfer,
            lease,
            to_principal=self.b_name,
            new_execution_key=f"t{n}",
            ttl_seconds=TTL,
        )
        if moved is not None:
            self._call("release", b.leases.release, moved)
        # handoff of a new lease and the checkpoint to the second principal
        lease = self._call("acquire", a.leases.acquire, "soak", own, ttl_seconds=TTL)
        if lease is not None:
            handoff = self._call(
                "handoff.create",
                a.handoffs.create,
                self.b_name,
                own,
                checkpoint_id=None if ckpt is None else ckpt.checkpoint_id,
                lease=lease,
                message=f"round {n}",
            )
            if handoff is not None:
                accepted = self._call(
                    "handoff.resolve", b.handoffs.resolve, handoff.handoff_id, "accepted"
                )
                if accepted is not None and accepted.lease is not None:
                    self._call("release", b.leases.release, accepted.lease)
            else:
                self._call("release", a.leases.release, lease)
        events = self._call("events.list", a.events.list, after_seq=self.after_seq, limit=100)
        if events:
            self.after_seq = events[-1].seq

    def report(self) -> dict[str, Any]:
        return {
            "rounds": self.n,
            "conflicts": self.conflicts,
            "errors": dict(self.errors),
            "lat": {op: a.tobytes() for op, a in self.lat.items()},
        }

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _worker(conn: Connection) -> None:
    """One client process: build the client, report ``ready``, wait for ``(start, end)``
    epoch seconds, run rounds until ``end``, report."""
    cfg = conn.recv()
    client = Client(cfg)
    conn.send("ready")
    start, end = conn.recv()
    time.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        client.round()
    conn.send(client.report())
    client.close()


# --------------------------------------------------------------------------- run


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _audit(ledger_url: str, redis_url: str | None, org: str) -> dict[str, Any]:
    """``baton reconcile`` (Redis arm) then ``baton audit`` of ``org``: exit status and
    output."""
    base = [*_baton(), "--ledger-url", ledger_url, "--org", org, "--principal", "soak"]
    out: dict[str, Any] = {}
    if redis_url:
        r = subprocess.run(
            [*base, "--redis-url", redis_url, "reconcile"],
            capture_output=True,
            text=True,
            env=_env(redis_url),
            timeout=600,
        )
        out["reconcile_exit"] = r.returncode
    r = subprocess.run(
        [*base, "--format", "json", "audit"],
        capture_output=True,
        text=True,
        env=_env(None),
        timeout=600,
    )
    out["audit_exit"] = r.returncode
    out["audit_output"] = (r.stdout + r.stderr).strip()[-2000:]
    return out


def run_arm(arm: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """One arm: server, keys, clients for ``--minutes``, RSS samples, audit."""
    from prefect_baton.rest.keys import create_key

    redis_url = args.redis_url if arm == "redis" else None
    ledger_url = (
        args.pg_url if arm == "postgresql" else f"sqlite:///{os.path.join(tmp, arm + '.db')}"
    )
    if redis_url:
        import redis

        redis.Redis.from_url(redis_url).flushdb()
    org = f"soak-{arm}-{uuid.uuid4().hex[:8]}"
    cfgs = []
    for i in range(args.clients):
        cfgs.append(
            {
                "index": i,
                "secret_a": create_key(ledger_url, org=org, principal=f"c{i}a")[0],
                "secret_b": create_key(ledger_url, org=org, principal=f"c{i}b")[0],
                "principal_b": f"c{i}b",
            }
        )
    server = Server(ledger_url, redis_url, os.path.join(tmp, f"{arm}.log"), baton_serve=True)
    ctx = mp.get_context("spawn")
    conns: list[Connection] = []
    procs = []
    reports: list[dict[str, Any]] = []
    samples: list[tuple[float, float, float, int]] = []  # (s since start, total, max, procs)
    try:
        for cfg in cfgs:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            parent.send({**cfg, "base_url": server.base_url})
            conns.append(parent)
            procs.append(p)
        ready_by = time.time() + READY_SECONDS
        for conn in conns:
            if not conn.poll(max(0.0, ready_by - time.time())) or conn.recv() != "ready":
                raise RuntimeError(f"a client did not get ready within {READY_SECONDS} s")
        seconds = args.minutes * 60
        start = time.time() + 0.5
        end = start + seconds
        for conn in conns:
            conn.send((start, end))
        time.sleep(max(0.0, start - time.time()))
        next_print = start + 60
        while time.time() < end:
            total, largest, nproc, pss = _rss_mb(server.proc.pid)
            samples.append((time.time() - start, total, largest, nproc, pss))
            if time.time() >= next_print:
                print(
                    f"{arm}: {(time.time() - start) / 60:.1f} min, server RSS {total:.1f} MB "
                    f"({nproc} processes)",
                    file=sys.stderr,
                    flush=True,
                )
                next_print += 60
            time.sleep(min(args.sample_seconds, max(0.0, end - time.time())))
        total, largest, nproc, pss = _rss_mb(server.proc.pid)
        samples.append((time.time() - start, total, largest, nproc, pss))
        for conn in conns:
            if not conn.poll(300):
                raise RuntimeError("a client did not report")
            reports.append(conn.recv())
    finally:
        for p in procs:  # after a failure, at once; else once each has reported
            p.join(30 if len(reports) == len(procs) else 0)
            if p.is_alive():
                p.terminate()
                p.join(10)
        server.stop()
    audit = _audit(ledger_url, redis_url, org)
    if redis_url:
        import redis

        redis.Redis.from_url(redis_url).flushdb()
    return _summarise_arm(arm, args, reports, samples, audit)


def _summarise_arm(
    arm: str,
    args: argparse.Namespace,
    reports: list[dict[str, Any]],
    samples: list[tuple[float, float, float, int, float]],
    audit: dict[str, Any],
) -> dict[str, Any]:
    seconds = args.minutes * 60
    lat: dict[str, list[float]] = {}
    errors: Counter[str] = Counter()
    for r in reports:
        errors.update(r["errors"])
        for op, raw in r["lat"].items():
            a = array.array("d")
            a.frombytes(raw)
            lat.setdefault(op, []).extend(a)
    ops = {}
    for op in sorted(lat):
        values = sorted(lat[op])
        ops[op] = {
            "count": len(values),
            "per_s": round(len(values) / seconds, 1),
            "p50_ms": round(_quantile(values, 0.50) * 1e3, 2),
            "p99_ms": round(_quantile(values, 0.99) * 1e3, 2),
        }
    warm = WARMUP_FRACTION * seconds

    def around(t: float) -> float:
        """Median total RSS of the samples within 5 % of the run (at least one sampling
        interval) around ``t`` s; the nearest sample if none is."""
        width = max(0.05 * seconds, args.sample_seconds)
        near = [s[1] for s in samples if abs(s[0] - t) <= width]
        if not near:
            near = [min(samples, key=lambda s: abs(s[0] - t))[1]]
        return statistics.median(near)

    rss_warm, rss_end = around(warm), around(seconds)
    growth = rss_end / rss_warm - 1
    rss_max = max(s[1] for s in samples)
    audit_clean = audit["audit_exit"] == 0 and audit.get("reconcile_exit", 0) == 0
    n_errors = sum(errors.values())
    return {
        "arm": arm,
        "minutes": args.minutes,
        "clients": args.clients,
        "rounds": sum(r["rounds"] for r in reports),
        "expected_conflicts": sum(r["conflicts"] for r in reports),
        "errors": n_errors,
        "errors_by_operation": dict(errors),
        "audit": audit,
        "rss_mb": {
            "after_warmup": round(rss_warm, 1),
            "end": round(rss_end, 1),
            "max": round(rss_max, 1),
            "largest_process_max": round(max((s[2] for s in samples), default=0.0), 1),
            "processes": max((s[3] for s in samples), default=0),
            "pss_max": round(max((s[4] for s in samples), default=0.0), 1),
            "growth_after_warmup": round(growth, 4),
            "samples": [
                [round(t, 1), round(mb, 1)]
                for t, mb, _largest, _n, _pss in samples[:: max(1, len(samples) // 60)]
            ],
        },
        "operations": ops,
        "targets": {
            "no_errors": n_errors == 0,
            "audit_clean": audit_clean,
            f"rss_growth_after_warmup_under_{TARGET_GROWTH:.0%}": growth < TARGET_GROWTH,
            f"rss_under_{TARGET_RSS_MB:.0f}_mb": rss_max < TARGET_RSS_MB,
        },
    }


def _print_arm(res: dict[str, Any]) -> None:
    rss = res["rss_mb"]
    print(
        f"\n{res['arm']}: {res['minutes']} min, {res['clients']} clients, {res['rounds']} rounds, "
        f"{res['errors']} errors, {res['expected_conflicts']} expected conflicts, audit "
        f"{'clean' if res['targets']['audit_clean'] else 'FAILED'}; server RSS "
        f"{rss['after_warmup']} MB after warm-up, {rss['end']} MB at the end "
        f"({rss['growth_after_warmup']:+.1%}), max {rss['max']} MB over {rss['processes']} "
        f"processes (PSS at most {rss['pss_max']} MB)",
        file=sys.stderr,
    )
    print("| operation | calls | per s | p50 ms | p99 ms |", file=sys.stderr)
    print("| --- | ---: | ---: | ---: | ---: |", file=sys.stderr)
    for op, row in res["operations"].items():
        print(
            f"| {op} | {row['count']:,} | {row['per_s']} | {row['p50_ms']} | {row['p99_ms']} |",
            file=sys.stderr,
        )
    if res["errors_by_operation"]:
        print(f"errors: {res['errors_by_operation']}", file=sys.stderr)
    if not res["targets"]["audit_clean"]:
        print(f"audit: {res['audit']}", file=sys.stderr)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (``list[str]``; default ``sys.argv[1:]``), run every arm, print
    progress and tables to stderr and one JSON line to stdout, and return the results.

    Raises:
        SystemExit: an unknown ``--only`` name, a non-positive number, or a non-loopback
            database or Redis URL.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of each arm")
    ap.add_argument("--clients", type=int, default=16, help="client processes")
    ap.add_argument("--only", default=",".join(ARMS), help="sqlite,postgresql,redis")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/baton_soak")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    ap.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling interval")
    args = ap.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    if not args.only or any(x not in ARMS for x in args.only):
        ap.error(f"--only takes a comma-separated subset of {','.join(ARMS)}")
    if args.minutes <= 0 or args.clients < 1 or args.sample_seconds <= 0:
        ap.error("--minutes, --clients and --sample-seconds must be positive")
    for url in (args.pg_url, args.redis_url):
        host = httpx.URL(url.replace("postgresql://", "http://").replace("redis://", "http://"))
        if host.host not in ("127.0.0.1", "localhost", "::1"):
            ap.error(f"loopback servers only: {url}")
    tmp = tempfile.mkdtemp(prefix="baton-soak-")
    results = []
    try:
        for arm in args.only:
            print(f"{arm}: {args.minutes} min, {args.clients} clients", file=sys.stderr)
            res = run_arm(arm, args, tmp)
            _print_arm(res)
            results.append(res)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "args": dict(vars(args)),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1min_end": round(os.getloadavg()[0], 2),
        "arms": results,
        "all_targets_met": all(all(r["targets"].values()) for r in results),
    }
    print(json.dumps(out, sort_keys=True))
    return out


if __name__ == "__main__":
    main()
