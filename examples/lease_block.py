"""Plain agent code with ``with b.lease(...)``: claim a batch, work through it in
checkpointed steps, crash half-way, resume from the checkpoint, and record the outcome.

Run from the repository root::

    python examples/lease_block.py

The ledger is a SQLite file in a fresh temporary directory (or ``BATON_LEDGER_URL``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from prefect_baton import Baton, ConflictError

ITEMS = ["alpha", "bravo", "charlie", "delta", "echo"]
RESOURCE = ("batch", "nightly-2026-11-30")


class Crash(Exception):
    """Stands in for whatever can go wrong half-way through."""


def run_agent(b: Baton, *, crash_after: int | None = None, rival: Baton | None = None) -> None:
    """Process the batch under a lease, resuming from this agent's checkpoint; ``rival``
    tries to claim the same batch while the lease is held."""
    with b.lease(*RESOURCE, ttl_seconds=30, purpose="nightly digest") as held:
        saved = b.checkpoints.get(RESOURCE[1], "progress")
        done: list[str] = list(saved.state["done"]) if saved else []
        digests: dict[str, str] = dict(saved.state["digests"]) if saved else {}
        print(f"{b.principal}: holds epoch {held.epoch}, resuming after {len(done)} item(s)")
        for item in ITEMS[len(done) :]:
            if crash_after is not None and len(done) == crash_after:
                raise Crash(f"crashed before {item}")
            digests[item] = hashlib.sha256(item.encode()).hexdigest()[:12]
            done.append(item)
            # The checkpoint is fenced by the lease: it is rejected once the lease is lost.
            b.checkpoints.save(
                RESOURCE[1], "progress", {"done": done, "digests": digests}, fence=held
            )
            print(f"{b.principal}: processed {item}")
            if rival is not None:
                try:
                    rival.leases.acquire(*RESOURCE, ttl_seconds=30)
                except ConflictError as err:
                    print(f"{rival.principal}: {err.code}, the batch is taken")
                rival = None
        outcome = b.outcomes.record(
            RESOURCE[1],
            "succeeded",
            fence=held,
            evidence=[
                {"kind": "digest", "uri": f"item:{name}", "digest": f"sha256:{digest}"}
                for name, digest in digests.items()
            ],
        )
        items = len(outcome.evidence)
        print(f"{b.principal}: outcome {outcome.status} with {items} evidence items")


def main() -> None:
    ledger = os.environ.get("BATON_LEDGER_URL") or (
        f"sqlite:///{tempfile.mkdtemp(prefix='baton-example-')}/ledger.db"
    )
    agent = Baton(ledger_url=ledger, org="example", principal="digest-agent")
    rival = agent.as_principal("other-agent")

    try:
        run_agent(agent, crash_after=2)
    except Crash as exc:
        # Leaving the block released the lease, so the work can be picked up at once.
        print(f"{agent.principal}: {exc}")

    run_agent(agent, rival=rival)
    info = rival.leases.inspect(*RESOURCE)
    print(f"after the run: held={info.held}, epoch={info.epoch}, version={info.version}")
    kinds = [e.kind for e in agent.events.list(limit=1000)]
    print("events:", ", ".join(f"{k} x{kinds.count(k)}" for k in dict.fromkeys(kinds)))


if __name__ == "__main__":
    main()
