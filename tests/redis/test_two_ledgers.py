"""Two ledgers whose clients share one Redis database and an org name: the org's Redis state
belongs to the ledger that built it (the ledger id in its incarnation marker,
``check_org_ledger``). A client of the other ledger is refused at its first use of the org
(``VALIDATION_ERROR`` naming the org, the Redis and the other ledger) and a reconciler of the
other ledger skips the org without applying or trimming its journal: nothing reaches the
wrong ledger, and the right one still gets every entry. A marker of an earlier version,
without a ledger id, is accepted and gets one at the next rebuild. Real Redis (the test
database of ``BATON_TEST_REDIS_URL``); the first ledger on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import text

from prefect_baton import Baton, ValidationError
from prefect_baton._stores.ledger.authority import INCARNATION_OP, LEDGER_ID_FIELD
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.connection import server_address
from prefect_baton._stores.redis.keys import MARKER_LEDGER_FIELD, org_keys
from prefect_baton._stores.redis.reconciler import run_reconciler
from tests.conftest import REDIS_URL, require_redis, store_for


@pytest.fixture(params=["sqlite", "postgresql"])
def first(request: pytest.FixtureRequest, tmp_path: Path) -> LedgerStore:
    """The ledger that builds the org's Redis state."""
    if request.param == "sqlite":
        return store_for(f"sqlite:///{tmp_path / 'first.db'}")
    return store_for(str(request.getfixturevalue("pg_url")))


@pytest.fixture
def second(tmp_path: Path) -> LedgerStore:
    """Another ledger, whose clients use the same Redis database and org name."""
    return store_for(f"sqlite:///{tmp_path / 'second.db'}")


@pytest.fixture
def org() -> str:
    return f"acme-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def authorities() -> Iterator[list[RedisAuthority]]:
    require_redis()
    made: list[RedisAuthority] = []
    yield made
    for auth in made:
        auth.close()


def _authority(made: list[RedisAuthority], ledger: LedgerStore, **kwargs: object) -> RedisAuthority:
    opts: dict[str, object] = {"ack": "redis", "reconcile_in_client": False, **kwargs}
    auth = RedisAuthority(connect(REDIS_URL), ledger, owns_client=True, **opts)  # type: ignore[arg-type]
    made.append(auth)
    return auth


def _rows(ledger: LedgerStore, org: str) -> dict[str, int]:
    """How many rows ``org`` has in the ledger's tables that a drain writes."""
    tables = ("baton_organizations", "baton_leases", "baton_lease_transitions", "baton_events")
    with ledger.engines.read.connect() as conn:
        return {
            t: int(
                conn.execute(
                    text(f"SELECT count(*) FROM {t} WHERE org_id = :o"), {"o": org}
                ).scalar_one()
            )
            for t in tables
        }


def test_a_reconciler_of_another_ledger_skips_the_org_and_leaves_its_journal(
    first: LedgerStore, second: LedgerStore, org: str, authorities: list[RedisAuthority]
) -> None:
    """The trial's case: a lease acquired through the first ledger's client, then a
    reconcile with the second ledger and the same Redis database. It applies nothing,
    writes nothing to the second ledger, keeps the journal, and says why; a reconcile with
    the first ledger then applies the entry."""
    auth = _authority(authorities, first)
    lease = Baton(org=org, principal="a", store=first, lease_authority=auth).leases.acquire(
        "file", "a.py", ttl_seconds=60
    )
    journal = org_keys(org).journal
    pending = int(auth.client.xlen(journal))
    assert pending >= 1

    wrong = run_reconciler(client=auth.client, store=second, orgs=[org])
    assert wrong.applied == 0
    assert list(wrong.skipped) == [org]
    reason = wrong.skipped[org]
    assert repr(org) in reason
    assert str(server_address(auth.client)) in reason
    assert "another ledger" in reason
    assert set(_rows(second, org).values()) == {0}
    assert int(auth.client.xlen(journal)) == pending

    right = run_reconciler(client=auth.client, store=first, orgs=[org])
    assert right.applied == pending
    assert not right.skipped
    with first.engines.read.connect() as conn:
        found = conn.execute(
            text("SELECT lease_id FROM baton_leases WHERE org_id = :o"), {"o": org}
        ).scalars()
        assert list(found) == [lease.lease_id]


def test_a_client_of_another_ledger_is_refused_at_its_first_use_of_the_org(
    first: LedgerStore, second: LedgerStore, org: str, authorities: list[RedisAuthority]
) -> None:
    """Every lease call of the second ledger's client is refused before Redis decides
    anything (with either acknowledgement mode), its hand-back too; the first ledger's
    client and state are unchanged."""
    auth = _authority(authorities, first)
    mine = Baton(org=org, principal="a", store=first, lease_authority=auth)
    held = mine.leases.acquire("file", "a.py", ttl_seconds=60)
    auth.reconciler.drain(org)
    before = auth.client.xlen(org_keys(org).journal)
    for ack in ("redis", "ledger"):
        other = _authority(authorities, second, ack=ack)
        theirs = Baton(org=org, principal="b", store=second, lease_authority=other)
        calls: list[Callable[[], object]] = [
            partial(theirs.leases.acquire, "file", "b.py", ttl_seconds=60),
            partial(theirs.leases.inspect, "file", "a.py"),
            partial(other.return_to_ledger, org),
        ]
        for call in calls:
            with pytest.raises(ValidationError, match=r"belongs to another ledger") as err:
                call()
            assert repr(org) in str(err.value)
            assert str(server_address(auth.client)) in str(err.value)
    assert auth.client.xlen(org_keys(org).journal) == before
    assert set(_rows(second, org).values()) == {0}
    info = mine.leases.inspect("file", "a.py")
    assert info.lease is not None
    assert info.lease.lease_id == held.lease_id
    assert not mine.leases.inspect("file", "b.py").held


def test_an_org_whose_marker_has_no_ledger_id_keeps_working(
    first: LedgerStore, org: str, authorities: list[RedisAuthority]
) -> None:
    """A marker and an incarnation row written before ledger ids were recorded: clients
    and the reconciler go on using the org, and the next rebuild records an id in both."""
    auth = _authority(authorities, first)
    held = Baton(org=org, principal="a", store=first, lease_authority=auth).leases.acquire(
        "file", "a.py", ttl_seconds=60
    )
    keys = org_keys(org)
    auth.client.hdel(keys.inc, MARKER_LEDGER_FIELD)
    with first.engines.write.begin() as conn:
        row = auth.reconciler._system_row(conn, org, INCARNATION_OP)
        assert row is not None
        assert row.pop(LEDGER_ID_FIELD)
        auth.reconciler._set_system_row(conn, org, INCARNATION_OP, row, 0)

    later = _authority(authorities, first)
    baton = Baton(org=org, principal="a", store=first, lease_authority=later)
    renewed = baton.leases.renew(held, ttl_seconds=60)
    assert run_reconciler(client=later.client, store=first, orgs=[org]).applied >= 2
    assert _rows(first, org)["baton_leases"] == 1

    auth.client.delete(keys.inc)  # a loss: the next operation rebuilds from the ledger
    assert baton.leases.renew(renewed, ttl_seconds=60).version == renewed.version + 1
    marker = auth.client.hget(keys.inc, MARKER_LEDGER_FIELD)
    with first.engines.read.connect() as conn:
        row = later.reconciler._system_row(conn, org, INCARNATION_OP)
    assert marker is not None
    assert row is not None
    assert marker.decode() == row[LEDGER_ID_FIELD]
