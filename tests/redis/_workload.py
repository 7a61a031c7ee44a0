"""A random lease workload for the fault tests: what it was granted and what was
acknowledged, so the tests can compare it with the ledger afterwards."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from prefect_baton import Baton, BatonError, Lease


@dataclass
class Record:
    """What a workload saw: new generations granted (``grants``: resource, lease id,
    epoch, phase), acknowledged transitions (``acked``: lease id, version) and error codes."""

    grants: list[tuple[str, str, int, str]] = field(default_factory=list)
    acked: list[tuple[str, int]] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)
    ops: int = 0


def run(
    clients: list[Baton],
    resources: list[str],
    n_ops: int,
    record: Record,
    *,
    phase: str,
    seed: int,
    held: dict[tuple[int, str], Lease] | None = None,
) -> dict[tuple[int, str], Lease]:
    """Run ``n_ops`` random acquire/renew/transfer/release calls; tolerate every
    :class:`BatonError` (counted by code in ``record.codes``)."""
    rng = random.Random(seed)
    held = {} if held is None else held
    for i in range(n_ops):
        ci = rng.randrange(len(clients))
        b = clients[ci]
        mine = [k for k in held if k[0] == ci]
        op = rng.choice(["acquire", "acquire", "renew", "release", "transfer"])
        if op != "acquire" and not mine:
            op = "acquire"
        record.ops += 1
        try:
            if op == "acquire":
                rid = rng.choice(resources)
                key = rng.choice([None, f"{phase}-{seed}-{i}"])
                lease = b.leases.acquire("res", rid, ttl_seconds=10, idempotency_key=key)
                held[(ci, rid)] = lease
                if not lease.replayed:
                    record.grants.append((rid, lease.lease_id, lease.epoch, phase))
                    record.acked.append((lease.lease_id, lease.version))
            elif op == "renew":
                k = rng.choice(mine)
                lease = b.leases.renew(held[k])
                held[k] = lease
                record.acked.append((lease.lease_id, lease.version))
            elif op == "release":
                k = rng.choice(mine)
                receipt = b.leases.release(held.pop(k))
                if receipt.status != "no_change":
                    record.acked.append((receipt.lease.lease_id, receipt.lease.version))
            else:
                k = rng.choice(mine)
                to = rng.randrange(len(clients))
                lease = b.leases.transfer(
                    held.pop(k),
                    to_principal=clients[to].principal,
                    new_execution_key=f"x-{phase}-{seed}-{i}",
                    ttl_seconds=10,
                )
                held[(to, k[1])] = lease
                record.grants.append((k[1], lease.lease_id, lease.epoch, phase))
                record.acked.append((lease.lease_id, lease.version))
        except BatonError as exc:
            record.codes[exc.code] += 1
            if op != "acquire" and exc.code in ("LEASE_LOST", "NOT_FOUND"):
                for k2 in [k for k in mine if k in held]:
                    if op in ("renew", "release", "transfer"):
                        held.pop(k2, None)
                        break
    return held
