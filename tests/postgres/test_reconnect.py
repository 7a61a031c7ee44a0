"""PostgreSQL: the ledger store's pooled connections closed by the server (as a server
restart closes them) are replaced on first use, with no error to the caller and nothing done
twice (the pool does not ping a connection at each checkout)."""

from __future__ import annotations

import uuid

import psycopg

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from tests.conftest import store_for


def _close_backends(pg_url: str, store: LedgerStore) -> None:
    """Terminate the server process of ``store``'s idle pooled connection (the server side
    of a restart)."""
    with store.engines.write.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row == (True,)


def test_writes_and_reads_after_the_server_closed_the_pooled_connection(pg_url: str) -> None:
    """An acquire, a release, an inspect and a renew each run on a pooled connection the
    server closed: each succeeds once, and the ledger holds exactly one generation per
    acquire."""
    store_for(pg_url)  # the schema, migrated
    store = LedgerStore(pg_url, migrate=False)
    b = Baton(org=f"org-{uuid.uuid4().hex[:12]}", principal="agent-a", store=store)
    try:
        first = b.leases.acquire("deploy", "svc", ttl_seconds=60)
        _close_backends(pg_url, store)
        assert b.leases.release(first).status == "released"
        _close_backends(pg_url, store)
        second = b.leases.acquire("deploy", "svc", ttl_seconds=60)
        assert second.epoch == first.epoch + 1
        _close_backends(pg_url, store)
        assert b.leases.inspect("deploy", "svc").held
        _close_backends(pg_url, store)
        renewed = b.leases.renew(second, ttl_seconds=60)
        assert renewed.version == second.version + 1
        _close_backends(pg_url, store)
        assert b.leases.release(renewed).status == "released"
        rows, _transitions = store.lease_history(b.org)
        assert [(g.epoch, g.status) for g in rows] == [
            (first.epoch, "released"),
            (second.epoch, "released"),
        ]
    finally:
        store.close()
