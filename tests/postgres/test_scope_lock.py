"""PostgreSQL: an acquire that supersedes its own effective *scoped* lease without scopes
holds the org's scope lock, so a concurrent scoped acquire of another principal never sees
that lease ended before its recorded end (the overlap the many-process test once found:
'area/**' ended at t+3 ms, 'area/r4/*' granted at t)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from tests.conftest import store_for


def test_unscoped_supersede_of_a_scoped_lease_waits_for_the_scope_lock(pg_url: str) -> None:
    store_for(pg_url)  # the schema, migrated
    store = LedgerStore(pg_url, migrate=False)
    org = f"org-{uuid.uuid4().hex[:12]}"
    b = Baton(org=org, principal="p1", store=store)
    try:
        scoped = b.leases.acquire("res", "r0", ttl_seconds=60, scopes=["area/**"])
        box: dict[str, Any] = {}
        with psycopg.connect(pg_url) as admin:  # a transaction holding the scope lock
            admin.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"scopes:{org}",)
            )

            def supersede() -> None:
                box["lease"] = b.leases.acquire("res", "r0", ttl_seconds=60)

            t = threading.Thread(target=supersede, daemon=True)
            t.start()
            t.join(1.0)
            assert t.is_alive(), "the supersede did not wait for the scope lock"
            row = admin.execute(
                "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
            ).fetchone()
            assert row is not None
            released_at_ms = int(row[0])
            admin.commit()
        t.join(30)
        assert not t.is_alive()
        new = box["lease"]
        assert new.epoch == scoped.epoch + 1
        assert new.scopes == ()
        rows, _transitions = store.lease_history(org)
        ended = next(g for g in rows if g.lease_id == scoped.lease_id)
        assert ended.status == "superseded"
        assert ended.ended_at_ms is not None
        assert ended.ended_at_ms >= released_at_ms
    finally:
        store.close()
