"""Correct use of the sync client: mypy --strict must accept it, with exact result types."""

from __future__ import annotations

from typing import assert_type

from prefect_baton import (
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


def leases(b: Baton) -> None:
    lease = b.leases.acquire("deploy", "svc", ttl_seconds=60, scopes=["src/**"])
    assert_type(lease, Lease)
    assert_type(b.leases.renew(lease, ttl_seconds=30), Lease)
    assert_type(b.leases.inspect("deploy", "svc"), LeaseInfo)
    assert_type(b.leases.list(limit=10), Page[Lease])
    assert_type(
        b.leases.acquire_many([("deploy", "a"), ("deploy", "b")], ttl_seconds=60), list[Lease]
    )
    assert_type(b.leases.release(lease), Receipt)
    with b.lease("deploy", "svc", ttl_seconds=60) as held:
        assert_type(held, LeaseKeeper)
        b.checkpoints.save("svc", "plan", {"step": 1}, fence=held)


def records(b: Baton) -> None:
    ck = b.checkpoints.save("svc", "plan", {"step": 1}, expected_version=0)
    assert_type(ck, Checkpoint)
    assert_type(b.checkpoints.get("svc", "plan"), Checkpoint | None)
    assert_type(b.checkpoints.history("svc", "plan", limit=10, cursor=None), Page[Checkpoint])
    h = b.handoffs.create("agent-b", "svc", checkpoint_id=ck.checkpoint_id)
    assert_type(h, Handoff)
    assert_type(b.handoffs.resolve(h.handoff_id, "accepted", "ok"), Handoff)
    assert_type(b.handoffs.inbox(limit=10), Page[Handoff])
    assert_type(b.handoffs.list(party="*", status="pending", limit=10), Page[Handoff])
    out = b.outcomes.record("svc", "succeeded", evidence=[{"kind": "file", "uri": "u"}])
    assert_type(out, Outcome)
    assert_type(b.outcomes.record("svc", "failed"), Outcome)
    assert_type(b.outcomes.list("svc", limit=10, cursor=None), Page[Outcome])
    assert_type(b.events.list(after_seq=0, limit=10), Page[Event])
    assert_type(b.prune_receipts(), int)
    assert_type(b.as_principal("agent-b"), Baton)
