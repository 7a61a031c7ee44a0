"""Correct use of the async client: mypy --strict must accept it, with the same result
types as the sync client (an ``Any`` result fails ``assert_type``)."""

from __future__ import annotations

from typing import assert_type

from prefect_baton import (
    AsyncBaton,
    AsyncLeaseAPI,
    Baton,
    Checkpoint,
    Event,
    Handoff,
    Lease,
    LeaseInfo,
    LeaseKeeper,
    Outcome,
    Page,
    Receipt,
)


async def leases(ab: AsyncBaton) -> None:
    assert_type(ab.leases, AsyncLeaseAPI)
    lease = await ab.leases.acquire("deploy", "svc", ttl_seconds=60, scopes=["src/**"])
    assert_type(lease, Lease)
    assert_type(await ab.leases.renew(lease, ttl_seconds=30), Lease)
    assert_type(await ab.leases.inspect("deploy", "svc"), LeaseInfo)
    assert_type(await ab.leases.list(limit=10), Page[Lease])
    many = await ab.leases.acquire_many([("deploy", "a"), ("deploy", "b")], ttl_seconds=60)
    assert_type(many, list[Lease])
    assert_type(await ab.leases.release(lease), Receipt)
    async with ab.lease("deploy", "svc", ttl_seconds=60) as held:
        assert_type(held, LeaseKeeper)
        await ab.checkpoints.save("svc", "plan", {"step": 1}, fence=held)


async def records(ab: AsyncBaton) -> None:
    ck = await ab.checkpoints.save("svc", "plan", {"step": 1}, expected_version=0)
    assert_type(ck, Checkpoint)
    assert_type(await ab.checkpoints.get("svc", "plan"), Checkpoint | None)
    assert_type(
        await ab.checkpoints.history("svc", "plan", limit=10, cursor=None), Page[Checkpoint]
    )
    h = await ab.handoffs.create("agent-b", "svc", checkpoint_id=ck.checkpoint_id)
    assert_type(h, Handoff)
    assert_type(await ab.handoffs.resolve(h.handoff_id, "accepted", "ok"), Handoff)
    assert_type(await ab.handoffs.inbox(limit=10), Page[Handoff])
    assert_type(await ab.handoffs.list(party="*", status="pending", limit=10), Page[Handoff])
    out = await ab.outcomes.record("svc", "succeeded", evidence=[{"kind": "file", "uri": "u"}])
    assert_type(out, Outcome)
    assert_type(await ab.outcomes.record("svc", "failed"), Outcome)
    assert_type(await ab.outcomes.list("svc", limit=10, cursor=None), Page[Outcome])
    assert_type(await ab.events.list(after_seq=0, limit=10), Page[Event])
    assert_type(await ab.prune_receipts(), int)
    assert_type(ab.as_principal("agent-b"), AsyncBaton)
    assert_type(ab.sync, Baton)


async def client() -> None:
    async with AsyncBaton(org="acme", principal="agent-a") as ab:
        assert_type(ab, AsyncBaton)
        assert_type(ab.org, str)
    await AsyncBaton.from_settings(org="acme").aclose()
    remote = AsyncBaton(api_url="http://127.0.0.1:8787", api_key="bk_x", ack="ledger")
    assert_type(AsyncBaton(sync=remote.sync), AsyncBaton)
    assert_type(AsyncBaton("sqlite:///l.db", "acme", "agent-a", "owner"), AsyncBaton)
