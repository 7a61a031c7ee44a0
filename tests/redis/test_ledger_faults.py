"""A journal entry the ledger refuses (issue #13 section 2): a generation whose epoch
another generation of its resource already has in the ledger. The reconciler records it as
a fault instead of raising a raw ``IntegrityError`` (or failing every drain after it), fails
the org closed (its Redis state is rebuilt from the ledger with higher epochs), and
``baton audit`` reports both the fault and the duplicate epoch. On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import fakeredis
import pytest
from sqlmodel import Session, select

from prefect_baton import Baton, BatonError, UnavailableError
from prefect_baton._stores.ledger.tables import GenerationRow, LeaseTransition
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton.audit import audit_ledger
from tests.conftest import store_for


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


def _phantom(url: str, org: str, lease_id: str, epoch: int) -> None:
    """Put into the ledger a released generation of ``res/r0`` with ``epoch`` that Redis
    never granted (as if Redis had handed the epoch out and then lost it)."""
    store = store_for(url)
    with Session(store.engines.write) as s:
        row = s.exec(select(GenerationRow).where(GenerationRow.lease_id == lease_id)).one()
        data = row.model_dump()
        data.update(lease_id=f"lease_{uuid.uuid4().hex}", epoch=epoch, version=row.version + 1)
        s.add(GenerationRow(**data))
        s.commit()


def test_refused_journal_entry_is_a_fault_not_a_crash(ledger_url: str) -> None:
    org = f"org-{uuid.uuid4().hex[:12]}"
    ledger = store_for(ledger_url)
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    auth = RedisAuthority(client, ledger, ack="ledger")
    try:
        a = Baton(org=org, principal="p-a", store=ledger, lease_authority=auth)
        b = a.as_principal("p-b")
        first = a.leases.acquire("res", "r0", ttl_seconds=30)
        a.leases.release(first)
        _phantom(ledger_url, org, first.lease_id, first.epoch + 1)
        # Redis grants epoch 2, which the ledger already has: the drain records the fault,
        # and with ack="ledger" the grant does not count
        with pytest.raises(UnavailableError, match="refused"):
            b.leases.acquire("res", "r0", ttl_seconds=30)
        assert not client.exists(org_keys(org).base.inc)  # failed closed
        report = audit_ledger(ledger, org)
        assert any("same epoch 2" in v for v in report.violations), report.violations
        assert any("refused by the ledger" in v for v in report.violations), report.violations
        # the library goes on: the refused grant does not exist after the rebuild
        a.events.list(limit=100)
        assert b.leases.list() == []
        assert b.leases.inspect("res", "r0").lease is None
        fresh = b.leases.acquire("res", "r0", ttl_seconds=30)
        assert fresh.epoch > EPOCH_RANGE
        auth.sync_ledger(org, strict=True)
        assert len(audit_ledger(ledger, org).violations) == len(report.violations)
    finally:
        auth.close()


def test_refused_entry_with_ack_redis_leaves_only_baton_errors(ledger_url: str) -> None:
    """With ``ack="redis"`` the clashing grant was acknowledged before the drain; the drain
    (here: the barrier of events.list) records the fault, and the grant's holder then gets
    BatonErrors from renew and fenced writes, never a raw IntegrityError."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    ledger = store_for(ledger_url)
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    auth = RedisAuthority(client, ledger, ack="redis", reconcile_in_client=False)
    try:
        a = Baton(org=org, principal="p-a", store=ledger, lease_authority=auth)
        b = a.as_principal("p-b")
        first = a.leases.acquire("res", "r0", ttl_seconds=30)
        a.leases.release(first)
        auth.sync_ledger(org, strict=True)
        _phantom(ledger_url, org, first.lease_id, first.epoch + 1)
        clash = b.leases.acquire("res", "r0", ttl_seconds=30)
        assert clash.epoch == first.epoch + 1
        a.events.list(limit=100)  # drains: the fault is recorded
        assert not client.exists(org_keys(org).base.inc)
        with pytest.raises(BatonError):
            b.leases.renew(clash)
        with pytest.raises(BatonError):
            b.checkpoints.save("s", "k", {"x": 1}, fence=clash)
        assert any("same epoch" in v for v in audit_ledger(ledger, org).violations)
    finally:
        auth.close()


def test_audit_flags_two_generations_with_one_epoch(ledger_url: str) -> None:
    """A transition of another lease id with an epoch a generation of its resource already
    has (however it got into the ledger) is reported by the audit."""
    org = f"org-{uuid.uuid4().hex[:12]}"
    ledger = store_for(ledger_url)
    a = Baton(org=org, principal="p-a", store=ledger)
    lease = a.leases.acquire("res", "r0", ttl_seconds=30)
    assert audit_ledger(ledger, org).ok
    with Session(ledger.engines.write) as s:
        t = s.exec(select(LeaseTransition).where(LeaseTransition.lease_id == lease.lease_id)).one()
        data = t.model_dump(exclude={"seq"})
        data.update(lease_id=f"lease_{uuid.uuid4().hex}", version=t.version + 1)
        s.add(LeaseTransition(**data))
        s.commit()
    report = audit_ledger(ledger, org)
    assert any(f"same epoch {lease.epoch}" in v for v in report.violations), report.violations
