"""Fault tests against a redis-server of the test's own (issue #3 "Tests"): SIGKILL and
restart it empty mid-workload, SIGSTOP it past the client timeout, SIGKILL a client holding a
lease, SIGSTOP a holder past its TTL. After every scenario the ledger history passes the audit
and every transition acknowledged with ``ack="ledger"`` is in the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import redis
from prefect_baton import Baton, ConflictError, LeaseLostError, StaleFenceError, UnavailableError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton.audit import audit_ledger
from prefect_baton.errors import ValidationError

from . import _workload
from .conftest import RedisServer

HOLDER = Path(__file__).with_name("_holder.py")
RESOURCES = [f"r{i}" for i in range(6)]

pytestmark = pytest.mark.slow


def _org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def _clients(auth: RedisAuthority, ledger: LedgerStore, org: str, n: int = 3) -> list[Baton]:
    first = Baton(org=org, principal="p0", store=ledger, lease_authority=auth)
    return [first] + [first.as_principal(f"p{i}") for i in range(1, n)]


def _ledger_transitions(ledger: LedgerStore, org: str) -> set[tuple[str, int]]:
    _rows, transitions = ledger.lease_history(org)
    return {(t.lease_id, t.version) for t in transitions}


def _assert_ledger_ok(ledger: LedgerStore, org: str, acked: list[tuple[str, int]]) -> None:
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations
    missing = set(acked) - _ledger_transitions(ledger, org)
    assert not missing, f"acknowledged with ack='ledger' but not in the ledger: {missing}"


def _max_epochs(grants: list[tuple[str, str, int, str]], phase: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for rid, _lid, epoch, ph in grants:
        if ph == phase:
            out[rid] = max(out[rid], epoch)
    return out


def test_sigkill_and_empty_restart_mid_workload(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """Redis SIGKILLed and restarted empty mid-workload: calls fail closed while it is down,
    the state is rebuilt from the ledger, epochs granted after the loss exceed all before."""
    org = _org()
    auth = make_authority(ack="ledger")
    clients = _clients(auth, ledger, org)
    rec = _workload.Record()
    held = _workload.run(clients, RESOURCES, 120, rec, phase="before", seed=1)
    assert rec.grants

    redis_server.kill()
    down = _workload.Record()
    _workload.run(clients, RESOURCES, 15, down, phase="down", seed=2, held=dict(held))
    assert down.codes == {"UNAVAILABLE": down.ops}, "a call succeeded with Redis down"

    redis_server.start()
    after = _workload.Record()
    _workload.run(clients, RESOURCES, 120, after, phase="after", seed=3, held=held)
    assert after.grants
    before_max = _max_epochs(rec.grants, "before")
    for rid, _lid, epoch, _ph in after.grants:
        assert epoch > max(before_max.values()), (rid, epoch)
        assert epoch > EPOCH_RANGE
    _assert_ledger_ok(ledger, org, rec.acked + after.acked)


def test_restart_loses_unreconciled_ack_redis_but_epochs_keep_rising(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """With ack='redis' and no drain before the loss, the unreconciled transitions are lost,
    yet every epoch granted after the restart is above every epoch granted before it."""
    org = _org()
    auth = make_authority(ack="redis", reconcile_interval_seconds=3600)
    clients = _clients(auth, ledger, org)
    rec = _workload.Record()
    held = _workload.run(clients, RESOURCES, 150, rec, phase="before", seed=4)
    assert rec.grants

    redis_server.kill()
    redis_server.start()
    after = _workload.Record()
    _workload.run(clients, RESOURCES, 150, after, phase="after", seed=5, held=held)
    assert after.grants
    top_before = max(e for _r, _l, e, _p in rec.grants)
    assert min(e for _r, _l, e, _p in after.grants) > top_before
    lost = set(rec.acked) - _ledger_transitions(ledger, org)
    assert lost, "the drain was expected to lag behind at the time of the loss"
    auth.sync_ledger(org, strict=True)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations
    assert not set(after.acked) - _ledger_transitions(ledger, org)


@pytest.mark.parametrize("ack", ["redis", "ledger"])
def test_restart_from_an_older_snapshot_hands_out_no_token_twice(
    redis_server: RedisServer,
    ledger: LedgerStore,
    make_authority: Callable[..., RedisAuthority],
    ack: str,
) -> None:
    """Redis restarts from a snapshot older than what clients were told since (RDB or AOF
    persistence, a failover to a lagging replica): the marker is still in it, yet the new
    server process counts as a data loss. The state is rebuilt from the ledger, so the
    generation granted after the snapshot is current again: another principal is refused,
    the released holder can neither renew nor write fenced records, the real holder can."""
    org = _org()
    auth = make_authority(ack=ack)
    a, b, c = _clients(auth, ledger, org)
    first = a.leases.acquire("repo", "x", ttl_seconds=60)
    a.checkpoints.save("subject", "progress", {"by": "a"}, fence=first)
    redis.Redis.from_url(redis_server.url).save()  # the snapshot the restart loads
    a.leases.release(first)
    second = b.leases.acquire("repo", "x", ttl_seconds=60)
    assert second.epoch > first.epoch
    auth.sync_ledger(org, strict=True)

    redis_server.kill()
    redis_server.start()

    with pytest.raises(ConflictError):
        c.leases.acquire("repo", "x", ttl_seconds=60)
    with pytest.raises(LeaseLostError):
        a.leases.renew(first)
    with pytest.raises(StaleFenceError):
        a.checkpoints.save("subject", "progress", {"by": "a, stale"}, fence=first)
    renewed = b.leases.renew(second)
    assert (renewed.lease_id, renewed.epoch) == (second.lease_id, second.epoch)
    b.checkpoints.save("subject", "progress", {"by": "b"}, fence=second)
    b.leases.release(renewed)
    third = c.leases.acquire("repo", "x", ttl_seconds=60)
    assert third.epoch >= EPOCH_RANGE > second.epoch
    auth.sync_ledger(org, strict=True)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations


def test_a_redis_user_without_info_is_a_configuration_error(
    redis_server: RedisServer, ledger: LedgerStore
) -> None:
    """Restarts are told by the server's ``run_id`` (``INFO server``): a Redis user whose ACL
    refuses ``INFO`` gets VALIDATION_ERROR naming the command, and nothing is granted."""
    admin = redis.Redis.from_url(redis_server.url)
    admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info")
    url = redis_server.url.replace("redis://", "redis://noinfo:pw@")
    auth = RedisAuthority.from_url(url, ledger)
    baton = Baton(org=_org(), principal="p0", store=ledger, lease_authority=auth)
    try:
        with pytest.raises(ValidationError, match="'info' command"):
            baton.leases.acquire("repo", "x", ttl_seconds=60)
    finally:
        baton.close()
        auth.close()
    assert not admin.keys("baton:{*")


def test_missing_marker_fails_closed_until_rebuilt(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """Without auto-rebuild, an empty Redis refuses every call (UNAVAILABLE, nothing written)
    until rebuild(); the rebuilt state holds the ledger's leases with epochs above the floor."""
    org = _org()
    auth = make_authority(ack="ledger", auto_rebuild=False)
    a, b = _clients(auth, ledger, org, 2)
    with pytest.raises(UnavailableError):
        a.leases.acquire("res", "r0", ttl_seconds=30)
    auth.rebuild(org)
    held = a.leases.acquire("res", "r0", ttl_seconds=60)
    redis_server.kill()
    redis_server.start()
    for call in (
        lambda: a.leases.renew(held),
        lambda: b.leases.acquire("res", "r1", ttl_seconds=30),
        lambda: b.leases.inspect("res", "r0"),
    ):
        with pytest.raises(UnavailableError):
            call()
    assert auth.client.hlen(org_keys(org).base[1]) == 0
    auth.rebuild(org)
    with pytest.raises(ConflictError):
        b.leases.acquire("res", "r0", ttl_seconds=30)
    renewed = a.leases.renew(held)
    assert (renewed.lease_id, renewed.epoch) == (held.lease_id, held.epoch)
    moved = a.leases.transfer(renewed, to_principal="p1", new_execution_key="k", ttl_seconds=30)
    assert moved.epoch > EPOCH_RANGE
    fresh = b.leases.acquire("res", "r1", ttl_seconds=30)
    assert fresh.epoch == EPOCH_RANGE + 1
    _assert_ledger_ok(ledger, org, [(held.lease_id, 1), (renewed.lease_id, 2)])


def test_concurrent_rebuild_keeps_others_unavailable(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """While another client holds the rebuild lock, calls fail with UNAVAILABLE."""
    org = _org()
    auth = make_authority(ack="ledger", rebuild_wait_seconds=0.2)
    (a,) = _clients(auth, ledger, org, 1)
    a.leases.acquire("res", "r0", ttl_seconds=30)
    auth.client.delete(org_keys(org).base.inc)
    auth.client.set(org_keys(org).rebuild, "someone-else", px=60_000)
    with pytest.raises(UnavailableError):
        a.leases.acquire("res", "r1", ttl_seconds=30)
    auth.client.delete(org_keys(org).rebuild)
    assert a.leases.acquire("res", "r1", ttl_seconds=30).epoch == EPOCH_RANGE + 1


def test_sigstop_server_past_client_timeout(
    redis_server: RedisServer, ledger: LedgerStore, make_authority: Callable[..., RedisAuthority]
) -> None:
    """Redis paused past the client's 1 s timeout: calls raise UNAVAILABLE; afterwards the
    holder still holds and nobody else was granted the resource."""
    org = _org()
    auth = make_authority(ack="ledger")
    a, b = _clients(auth, ledger, org, 2)
    held = a.leases.acquire("res", "r0", ttl_seconds=60)
    acked = [(held.lease_id, held.version)]
    redis_server.pause()
    try:
        with pytest.raises(UnavailableError):
            a.leases.renew(held)
        with pytest.raises(UnavailableError):
            b.leases.acquire("res", "r0", ttl_seconds=30)
    finally:
        redis_server.resume()
    with pytest.raises(ConflictError):
        b.leases.acquire("res", "r0", ttl_seconds=30)
    info = a.leases.inspect("res", "r0")
    assert info.lease is not None
    assert info.lease.lease_id == held.lease_id
    renewed = a.leases.renew(held)
    acked.append((renewed.lease_id, renewed.version))
    _assert_ledger_ok(ledger, org, acked)


def _spawn_holder(cfg: dict[str, Any]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the holder did not start: {proc.communicate()[1][-3000:]}")
    return proc, json.loads(line)


def _wait_not_held(b: Baton, rid: str) -> None:
    deadline = time.monotonic() + 60
    while b.leases.inspect("res", rid).held:
        assert time.monotonic() < deadline, "the lease never ran out on the Redis clock"
        time.sleep(0.2)


def test_sigkill_client_holding_lease(
    redis_server: RedisServer,
    ledger: LedgerStore,
    make_authority: Callable[..., RedisAuthority],
    tmp_path: Path,
) -> None:
    """A holder process SIGKILLed keeps the resource until its TTL runs out; then another
    principal takes it over with a higher epoch."""
    org = _org()
    cfg = {
        "redis_url": redis_server.url,
        "ledger_url": ledger.url,
        "org": org,
        "principal": "holder",
        "resource": "r0",
        "mode": "hold",
    }
    proc, lease = _spawn_holder(cfg)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    auth = make_authority(ack="ledger")
    (b,) = _clients(auth, ledger, org, 1)
    with pytest.raises(ConflictError):
        b.leases.acquire("res", "r0", ttl_seconds=30)
    _wait_not_held(b, "r0")
    taken = b.leases.acquire("res", "r0", ttl_seconds=30)
    assert taken.epoch == lease["epoch"] + 1
    rows, _t = ledger.lease_history(org)
    assert {h.lease_id: h.status for h in rows}[lease["lease_id"]] == "taken_over"
    _assert_ledger_ok(ledger, org, [(lease["lease_id"], lease["version"])])


def test_sigstop_holder_past_ttl(
    redis_server: RedisServer,
    ledger: LedgerStore,
    make_authority: Callable[..., RedisAuthority],
) -> None:
    """A holder process paused past its TTL: after it resumes, its renew is LEASE_LOST and
    its fenced checkpoint writes are STALE_FENCE; the new holder's epoch is higher."""
    org = _org()
    cfg = {
        "redis_url": redis_server.url,
        "ledger_url": ledger.url,
        "org": org,
        "principal": "holder",
        "resource": "r0",
        "mode": "fenced",
    }
    proc, lease = _spawn_holder(cfg)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        # The holder may be stopped inside a ledger transaction, holding SQLite's write
        # lock until it resumes: the taker works on Redis alone (ack="redis", no drain
        # thread) while the holder is stopped, and drains once it has resumed.
        auth = make_authority(ack="redis", reconcile_in_client=False)
        (b,) = _clients(auth, ledger, org, 1)
        _wait_not_held(b, "r0")
        taken = b.leases.acquire("res", "r0", ttl_seconds=60)
        assert taken.epoch == lease["epoch"] + 1
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    report = [json.loads(line) for line in out.splitlines() if line.strip()]
    outcome = report[-1]
    assert outcome["fenced_save"] == "STALE_FENCE", report
    assert outcome["renew"] == "LEASE_LOST", report
    assert outcome["exit"] == "LEASE_LOST", report
    as_holder = b.as_principal("holder")
    from prefect_baton import Lease

    stale = Lease.model_validate(outcome["lease"])
    with pytest.raises(LeaseLostError):
        as_holder.leases.renew(stale)
    with pytest.raises(StaleFenceError):
        as_holder.checkpoints.save("subject", "progress", {"late": True}, fence=stale)
    acked = [(lease["lease_id"], v) for v in range(lease["version"], stale.version + 1)]
    auth.reconciler.drain(org)
    _assert_ledger_ok(ledger, org, [*acked, (taken.lease_id, taken.version)])
