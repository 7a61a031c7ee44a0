"""The request digests of acquire receipts agree across stores: the ledger's acquire, its
``acquire_many`` and the Redis authority's store the same digest for the same request, so a
replay after Redis lost its data (and was rebuilt from the ledger's receipts) still matches."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
from sqlalchemy import select
from sqlmodel import col

from prefect_baton import IdempotencyMismatchError
from prefect_baton._rules.digests import acquire_digest
from prefect_baton._stores.ledger.many import ledger_acquire_many
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import ReceiptRow
from prefect_baton._stores.protocol import Caller, Execution
from prefect_baton._stores.redis.authority import AcquireRequest, RedisAuthority
from prefect_baton._stores.redis.keys import org_keys

REQUEST = AcquireRequest("repo", "main", 60_000, ("docs/**", "src/*.py"), "merge", 0)


@pytest.fixture
def auth(ledger: LedgerStore) -> Iterator[RedisAuthority]:
    """An authority on a fakeredis server of its own, with ``ack="ledger"``."""
    a = RedisAuthority(fakeredis.FakeRedis(server=fakeredis.FakeServer()), ledger, ack="ledger")
    yield a
    a.close()


def _caller() -> Caller:
    return Caller(org=f"org-{uuid.uuid4().hex[:12]}", principal="agent-a", role="agent")


def _ledger_digest(store: LedgerStore, caller: Caller, key: str) -> str:
    with store._read() as (s, _now):
        row = s.execute(
            select(ReceiptRow).where(
                col(ReceiptRow.org_id) == caller.org,
                col(ReceiptRow.principal) == caller.principal,
                col(ReceiptRow.operation) == "acquire",
                col(ReceiptRow.idem_key) == key,
            )
        ).scalar_one()
        return str(row.request_digest)


def _acquire(a: LedgerStore | RedisAuthority, caller: Caller, key: str) -> None:
    a.acquire(caller, REQUEST, Execution(key))


def test_ledger_and_redis_store_the_same_acquire_digest(
    ledger: LedgerStore, auth: RedisAuthority
) -> None:
    want = acquire_digest(
        ttl_ms=REQUEST.ttl_ms,
        scopes=REQUEST.scopes,
        purpose=REQUEST.purpose,
        expected_version=REQUEST.expected_version,
    )
    on_ledger, on_many, on_redis = _caller(), _caller(), _caller()
    _acquire(ledger, on_ledger, "exec-1")
    ledger_acquire_many(ledger, on_many, [REQUEST], Execution("exec-1"))
    _acquire(auth, on_redis, "exec-1")
    keys = org_keys(on_redis.org)
    raw = auth.client.hget(
        keys.base.kept, keys.receipt_field("agent-a", "exec-1", REQUEST.resource_type, "main")
    )
    assert json.loads(raw)["d"] == want
    assert _ledger_digest(ledger, on_ledger, "exec-1") == want
    assert _ledger_digest(ledger, on_many, "exec-1") == want
    assert _ledger_digest(ledger, on_redis, "exec-1") == want  # reconciled from Redis


def test_a_replay_after_a_rebuild_matches_the_restored_digest(
    ledger: LedgerStore, auth: RedisAuthority
) -> None:
    caller = _caller()
    _acquire(auth, caller, "exec-1")
    auth.client.flushall()  # Redis loses its data; the next call rebuilds from the ledger
    lease = auth.acquire(caller, REQUEST, Execution("exec-1"))
    assert lease.replayed
    with pytest.raises(IdempotencyMismatchError):
        auth.acquire(
            caller,
            REQUEST._replace(ttl_ms=REQUEST.ttl_ms + 1000),
            Execution("exec-1"),
        )
