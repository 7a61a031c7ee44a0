"""Which clients watch for a new Redis server process (``_stores/redis/restarts.py``), and
what a connection to a server whose ``run_id`` is not the recorded one does. The restart
itself (an older snapshot loaded) is in ``test_faults.py``."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import fakeredis
from redis.sentinel import Sentinel

import redis
from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton._stores.redis.restarts import RUN_KEY, watch_restarts

from .conftest import RedisServer


def test_sentinel_primaries_are_watched_and_fakes_are_not() -> None:
    """A Sentinel-managed client (its connections follow the primary through a failover)
    checks each new connection; an in-process fake (no ``INFO``) is left as it is. Neither
    connects here."""
    primary = Sentinel([("127.0.0.1", 1)], socket_connect_timeout=0.1).master_for("baton")
    assert watch_restarts(primary)
    assert primary.connection_pool.connection_kwargs["redis_connect_func"] is not None
    fake = fakeredis.FakeRedis()
    assert not watch_restarts(fake)
    assert "redis_connect_func" not in fake.connection_pool.connection_kwargs


def test_a_connection_to_an_unrecorded_server_process_rebuilds_every_listed_org(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """``baton:run`` naming another process (as after a restart that kept the data): the
    next new connection deletes every listed org's marker and records this process's
    ``run_id``; each org's next operation rebuilds it from the ledger, so the epochs it
    grants start at the next incarnation's floor."""
    orgs = [f"org-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    first = make_authority(ack="ledger")
    before = [
        Baton(org=org, principal="a", store=ledger, lease_authority=first).leases.acquire(
            "repo", "x", ttl_seconds=60
        )
        for org in orgs
    ]
    assert all(lease.epoch < EPOCH_RANGE for lease in before)
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    run_id = admin.info("server")["run_id"]
    assert admin.get(RUN_KEY) == run_id
    admin.set(RUN_KEY, "0" * 40)

    second = make_authority(ack="ledger")
    other = Baton(org=orgs[0], principal="b", store=ledger, lease_authority=second)
    assert other.leases.inspect("repo", "x") is not None  # connects: the check runs first
    assert admin.get(RUN_KEY) == run_id
    for org, lease in zip(orgs, before, strict=True):
        holder = Baton(org=org, principal="a", store=ledger, lease_authority=second)
        holder.leases.release(holder.leases.renew(lease))
        again = holder.leases.acquire("repo", "x", ttl_seconds=60)
        assert again.epoch >= EPOCH_RANGE
        assert admin.exists(org_keys(org).base.inc)
