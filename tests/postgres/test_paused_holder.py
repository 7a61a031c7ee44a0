"""PostgreSQL: a client paused inside a ledger transaction does not hold its locks for good.

Found by a hostile trial: a holder stopped (SIGSTOP) inside the commit of a write kept its
session "idle in transaction" with the resource's lock, so another principal's acquire of
that resource waited until the paused process resumed, long after its lease ran out. The
ledger's connections set ``idle_in_transaction_session_timeout``: the server ends such a
session, its transaction rolls back and the waiting write goes on.
"""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import text

from prefect_baton import Baton, ConflictError
from prefect_baton._stores.ledger.engine import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS
from prefect_baton._stores.ledger.store import LedgerStore
from tests.conftest import store_for


def test_every_ledger_connection_ends_idle_transactions(pg_url: str) -> None:
    """The setting is on each connection of the store's pool."""
    store = LedgerStore(pg_url, migrate=False)
    try:
        with store.engines.write.connect() as conn:
            shown = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one()
        assert shown == f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"
    finally:
        store.close()


def test_a_holder_paused_inside_its_transaction_does_not_block_the_resource(
    pg_url: str,
) -> None:
    """Alice's acquire pauses inside its transaction (after taking the resource's lock,
    before COMMIT; a thread blocked there is what SIGSTOP leaves). Bob's acquire of the same
    resource waits on that lock only until the server ends alice's idle session: bob gets
    the lease (epoch 1, the first grant); alice, resuming, gets CONFLICT (her transaction
    was rolled back and its retry met bob's lease) and nothing of hers was recorded.
    Before, bob waited until alice resumed, then got CONFLICT."""
    store_for(pg_url)  # the schema, migrated once
    org = f"org-{uuid.uuid4().hex[:12]}"
    a_store = LedgerStore(pg_url, migrate=False)
    b_store = LedgerStore(pg_url, migrate=False)
    alice = Baton(org=org, principal="alice", store=a_store)
    bob = Baton(org=org, principal="bob", store=b_store)
    for who in (alice, bob):  # each principal's first write registers it, in a transaction
        who.leases.release(who.leases.acquire("deploy", "warm-up", ttl_seconds=10))  # of its own
    paused, resume = threading.Event(), threading.Event()
    flush = a_store._flush_events

    def pause_then_flush(tx: object) -> None:
        paused.set()
        resume.wait(60)
        flush(tx)  # type: ignore[arg-type]

    a_store._flush_events = pause_then_flush  # type: ignore[method-assign]
    outcome: dict[str, object] = {}

    def alice_acquires() -> None:
        try:
            outcome["alice"] = alice.leases.acquire("deploy", "svc", ttl_seconds=30)
        except Exception as exc:  # what alice's caller sees on resuming
            outcome["alice"] = exc

    worker = threading.Thread(target=alice_acquires, daemon=True)
    worker.start()
    # Alice resumes 40 s later however bob fares: without the server's timeout bob's
    # acquire waits for her, then meets her lease.
    timer = threading.Timer(40, resume.set)
    timer.start()
    try:
        assert paused.wait(30), "alice's acquire never reached its transaction"
        lease = bob.leases.acquire("deploy", "svc", ttl_seconds=30)
        resume.set()
        worker.join(60)
        assert (lease.owner, lease.epoch, lease.version) == ("bob", 1, 1)
        # Her transaction was rolled back before COMMIT; its retry on a new connection
        # meets bob's lease (paused at COMMIT she would get UNAVAILABLE instead).
        assert isinstance(outcome["alice"], ConflictError), outcome
        info = bob.leases.inspect("deploy", "svc")
        assert info.lease is not None
        assert info.lease.lease_id == lease.lease_id
        events = bob.as_principal("bob", "owner").events.list()
        assert [e.kind for e in events if e.subject == "deploy/svc"] == ["lease.acquired"]
    finally:
        timer.cancel()
        resume.set()
        a_store.close()
        b_store.close()
