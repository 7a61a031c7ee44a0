"""One OS process of the concurrency tests: random lease operations on a shared ledger, or
(``"mode": "block"``) one lease block.

Usage: ``python _concurrency_worker.py '<json config>'``. Prints one JSON line with what
it was granted (every new generation it was handed) and the error codes it met; in block
mode, whether its body ran and the error code that refused it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prefect_baton import Baton, BatonError, Lease

EXPECTED_CODES = {"CONFLICT", "LEASE_LOST", "NOT_FOUND", "VERSION_CONFLICT"}


def _wait_for(path: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"never saw {path.name}")
        time.sleep(0.005)


def block_main(cfg: dict[str, Any]) -> None:
    """Enter ``with b.lease(...)`` once (execution key ``cfg["key"]``, ``None``: the
    block's own) after the go signal; the body writes its lease to ``ran-<index>`` and
    holds the lease until the file ``release`` exists (a test may kill it meanwhile)."""
    idx: int = cfg["index"]
    barrier = Path(cfg["barrier_dir"])
    b = Baton(
        ledger_url=cfg.get("ledger_url"),
        redis_url=cfg.get("redis_url"),
        api_url=cfg.get("api_url"),
        api_key=cfg.get("api_key"),
        org=cfg.get("org"),
        principal=cfg.get("principal"),
    )
    (barrier / f"ready-{idx}").touch()
    _wait_for(barrier / "go")
    out: dict[str, Any] = {"index": idx, "ran": False, "code": None}
    try:
        with b.lease(
            cfg["resource_type"],
            cfg["resource_id"],
            ttl_seconds=cfg["ttl_seconds"],
            idempotency_key=cfg.get("key"),
        ) as held:
            out["ran"] = True
            # written whole then renamed: the test polls for ``ran-*`` and reads it at once
            part = barrier / f".part-ran-{idx}"  # not matched by the glob ``ran-*``
            part.write_text(held.lease.model_dump_json())
            os.replace(part, barrier / f"ran-{idx}")
            _wait_for(barrier / "release", 600)
        out["receipt"] = held.receipt_status
    except BatonError as exc:
        out["code"] = exc.code
    b.close()
    print(json.dumps(out))


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    if cfg.get("mode") == "block":
        block_main(cfg)
        return
    idx: int = cfg["index"]
    principal: str = cfg["principal"]
    principals: list[str] = cfg["principals"]
    resources: list[str] = cfg["resources"]
    rng = random.Random(cfg["seed"])
    b = Baton(ledger_url=cfg["ledger_url"], org=cfg["org"], principal=principal)

    barrier = Path(cfg["barrier_dir"])
    (barrier / f"ready-{idx}").touch()
    deadline = time.monotonic() + 60
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("never got the go signal")
        time.sleep(0.005)

    held: dict[str, Lease] = {}  # resource id -> the lease this process believes it holds
    keys: dict[str, tuple[str, tuple[str, ...]]] = {}  # execution key -> (resource, scopes)
    grants: list[dict[str, Any]] = []
    codes: Counter[str] = Counter()
    unexpected: list[str] = []
    ops: Counter[str] = Counter()
    last_version: dict[str, int] = {}

    def scopes_for(rid: str) -> tuple[str, ...]:
        if rng.random() < 0.3:
            return ()
        # resource 0 claims the whole area, the others their own corner of it
        return ("area/**",) if rid == resources[0] else (f"area/{rid}/*",)

    def grant(lease: Lease, action: str) -> None:
        grants.append(
            {
                "action": action,
                "resource_id": lease.resource_id,
                "lease_id": lease.lease_id,
                "epoch": lease.epoch,
                "version": lease.version,
                "owner": lease.owner,
                "replayed": lease.replayed,
            }
        )

    for i in range(cfg["ops"]):
        op = rng.choices(
            ["acquire", "renew", "release", "transfer", "release_by_id", "inspect", "cas", "adopt"],
            weights=[30, 15, 20, 10, 5, 5, 10, 10],
        )[0]
        if op in ("renew", "release", "transfer", "release_by_id") and not held:
            op = rng.choice(["acquire", "adopt"])
        ops[op] += 1
        try:
            if op in ("acquire", "cas"):
                if keys and rng.random() < 0.2:  # retry an earlier execution (a replay)
                    key: str | None = rng.choice(sorted(keys))
                    assert key is not None
                    rid, scopes = keys[key]
                else:
                    rid = rng.choice(resources)
                    key = rng.choice([None, f"{principal}-{idx}-{i}"])
                    scopes = scopes_for(rid)
                    if key is not None:
                        keys[key] = (rid, scopes)
                expected = None
                if op == "cas" and key is None:
                    expected = last_version.get(rid, b.leases.inspect("res", rid).version)
                lease = b.leases.acquire(
                    "res",
                    rid,
                    ttl_seconds=10,
                    scopes=scopes,
                    idempotency_key=key,
                    expected_version=expected,
                )
                held[rid] = lease
                last_version[rid] = lease.version
                grant(lease, "acquire")
            elif op == "renew":
                rid = rng.choice(sorted(held))
                try:
                    held[rid] = b.leases.renew(held[rid])
                    last_version[rid] = held[rid].version
                except BatonError:
                    del held[rid]
                    raise
            elif op == "release":
                rid = rng.choice(sorted(held))
                lease = held.pop(rid)
                b.leases.release(lease)
            elif op == "release_by_id":
                rid = rng.choice(sorted(held))
                lease = held.pop(rid)
                b.leases.release_by_id(lease.lease_id)
            elif op == "transfer":
                rid = rng.choice(sorted(held))
                lease = held.pop(rid)
                to = rng.choice(principals)
                moved = b.leases.transfer(
                    lease, to_principal=to, new_execution_key=f"xfer-{idx}-{i}", ttl_seconds=10
                )
                grant(moved, "transfer")
                if to == principal:
                    held[rid] = moved
            elif op == "adopt":  # pick up leases transferred to this principal
                for lease in b.leases.list(resource_type="res"):
                    held.setdefault(lease.resource_id, lease)
            elif op == "inspect":
                rid = rng.choice(resources)
                last_version[rid] = b.leases.inspect("res", rid).version
        except BatonError as exc:
            codes[exc.code] += 1
            if exc.code not in EXPECTED_CODES:
                unexpected.append(f"{op}: {exc.code}: {exc}")
        except Exception as exc:
            unexpected.append(f"{op}: {type(exc).__name__}: {exc}")

    for lease in held.values():  # tidy up what this process still believes it holds
        try:
            b.leases.release(lease)
        except BatonError as exc:
            if exc.code not in EXPECTED_CODES:
                unexpected.append(f"final release: {exc.code}: {exc}")
    b.close()
    print(
        json.dumps(
            {
                "index": idx,
                "pid": os.getpid(),
                "grants": grants,
                "codes": dict(codes),
                "ops": dict(ops),
                "unexpected": unexpected,
            }
        )
    )


if __name__ == "__main__":
    main()
