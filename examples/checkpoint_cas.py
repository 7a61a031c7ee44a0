"""Checkpoint compare-and-swap from two writers.

Two OS processes act as two replicas of the same agent (one principal) and append to one
checkpoint. In every round both read the checkpoint, wait until the other has read it too,
then write with ``expected_version`` set to the version they read. Exactly one write wins;
the loser gets ``VERSION_CONFLICT``, re-reads and retries on top of the winner's write, so no
update is lost.

Run from the repository root::

    python examples/checkpoint_cas.py

The ledger is a SQLite file in a fresh temporary directory (or ``BATON_LEDGER_URL``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from prefect_baton import Baton, VersionConflictError

ROUNDS = 5
SUBJECT, KIND = "shared-index", "entries"
WRITERS = ("writer-a", "writer-b")


def writer(name: str, ledger: str, barrier: Barrier, results: Queue) -> None:
    """Append one entry per round with compare-and-swap, retrying after a conflict."""
    b = Baton(ledger_url=ledger, org="example", principal="indexer")
    for rnd in range(1, ROUNDS + 1):
        barrier.wait(timeout=60)  # both start the round together
        current = b.checkpoints.get(SUBJECT, KIND)
        barrier.wait(timeout=60)  # both have read the same version
        conflicts = 0
        while True:
            version = current.version if current else 0
            entries = list(current.state["entries"]) if current else []
            try:
                b.checkpoints.save(
                    SUBJECT,
                    KIND,
                    {"entries": [*entries, f"{name}:{rnd}"]},
                    expected_version=version,
                )
                break
            except VersionConflictError as err:
                conflicts += 1
                results.put(("conflict", rnd, name, err.expected_version, err.current_version))
                current = b.checkpoints.get(SUBJECT, KIND)  # re-read, then retry
        results.put(("saved", rnd, name, version + 1, conflicts))
    b.close()
    results.put(("done", 0, name, 0, 0))


def main() -> int:
    ledger = os.environ.get("BATON_LEDGER_URL") or (
        f"sqlite:///{tempfile.mkdtemp(prefix='baton-example-')}/ledger.db"
    )
    Baton(ledger_url=ledger, org="example", principal="indexer").close()  # create the tables
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(WRITERS))
    results: Queue = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(n, ledger, barrier, results)) for n in WRITERS]
    for p in procs:
        p.start()
    events: list[tuple[str, int, str, int, int]] = []
    while sum(e[0] == "done" for e in events) < len(WRITERS):
        events.append(results.get(timeout=120))
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        print("a writer failed")
        return 1

    ok = True
    for rnd in range(1, ROUNDS + 1):
        saved = [e for e in events if e[0] == "saved" and e[1] == rnd]
        first_try = [e[2] for e in saved if e[4] == 0]
        retried = [e for e in saved if e[4] > 0]
        conflicts = [e for e in events if e[0] == "conflict" and e[1] == rnd]
        if len(first_try) != 1 or len(retried) != 1:
            ok = False
        for _, _, loser, expected, current in conflicts:
            print(
                f"round {rnd}: {first_try[0] if first_try else '?'} won at version "
                f"{expected + 1}; {loser} got VERSION_CONFLICT (expected {expected}, "
                f"current {current}), re-read and saved version {current + 1}"
            )

    b = Baton(ledger_url=ledger, org="example", principal="indexer")
    final = b.checkpoints.get(SUBJECT, KIND)
    assert final is not None
    entries = final.state["entries"]
    expected = {f"{n}:{r}" for n in WRITERS for r in range(1, ROUNDS + 1)}
    history = b.checkpoints.history(SUBJECT, KIND)
    print(f"final version {final.version}, {len(entries)} entries, {len(history)} versions kept")
    if set(entries) != expected or len(entries) != len(expected) or not ok:
        print("LOST UPDATE or a round without exactly one winner")
        return 1
    print(f"every round had exactly one winner; no update was lost ({len(expected)} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
