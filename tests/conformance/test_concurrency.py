"""Many processes at once (issue #2 "Inside"): 8 OS processes x 200 random lease operations
on 5 resources; afterwards the ledger history shows no overlapping effective holdings, epochs
that only rise, and every generation a process was handed recorded exactly as handed."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prefect_baton._rules.scopes import sets_overlap
from prefect_baton.audit import audit_ledger
from tests.conftest import store_for

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
