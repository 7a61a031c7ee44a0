"""The filtered event listing reads through its index on SQLite (which keeps no planner
statistics in a ledger): a resource's events through ``ix_event_lease``, a subject's
through ``ix_event_subject``, never the org's whole stream (``ix_event_org_seq``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"resource_type": "t", "resource_id": "r3"}, "ix_event_lease"),
        ({"resource_type": "t", "resource_id": "r3", "kind": "lease.released"}, "ix_event_lease"),
        ({"subject": "t/r3"}, "ix_event_subject"),
    ],
)
def test_filtered_list_reads_through_its_index(
    tmp_path: Path, filters: dict[str, Any], index: str
) -> None:
    """The query plan of a filtered listing searches ``index``, not the org's stream."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'ledger.db'}")
    b = Baton(org="o", principal="a", store=store)
    for i in range(60):
        b.leases.release(b.leases.acquire("t", f"r{i % 6}", ttl_seconds=60))
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM baton_events" in statement:
            seen.append((statement, params))

    engine = store.engines.read
    event.listen(engine, "before_cursor_execute", grab)
    try:
        events = b.events.list(after_seq=3, **filters)
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    assert events
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    [(statement, params)] = seen
    with engine.connect() as conn:
        plan = " ".join(
            str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
        )
    assert index in plan
    assert "ix_event_org_seq" not in plan
    store.close()
