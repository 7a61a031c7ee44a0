"""Mistakes mypy must catch, on the sync and the async client alike.

Each line carries the ``# type: ignore[<code>]`` of the error it must produce; strict mypy
(``warn_unused_ignores``) reports an ignore that silences nothing, so this file fails the
check as soon as a mistake is no longer caught.
"""

from __future__ import annotations

from sqlalchemy import Engine

from prefect_baton import AsyncBaton, Baton, Lease


def sync_mistakes(b: Baton, lease: Lease) -> None:
    b.leases.acquire("deploy", "svc", ttl_secnds=60)  # type: ignore[call-arg]
    b.leases.acquire("deploy", "svc", ttl_seconds="60")  # type: ignore[arg-type]
    b.leases.renew(lease, 30)  # type: ignore[call-arg]
    b.checkpoints.save("svc", "plan", {"step": 1}, fenc=lease)  # type: ignore[call-arg]
    b.lease("deploy", "svc", ttl_secnds=60)  # type: ignore[call-arg]
    b.leases.aquire("deploy", "svc", ttl_seconds=60)  # type: ignore[attr-defined]


async def async_mistakes(ab: AsyncBaton, lease: Lease) -> None:
    AsyncBaton(org="acme", ackk="ledger")  # type: ignore[call-overload]
    AsyncBaton(ledger_url=1)  # type: ignore[call-overload]
    await ab.leases.acquire("deploy", "svc", ttl_secnds=60)  # type: ignore[call-arg]
    await ab.leases.acquire("deploy", "svc", ttl_seconds="60")  # type: ignore[arg-type]
    await ab.leases.renew(lease, 30)  # type: ignore[call-arg]
    await ab.checkpoints.save("svc", "plan", {"step": 1}, fenc=lease)  # type: ignore[call-arg]
    await ab.handoffs.resolve("h", "accepted", nte="x")  # type: ignore[call-arg]
    await ab.outcomes.record("svc", "failed", evidnce=[])  # type: ignore[call-arg]
    await ab.events.list(kind=1)  # type: ignore[arg-type]
    ab.lease("deploy", "svc", ttl_secnds=60)  # type: ignore[call-arg]
    await ab.leases.aquire("deploy", "svc", ttl_seconds=60)  # type: ignore[attr-defined]
    wrong: int = await ab.leases.acquire("deploy", "svc", ttl_seconds=60)  # type: ignore[assignment]
    del wrong
    not_awaited: Lease = ab.leases.acquire("deploy", "svc", ttl_seconds=60)  # type: ignore[assignment]
    del not_awaited


def fencing_mistakes(engine: Engine, lease: Lease) -> None:
    from prefect_baton.fencing import guard, headers

    with engine.begin() as conn:
        guard(conn, lease.lease_id)  # type: ignore[arg-type]
        guard(conn, lease.epoch)  # type: ignore[arg-type]
        guard(engine, lease)  # type: ignore[arg-type]
    headers(lease.fencing_token)  # type: ignore[arg-type]
