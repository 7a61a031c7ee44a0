"""Many processes on the Redis authority: the conformance suite's concurrency worker (8 OS
processes x 200 random lease operations on 5 resources) run with ``BATON_REDIS_URL`` set,
for both acknowledgement modes; afterwards the ledger passes the audit and holds every
generation a process was handed, exactly as handed, with no fencing token handed twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prefect_baton._rules.scopes import sets_overlap
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.audit import audit_ledger

from .conftest import RedisServer

WORKER = Path(__file__).parents[1] / "conformance" / "_concurrency_worker.py"
PROCESSES = 8


def _run(url: str, redis_url: str, ack: str, org: str, tmp_path: Path) -> list[dict[str, Any]]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "BATON_REDIS_URL": redis_url, "BATON_REDIS_ACK": ack}
    procs = []
    principals = [f"p{i}" for i in range(4)]
    for i in range(PROCESSES):
        cfg = {
            "index": i,
            "ledger_url": url,
            "org": org,
            "principal": principals[i % 4],
            "principals": principals,
            "resources": [f"r{i}" for i in range(5)],
            "ops": 200,
            "seed": 2000 + i,
            "barrier_dir": str(barrier),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(Path(__file__).resolve().parents[2]),
            )
        )
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < PROCESSES:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            pytest.fail(f"a worker did not start: {[p.communicate()[1][-2000:] for p in procs]}")
        time.sleep(0.01)
    (barrier / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("ack", ["ledger", "redis"])
def test_many_processes_on_redis_keep_lease_invariants(
    redis_server: RedisServer, tmp_path: Path, ack: str
) -> None:
    """8 processes x 200 random operations through Redis leave an audited ledger history
    that holds every generation handed out, each fencing token handed to one generation."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = LedgerStore(url)
    org = f"org-{uuid.uuid4().hex[:12]}"
    try:
        results = _run(url, redis_server.url, ack, org, tmp_path)
        assert [u for r in results for u in r["unexpected"]] == []
        grants = [g for r in results for g in r["grants"]]
        assert len([g for g in grants if not g["replayed"]]) > 50
        assert sum(r["codes"].get("CONFLICT", 0) for r in results) > 0
        report = audit_ledger(store, org)
        assert report.ok, report.violations
        rows, _transitions = store.lease_history(org)
        by_id = {h.lease_id: h for h in rows}
        token_owner: dict[tuple[str, int], str] = {}
        for g in grants:
            h = by_id.get(g["lease_id"])
            assert h is not None, g
            assert (h.resource_id, h.epoch, h.owner) == (g["resource_id"], g["epoch"], g["owner"])
            token = (g["resource_id"], g["epoch"])
            assert token_owner.setdefault(token, g["lease_id"]) == g["lease_id"], token
        per_resource: dict[str, list[Any]] = defaultdict(list)
        for h in rows:
            per_resource[h.resource_id].append(h)
        for gens in per_resource.values():
            assert sum(h.status == "active" for h in gens) <= 1

        def span(h: Any) -> tuple[int, int]:
            end = h.expires_at_ms if h.ended_at_ms is None else min(h.expires_at_ms, h.ended_at_ms)
            return h.acquired_at_ms, end

        scoped = [h for h in rows if h.scopes]
        for i, a in enumerate(scoped):
            for b in scoped[i + 1 :]:
                if a.owner == b.owner or a.resource_id == b.resource_id:
                    continue
                if sets_overlap(a.scopes, b.scopes):
                    (a0, a1), (b0, b1) = span(a), span(b)
                    assert a1 <= b0 or b1 <= a0, (a.lease_id, b.lease_id)
    finally:
        store.close()
