"""Many processes at once (issue #2 "Inside"): 8 OS processes x 200 random lease operations
on 5 resources; afterwards the ledger history shows no overlapping effective holdings, epochs
that only rise, and every generation a process was handed recorded exactly as handed.

Attempts of one execution (issue #13): lease blocks in separate processes under one
execution key, a SIGKILLed holder, and blocks without a key."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prefect_baton import Baton, BatonError, IdempotencyInFlightError, Lease, StaleFenceError
from prefect_baton._rules.scopes import sets_overlap
from prefect_baton.audit import audit_ledger
from prefect_baton.rest import create_key
from tests.conftest import REDIS_URL, require_redis, rest_baton, store_for

from ._util import wait_until_expired

PROCESSES = 8
OPS = 200
RESOURCES = [f"r{i}" for i in range(5)]
PRINCIPALS = [f"p{i}" for i in range(4)]  # two processes per principal
WORKER = Path(__file__).with_name("_concurrency_worker.py")
NEW_GENERATION = {"acquire", "takeover", "supersede", "transfer"}


def _run_workers(url: str, org: str, tmp_path: Path) -> list[dict[str, Any]]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = []
    for i in range(PROCESSES):
        cfg = {
            "index": i,
            "ledger_url": url,
            "org": org,
            "principal": PRINCIPALS[i % len(PRINCIPALS)],
            "principals": PRINCIPALS,
            "resources": RESOURCES,
            "ops": OPS,
            "seed": 1000 + i,
            "barrier_dir": str(barrier),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < PROCESSES:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            errs = [p.communicate()[1][-2000:] for p in procs]
            pytest.fail(f"a worker did not start: {errs}")
        time.sleep(0.01)
    (barrier / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["sqlite", "postgresql"])
def test_many_processes_keep_lease_invariants(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> None:
    """8 processes x 200 random lease operations leave no overlap and strictly rising epochs."""
    if arm == "sqlite":
        url = f"sqlite:///{tmp_path / 'concurrency.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    org = f"org-{uuid.uuid4().hex[:12]}"
    store = store_for(url)  # creates the schema before the workers start

    results = _run_workers(url, org, tmp_path)

    unexpected = [u for r in results for u in r["unexpected"]]
    assert unexpected == []
    grants = [g for r in results for g in r["grants"]]
    new_grants = [g for g in grants if not g["replayed"]]
    assert len(new_grants) > 50, "the workers barely acquired anything"
    codes: dict[str, int] = defaultdict(int)
    for r in results:
        for code, n in r["codes"].items():
            codes[code] += n
    assert codes["CONFLICT"] > 0, "no contention happened"

    # 1. the audit: no overlapping effective holdings, epochs and versions consistent
    report = audit_ledger(store, org)
    assert report.ok, report.violations
    assert report.generations >= len({g["lease_id"] for g in new_grants})

    rows, transitions = store.lease_history(org)
    by_id = {h.lease_id: h for h in rows}

    # 2. epochs strictly rise per resource, in the order generations were committed
    epochs: dict[str, list[int]] = defaultdict(list)
    all_epochs: dict[str, list[int]] = defaultdict(list)
    for t in transitions:
        all_epochs[t.resource_id].append(t.epoch)
        if t.action in NEW_GENERATION:
            epochs[t.resource_id].append(t.epoch)
    for rid, seq in epochs.items():
        assert all(a < b for a, b in itertools.pairwise(seq)), (rid, seq)
        assert all_epochs[rid] == sorted(all_epochs[rid]), rid
    per_resource: dict[str, list[Any]] = defaultdict(list)
    for h in rows:
        per_resource[h.resource_id].append(h)
    for rid, gens in per_resource.items():
        gens.sort(key=lambda h: (h.acquired_at_ms, h.epoch))
        assert len({h.epoch for h in gens}) == len(gens), rid
        assert sum(h.status == "active" for h in gens) <= 1, rid
        for prev, nxt in itertools.pairwise(gens):
            assert nxt.epoch > prev.epoch, (rid, prev.lease_id, nxt.lease_id)

    # 3. every generation a process was handed is in the ledger as it was handed, and no
    #    fencing token (resource, epoch) was handed to two different generations
    token_owner: dict[tuple[str, int], str] = {}
    for g in grants:
        h = by_id.get(g["lease_id"])
        assert h is not None, g
        assert (h.resource_id, h.epoch, h.owner) == (g["resource_id"], g["epoch"], g["owner"])
        token = (g["resource_id"], g["epoch"])
        assert token_owner.setdefault(token, g["lease_id"]) == g["lease_id"], token

    # 4. write scopes: no two principals' effective leases with overlapping scopes overlap in time
    def span(h: Any) -> tuple[int, int]:
        end = h.expires_at_ms if h.ended_at_ms is None else min(h.expires_at_ms, h.ended_at_ms)
        return h.acquired_at_ms, end

    scoped = [h for h in rows if h.scopes]
    for i, a in enumerate(scoped):
        for b in scoped[i + 1 :]:
            if a.owner == b.owner or a.resource_id == b.resource_id:
                continue
            if not sets_overlap(a.scopes, b.scopes):
                continue
            (a0, a1), (b0, b1) = span(a), span(b)
            assert a1 <= b0 or b1 <= a0, (a.lease_id, b.lease_id, a.scopes, b.scopes)


# ------------------------------------------------------ attempts of one execution, processes

BLOCK_ARMS = ["sqlite", "postgresql", "redis", "rest"]


def _block_arm(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> tuple[dict[str, Any], Baton]:
    """The worker configuration (how to open the arm's client, as ``agent-a`` of a fresh
    org) and a client of the test process on the same arm and identity."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    if arm == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
    else:
        url = str(request.getfixturevalue("sqlite_url"))
    store_for(url)  # creates the schema before the workers start
    if arm == "rest":
        api = str(request.getfixturevalue("rest_api"))
        key, _ = create_key(
            org=org, principal="agent-a", role="agent", engines=store_for(url).engines
        )
        return {"mode": "block", "api_url": api, "api_key": key}, rest_baton(api, url, org)
    cfg: dict[str, Any] = {"mode": "block", "org": org, "principal": "agent-a"}
    cfg["ledger_url"] = url
    if arm == "redis":
        require_redis()
        cfg["redis_url"] = REDIS_URL
        return cfg, Baton(ledger_url=url, redis_url=REDIS_URL, org=org, principal="agent-a")
    return cfg, Baton(org=org, principal="agent-a", store=store_for(url))


def _spawn(cfg: dict[str, Any], barrier: Path, index: int, **extra: Any) -> subprocess.Popen[str]:
    full = {
        **cfg,
        "index": index,
        "barrier_dir": str(barrier),
        "resource_type": "task",
        "resource_id": "A9",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(full)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_files(barrier: Path, pattern: str, n: int, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 120
    while len(list(barrier.glob(pattern))) < n:
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            pytest.fail(
                f"workers stuck before {pattern}: {[p.communicate()[1][-2000:] for p in procs]}"
            )
        time.sleep(0.01)


def _result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-4000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize("arm", BLOCK_ARMS)
def test_ten_processes_under_one_execution_key_run_one_body(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> None:
    """Ten processes entering ``with b.lease(..., idempotency_key="run-123")`` at once run
    one body; the other nine are refused IDEMPOTENCY_IN_FLIGHT while it holds the lease."""
    cfg, b = _block_arm(request, tmp_path, arm)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [_spawn(cfg, barrier, i, ttl_seconds=30, key="run-123") for i in range(10)]
    _wait_files(barrier, "ready-*", 10, procs)
    (barrier / "go").touch()
    deadline = time.monotonic() + 120
    while sum(p.poll() is not None for p in procs) < 9 and time.monotonic() < deadline:
        time.sleep(0.02)
    (barrier / "release").touch()
    results = [_result(p) for p in procs]
    assert sum(r["ran"] for r in results) == 1, results
    assert sorted(str(r["code"]) for r in results) == ["IDEMPOTENCY_IN_FLIGHT"] * 9 + ["None"]
    assert [r["receipt"] for r in results if r["ran"]] == ["released"]
    assert not b.leases.inspect("task", "A9").held
    b.close()


@pytest.mark.slow
@pytest.mark.parametrize("arm", BLOCK_ARMS)
def test_killed_holder_is_taken_over_by_a_new_attempt_with_a_new_epoch(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> None:
    """When the process holding an execution's lease is SIGKILLed, another attempt of the
    execution is refused until the lease expires, then takes over with a higher epoch, and
    the dead attempt's epoch no longer fences a write."""
    cfg, b = _block_arm(request, tmp_path, arm)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    holder = _spawn(cfg, barrier, 0, ttl_seconds=10, key="run-123")
    _wait_files(barrier, "ready-*", 1, [holder])
    (barrier / "go").touch()
    _wait_files(barrier, "ran-*", 1, [holder])
    old = Lease.model_validate_json((barrier / "ran-0").read_text())
    holder.send_signal(signal.SIGKILL)
    holder.wait(30)
    with (
        pytest.raises(IdempotencyInFlightError),
        b.lease("task", "A9", ttl_seconds=10, idempotency_key="run-123"),
    ):
        pytest.fail("a second attempt entered while the first one's lease was held")
    wait_until_expired(b, old)
    with b.lease("task", "A9", ttl_seconds=10, idempotency_key="run-123") as held:
        assert held.epoch > old.epoch
        assert held.lease_id != old.lease_id
        with pytest.raises(StaleFenceError):
            b.checkpoints.save("A9", "progress", {"step": 1}, fence=old)
        assert b.checkpoints.save("A9", "progress", {"step": 1}, fence=held).version == 1
    b.close()


@pytest.mark.slow
@pytest.mark.parametrize("arm", BLOCK_ARMS)
def test_blocks_without_key_in_two_processes_do_not_supersede(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> None:
    """Two processes of one principal entering ``with b.lease(...)`` without an execution
    key: the second is refused CONFLICT and the first keeps its lease to the end."""
    cfg, b = _block_arm(request, tmp_path, arm)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    first = _spawn(cfg, barrier, 0, ttl_seconds=30)
    _wait_files(barrier, "ready-*", 1, [first])
    (barrier / "go").touch()
    _wait_files(barrier, "ran-*", 1, [first])
    second = _result(_spawn(cfg, barrier, 1, ttl_seconds=30))
    assert (second["ran"], second["code"]) == (False, "CONFLICT")
    (barrier / "release").touch()
    assert _result(first)["receipt"] == "released"
    b.close()


# ------------------------------------------------- a checkpoint's delete against its handoff

RACE_ROUNDS = 30


def _code_of(call: Any) -> str:
    """``"ok"`` when ``call()`` returns, else the code of the BatonError it raised."""
    try:
        call()
    except BatonError as e:
        return e.code
    return "ok"


def _delete_against_handoff(b: Baton, subject: str, *, reads: int) -> tuple[str, str]:
    """Save a checkpoint of ``subject``, then from two threads started together delete it
    and create a handoff carrying it, the latter after ``reads`` reads of the checkpoint
    (so that either may come first); the outcomes (``"ok"`` or the error code) of the
    delete and of the create."""
    ckpt_id = b.checkpoints.save(subject, "draft", {"n": 1}).checkpoint_id
    barrier = threading.Barrier(2)
    got: dict[str, str] = {}

    def run(name: str, call: Any) -> None:
        barrier.wait()
        for _ in range(reads if name == "handoff" else 0):
            b.checkpoints.get(subject, "draft")
        got[name] = _code_of(call)

    threads = [
        threading.Thread(target=run, args=("delete", lambda: b.checkpoints.delete(ckpt_id))),
        threading.Thread(
            target=run,
            args=(
                "handoff",
                lambda: b.handoffs.create("agent-b", subject, checkpoint_id=ckpt_id),
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got["delete"], got["handoff"]


@pytest.mark.parametrize("arm", ["sqlite", "postgresql"])
def test_delete_and_handoff_of_a_checkpoint_never_both_succeed(
    request: pytest.FixtureRequest, tmp_path: Path, arm: str
) -> None:
    """A checkpoint's delete and a handoff created carrying it, started together from two
    threads: exactly one succeeds, every round. Either the delete wins and the handoff is
    NOT_FOUND, or the handoff wins and the delete is CONFLICT (a pending handoff carries
    the checkpoint)."""
    if arm == "sqlite":
        url = f"sqlite:///{tmp_path / 'race.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    org = f"org-{uuid.uuid4().hex[:12]}"
    writer = Baton(org=org, principal="agent-a", store=store_for(url))
    outcomes = [
        _delete_against_handoff(writer, f"subject-{i}", reads=i % 3) for i in range(RACE_ROUNDS)
    ]
    assert set(outcomes) <= {("ok", "NOT_FOUND"), ("CONFLICT", "ok")}, outcomes
