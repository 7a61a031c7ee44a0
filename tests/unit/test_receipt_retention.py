"""Idempotency receipts are kept for the retention and then pruned."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from prefect_baton import Baton
from prefect_baton._stores.ledger import base as store_mod
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import ReceiptRow


def _count(store: LedgerStore, org: str) -> int:
    with store._read() as (s, _now):
        return int(
            s.execute(
                select(func.count()).select_from(ReceiptRow).where(ReceiptRow.org_id == org)
            ).scalar_one()
        )


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


def test_expired_receipts_are_ignored_and_pruned(url: str) -> None:
    """A receipt past its retention is not replayed and prune_receipts deletes it."""
    store = LedgerStore(url, receipt_retention_seconds=0)
    b = Baton(org=f"o-{uuid.uuid4().hex[:8]}", principal="a", store=store)
    first = b.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    again = b.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    assert not again.replayed
    assert again.version == first.version + 1
    assert _count(store, b.org) >= 1
    assert b.prune_receipts() >= 1
    assert _count(store, b.org) == 0
    store.close()


def test_receipts_within_retention_replay(url: str) -> None:
    """Within the retention an exact retry replays the stored receipt."""
    store = LedgerStore(url)
    b = Baton(org=f"o-{uuid.uuid4().hex[:8]}", principal="a", store=store)
    first = b.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    again = b.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    assert again.replayed
    assert again.version == first.version
    assert b.prune_receipts() == 0 or _count(store, b.org) == 1
    store.close()


def test_writes_prune_expired_receipts_in_passing(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ordinary writes delete expired receipts now and then, with no sweeper."""
    monkeypatch.setattr(store_mod, "PRUNE_EVERY_WRITES", 1)
    store = LedgerStore(url, receipt_retention_seconds=0)
    b = Baton(org=f"o-{uuid.uuid4().hex[:8]}", principal="a", store=store)
    b.checkpoints.save("s", "k", {"n": 1}, idempotency_key="save-1")
    b.checkpoints.save("s", "k2", {"n": 1})
    assert _count(store, b.org) == 0
    store.close()


def test_a_handed_off_execution_key_is_refused_only_while_its_receipt_is_kept(url: str) -> None:
    """The refusal of a transferred execution key (``LEASE_LOST``, ``transferred``, even
    after the recipient released the resource) rests on the acquire's receipt: past
    ``BATON_RECEIPT_RETENTION_SECONDS`` (here 0) the same key acquires the resource again as
    a new request, as docs/concepts.md and docs/prefect.md say."""
    store = LedgerStore(url, receipt_retention_seconds=0)
    b = Baton(org=f"o-{uuid.uuid4().hex[:8]}", principal="sender", store=store)
    old = b.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="run-1")
    moved = b.leases.transfer(
        old, to_principal="recipient", new_execution_key="run-2", ttl_seconds=30
    )
    b.as_principal("recipient").leases.release(moved)
    b.prune_receipts()
    again = b.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="run-1")
    assert again.lease_id != old.lease_id
    assert again.epoch > moved.epoch
    store.close()
