"""The Redis lease authority on a real Redis Cluster (three masters started by the session
fixture ``redis_cluster``, no persistence): orgs land on different nodes by their hash tag,
the lease loop and the reconciler work there unchanged, fencing holds, and the loss of one
master's data fails only its orgs closed until they are rebuilt from the ledger with higher
epochs. A slice of the conformance suite runs on the cluster too (bottom of this file)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from redis.cluster import key_slot

from prefect_baton import (
    Baton,
    ConflictError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
    ValidationError,
)
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.cluster import BatonRedisCluster, is_cluster_url, node_time_ms
from prefect_baton._stores.redis.keys import ORGS_KEY, org_keys
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton._stores.redis.reconciler import registered_orgs, run_reconciler
from prefect_baton.audit import audit_ledger
from tests.conformance import (
    test_handoffs,
    test_idempotency,
    test_isolation,
    test_leases,
    test_scopes,
)
from tests.conftest import store_for

from .conftest import HOST, RedisClusterNodes, _free_cluster_ports

MakeAuthority = Callable[..., RedisAuthority]
EVIDENCE = [{"kind": "log", "uri": "https://ci.example/run/1"}]


def _new_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def orgs_by_port(cluster: RedisClusterNodes, per_node: int = 1) -> dict[int, list[str]]:
    """Fresh org ids, ``per_node`` for each master, found by the slot of their hash tag."""
    out: dict[int, list[str]] = {p: [] for p in cluster.ports}
    while any(len(v) < per_node for v in out.values()):
        org = _new_org()
        port = cluster.port_of_slot(key_slot(org_keys(org).base.inc.encode()))
        if len(out[port]) < per_node:
            out[port].append(org)
    return out


@pytest.fixture
def make_cluster_authority(
    redis_cluster: RedisClusterNodes, ledger: LedgerStore
) -> Iterator[MakeAuthority]:
    """``make(**kwargs)``: an authority on the cluster and the test's SQLite ledger (1 s
    socket timeouts); all are closed at the end."""
    made: list[RedisAuthority] = []

    def make(**kwargs: object) -> RedisAuthority:
        client = connect(redis_cluster.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        auth = RedisAuthority(client, ledger, owns_client=True, **kwargs)  # type: ignore[arg-type]
        made.append(auth)
        return auth

    yield make
    for auth in made:
        try:
            auth.close()
        except Exception:
            pass


def _client(auth: RedisAuthority, org: str, principal: str = "alice", role: str = "agent") -> Baton:
    return Baton(org=org, principal=principal, role=role, store=auth.store, lease_authority=auth)


# ------------------------------------------------------------------------------ routing


def test_cluster_url_gives_a_cluster_client(redis_cluster: RedisClusterNodes) -> None:
    """redis+cluster:// gives a cluster client that knows all three masters; redis:// does not."""
    assert is_cluster_url(redis_cluster.url)
    assert not is_cluster_url(f"redis://{HOST}:{redis_cluster.ports[0]}/0")
    client = connect(redis_cluster.url)
    try:
        assert isinstance(client, BatonRedisCluster)
        assert sorted(n.port for n in client.get_primaries()) == sorted(redis_cluster.ports)
    finally:
        client.close()


def test_orgs_live_on_the_node_of_their_hash_tag(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority
) -> None:
    """Each org's keys share one slot (CLUSTER KEYSLOT) and exist only on the master serving it;
    baton:orgs lists every org."""
    auth = make_cluster_authority(ack="ledger")
    by_port = orgs_by_port(redis_cluster)
    for port, (org,) in by_port.items():
        keys = org_keys(org)
        slots = {redis_cluster.keyslot(k) for k in (*keys.base, keys.rebuild)}
        assert slots == {key_slot(keys.base.inc.encode())}
        slot = slots.pop()
        assert redis_cluster.port_of_slot(slot) == port
        _client(auth, org).leases.acquire("deploy", "svc", ttl_seconds=30)
        assert redis_cluster.admin(port).exists(keys.base.inc, keys.base.journal, keys.base[1]) == 3
        for p in redis_cluster.ports:
            count = redis_cluster.admin(p).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
            assert (count > 0) == (p == port), (org, p, count)
    assert set(registered_orgs(auth.client)) >= {o for (o,) in by_port.values()}
    orgs_port = redis_cluster.port_of_slot(key_slot(ORGS_KEY.encode()))
    assert redis_cluster.admin(orgs_port).sismember(ORGS_KEY, by_port[orgs_port][0])


def test_node_time_is_read_on_the_orgs_node(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority
) -> None:
    """node_time_ms reads TIME of the node that holds the key (the clock its scripts use)."""
    auth = make_cluster_authority()
    for port, (org,) in orgs_by_port(redis_cluster).items():
        sec, usec = redis_cluster.admin(port).time()
        before = int(sec) * 1000 + int(usec) // 1000
        assert node_time_ms(auth.client, org_keys(org).base.inc) >= before


# ------------------------------------------------------------------------------ lease loop


def test_lease_loop_on_every_node(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority
) -> None:
    """Acquire, conflict, renew, transfer, release, force release, acquire_many and scoped
    acquire behave as on one server, for orgs on each of the three masters."""
    auth = make_cluster_authority(ack="ledger")
    for (org,) in orgs_by_port(redis_cluster).values():
        alice, bob = _client(auth, org), _client(auth, org, "bob")
        admin = _client(auth, org, "root", "admin")

        held = alice.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="run-1")
        assert (held.version, held.epoch) == (1, 1)
        with pytest.raises(ConflictError):
            bob.leases.acquire("deploy", "svc", ttl_seconds=30)
        again = alice.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="run-1")
        assert again.replayed
        assert again.lease_id == held.lease_id

        renewed = alice.leases.renew(held, ttl_seconds=60)
        assert (renewed.lease_id, renewed.version, renewed.epoch) == (held.lease_id, 2, 1)

        moved = alice.leases.transfer(
            renewed, to_principal="bob", new_execution_key="run-2", ttl_seconds=30
        )
        assert (moved.owner, moved.epoch, moved.version) == ("bob", 2, 3)
        with pytest.raises(LeaseLostError):
            alice.leases.renew(renewed, ttl_seconds=30)
        assert bob.leases.release(moved).status == "released"
        assert bob.leases.release(moved).status == "no_change"

        other = alice.leases.acquire("deploy", "db", ttl_seconds=30)
        assert admin.leases.force_release(other.lease_id).status == "released"
        with pytest.raises(NotFoundError):
            admin.leases.force_release(other.lease_id)

        many = alice.leases.acquire_many([("job", f"j{i}") for i in range(5)], ttl_seconds=30)
        assert [m.epoch for m in many] == [1] * 5
        with pytest.raises(ConflictError):
            bob.leases.acquire_many([("job", "new"), ("job", "j3")], ttl_seconds=30)
        assert not alice.leases.inspect("job", "new").held

        alice.leases.acquire("repo", "a", ttl_seconds=30, scopes=["src/**"])
        with pytest.raises(ConflictError):
            bob.leases.acquire("repo", "b", ttl_seconds=30, scopes=["src/app/*.py"])
        bob.leases.acquire("repo", "c", ttl_seconds=30, scopes=["docs/**"])

        info = bob.leases.inspect("deploy", "svc")
        assert (info.held, info.version, info.epoch) == (False, 3, 2)  # release keeps both
        kinds = [e.kind for e in alice.events.list(limit=1000)]
        assert kinds.count("lease.acquired") == 9
        assert kinds.count("lease.transferred") == 1
        assert kinds.count("lease.released") == 2
        report = audit_ledger(auth.store, org)
        assert report.ok, report.violations


def test_fencing_refuses_a_stale_epoch(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority
) -> None:
    """A fenced checkpoint or outcome under a lease that was transferred away is STALE_FENCE."""
    auth = make_cluster_authority(ack="redis")
    for (org,) in orgs_by_port(redis_cluster).values():
        alice, bob = _client(auth, org), _client(auth, org, "bob")
        held = alice.leases.acquire("deploy", "svc", ttl_seconds=30)
        alice.checkpoints.save("svc", "rollout", {"step": 1}, fence=held)
        moved = alice.leases.transfer(
            held, to_principal="bob", new_execution_key="k2", ttl_seconds=30
        )
        assert moved.epoch > held.epoch
        with pytest.raises(StaleFenceError):
            alice.checkpoints.save("svc", "rollout", {"step": 2}, fence=held)
        with pytest.raises(StaleFenceError):
            alice.outcomes.record("svc", "succeeded", evidence=EVIDENCE, fence=held)
        bob.checkpoints.save("svc", "rollout", {"step": 2}, fence=moved)
        assert (
            bob.outcomes.record("svc", "succeeded", evidence=EVIDENCE, fence=moved).status
            == "succeeded"
        )


# ------------------------------------------------------------------------------ reconciler


def test_reconciler_drains_every_nodes_journal_into_sqlite(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority, ledger: LedgerStore
) -> None:
    """With ack='redis' and no drain thread, the ledger stays empty until run_reconciler drains
    each org's journal from its own node; then the history is complete and the journals empty."""
    auth = make_cluster_authority(ack="redis", reconcile_in_client=False)
    orgs = [o for (o,) in orgs_by_port(redis_cluster).values()]
    for org in orgs:
        a = _client(auth, org)
        lease = a.leases.acquire("deploy", "svc", ttl_seconds=30)
        lease = a.leases.renew(lease, ttl_seconds=30)
        a.leases.release(lease)
        assert auth.reconciler.lag(org).entries == 3
        assert ledger.lease_history(org) == ([], [])

    report = run_reconciler(client=auth.client, store=ledger, orgs=orgs)
    assert report.applied == 9
    for org in orgs:
        assert report.lag[org].entries == 0
        assert auth.client.xlen(org_keys(org).base.journal) == 0
        rows, transitions = ledger.lease_history(org)
        assert [t.action for t in transitions] == ["acquire", "renew", "release"]
        assert [r.status for r in rows] == ["released"]
    again = run_reconciler(client=auth.client, store=ledger, orgs=orgs)
    assert again.applied == 0


def test_baton_reconcile_cli_with_a_cluster_url(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority, tmp_path: Path
) -> None:
    """`baton --redis-url redis+cluster://... reconcile` drains an org's journal into the ledger."""
    ledger_url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = LedgerStore(ledger_url)
    try:
        auth = RedisAuthority(
            connect(redis_cluster.url),
            store,
            ack="redis",
            owns_client=True,
            reconcile_in_client=False,
        )
        org = _new_org()
        a = _client(auth, org)
        a.leases.release(a.leases.acquire("file", "f1", ttl_seconds=30))
        auth.close()
        assert store.lease_history(org) == ([], [])
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "prefect_baton.cli",
                "--ledger-url",
                ledger_url,
                "--redis-url",
                redis_cluster.url,
                "--org",
                org,
                "--format",
                "json",
                "reconcile",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["reconcile"]["lag"][org]["entries"] == 0
        _rows, transitions = store.lease_history(org)
        assert [t.action for t in transitions] == ["acquire", "release"]
    finally:
        store.close()


# ------------------------------------------------------------------------------ bad input


def test_bad_cluster_urls_are_coded_errors(
    redis_cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """A cluster URL with a database other than 0 is VALIDATION_ERROR; one whose nodes do not
    answer is UNAVAILABLE; neither writes anything."""
    store = LedgerStore(f"sqlite:///{tmp_path}/bad.db")
    try:
        org = _new_org()
        with pytest.raises(ValidationError):
            Baton(
                org=org, store=store, redis_url=f"redis+cluster://{HOST}:{redis_cluster.ports[0]}/3"
            )
        dead = _free_cluster_ports(1)[0]
        with pytest.raises(UnavailableError):
            Baton(org=org, store=store, redis_url=f"redis+cluster://{HOST}:{dead}")
        assert store.lease_history(org) == ([], [])
    finally:
        store.close()


def test_baton_with_a_cluster_url(redis_cluster: RedisClusterNodes, ledger: LedgerStore) -> None:
    """Baton(redis_url='redis+cluster://...') holds its leases on the cluster."""
    org = _new_org()
    b = Baton(org=org, principal="alice", store=ledger, redis_url=redis_cluster.url, ack="ledger")
    try:
        assert isinstance(b.authority, RedisAuthority)
        with b.lease("deploy", "svc", ttl_seconds=30) as held:
            port = redis_cluster.port_of_slot(key_slot(org_keys(org).base.inc.encode()))
            assert redis_cluster.admin(port).exists(org_keys(org).base.inc) == 1
            assert held.epoch == 1
        assert [e.kind for e in b.events.list()] == ["lease.acquired", "lease.released"]
    finally:
        b.close()


def test_unserved_slot_is_unavailable(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority
) -> None:
    """While the org's slot is not served (CLUSTERDOWN), calls fail with UNAVAILABLE and write
    nothing; once the slot is served again they succeed."""
    auth = make_cluster_authority(ack="ledger")
    (org,) = orgs_by_port(redis_cluster)[redis_cluster.ports[2]]
    a = _client(auth, org)
    a.leases.acquire("deploy", "svc", ttl_seconds=30)
    slot = key_slot(org_keys(org).base.inc.encode())
    node = redis_cluster.admin(redis_cluster.ports[2])
    node.execute_command("CLUSTER", "DELSLOTS", slot)
    try:
        with pytest.raises(UnavailableError):
            _client(auth, org, "bob").leases.acquire("deploy", "db", ttl_seconds=30)
    finally:
        node.execute_command("CLUSTER", "ADDSLOTS", slot)
        redis_cluster.wait_ok()
    assert not a.leases.inspect("deploy", "db").held
    assert a.leases.inspect("deploy", "svc").held


# ------------------------------------------------------------------------------ data loss


def test_one_master_loses_its_data(
    redis_cluster: RedisClusterNodes, make_cluster_authority: MakeAuthority, ledger: LedgerStore
) -> None:
    """One master is SIGKILLed and replaced by an empty node (fresh cluster config, same port,
    same slots). Its orgs fail closed (UNAVAILABLE) while it is down and after it is back
    empty, other nodes' orgs keep working throughout; after the rebuild from the ledger the
    lost org's lease is held again and new grants carry epochs above every earlier one."""
    by_port = orgs_by_port(redis_cluster)
    victim_port = redis_cluster.ports[1]
    (lost_org,) = by_port[victim_port]
    safe_orgs = [o for p, (o,) in by_port.items() if p != victim_port]

    strict = make_cluster_authority(ack="ledger", auto_rebuild=False)
    before: dict[str, int] = {}
    held: dict[str, object] = {}
    for org in [lost_org, *safe_orgs]:
        assert strict.rebuild(org) == 0  # first set-up: incarnation 0 (no auto_rebuild)
        a = _client(strict, org)
        first = a.leases.acquire("res", "r0", ttl_seconds=60)
        a.leases.release(a.leases.acquire("res", "r1", ttl_seconds=30))
        a.leases.release(a.leases.acquire("res", "r1", ttl_seconds=30))
        held[org] = first
        before[org] = a.leases.inspect("res", "r1").epoch
    keyed = _client(strict, lost_org).leases.acquire(
        "res", "r3", ttl_seconds=60, idempotency_key="run-7"
    )

    old_id = redis_cluster.node_id(victim_port)
    ranges = redis_cluster.slot_ranges(victim_port)
    redis_cluster.kill(victim_port)
    lost = _client(strict, lost_org, "bob")
    with pytest.raises(UnavailableError):
        lost.leases.acquire("res", "r2", ttl_seconds=30)
    for org in safe_orgs:  # other masters keep serving their own slots
        _client(strict, org, "bob").leases.inspect("res", "r0")

    redis_cluster.restart_empty(victim_port, ranges, old_id)
    assert redis_cluster.node_id(victim_port) != old_id
    assert redis_cluster.admin(victim_port).dbsize() == 0
    for call in (
        lambda: lost.leases.acquire("res", "r2", ttl_seconds=30),
        lambda: lost.leases.inspect("res", "r0"),
        lambda: _client(strict, lost_org).leases.renew(held[lost_org], ttl_seconds=30),  # type: ignore[arg-type]
    ):
        with pytest.raises(UnavailableError):
            call()
    assert redis_cluster.admin(victim_port).dbsize() == 0  # refused calls wrote nothing

    healing = make_cluster_authority(ack="ledger")  # auto_rebuild: the next call rebuilds
    lost_bob = _client(healing, lost_org, "bob")
    with pytest.raises(ConflictError):  # restored from the ledger: still held by alice
        lost_bob.leases.acquire("res", "r0", ttl_seconds=30)
    replay = _client(healing, lost_org).leases.acquire(
        "res", "r3", ttl_seconds=60, idempotency_key="run-7"
    )  # its receipt was restored from the ledger (a pipeline on the cluster)
    assert replay.replayed
    assert (replay.lease_id, replay.epoch) == (keyed.lease_id, keyed.epoch)
    renewed = _client(healing, lost_org).leases.renew(held[lost_org], ttl_seconds=30)  # type: ignore[arg-type]
    assert renewed.epoch == 1
    fresh = lost_bob.leases.acquire("res", "r1", ttl_seconds=30)
    assert fresh.epoch > EPOCH_RANGE > before[lost_org]
    moved = _client(healing, lost_org).leases.transfer(
        renewed, to_principal="bob", new_execution_key="k", ttl_seconds=30
    )
    assert moved.epoch > EPOCH_RANGE
    report = audit_ledger(ledger, lost_org)
    assert report.ok, report.violations

    for org in safe_orgs:  # untouched: no rebuild, epochs continue from where they were
        b = _client(strict, org, "bob")
        with pytest.raises(ConflictError):
            b.leases.acquire("res", "r0", ttl_seconds=30)
        assert b.leases.acquire("res", "r1", ttl_seconds=30).epoch == before[org] + 1


# ------------------------------------------------------------------------------ conformance


def _cheap_tests(module: ModuleType, slow: set[str]) -> dict[str, object]:
    return {
        f"test_conformance_{module.__name__.rsplit('.', 1)[-1][5:]}__{name[5:]}": fn
        for name, fn in vars(module).items()
        if name.startswith("test_") and callable(fn) and name not in slow
    }


# Tests that wait for a 10 s TTL to run out are left to the single-server arms.
_SLOW = {
    "test_expired_lease_is_not_held",
    "test_takeover_after_expiry",
    "test_report_expired_records_lease_expired_once",
    "test_expired_handoff_cannot_be_resolved",
}
for _module in (test_leases, test_scopes, test_idempotency, test_isolation, test_handoffs):
    globals().update(_cheap_tests(_module, _SLOW))
foreign = test_isolation.foreign


@pytest.fixture
def baton(redis_cluster: RedisClusterNodes, sqlite_url: str, org: str) -> Iterator[Baton]:
    """The conformance suite's client (``agent-a`` in a fresh org) on the cluster arm: the
    session's SQLite ledger, ``ack="redis"`` with the drain thread."""
    store = store_for(sqlite_url)
    auth = RedisAuthority(connect(redis_cluster.url), store, ack="redis", owns_client=True)
    yield Baton(org=org, principal="agent-a", role="agent", store=store, lease_authority=auth)
    auth.close()
