"""One demo role as an OS process: ``python -m prefect_baton.demo.worker '<json config>'``.

Prints one JSON line with the role's result on stdout. A researcher told to ``crash``
SIGKILLs itself mid-file; one told to ``pause`` writes a marker naming the lease it holds and
SIGSTOPs itself, and the orchestrator resumes it once another researcher has taken over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect_baton import Baton, LeaseKeeper
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton.demo import roles
from prefect_baton.errors import as_baton_error


def _fault_hook(b: Baton, cfg: dict[str, Any]) -> roles.FaultHook | None:
    fault = cfg.get("fault")
    if fault not in ("crash", "pause"):
        return None
    fired = False

    def hook(file_id: str, held: LeaseKeeper, started: int) -> None:
        nonlocal fired
        if fired or started < 1:
            return
        fired = True
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        marker = Path(cfg["run_dir"]) / f"pause-{cfg['worker']}.json"
        part = marker.with_suffix(".part")  # written whole, then renamed: never read half
        part.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "resource_id": file_id,
                    "lease_id": held.lease_id,
                    "epoch": held.epoch,
                }
            )
        )
        os.replace(part, marker)
        # Stop between ledger transactions: a renewal or a drain of the Redis journal stopped
        # inside one would hold SQLite's write lock and block the other researchers' writes
        # (their takeover included) for the busy timeout, which is not the fault shown here.
        with ExitStack() as quiet:
            quiet.enter_context(held.heartbeat_paused())
            if isinstance(b.authority, RedisAuthority):
                quiet.enter_context(b.authority.drain_paused())
            os.kill(os.getpid(), signal.SIGSTOP)

    return hook


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the role named in ``cfg["role"]`` and return its result (JSON-able)."""
    b = Baton(
        ledger_url=cfg["ledger_url"],
        org=cfg["org"],
        principal=cfg["principal"],
        redis_url=cfg.get("redis_url"),
    )
    files = {k: Path(v) for k, v in cfg["files"].items()}
    role = cfg["role"]
    try:
        if role == "researcher":
            stats = roles.researcher(
                b,
                files,
                worker=cfg["worker"],
                ttl_seconds=cfg["ttl"],
                lines_per_chunk=cfg["lines_per_chunk"],
                work_seconds=cfg["work_seconds"],
                offset=cfg["offset"],
                fault=_fault_hook(b, cfg),
            )
            return stats.to_dict()
        if role == "writer":
            h = roles.writer(b, files, ttl_seconds=max(cfg["ttl"], 30))
            return {"handoff_id": h.handoff_id}
        if role == "operator":
            path = roles.operator(
                b,
                Path(cfg["run_dir"]),
                ttl_seconds=max(cfg["ttl"], 30),
                timeout_seconds=cfg["timeout"],
            )
            return {"report": str(path)}
        if role == "reviewer":
            return roles.reviewer(b, files, timeout_seconds=cfg["timeout"])
        raise SystemExit(f"unknown role {role!r}")
    finally:
        b.close()


def main() -> None:
    """Run the role of the JSON config in ``argv[1]``; print its result as one JSON line, or
    ``{"worker": ..., "error": {"code", "message"}}`` and exit 1 when it failed (the
    orchestrator reports the error; the traceback goes to the worker's log on stderr)."""
    cfg = json.loads(sys.argv[1])
    worker = cfg.get("worker", cfg["role"])
    try:
        result = run(cfg)
    except Exception as exc:
        traceback.print_exc()
        err = as_baton_error(exc).to_dict()
        print(json.dumps({"worker": worker, "error": err}, default=str), flush=True)
        sys.exit(1)
    print(json.dumps({"worker": worker, **result}), flush=True)


if __name__ == "__main__":
    main()
