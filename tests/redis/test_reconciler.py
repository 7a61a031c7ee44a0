"""The reconciler's ledger writes on SQLite and PostgreSQL: a journal applied in one batch
writes the same rows as the same journal applied one entry per batch (a lease acquired and
released within a batch is one row in its final state, with both transitions and events),
re-applying entries changes nothing (on PostgreSQL this is the path where the ``COPY`` of
transitions and events meets rows already there), and the org and principals are
registered."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from sqlalchemy import text

from prefect_baton import Baton
from prefect_baton._rules.core import canonical_json
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.reconciler import Reconciler
from prefect_baton.audit import audit_ledger

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    """A SQLite ledger of the test, or the session's PostgreSQL ledger."""
    if request.param == "sqlite":
        s = LedgerStore(f"sqlite:///{tmp_path / 'ledger.db'}")
        yield s
        s.close()
        return
    from tests.conftest import store_for

    yield store_for(str(request.getfixturevalue("pg_url")))


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> fakeredis.FakeRedis:
    """A fakeredis client whose journal is never trimmed, so it can be applied again."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    monkeypatch.setattr(client, "xtrim", lambda *a, **k: 0)
    return client


PAIRS = 40
"""Acquire+release pairs of the workload besides its 9 other entries: with them a batch of
the whole journal is large enough for the ``COPY`` path (``COPY_MIN_ENTRIES``)."""
ENTRIES = 9 + 2 * PAIRS


def _workload(auth: RedisAuthority) -> Baton:
    """Leases of every kind of transition, left in the journal (nothing drained), and
    :data:`PAIRS` acquire+release pairs of other principals."""
    a = Baton(
        org=f"org-{uuid.uuid4().hex[:12]}",
        principal="agent-a",
        store=auth.store,
        lease_authority=auth,
    )
    lease = a.leases.acquire("res", "r0", ttl_seconds=30)
    a.leases.release(lease)
    lease = a.leases.acquire("res", "r1", ttl_seconds=30, idempotency_key="k1")
    lease = a.leases.renew(lease)
    moved = a.leases.transfer(lease, to_principal="agent-b", new_execution_key="k2", ttl_seconds=30)
    a.as_principal("agent-b").leases.release(moved)
    scoped = a.leases.acquire("res", "r2", ttl_seconds=30, scopes=["p/**"], purpose='say "hi"\\')
    a.as_principal("boss", role="admin").leases.force_release(scoped.lease_id)
    a.leases.acquire("res", "r0", ttl_seconds=30)
    for i in range(PAIRS):
        other = a.as_principal(f"agent-{i % 3}")
        other.leases.release(other.leases.acquire("res", f"p{i % 7}-é", ttl_seconds=30))
    return a


def _rows(store: LedgerStore, org: str) -> dict[str, list[dict[str, Any]]]:
    """The org's lease rows, transitions and events (in ``seq`` order, without ``seq``),
    acquire receipts (without their serial id), journal cursor, principals and org row."""
    queries = {
        "leases": "SELECT * FROM baton_leases WHERE org_id = :o ORDER BY lease_id",
        "transitions": "SELECT * FROM baton_lease_transitions WHERE org_id = :o ORDER BY seq",
        "events": "SELECT * FROM baton_events WHERE org_id = :o ORDER BY seq",
        # the acquire receipts, and the journal cursor's value (where it was created differs)
        "receipts": "SELECT * FROM baton_receipts WHERE org_id = :o AND operation = 'acquire' "
        "ORDER BY idem_key",
        "cursor": "SELECT response FROM baton_receipts WHERE org_id = :o "
        "AND operation = 'redis.journal'",
        "principals": "SELECT name, role FROM baton_principals WHERE org_id = :o ORDER BY name",
        "orgs": "SELECT org_id FROM baton_organizations WHERE org_id = :o",
    }
    out: dict[str, list[dict[str, Any]]] = {}
    with store.engines.read.connect() as conn:
        for name, sql in queries.items():
            rows = conn.execute(text(sql), {"o": org}).mappings()
            out[name] = [{k: v for k, v in r.items() if k not in ("seq", "id")} for r in rows]
    return out


def _forget(store: LedgerStore, org: str) -> None:
    """Delete what the reconciler wrote for ``org`` (not the org and principals)."""
    with store.engines.write.begin() as conn:
        for table in ("baton_leases", "baton_lease_transitions", "baton_events", "baton_receipts"):
            conn.execute(text(f"DELETE FROM {table} WHERE org_id = :o"), {"o": org})


def _forget_cursor(store: LedgerStore, org: str) -> None:
    with store.engines.write.begin() as conn:
        conn.execute(
            text("DELETE FROM baton_receipts WHERE org_id = :o AND operation = 'redis.journal'"),
            {"o": org},
        )


# --------------------------------------------------------------------------- tests


def test_one_batch_writes_the_rows_of_one_entry_per_batch(
    journal: fakeredis.FakeRedis, store: LedgerStore
) -> None:
    """The journal applied as one batch and applied one entry per batch leave the same lease
    rows, transitions, events (same ids, payloads and order) and receipts."""
    auth = RedisAuthority(journal, store, ack="redis", reconcile_in_client=False)
    a = _workload(auth)
    assert Reconciler(journal, store, batch_size=1000).drain(a.org) == ENTRIES
    whole = _rows(store, a.org)
    _forget(store, a.org)
    assert Reconciler(journal, store, batch_size=1).drain(a.org) == ENTRIES
    assert _rows(store, a.org) == whole
    assert audit_ledger(store, a.org).ok

    # the lease acquired and released in the batch: one row, released, two transitions
    r0 = [row for row in whole["leases"] if row["resource_id"] == "r0"]
    assert sorted(row["status"] for row in r0) == ["active", "released"]
    first = next(row for row in r0 if row["status"] == "released")["lease_id"]
    actions = [t["action"] for t in whole["transitions"] if t["lease_id"] == first]
    assert actions == ["acquire", "release"]
    kinds = [e["kind"] for e in whole["events"]]
    assert kinds[9:] == ["lease.acquired", "lease.released"] * PAIRS
    assert kinds[:9] == [
        "lease.acquired",
        "lease.released",
        "lease.acquired",
        "lease.renewed",
        "lease.transferred",
        "lease.released",
        "lease.acquired",
        "lease.released",
        "lease.acquired",
    ]
    assert [(p["name"], p["role"]) for p in whole["principals"]] == [
        ("agent-0", "agent"),
        ("agent-1", "agent"),
        ("agent-2", "agent"),
        ("agent-a", "agent"),
        ("agent-b", "agent"),
        ("boss", "admin"),
    ]
    assert whole["orgs"] == [{"org_id": a.org}]
    # payloads are canonical JSON, as the ledger store writes them
    assert all(e["payload"] == canonical_json(json.loads(e["payload"])) for e in whole["events"])
    assert any("é" in e["payload"] for e in whole["events"])
    assert [r["idem_key"] for r in whole["receipts"]] == ["k1"]


def test_reapplying_entries_changes_nothing(
    journal: fakeredis.FakeRedis, store: LedgerStore
) -> None:
    """With the cursor lost and the journal untrimmed, draining again applies every entry
    again (PostgreSQL: the COPY meets the rows already there and the batch is written
    with insert-or-ignore instead) and leaves the same rows; rows missing from such a
    batch are written."""
    auth = RedisAuthority(journal, store, ack="redis", reconcile_in_client=False)
    a = _workload(auth)
    rec = Reconciler(journal, store, batch_size=1000)
    assert rec.drain(a.org) == ENTRIES
    before = _rows(store, a.org)
    for batch_size in (1000, 4):  # one batch (COPY on PostgreSQL), small batches
        _forget_cursor(store, a.org)
        assert Reconciler(journal, store, batch_size=batch_size).drain(a.org) == ENTRIES
        assert _rows(store, a.org) == before
    # part of a batch already there: the last transition and event are missing
    _forget_cursor(store, a.org)
    with store.engines.write.begin() as conn:
        for table in ("baton_lease_transitions", "baton_events"):
            conn.execute(
                text(
                    f"DELETE FROM {table} WHERE seq = "
                    f"(SELECT max(seq) FROM {table} WHERE org_id = :o)"
                ),
                {"o": a.org},
            )
    assert len(_rows(store, a.org)["events"]) == ENTRIES - 1
    assert Reconciler(journal, store, batch_size=1000).drain(a.org) == ENTRIES
    assert _rows(store, a.org) == before
    assert audit_ledger(store, a.org).ok


def test_a_changed_role_is_written_again(journal: fakeredis.FakeRedis, store: LedgerStore) -> None:
    """A principal registered by an earlier batch is written again when a later entry
    carries another role."""
    auth = RedisAuthority(journal, store, ack="redis", reconcile_in_client=False)
    a = _workload(auth)
    rec = Reconciler(journal, store)
    rec.drain(a.org)
    lease = a.as_principal("boss", role="owner").leases.acquire("res", "r9", ttl_seconds=30)
    rec.drain(a.org)
    assert {"name": "boss", "role": "owner"} in _rows(store, a.org)["principals"]
    a.as_principal("boss", role="admin").leases.force_release(lease.lease_id)
    rec.drain(a.org)
    assert {"name": "boss", "role": "admin"} in _rows(store, a.org)["principals"]


def test_a_drain_into_a_read_only_sqlite_ledger_says_the_file_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconciler reports a ledger write refused for lack of permission as the ledger
    store does (the one rule, ``ledger_failure``): ``UNAVAILABLE`` naming the file and
    saying it is not writable, not the bare driver text."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from prefect_baton.errors import UnavailableError

    path = tmp_path / "ledger.db"
    store = LedgerStore(f"sqlite:///{path}")
    rec = Reconciler(fakeredis.FakeRedis(server=fakeredis.FakeServer()), store)
    refused = sqlite3.OperationalError("attempt to write a readonly database")
    refused.sqlite_errorcode = 8  # SQLITE_READONLY

    def read_only(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("INSERT ...", {}, refused)

    monkeypatch.setattr(rec, "_apply", read_only)
    try:
        with pytest.raises(UnavailableError, match="not writable") as caught:
            rec.drain_once("org-ro")
        assert str(path) in caught.value.message
    finally:
        store.close()
