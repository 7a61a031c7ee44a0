"""Loss of part of an org's Redis state (issue #13 section 2): an ``allkeys-*`` eviction, or
a ``DEL``, removes some of an org's keys while the incarnation marker survives. Every script
sees it before deciding anything, deletes the marker, and the org's state is rebuilt from
the ledger: no grant is ever made on partial state, and every later epoch is above every
epoch handed out. On fakeredis and on the real server (127.0.0.1:6379, an org of its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefect_baton import (
    Baton,
    BatonSettings,
    ConflictError,
    IdempotencyInFlightError,
    LeaseLostError,
    NotFoundError,
    UnavailableError,
    ValidationError,
)
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import Caller
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.handoffs import mark_rejected
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton.audit import audit_ledger
from tests.conftest import REDIS_ARMS, REDIS_URL, require_redis

from .conftest import RedisServer

#: The per-org keys after the marker (``inc``), as named in keys.py.
KEYS = ("heads", "lid", "old", "oldx", "own", "sx", "sl", "se", "j", "rc", "rcx")


@pytest.fixture(params=REDIS_ARMS)
def client(request: pytest.FixtureRequest) -> Iterator[object]:
    if request.param == "fakeredis":
        yield fakeredis.FakeRedis(server=fakeredis.FakeServer())
        return
    require_redis()
    c = connect(REDIS_URL)
    yield c
    c.close()


def _authority(client: object, ledger: LedgerStore, **kwargs: object) -> RedisAuthority:
    return RedisAuthority(client, ledger, ack="ledger", **kwargs)  # type: ignore[arg-type]


class Org:
    """An org whose Redis state has every key: a scoped lease held by ``a`` (heads, lid,
    own, sx, sl, se, the journal), a retired generation (old, oldx), a keyed acquire
    released since (its receipt: rc, rcx) and a lease-carrying handoff whose rejection was
    settled in Redis and interrupted there (its resolution: rc, rcx). ``epochs`` holds every
    epoch handed out before the loss."""

    def __init__(self, auth: RedisAuthority, ledger: LedgerStore) -> None:
        self.org = f"org-{uuid.uuid4().hex[:12]}"
        auth.rebuild(self.org)
        self.a = Baton(org=self.org, principal="p-a", store=ledger, lease_authority=auth)
        self.b = self.a.as_principal("p-b")
        first = self.a.leases.acquire("res", "r1", ttl_seconds=30)
        self.a.leases.release(first)
        again = self.b.leases.acquire("res", "r1", ttl_seconds=30)
        self.b.leases.release(again)
        self.held = self.a.leases.acquire("res", "r0", ttl_seconds=60, scopes=["src/**"])
        done = self.a.leases.acquire("job", "j1", ttl_seconds=60, idempotency_key="run-1")
        self.a.leases.release(done)
        carried = self.a.leases.acquire("job", "j2", ttl_seconds=60)
        self.handoff = self.a.handoffs.create("p-b", "j2", lease=carried).handoff_id
        assert mark_rejected(auth, Caller(self.org, "p-b"), self.handoff)
        self.epochs = [first.epoch, again.epoch, self.held.epoch, done.epoch, carried.epoch]
        keys = org_keys(self.org)
        for name in KEYS:
            assert auth.client.exists(keys.prefix + name), name

    def check_after_loss(self, kept: bool) -> None:
        """No grant on the lost state: ``b`` still conflicts with ``a``'s restored lease,
        which ``a`` can renew; the retry of the finished keyed acquire is still
        ``LEASE_LOST`` (its receipt kept, or restored from the ledger's); with rc and rcx
        ``kept``, the settled rejection still refuses an accept; every later grant, of any
        resource, is above every epoch handed out before the loss."""
        with pytest.raises(ConflictError):
            self.b.leases.acquire("res", "r0", ttl_seconds=30)
        with pytest.raises(LeaseLostError, match="released"):
            self.a.leases.acquire("job", "j1", ttl_seconds=60, idempotency_key="run-1")
        if kept:
            with pytest.raises(NotFoundError):
                self.b.handoffs.resolve(self.handoff, "accepted")
        renewed = self.a.leases.renew(self.held)
        assert (renewed.lease_id, renewed.epoch) == (self.held.lease_id, self.held.epoch)
        self.a.leases.release(renewed)
        before = max(self.epochs)
        for rid in ("r0", "r1", "r2"):
            lease = self.b.leases.acquire("res", rid, ttl_seconds=30)
            assert lease.epoch > before, (rid, lease.epoch, self.epochs)


@pytest.mark.parametrize("name", KEYS)
def test_each_lost_key_fails_closed_then_rebuilds_with_higher_epochs(
    client: object, ledger: LedgerStore, name: str
) -> None:
    """Deleting any one key of an org (the marker surviving) makes the next operation fail
    closed (UNAVAILABLE, the marker deleted) until the rebuild, after which the holder still
    holds and every new epoch is above every epoch handed out."""
    auth = _authority(client, ledger, auto_rebuild=False)
    org = Org(auth, ledger)
    keys = org_keys(org.org)
    auth.client.delete(keys.prefix + name)
    with pytest.raises(UnavailableError):
        org.b.leases.acquire("res", "r2", ttl_seconds=30)
    assert not auth.client.exists(keys.base.inc)
    with pytest.raises(UnavailableError):
        org.a.leases.renew(org.held)
    auth.rebuild(org.org)
    org.check_after_loss(kept=name not in ("rc", "rcx"))
    report = audit_ledger(ledger, org.org)
    assert report.ok, report.violations


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lost=st.sets(st.sampled_from(KEYS), min_size=1))
def test_any_lost_subset_rebuilds_on_the_next_call(
    client: object, ledger: LedgerStore, lost: set[str]
) -> None:
    """Deleting any subset of an org's keys: the next call (auto-rebuild) sees it, rebuilds
    from the ledger, and grants nothing on the lost state."""
    auth = _authority(client, ledger)
    org = Org(auth, ledger)
    keys = org_keys(org.org)
    auth.client.delete(*(keys.prefix + name for name in lost))
    org.check_after_loss(kept=not lost & {"rc", "rcx"})
    assert audit_ledger(ledger, org.org).ok


def _evict_volatile(auth: RedisAuthority, org: str) -> int:
    """Delete every key of ``org`` that has a TTL, as a ``volatile-*`` ``maxmemory-policy``
    may (the rebuild lock aside, which only a rebuild holds); returns how many."""
    keys = org_keys(org)
    gone = [
        k
        for k in auth.client.scan_iter(match=keys.prefix + "*")
        if auth.client.pttl(k) > 0 and k not in (keys.rebuild, keys.rebuild.encode())
    ]
    for k in gone:
        auth.client.delete(k)
    return len(gone)


def test_a_volatile_eviction_takes_no_receipt_or_handoff_resolution(
    client: object, ledger: LedgerStore
) -> None:
    """What a ``volatile-*`` policy (accepted with ``allow_eviction``) may evict, the keys
    with a TTL, holds nothing the decisions read: after it, a retried keyed acquire whose
    lease was released is still ``LEASE_LOST`` (not granted anew with a new fencing token,
    as when the receipt was a key with a TTL), another attempt of an execution whose lease
    is held is still ``IDEMPOTENCY_IN_FLIGHT`` (not handed the same lease), and a
    lease-carrying handoff whose rejection was settled in Redis cannot be accepted."""
    auth = _authority(client, ledger)
    org = f"org-{uuid.uuid4().hex[:12]}"
    a = Baton(org=org, principal="p-a", store=ledger, lease_authority=auth)
    b = a.as_principal("p-b")
    done = a.leases.acquire("job", "j1", ttl_seconds=60, idempotency_key="run-1")
    a.leases.release(done)
    held = a.leases.acquire("job", "j2", ttl_seconds=60, idempotency_key="run-2", attempt="t1")
    carried = a.leases.acquire("job", "j3", ttl_seconds=60)
    h = a.handoffs.create("p-b", "j3", lease=carried)
    # a rejection settled in Redis, interrupted before it released the lease or was recorded
    assert mark_rejected(auth, Caller(org, "p-b"), h.handoff_id)
    _evict_volatile(auth, org)
    with pytest.raises(LeaseLostError, match="released"):
        a.leases.acquire("job", "j1", ttl_seconds=60, idempotency_key="run-1")
    with pytest.raises(IdempotencyInFlightError):
        a.leases.acquire("job", "j2", ttl_seconds=60, idempotency_key="run-2", attempt="t2")
    with pytest.raises(NotFoundError):
        b.handoffs.resolve(h.handoff_id, "accepted")
    assert a.leases.inspect("job", "j3").lease == carried.model_copy(update={"replayed": False})
    again = a.leases.acquire("job", "j2", ttl_seconds=60, idempotency_key="run-2", attempt="t1")
    assert (again.lease_id, again.epoch, again.replayed) == (held.lease_id, held.epoch, True)
    report = audit_ledger(ledger, org)
    assert report.ok, report.violations


def test_an_evicting_policy_is_refused_unless_allowed(
    redis_server: RedisServer, ledger: LedgerStore, tmp_path: Path
) -> None:
    """A server whose maxmemory-policy may evict keys (set here on the test's own server)
    is refused at start-up with VALIDATION_ERROR naming the setting, unless evictions are
    accepted (allow_eviction, BATON_REDIS_ALLOW_EVICTION); noeviction is accepted."""
    admin = connect(redis_server.url)
    try:
        for policy in ("allkeys-lru", "allkeys-random", "volatile-lru"):
            admin.config_set("maxmemory-policy", policy)
            with pytest.raises(ValidationError, match="maxmemory-policy is '" + policy):
                RedisAuthority(connect(redis_server.url), ledger, owns_client=True)
            with pytest.raises(ValidationError, match="noeviction"):
                Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", redis_url=redis_server.url)
            allowed = RedisAuthority(
                connect(redis_server.url), ledger, owns_client=True, allow_eviction=True
            )
            b = Baton(org=f"org-{policy}", principal="a", store=ledger, lease_authority=allowed)
            b.leases.acquire("res", "r0", ttl_seconds=30)
            allowed.close()
            settings = BatonSettings(redis_allow_eviction=True)
            with Baton(
                ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
                redis_url=redis_server.url,
                settings=settings,
            ) as c:
                c.leases.list()
        admin.config_set("maxmemory-policy", "noeviction")
        RedisAuthority(connect(redis_server.url), ledger, owns_client=True).close()
    finally:
        admin.close()


def test_a_misconfigured_redis_url_is_validation_error_at_once(
    ledger: LedgerStore, tmp_path: Path
) -> None:
    """A Redis error reply that is a configuration error (a database index the server does
    not have) is VALIDATION_ERROR at once, at start-up and from a lease block whose policy
    check was skipped, not UNAVAILABLE retried by the keeper."""
    require_redis()
    url = REDIS_URL.rsplit("/", 1)[0] + "/99"
    with pytest.raises(ValidationError, match="DB index is out of range"):
        Baton(ledger_url=f"sqlite:///{tmp_path / 'l.db'}", redis_url=url)
    allowed = RedisAuthority(connect(url), ledger, owns_client=True, allow_eviction=True)
    b = Baton(org="org-db99", principal="a", store=ledger, lease_authority=allowed)
    try:
        with pytest.raises(ValidationError, match="DB index is out of range"):
            b.leases.acquire("res", "r0", ttl_seconds=30)
        with (
            pytest.raises(ValidationError, match="DB index is out of range"),
            b.lease("res", "r0", ttl_seconds=30),
        ):
            pass
    finally:
        allowed.close()


def test_an_unreadable_policy_is_logged_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    """When the server refuses both reads of maxmemory-policy, the warning names the
    refusal rather than implying the policy is wrong."""
    from redis.exceptions import ResponseError

    from prefect_baton._stores.redis.base import check_eviction_policy

    class Refusing:
        def config_get(self, *_a: object) -> object:
            raise ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'")

        def info(self, *_a: object) -> object:
            raise ResponseError("NOPERM this user has no permissions to run the 'info' command")

    with caplog.at_level("WARNING"):
        check_eviction_policy(Refusing(), allow=False)  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert "unknown command 'CONFIG'" in record.getMessage()
    assert "NOPERM" in record.getMessage()
