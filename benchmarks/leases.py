"""Lease benchmarks (issue #3): prefect-baton on Redis against plain Redis locks and the SQL
ledgers, in one run, reported as a table and one JSON object with ratios.

Sections (``--only`` picks some):

* ``pairs``: uncontended acquire+release, one client, sequential, rounds interleaved: the
  floor (``SET NX PX`` + a Lua compare-and-delete), redis-py ``Lock``, python-redis-lock,
  pottery ``Redlock`` with one master, prefect-baton on Redis (``ack="redis"`` with the
  journal drained by a ``run_reconciler`` process, ``ack="redis"`` drained by the client's
  own thread, ``ack="redis"`` drained only after the timing, the same with every acquire
  under an execution key of its own (``keyed``: the receipt path), ``ack="ledger"``),
  prefect-baton on the SQLite ledger and on PostgreSQL.
* ``many``: ``acquire_many`` of 100 resources against the floor's acquire (``SET NX PX``),
  per lease.
* ``concurrent``: 16 client processes on 100 resources for a fixed time: throughput, and
  from the ledger afterwards the audit (no overlapping holdings) and the reconciler's largest
  lag during the run; with the ledger on SQLite and on PostgreSQL.
* ``scale``: acquire+release latency with 1,000 / 100,000 / 1,000,000 active leases.
* ``scoped``: scoped acquire+release with 10 / 10,000 active scoped leases, against unscoped.
* ``drain``: reconciler drain rate into SQLite and PostgreSQL.

Usage::

    python benchmarks/leases.py [--redis-url redis://127.0.0.1:6379/12] \\
        [--pg-url postgresql://postgres@127.0.0.1:5432/test] [--pairs 3000] [--rounds 3] \\
        [--scale 1000,100000,1000000] [--seconds 10] [--only pairs,many,...]

Everything runs against loopback servers only. The Redis database given is flushed first.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from prefect_baton import Baton, BatonError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.base import DEFAULT_MAX_LAG_ENTRIES
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton._stores.redis.reconciler import Reconciler
from prefect_baton.audit import audit_ledger

CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
RESOURCES = 100
TMP = tempfile.mkdtemp(prefix="baton-bench-")


def _org() -> str:
    return f"bench-{uuid.uuid4().hex[:10]}"


def _sqlite_url(name: str) -> str:
    return f"sqlite:///{os.path.join(TMP, name + '.db')}"


# --------------------------------------------------------------------------- variants


class Variant:
    """One way of taking and dropping a lock: ``pair(i)`` acquires and releases resource
    ``i % 100`` once; ``close()`` tidies up."""

    name = ""

    def pair(self, i: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the variant holds open."""


class Floor(Variant):
    name = "floor: SET NX PX + Lua compare-and-delete"

    def __init__(self, url: str) -> None:
        self.r = connect(url)
        self.cad = self.r.register_script(CAD)

    def acquire(self, key: str) -> str:
        token = uuid.uuid4().hex
        if not self.r.set(key, token, nx=True, px=30_000):
            raise RuntimeError("floor: taken")
        return token

    def pair(self, i: int) -> None:
        key = f"floor:{i % RESOURCES}"
        self.cad(keys=[key], args=[self.acquire(key)])


class RedisPyLock(Variant):
    name = "redis-py Lock"

    def __init__(self, url: str) -> None:
        self.r = connect(url)

    def pair(self, i: int) -> None:
        lock = self.r.lock(f"rpl:{i % RESOURCES}", timeout=30)
        if not lock.acquire(blocking=False):
            raise RuntimeError("taken")
        lock.release()


class PythonRedisLock(Variant):
    name = "python-redis-lock"

    def __init__(self, url: str) -> None:
        import redis_lock

        self.mod = redis_lock
        self.r = connect(url)

    def pair(self, i: int) -> None:
        lock = self.mod.Lock(self.r, f"prl:{i % RESOURCES}", expire=30)
        if not lock.acquire(blocking=False):
            raise RuntimeError("taken")
        lock.release()


class PotteryRedlock(Variant):
    name = "pottery Redlock (one master)"

    def __init__(self, url: str) -> None:
        from pottery import Redlock

        self.cls = Redlock
        self.r = connect(url)

    def pair(self, i: int) -> None:
        lock = self.cls(key=f"pot:{i % RESOURCES}", masters={self.r}, auto_release_time=30)
        if not lock.acquire(blocking=False):
            raise RuntimeError("taken")
        lock.release()


class BatonVariant(Variant):
    """Acquire+release pairs of one client; ``keyed``: each acquire under an execution key
    of its own (the receipt path: a receipt looked up, missed, and stored)."""

    def __init__(
        self,
        name: str,
        baton: Baton,
        closers: list[Callable[[], None]],
        *,
        keyed: bool = False,
    ) -> None:
        self.name = name
        self.b = baton
        self.closers = closers
        self.keyed = keyed
        self.done = 0  # pairs made: the next execution key's number

    def pair(self, i: int) -> None:
        self.done += 1
        key = f"k{self.done}" if self.keyed else None
        lease = self.b.leases.acquire(
            "res", f"r{i % RESOURCES}", ttl_seconds=30, idempotency_key=key
        )
        self.b.leases.release(lease)

    def close(self) -> None:
        for c in self.closers:
            c()


def reconciler_process(
    redis_url: str, ledger_url: str, org: str, nice: int = 0
) -> subprocess.Popen[bytes]:
    """A ``run_reconciler(follow=True)`` process draining ``org`` (stopped by its pid), at
    scheduling priority ``nice`` (negative: ahead of the client processes, standing in for a
    reconciler with a CPU of its own; needs root). On PostgreSQL its connection carries the
    application name :func:`_app_name` of ``org``, so that its server process can be found."""
    if ledger_url.startswith("postgres"):
        sep = "&" if "?" in ledger_url else "?"
        ledger_url = f"{ledger_url}{sep}application_name={_app_name(org)}"
    code = (
        "from prefect_baton.reconcile import run_reconciler\n"
        f"run_reconciler({redis_url!r}, {ledger_url!r}, orgs=[{org!r}], follow=True, "
        "interval_seconds=0.05)\n"
    )

    def set_priority() -> None:
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)

    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=set_priority)


def _app_name(org: str) -> str:
    return "rec-" + org


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; ``None``
    elsewhere or when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_seconds(store: LedgerStore, org: str) -> float | None:
    """CPU seconds of the PostgreSQL server process serving the reconciler of ``org``
    (found by its application name; the server runs on this machine), or ``None``."""
    from sqlalchemy import text

    if store.engines.is_sqlite:
        return None
    with store.engines.read.connect() as conn:
        pid = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"),
            {"a": _app_name(org)},
        ).scalar()
    return None if pid is None else _cpu_seconds(int(pid))


def _cpus(pid: int, store: LedgerStore, org: str) -> tuple[float | None, float | None]:
    """CPU seconds so far of the reconciler process ``pid`` and of its database server
    process (``None`` where unknown)."""
    return _cpu_seconds(pid), _server_cpu_seconds(store, org)


def baton_redis(
    redis_url: str,
    ledger_url: str,
    *,
    ack: str,
    drain: str,
    principal: str = "bench",
    keyed: bool = False,
) -> BatonVariant:
    """prefect-baton on Redis; ``drain`` is ``process`` (a reconciler process), ``thread``
    (the client's own drain thread), ``after`` (nothing drains while the variant runs; the
    journal is drained when it closes: the client's cost when the reconciler runs on another
    host) or ``none``."""
    store = LedgerStore(ledger_url)
    auth = RedisAuthority(
        connect(redis_url),
        store,
        ack=ack,
        reconcile_in_client=drain == "thread",
        # with nothing draining, the lag limit would make the client drain: off
        max_lag_entries=0 if drain in ("after", "none") else DEFAULT_MAX_LAG_ENTRIES,
    )
    org = _org()
    b = Baton(org=org, principal=principal, store=store, lease_authority=auth)
    closers: list[Callable[[], None]] = []
    if drain == "process":
        proc = reconciler_process(redis_url, ledger_url, org)
        closers.append(lambda: (proc.terminate(), proc.wait(10)))
    if drain == "after":
        closers.append(lambda: auth.reconciler.drain(org) and None)
    closers += [auth.close, store.close]
    label = f"prefect-baton Redis ack={ack}" + (f" (drain: {drain})" if ack == "redis" else "")
    return BatonVariant(label + (", keyed" if keyed else ""), b, closers, keyed=keyed)


def baton_ledger(name: str, ledger_url: str) -> BatonVariant:
    store = LedgerStore(ledger_url)
    b = Baton(org=_org(), principal="bench", store=store)
    return BatonVariant(name, b, [store.close])


class RawLedgerFloor(Variant):
    """The ledger's durable work for one pair with the database driver directly (``sqlite3``
    or psycopg, no ORM, no decision core): one write transaction for acquire (read the
    resource's newest row, insert the lease row, a transition row and an event row), one for
    release (read the lease row, update it, insert a transition and an event), on the ledger's
    own tables and indexes. SQLite runs in WAL with ``synchronous=NORMAL`` as the product sets
    it, PostgreSQL with its default ``synchronous_commit`` (on)."""

    def __init__(self, name: str, ledger_url: str) -> None:
        self.name = name
        LedgerStore(ledger_url).close()  # the ledger's schema, migrated
        self.org = _org()
        self.sqlite = ledger_url.startswith("sqlite")
        if self.sqlite:
            import sqlite3

            self.conn: Any = sqlite3.connect(ledger_url.removeprefix("sqlite:///"))
            self.conn.isolation_level = None
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.begin, self.ph = "BEGIN IMMEDIATE", "?"
        else:
            import psycopg

            self.conn = psycopg.connect(ledger_url, autocommit=True)
            self.begin, self.ph = "BEGIN", "%s"

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self.ph)

    def _tx(self, steps: Callable[[Any], None]) -> None:
        cur = self.conn.cursor()
        cur.execute(self.begin)
        try:
            steps(cur)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def _history(self, cur: Any, row: tuple[Any, ...], action: str, now: int) -> None:
        lease_id, rid, version, epoch, status, expires = row
        cur.execute(
            self._sql(
                "INSERT INTO baton_lease_transitions (org_id, resource_type, resource_id, "
                "lease_id, action, version, epoch, owner, execution_key, status, at_ms, "
                "expires_at_ms, actor) VALUES (?, 'res', ?, ?, ?, ?, ?, 'bench', NULL, ?, ?, ?, "
                "'bench')"
            ),
            (self.org, rid, lease_id, action, version, epoch, status, now, expires),
        )
        payload = json.dumps(
            {
                "lease_id": lease_id,
                "resource_type": "res",
                "resource_id": rid,
                "owner": "bench",
                "version": version,
                "epoch": epoch,
                "expires_at_ms": expires,
            },
            sort_keys=True,
        )
        cur.execute(
            self._sql(
                "INSERT INTO baton_events (event_id, org_id, kind, principal, subject, payload, "
                "occurred_at_ms) VALUES (?, ?, ?, 'bench', ?, ?, ?)"
            ),
            (f"evt_{uuid.uuid4().hex}", self.org, f"lease.{action}", f"res/{rid}", payload, now),
        )

    def pair(self, i: int) -> None:
        rid = f"r{i % RESOURCES}"
        lease_id = f"lease_{uuid.uuid4().hex}"

        def acquire(cur: Any) -> None:
            cur.execute(
                self._sql(
                    "SELECT lease_id, epoch, status FROM baton_leases WHERE org_id = ? AND "
                    "resource_type = 'res' AND resource_id = ? ORDER BY epoch DESC LIMIT 1"
                ),
                (self.org, rid),
            )
            head = cur.fetchone()
            if head is not None and head[2] == "active":
                raise RuntimeError("raw floor: taken")
            now = int(time.time() * 1000)
            row = (lease_id, rid, 1, (head[1] if head else 0) + 1, "active", now + 30_000)
            cur.execute(
                self._sql(
                    "INSERT INTO baton_leases (lease_id, org_id, resource_type, resource_id, "
                    "owner, execution_key, purpose, scopes, has_scopes, version, epoch, status, "
                    "acquired_at_ms, expires_at_ms, ttl_ms, ended_at_ms, ended_by) VALUES "
                    "(?, ?, 'res', ?, 'bench', NULL, NULL, '[]', 0, ?, ?, ?, ?, ?, 30000, NULL, "
                    "NULL)"
                ),
                (lease_id, self.org, rid, row[2], row[3], row[4], now, row[5]),
            )
            self._history(cur, row, "acquired", now)

        def release(cur: Any) -> None:
            cur.execute(
                self._sql(
                    "SELECT version, epoch, status, expires_at_ms FROM baton_leases "
                    "WHERE lease_id = ?"
                ),
                (lease_id,),
            )
            version, epoch, status, expires = cur.fetchone()
            if status != "active":
                raise RuntimeError("raw floor: not held")
            now = int(time.time() * 1000)
            cur.execute(
                self._sql(
                    "UPDATE baton_leases SET status = 'released', version = ?, "
                    "ended_at_ms = ?, ended_by = 'bench' WHERE lease_id = ?"
                ),
                (version + 1, now, lease_id),
            )
            self._history(
                cur, (lease_id, rid, version + 1, epoch, "released", expires), "released", now
            )

        self._tx(acquire)
        self._tx(release)

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- sections


#: The embedded ledger arms of ``pairs`` and the raw floor (:class:`RawLedgerFloor`) each
#: is measured against, round by round.
RAW_FLOOR_OF = {
    "prefect-baton SQLite ledger": "raw SQLite ledger floor (sqlite3)",
    "prefect-baton PostgreSQL ledger": "raw PostgreSQL ledger floor (psycopg)",
}
#: The issue #16 targets: an embedded ledger pair at least this fraction of its raw floor.
RAW_FLOOR_TARGETS = {"prefect-baton SQLite ledger": 0.3, "prefect-baton PostgreSQL ledger": 0.6}


def section_pairs(args: argparse.Namespace) -> dict[str, Any]:
    """Uncontended acquire+release pairs per second, rounds interleaved, ratios per round."""
    ru, pg = args.redis_url, args.pg_url
    makers: list[Callable[[], Variant]] = [
        lambda: Floor(ru),
        lambda: RedisPyLock(ru),
        lambda: PythonRedisLock(ru),
        lambda: PotteryRedlock(ru),
        lambda: baton_redis(ru, _sqlite_url("pairs-p"), ack="redis", drain="process"),
        lambda: baton_redis(ru, _sqlite_url("pairs-t"), ack="redis", drain="thread"),
        lambda: baton_redis(ru, _sqlite_url("pairs-a"), ack="redis", drain="after"),
        lambda: baton_redis(ru, _sqlite_url("pairs-k"), ack="redis", drain="after", keyed=True),
        lambda: baton_redis(ru, _sqlite_url("pairs-l"), ack="ledger", drain="none"),
        lambda: RawLedgerFloor("raw SQLite ledger floor (sqlite3)", _sqlite_url("pairs-raw")),
        lambda: baton_ledger("prefect-baton SQLite ledger", _sqlite_url("pairs-s")),
    ]
    if pg:
        makers.append(lambda: RawLedgerFloor("raw PostgreSQL ledger floor (psycopg)", pg))
        makers.append(lambda: baton_ledger("prefect-baton PostgreSQL ledger", pg))
    if args.ledger_only:  # the floor, the raw ledger floors and the embedded ledgers
        makers = [makers[0], *makers[-4 if pg else -2 :]]
    variants = [m() for m in makers]
    rates: dict[str, list[float]] = {v.name: [] for v in variants}
    ratios: dict[str, list[float]] = {v.name: [] for v in variants}
    raw_ratios: dict[str, list[float]] = {}  # embedded ledger arms over their raw floor
    try:
        for v in variants:  # warm up: scripts loaded, connections open, org rebuilt
            for i in range(200):
                v.pair(i)
        for _round in range(args.rounds):
            this: dict[str, float] = {}
            for v in variants:
                n = args.pairs if "ledger" not in v.name or "Redis" in v.name else args.pairs // 5
                t0 = time.perf_counter()
                for i in range(n):
                    v.pair(i)
                this[v.name] = n / (time.perf_counter() - t0)
                rates[v.name].append(this[v.name])
            floor = this[variants[0].name]
            for name, rate in this.items():
                ratios[name].append(rate / floor)
                raw = RAW_FLOOR_OF.get(name)
                if raw in this:
                    raw_ratios.setdefault(name, []).append(rate / this[raw])
    finally:
        for v in variants:
            v.close()
    out: dict[str, Any] = {
        name: {
            "pairs_per_s": round(statistics.median(rates[name]), 1),
            "ratio_to_floor": round(statistics.median(ratios[name]), 3),
            "ratio_per_round": [round(x, 3) for x in ratios[name]],
        }
        for name in rates
    }
    for name, values in raw_ratios.items():
        out[name]["ratio_to_raw_floor"] = round(statistics.median(values), 3)
        out[name]["ratio_to_raw_floor_per_round"] = [round(x, 3) for x in values]
    return out


def section_many(args: argparse.Namespace) -> dict[str, Any]:
    """acquire_many of 100 resources vs the floor's SET NX PX, per lease.

    Two prefect-baton arms, interleaved with the floor in every round: ``after`` (nothing
    drains while it runs, the journal is drained at the end: the reconciler runs on other
    CPUs, as in a deployment) and ``process`` (a ``baton reconcile`` process on the same 2
    vCPUs, applying 100 transitions per call to the SQLite ledger while the client runs)."""
    floor = Floor(args.redis_url)
    arms = {
        drain: baton_redis(args.redis_url, _sqlite_url(f"many-{drain}"), ack="redis", drain=drain)
        for drain in ("after", "process")
    }
    batches = max(20, args.pairs // 60)  # 50 batches of 100 (5,000 leases) per round at 3,000
    out: dict[str, list[float]] = {"floor": [], "after": [], "process": []}
    try:
        for v in arms.values():
            v.b.leases.acquire_many([("w", f"x{i}") for i in range(100)], ttl_seconds=10)
        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            for b in range(batches):
                for i in range(100):
                    floor.acquire(f"many:{rnd}:{b}:{i}")
            out["floor"].append(batches * 100 / (time.perf_counter() - t0))
            for drain, v in arms.items():
                t0 = time.perf_counter()
                for b in range(batches):
                    v.b.leases.acquire_many(
                        [("many", f"{drain}:{rnd}:{b}:{i}") for i in range(100)],
                        ttl_seconds=10,
                    )
                out[drain].append(batches * 100 / (time.perf_counter() - t0))
    finally:
        for v in arms.values():
            v.close()
    res: dict[str, Any] = {"floor_acquires_per_s": round(statistics.median(out["floor"]), 1)}
    for drain in arms:
        ratios = [m / f for m, f in zip(out[drain], out["floor"], strict=True)]
        suffix = "" if drain == "after" else "_reconciler_process"
        res["acquire_many_leases_per_s" + suffix] = round(statistics.median(out[drain]), 1)
        res["ratio" + suffix] = round(statistics.median(ratios), 2)
        res["ratio_per_round" + suffix] = [round(x, 2) for x in ratios]
    return res


def _worker(cfg: dict[str, Any], q: Any, go: Any, end_at: Any) -> None:
    """One client process of the concurrent section: once every client is ready, random
    acquire+release until the end."""
    import random

    rng = random.Random(cfg["seed"])
    if cfg["kind"] == "floor":
        f = Floor(cfg["redis_url"])
        f.r.ping()
        q.put("ready")
        go.wait()
        cfg["end"] = end_at.value
        ok = conflicts = 0
        while time.time() < cfg["end"]:
            key = f"conc:{rng.randrange(RESOURCES)}"
            try:
                token = f.acquire(key)
            except RuntimeError:
                conflicts += 1
                continue
            f.cad(keys=[key], args=[token])
            ok += 1
        q.put({"ok": ok, "conflicts": conflicts, "errors": []})
        return
    store = LedgerStore(cfg["ledger_url"])
    auth = RedisAuthority(
        connect(cfg["redis_url"]),
        store,
        ack="redis",
        reconcile_in_client=cfg["drain"] == "thread",
    )
    b = Baton(org=cfg["org"], principal=f"w{cfg['seed']}", store=store, lease_authority=auth)
    b.leases.inspect("res", "r0")
    q.put("ready")
    go.wait()
    cfg["end"] = end_at.value
    ok = conflicts = 0
    errors: list[str] = []
    while time.time() < cfg["end"]:
        try:
            lease = b.leases.acquire("res", f"r{rng.randrange(RESOURCES)}", ttl_seconds=30)
        except BatonError as exc:
            if exc.code == "CONFLICT":
                conflicts += 1
            else:
                errors.append(exc.code)
            continue
        b.leases.release(lease)
        ok += 1
    auth.close()
    store.close()
    q.put({"ok": ok, "conflicts": conflicts, "errors": errors[:5]})


def section_concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """16 processes on 100 resources: pairs/s, audit of the ledger, reconciler lag.

    Each database runs with one ``baton reconcile`` process at the clients' priority
    (``drain="process"``), with that process at ``--reconciler-nice``, and with no reconciler
    process but every client's own drain thread (``drain="thread"``: the default
    configuration, ``ack="redis"`` with ``reconcile_in_client=True``)."""
    setups: list[tuple[str, str | None, int, str]] = [("floor", None, 0, "")]
    dbs: list[tuple[str, str]] = [("sqlite", _sqlite_url("conc"))]
    if args.pg_url:
        dbs.append(("postgresql", args.pg_url))
    for db, url in dbs:
        setups.append((db, url, 0, "process"))
        if args.reconciler_nice:
            fresh = url if db != "sqlite" else _sqlite_url("conc-nice")
            setups.append((db, fresh, args.reconciler_nice, "process"))
        setups.append((db, url if db != "sqlite" else _sqlite_url("conc-thread"), 0, "thread"))
    out: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    for kind, ledger_url, nice, drain in setups:
        org = _org()
        rec_proc = None
        store = None
        rec = None
        if ledger_url is not None:
            store = LedgerStore(ledger_url)
            rec = Reconciler(connect(args.redis_url), store)
            if drain == "process":
                rec_proc = reconciler_process(args.redis_url, ledger_url, org, nice)
        q = ctx.Queue()
        go = ctx.Event()
        end_at = ctx.Value("d", 0.0)
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    {
                        "kind": "floor" if kind == "floor" else "baton",
                        "redis_url": args.redis_url,
                        "ledger_url": ledger_url,
                        "org": org,
                        "seed": i,
                        "drain": drain,
                    },
                    q,
                    go,
                    end_at,
                ),
            )
            for i in range(args.clients)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            assert q.get(timeout=120) == "ready"
        cpu_at_start = (
            None if rec_proc is None or store is None else _cpus(rec_proc.pid, store, org)
        )
        end = time.time() + args.seconds
        end_at.value = end
        go.set()
        max_entries, max_seconds = 0, 0.0
        halves = [0.0, 0.0]  # largest lag (s) in the first and second half of the burst
        while time.time() < end + 0.5:
            if rec is not None:
                lag = rec.lag(org)
                max_entries = max(max_entries, lag.entries)
                max_seconds = max(max_seconds, lag.seconds)
                half = 0 if time.time() < end - args.seconds / 2 else 1
                halves[half] = max(halves[half], lag.seconds)
            time.sleep(0.2)
        results = [q.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        ok = sum(r["ok"] for r in results)
        row: dict[str, Any] = {
            "clients": args.clients,
            "seconds": args.seconds,
            "pairs_per_s": round(ok / args.seconds, 1),
            "conflicts": sum(r["conflicts"] for r in results),
            "errors": [e for r in results for e in r["errors"]],
        }
        if rec is not None and store is not None:
            deadline = time.time() + 60
            while rec.lag(org).entries and time.time() < deadline:
                time.sleep(0.2)
            cpu_at_end = (None, None) if rec_proc is None else _cpus(rec_proc.pid, store, org)
            if rec_proc is not None:
                rec_proc.terminate()
                rec_proc.wait(10)
            rec.drain(org)
            report = audit_ledger(store, org)
            rows, transitions = store.lease_history(org)
            row.update(
                {
                    "audit_ok": report.ok,
                    "violations": report.violations[:5],
                    "generations": len(rows),
                    "transitions": len(transitions),
                    "max_lag_entries": max_entries,
                    "max_lag_seconds": round(max_seconds, 3),
                    "max_lag_seconds_by_half": [round(x, 3) for x in halves],
                }
            )
            # CPU of the reconciler process and of its database server process from the
            # start of the burst to the end of the catch-up, per transition written
            for i, name in enumerate(("reconciler", "db_server")):
                first, last = (cpu_at_start or (None, None))[i], cpu_at_end[i]
                if first is not None and last is not None and transitions:
                    spent = last - first
                    row[f"{name}_cpu_us_per_transition"] = round(1e6 * spent / len(transitions), 1)
            store.close()
        if nice:
            row["reconciler_nice"] = nice
        key = "floor" if kind == "floor" else f"baton_redis_ack_redis_{kind}"
        if drain == "thread":
            row["drain"] = "client threads"
            key += "_client_drain"
        out[key + (f"_reconciler_nice{nice}" if nice else "")] = row
    return out


def _purge(r: redis.Redis, org: str) -> None:
    keys = org_keys(org)
    r.unlink(*keys.base)  # freed in the background: a million-lease hash outlasts a timeout


def _pair_latency_us(b: Baton, n: int, *, scopes: list[str] | None = None) -> float:
    lat = []
    for i in range(n):
        sc = [f"new/{uuid.uuid4().hex[:8]}/**"] if scopes is not None else ()
        t0 = time.perf_counter()
        lease = b.leases.acquire("probe", f"p{i}", ttl_seconds=30, scopes=sc)
        b.leases.release(lease)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e6


def _empty_journal(r: redis.Redis, org: str) -> None:
    """Drop every entry of ``org``'s journal, keeping the (empty) stream: a missing journal
    key reads as lost Redis data, and the next call rebuilds the org from the ledger."""
    r.xtrim(org_keys(org).base.journal, maxlen=0)


def _preload(b: Baton, r: redis.Redis, have: int, want: int, *, scoped: bool) -> None:
    while have < want:
        n = min(1000, want - have)
        items: list[Any] = []
        for i in range(have, have + n):
            if scoped:
                items.append(
                    {"resource_type": "load", "resource_id": f"{i}", "scopes": [f"area/{i}/**"]}
                )
            else:
                items.append(("load", f"{i}"))
        b.leases.acquire_many(items, ttl_seconds=86_400)
        # the preload is not reconciled: the ledger is not measured here
        _empty_journal(r, b.org)
        have += n


def section_scale(args: argparse.Namespace) -> dict[str, Any]:
    """acquire+release latency (median µs) as the number of active leases grows."""
    r = connect(args.redis_url)
    store = LedgerStore(_sqlite_url("scale"))
    auth = RedisAuthority(
        connect(args.redis_url), store, ack="redis", reconcile_in_client=False, max_lag_entries=0
    )
    org = _org()
    loader = Baton(org=org, principal="loader", store=store, lease_authority=auth)
    probe = loader.as_principal("probe")
    out: dict[str, Any] = {}
    have = 0
    try:
        for level in args.scale:
            _preload(loader, r, have, level, scoped=False)
            have = level
            _empty_journal(r, org)
            _pair_latency_us(probe, 200)
            out[str(level)] = {
                "pair_median_us": round(_pair_latency_us(probe, args.latency_pairs), 1),
                "redis_used_memory_mb": round(int(r.info("memory")["used_memory"]) / 2**20, 1),
            }
            _empty_journal(r, org)
    finally:
        _purge(r, org)
        auth.close()
        store.close()
    first, last = str(args.scale[0]), str(args.scale[-1])
    out["ratio_largest_to_smallest"] = round(
        out[last]["pair_median_us"] / out[first]["pair_median_us"], 3
    )
    return out


def section_scoped(args: argparse.Namespace) -> dict[str, Any]:
    """Scoped acquire+release latency with 10 / 10,000 active scoped leases vs unscoped."""
    r = connect(args.redis_url)
    store = LedgerStore(_sqlite_url("scoped"))
    auth = RedisAuthority(
        connect(args.redis_url), store, ack="redis", reconcile_in_client=False, max_lag_entries=0
    )
    org = _org()
    loader = Baton(org=org, principal="loader", store=store, lease_authority=auth)
    probe = loader.as_principal("probe")
    out: dict[str, Any] = {}
    have = 0
    try:
        _pair_latency_us(probe, 200)
        for level in (10, 10_000):
            _preload(loader, r, have, level, scoped=True)
            have = level
            _empty_journal(r, org)
            _pair_latency_us(probe, 200, scopes=[])
            unscoped = _pair_latency_us(probe, args.latency_pairs)
            scoped = _pair_latency_us(probe, args.latency_pairs, scopes=[])
            _empty_journal(r, org)
            out[str(level)] = {
                "unscoped_pair_median_us": round(unscoped, 1),
                "scoped_pair_median_us": round(scoped, 1),
                "ratio_scoped_to_unscoped": round(scoped / unscoped, 3),
            }
    finally:
        _purge(r, org)
        auth.close()
        store.close()
    return out


def section_drain(args: argparse.Namespace) -> dict[str, Any]:
    """Entries per second the reconciler applies to SQLite and PostgreSQL."""
    targets = [("sqlite", _sqlite_url("drain"))]
    if args.pg_url:
        targets.append(("postgresql", args.pg_url))
    out: dict[str, Any] = {}
    for name, url in targets:
        v = baton_redis(args.redis_url, url, ack="redis", drain="none")
        try:
            n = args.drain_entries // 2
            for i in range(n):
                v.pair(i)
            from prefect_baton._stores.redis.authority import RedisAuthority

            assert isinstance(v.b.authority, RedisAuthority)
            rec = v.b.authority.reconciler
            pending = rec.lag(v.b.org).entries
            t0, c0 = time.perf_counter(), time.process_time()
            applied = rec.drain(v.b.org)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            out[name] = {
                "entries": applied,
                "pending_before": pending,
                "entries_per_s": round(applied / dt, 1),
                # CPU of this (the reconciler's) process; the database server's is not in it
                "reconciler_cpu_us_per_entry": round(1e6 * cpu / max(applied, 1), 1),
                "audit_ok": audit_ledger(v.b.store, v.b.org).ok,
            }
        finally:
            v.close()
    return out


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "pairs": section_pairs,
    "many": section_many,
    "concurrent": section_concurrent,
    "scale": section_scale,
    "scoped": section_scoped,
    "drain": section_drain,
}


# --------------------------------------------------------------------------- report


def _targets(res: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = {}
    pairs = res.get("pairs")
    if pairs:
        for name, want in RAW_FLOOR_TARGETS.items():
            if "ratio_to_raw_floor" in pairs.get(name, {}):
                got = pairs[name]["ratio_to_raw_floor"]
                key = name.removeprefix("prefect-baton ").replace(" ", "_").lower()
                t[f"{key}_pair_at_least_{want}x_raw_floor"] = {"value": got, "met": got >= want}
        baton = pairs.get("prefect-baton Redis ack=redis (drain: process)", {})
        t["redis_ack_redis_pair_cost_within_1.25x_floor"] = {
            "value": round(1 / baton["ratio_to_floor"], 3) if baton else None,
            "met": bool(baton) and 1 / baton["ratio_to_floor"] <= 1.25,
        }
        for other in ("python-redis-lock", "pottery Redlock (one master)"):
            if other in pairs and baton:
                t[f"faster_than_{other}"] = {
                    "value": round(baton["pairs_per_s"] / pairs[other]["pairs_per_s"], 3),
                    "met": baton["pairs_per_s"] > pairs[other]["pairs_per_s"],
                }
    if "many" in res:
        for suffix in ("", "_reconciler_process"):
            if "ratio" + suffix in res["many"]:
                t["acquire_many_at_least_5x_floor_per_lease" + suffix] = {
                    "value": res["many"]["ratio" + suffix],
                    "met": res["many"]["ratio" + suffix] >= 5,
                }
    if "scale" in res:
        v = res["scale"]["ratio_largest_to_smallest"]
        t["latency_largest_within_1.2x_smallest"] = {"value": v, "met": v <= 1.2}
    if "scoped" in res and "10000" in res["scoped"]:
        v = res["scoped"]["10000"]["ratio_scoped_to_unscoped"]
        t["scoped_10000_within_2x_unscoped"] = {"value": v, "met": v <= 2}
    if "concurrent" in res:
        for k, row in res["concurrent"].items():
            if "audit_ok" in row:
                t[f"{k}_no_double_holding"] = {"value": row["audit_ok"], "met": row["audit_ok"]}
    if "concurrent" in res and "drain" in res:
        for key, row in res["concurrent"].items():
            db = next((d for d in ("sqlite", "postgresql") if f"_{d}" in key), None)
            if db is None or db not in res["drain"] or "max_lag_seconds" not in row:
                continue
            need = row["pairs_per_s"] * 2
            t["reconciler_keeps_up_" + key.removeprefix("baton_redis_ack_redis_")] = {
                "value": {
                    "drain_entries_per_s": res["drain"][db]["entries_per_s"],
                    "load_entries_per_s": need,
                    "max_lag_entries": row["max_lag_entries"],
                    "max_lag_seconds": row["max_lag_seconds"],
                    "max_lag_seconds_by_half": row.get("max_lag_seconds_by_half"),
                },
                # bounded: under 5 s, and not still growing in the burst's second half
                "met": res["drain"][db]["entries_per_s"] > need
                and row["max_lag_seconds"] < 5.0
                and halves_bounded(row.get("max_lag_seconds_by_half")),
            }
    return t


def halves_bounded(halves: list[float] | None) -> bool:
    """Whether the largest lag of the burst's second half (seconds) is within 1 s or 1.5x of
    the first half's, i.e. the lag is not still growing."""
    if not halves:
        return True
    first, second = halves
    return second <= max(1.0, 1.5 * first)


def _print_table(res: dict[str, Any]) -> None:
    if "pairs" in res:
        print("\nUncontended acquire+release, one client (median of rounds)")
        print(f"{'variant':58s} {'pairs/s':>10s} {'x floor':>8s}")
        for name, row in res["pairs"].items():
            raw = row.get("ratio_to_raw_floor")
            extra = "" if raw is None else f"  {raw:.3f} x raw ledger floor"
            print(f"{name:58s} {row['pairs_per_s']:>10.1f} {row['ratio_to_floor']:>8.3f}{extra}")
    if "many" in res:
        m = res["many"]
        print("\nacquire_many(100) vs floor SET NX PX, leases/s")
        print(
            f"floor {m['floor_acquires_per_s']:.0f}  "
            f"acquire_many (reconciler elsewhere) {m['acquire_many_leases_per_s']:.0f}  "
            f"ratio {m['ratio']}"
        )
        if "ratio_reconciler_process" in m:
            print(
                "acquire_many with a reconciler process on the same CPUs "
                f"{m['acquire_many_leases_per_s_reconciler_process']:.0f}  "
                f"ratio {m['ratio_reconciler_process']}"
            )
    if "concurrent" in res:
        print("\n16 clients on 100 resources")
        for k, row in res["concurrent"].items():
            extra = ""
            if "audit_ok" in row:
                extra = (
                    f" audit_ok={row['audit_ok']} max_lag={row['max_lag_entries']} entries"
                    f"/{row['max_lag_seconds']} s"
                )
            print(
                f"{k:36s} {row['pairs_per_s']:>10.1f} pairs/s conflicts={row['conflicts']}{extra}"
            )
    if "scale" in res:
        print("\nacquire+release median latency vs active leases")
        for k, row in res["scale"].items():
            if isinstance(row, dict):
                print(
                    f"{k:>10s} active: {row['pair_median_us']:>8.1f} us  "
                    f"(Redis {row['redis_used_memory_mb']} MB)"
                )
        print(f"ratio largest/smallest: {res['scale']['ratio_largest_to_smallest']}")
    if "scoped" in res:
        print("\nscoped vs unscoped acquire+release median latency")
        for k, row in res["scoped"].items():
            print(
                f"{k:>7s} scoped leases: unscoped {row['unscoped_pair_median_us']} us, "
                f"scoped {row['scoped_pair_median_us']} us, ratio {row['ratio_scoped_to_unscoped']}"
            )
    if "drain" in res:
        print("\nreconciler drain rate")
        for k, row in res["drain"].items():
            print(f"{k:12s} {row['entries_per_s']:>10.1f} entries/s ({row['entries']} entries)")
    print("\ntargets")
    for k, v in res["targets"].items():
        print(f"  {'met ' if v['met'] else 'MISS'} {k}: {v['value']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print the table and the JSON object; return the results."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL arms")
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--scale", default="1000,100000,1000000")
    ap.add_argument("--latency-pairs", type=int, default=2000)
    ap.add_argument("--drain-entries", type=int, default=20_000)
    ap.add_argument(
        "--reconciler-nice",
        type=int,
        default=-10,
        help="also run the 16-client section with the reconciler process at this priority "
        "(a CPU of its own, as in a deployment); 0 skips that variant",
    )
    ap.add_argument(
        "--ledger-only",
        action="store_true",
        help="pairs: only the floor, the raw ledger floors and the embedded ledgers",
    )
    ap.add_argument("--only", default=",".join(SECTIONS))
    args = ap.parse_args(argv)
    args.scale = [int(x) for x in args.scale.split(",")]
    if args.no_pg:
        args.pg_url = None
    host = redis.Redis.from_url(args.redis_url).connection_pool.connection_kwargs.get("host")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("benchmarks run against loopback servers only")
    connect(args.redis_url).flushdb()
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "redis_server": redis.Redis.from_url(args.redis_url).info("server")["redis_version"],
        "redis_py": redis.__version__,
        "cpus": os.cpu_count(),
        "args": {k: v for k, v in vars(args).items() if k not in ("pg_url",)},
        "loadavg_1min_start": round(os.getloadavg()[0], 2),
    }
    for name in args.only.split(","):
        t0 = time.perf_counter()
        results[name] = SECTIONS[name](args)
        results.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
    results["loadavg_1min_end"] = round(os.getloadavg()[0], 2)
    results["targets"] = _targets(results)
    _print_table(results)
    print("\n" + json.dumps(results, sort_keys=True))
    return results


if __name__ == "__main__":
    main()
