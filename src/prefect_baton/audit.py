"""``baton audit``: check the ledger's lease history against the lease invariants.

Checks, per resource of an org:

1. no two effective generations overlap in time: a generation holds from ``acquired_at`` until
   the earliest of its end (release, transfer, takeover, revocation) and its last expiry, and
   the next generation starts no earlier than that;
2. epochs strictly rise from one generation to the next, and never fall in the history;
3. versions rise by exactly one on every acquire, takeover, supersede, renewal and transfer,
   and are kept by releases;
4. at most one generation is ``active``;
5. every acquire receipt points at an existing transition of its lease;
6. no two generations (lease ids) of a resource share an epoch (a fencing token handed out
   twice), in the generations or in the transitions;
7. no journal entry was refused by the ledger (a fault the Redis reconciler recorded, see
   :mod:`prefect_baton._stores.redis.reconciler`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise

from sqlalchemy import select
from sqlmodel import col

from prefect_baton._rules.core import Generation
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import LeaseTransition, ReceiptRow
from prefect_baton._stores.redis.ledger_writes import FAULT_OP, SYSTEM_PRINCIPAL

__all__ = ["AuditReport", "audit_ledger"]

_BUMPS = {"acquire", "takeover", "supersede", "renew", "transfer"}
_NEW_GENERATION = {"acquire", "takeover", "supersede", "transfer"}


@dataclass
class AuditReport:
    """Result of :func:`audit_ledger`.

    Attributes:
        org: the organization audited.
        resources, generations, transitions, receipts: how many were checked (``int``).
        violations: one human-readable line per broken invariant (empty when all hold).
    """

    org: str
    resources: int = 0
    generations: int = 0
    transitions: int = 0
    receipts: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """``True`` when no invariant is broken."""
        return not self.violations


def _holding_end(h: Generation) -> int:
    end = h.expires_at_ms
    if h.ended_at_ms is not None:
        end = min(end, h.ended_at_ms)
    return end


def audit_ledger(store: LedgerStore, org: str) -> AuditReport:
    """Check the lease history of ``org`` in ``store`` (see the module docstring).

    Returns:
        An :class:`AuditReport`; ``report.ok`` is false when any invariant is broken.
    """
    rows, transitions = store.lease_history(org)
    report = AuditReport(org=org, generations=len(rows), transitions=len(transitions))
    by_res: dict[tuple[str, str], list[Generation]] = defaultdict(list)
    for h in rows:
        by_res[(h.resource_type, h.resource_id)].append(h)
    report.resources = len(by_res)
    for res, gens in by_res.items():
        gens.sort(key=lambda g: g.epoch)
        name = f"{res[0]}/{res[1]}"
        active = [g for g in gens if g.status == "active"]
        if len(active) > 1:
            report.violations.append(f"{name}: {len(active)} active generations")
        for prev, nxt in pairwise(gens):
            if nxt.epoch <= prev.epoch:
                report.violations.append(f"{name}: epoch {nxt.epoch} after {prev.epoch}")
            if _holding_end(prev) > nxt.acquired_at_ms:
                report.violations.append(
                    f"{name}: generation epoch {prev.epoch} ({prev.lease_id}) held until "
                    f"{_holding_end(prev)} but epoch {nxt.epoch} ({nxt.lease_id}) started at "
                    f"{nxt.acquired_at_ms}"
                )
    last: dict[tuple[str, str], tuple[int, int]] = {}
    seen: set[tuple[str, int]] = set()
    holders: dict[tuple[str, str, int], str] = {
        (g.resource_type, g.resource_id, g.epoch): g.lease_id for g in rows
    }
    for t in transitions:
        res = (t.resource_type, t.resource_id)
        name = f"{res[0]}/{res[1]}"
        seen.add((t.lease_id, t.version))
        first = holders.setdefault((*res, t.epoch), t.lease_id)
        if first != t.lease_id:
            report.violations.append(
                f"{name}: generations {first} and {t.lease_id} have the same epoch {t.epoch}"
            )
            holders[(*res, t.epoch)] = t.lease_id
        if res in last:
            pv, pe = last[res]
            if t.action in _BUMPS and t.version != pv + 1:
                report.violations.append(
                    f"{name}: {t.action} to version {t.version} after version {pv}"
                )
            if t.action not in _BUMPS and t.version != pv:
                report.violations.append(f"{name}: {t.action} changed version {pv} to {t.version}")
            if t.epoch < pe or (t.action in _NEW_GENERATION and t.epoch <= pe):
                report.violations.append(f"{name}: {t.action} epoch {t.epoch} after {pe}")
        elif t.action in _BUMPS and t.action not in _NEW_GENERATION:
            report.violations.append(f"{name}: history starts with {t.action}")
        last[res] = (t.version, t.epoch)
    with store._read() as (s, _now):
        fault_row = s.execute(
            select(col(ReceiptRow.response)).where(
                col(ReceiptRow.org_id) == org,
                col(ReceiptRow.principal) == SYSTEM_PRINCIPAL,
                col(ReceiptRow.operation) == FAULT_OP,
            )
        ).scalar_one_or_none()
        for fault in json.loads(fault_row)["faults"] if fault_row else []:
            report.violations.append(
                f"journal entry {fault['entry']} was refused by the ledger "
                f"({fault['error']}): {fault['generations']}"
            )
        receipts = list(
            s.execute(
                select(ReceiptRow).where(
                    col(ReceiptRow.org_id) == org,
                    col(ReceiptRow.operation) == "acquire",
                )
            ).scalars()
        )
        report.receipts = len(receipts)
        for r in receipts:
            resp = json.loads(r.response)
            if (resp.get("lease_id"), resp.get("version")) not in seen:
                found = s.execute(
                    select(col(LeaseTransition.seq)).where(
                        col(LeaseTransition.lease_id) == resp.get("lease_id"),
                        col(LeaseTransition.version) == resp.get("version"),
                    )
                ).first()
                if found is None:
                    report.violations.append(
                        f"receipt {r.idem_key!r} points at missing transition "
                        f"{resp.get('lease_id')} v{resp.get('version')}"
                    )
    return report
