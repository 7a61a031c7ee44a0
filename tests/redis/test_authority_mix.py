"""One lease authority per organization (DESIGN.md "Storage"): once a client with a Redis
URL has used an org, a client without one is refused every lease transition of that org
(``FORBIDDEN``) instead of deciding on the ledger's lagging copy and handing out a
resource, and a fencing token, that Redis already gave; leases the ledger granted before
Redis was first used are in Redis from then on; ``return_to_ledger`` hands the org back, and
a later Redis client takes it again with higher epochs. On SQLite and PostgreSQL, with
fakeredis and the real server."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
from sqlmodel import Session, func, select

import redis
from prefect_baton import Baton, ConflictError, ForbiddenError, LeaseLostError, StaleFenceError
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import EventRow, GenerationRow
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from prefect_baton._stores.redis.connection import server_address
from prefect_baton._stores.redis.keys import org_keys
from prefect_baton.audit import audit_ledger
from tests.conftest import REDIS_URL, require_redis, store_for


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest) -> LedgerStore:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return store_for(str(url))


@pytest.fixture(params=["fakeredis", "redis"])
def auth(request: pytest.FixtureRequest, ledger: LedgerStore) -> Iterator[RedisAuthority]:
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        a = RedisAuthority(client, ledger, ack="ledger", owns_client=True, functions=False)
    else:
        require_redis()
        a = RedisAuthority(connect(REDIS_URL), ledger, ack="ledger", owns_client=True)
    yield a
    a.close()


@pytest.fixture
def org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def _counts(ledger: LedgerStore, org: str) -> tuple[int, int]:
    with Session(ledger.engines.read) as s:
        leases = s.exec(select(func.count()).where(GenerationRow.org_id == org)).one()
        events = s.exec(select(func.count()).where(EventRow.org_id == org)).one()
    return int(leases), int(events)


def test_a_client_without_redis_is_refused_once_redis_decides_the_org(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """Every lease transition of a ledger-only client is refused, naming the remedy, and
    writes nothing; the Redis client's leases stay the only ones."""
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    slow = Baton(org=org, principal="slow", store=ledger)
    held = fast.leases.acquire("file", "a.py", ttl_seconds=60)
    fast.leases.release(held)
    mine = fast.leases.acquire("file", "b.py", ttl_seconds=60)
    auth.reconciler.drain(org)
    before = _counts(ledger, org)
    with pytest.raises(ForbiddenError, match=r"decided by Redis.*BATON_REDIS_URL"):
        slow.leases.acquire("file", "a.py", ttl_seconds=60)
    # a Prefect worker whose BatonBlock has no redis_url has BATON_REDIS_URL set in vain
    with pytest.raises(ForbiddenError, match=r"BatonBlock's own redis_url"):
        slow.leases.acquire("file", "a.py", ttl_seconds=60)
    with pytest.raises(ForbiddenError, match="return-to-ledger"):
        slow.leases.acquire_many([("file", "c.py"), ("file", "d.py")], ttl_seconds=60)
    # the holder's own lease through a ledger-only client: refused too, not decided on the
    # ledger's copy
    as_holder = Baton(org=org, principal="fast", store=ledger)
    for call in (
        lambda: as_holder.leases.renew(mine, ttl_seconds=60),
        lambda: as_holder.leases.release(mine),
        lambda: as_holder.leases.transfer(
            mine, to_principal="slow", new_execution_key="k2", ttl_seconds=60
        ),
    ):
        with pytest.raises(ForbiddenError, match="decided by Redis"):
            call()
    assert _counts(ledger, org) == before
    assert fast.leases.renew(mine, ttl_seconds=60).version == mine.version + 1


def test_a_ledger_only_lease_read_is_refused_where_redis_decides(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """A ledger-only client does not answer "is it held?" from the ledger's copy, which lags
    Redis (here the grant is not drained yet: the copy would call the resource free): its
    inspect, get by id and list are refused as its lease decisions are. The Redis client
    still reads the ledger's history through them, the audit still reads the ledger, and
    once the org is handed back the ledger-only client reads again."""
    quick = RedisAuthority(auth.client, ledger, ack="redis", functions=False)
    fast = Baton(org=org, principal="fast", role="owner", store=ledger, lease_authority=quick)
    slow = Baton(org=org, principal="fast", role="owner", store=ledger)
    try:
        ended = fast.leases.acquire("file", "a.py", ttl_seconds=600)
        fast.leases.release(ended)
        quick.reconciler.drain(org)
        with quick.drain_paused():
            held = fast.leases.acquire("file", "b.py", ttl_seconds=600)
            for call in (
                lambda: slow.leases.inspect("file", "b.py"),
                lambda: slow.leases.get(held.lease_id),
                lambda: slow.leases.get(ended.lease_id),
                lambda: slow.leases.list(owner="*"),
                lambda: slow.leases.list(owner="*", include_ended=True),
            ):
                with pytest.raises(ForbiddenError, match=r"decided by Redis.*BATON_REDIS_URL"):
                    call()
            assert fast.leases.inspect("file", "b.py").held
        assert fast.leases.get(ended.lease_id).lease_id == ended.lease_id
        listed = fast.leases.list(owner="*", include_ended=True)
        assert {lease.lease_id for lease in listed} == {ended.lease_id, held.lease_id}
        assert audit_ledger(ledger, org).ok
        assert quick.return_to_ledger(org) is True
        assert slow.leases.inspect("file", "b.py").held
        assert slow.leases.get(held.lease_id).lease_id == held.lease_id
    finally:
        quick.close()


def test_a_ledger_only_outcome_lease_link_is_refused_where_redis_decides(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """An outcome linking a lease, recorded by a ledger-only client while Redis decides the
    org's leases, is refused like its lease reads (``FORBIDDEN``, not the lagging copy's
    ``NOT_FOUND`` for the caller's own live lease, not yet drained into it) and records
    nothing; the Redis client links it, and once the org is handed back the ledger-only
    client does too."""
    quick = RedisAuthority(auth.client, ledger, ack="redis", functions=False)
    clients = [
        Baton(org=org, principal="fast", store=ledger, lease_authority=authority)
        for authority in (quick, None)
    ]
    fast, slow = clients
    try:
        with quick.drain_paused():
            lease_id = fast.leases.acquire("file", "b.py", ttl_seconds=600).lease_id
            with pytest.raises(ForbiddenError, match=r"decided by Redis.*BATON_REDIS_URL"):
                slow.outcomes.record("s", "failed", lease_id=lease_id)
        assert not fast.outcomes.list("s")
        assert fast.outcomes.record("s", "failed", lease_id=lease_id).lease_id == lease_id
        assert quick.return_to_ledger(org) is True
        assert slow.outcomes.record("s", "failed", lease_id=lease_id).lease_id == lease_id
    finally:
        quick.close()


def test_leases_the_ledger_granted_before_redis_are_in_redis(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """A lease granted by a ledger-only client before any Redis client used the org is
    loaded into Redis when the first one does: it is not granted again, and the next
    epoch is above it."""
    slow = Baton(org=org, principal="slow", store=ledger)
    fast = Baton(org=org, principal="fast", role="owner", store=ledger, lease_authority=auth)
    before = slow.leases.acquire("file", "a.py", ttl_seconds=60)
    with pytest.raises(ConflictError):
        fast.leases.acquire("file", "a.py", ttl_seconds=60)
    with pytest.raises(ForbiddenError, match="decided by Redis"):
        slow.leases.release(before)
    taken = fast.leases.force_release(before.lease_id)
    assert taken.lease.lease_id == before.lease_id
    after = fast.leases.acquire("file", "a.py", ttl_seconds=60)
    assert after.epoch > before.epoch


def test_return_to_ledger_and_back(ledger: LedgerStore, auth: RedisAuthority, org: str) -> None:
    """Handing the org back drains the journal first (a lease Redis granted is held on the
    ledger too) and lets ledger-only clients decide again; a Redis client that uses the org
    afterwards takes it back, with epochs above every earlier one, and the audit is clean."""
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    slow = Baton(org=org, principal="slow", store=ledger)
    kept = fast.leases.acquire("file", "a.py", ttl_seconds=60)
    assert auth.return_to_ledger(org) is True
    assert not auth.client.exists(org_keys(org).base.inc)
    with pytest.raises(ConflictError):  # the lease Redis granted, now decided by the ledger
        slow.leases.acquire("file", "a.py", ttl_seconds=60)
    on_ledger = slow.leases.acquire("file", "b.py", ttl_seconds=60)
    assert auth.return_to_ledger(org) is False  # the ledger decides already
    # Redis takes the org back: the ledger's grant is loaded, epochs rise above it
    with pytest.raises(ConflictError):
        fast.leases.acquire("file", "b.py", ttl_seconds=60)
    with pytest.raises(ForbiddenError, match="decided by Redis"):
        slow.leases.acquire("file", "c.py", ttl_seconds=60)
    renewed = fast.leases.renew(kept, ttl_seconds=60)
    assert renewed.lease_id == kept.lease_id
    fresh = fast.leases.acquire("file", "c.py", ttl_seconds=60)
    assert fresh.epoch > kept.epoch  # the next incarnation's range
    assert on_ledger.epoch > kept.epoch  # the ledger granted above the last incarnation
    auth.reconciler.drain(org)
    assert audit_ledger(ledger, org).violations == []


def test_no_resource_is_granted_by_both_while_redis_first_takes_the_org(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """Ledger-only clients acquire many resources while a Redis client uses the org for
    the first time. Each ledger grant either committed before Redis took the org (and
    Redis then refuses the resource) or was refused; no resource is held by both."""
    names = [f"r{i}" for i in range(40)]
    granted: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(3)

    def ledger_only(part: list[str]) -> None:
        b = Baton(org=org, principal="slow", store=ledger)
        start.wait()
        for name in part:
            try:
                b.leases.acquire("res", name, ttl_seconds=60)
                granted.append(name)
            except ForbiddenError:
                refused.append(name)

    threads = [
        threading.Thread(target=ledger_only, args=(names[i::2],), name=f"slow-{i}")
        for i in range(2)
    ]
    for t in threads:
        t.start()
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    start.wait()
    fast.leases.acquire("res", "first", ttl_seconds=60)  # Redis takes the org
    for t in threads:
        t.join()
    assert sorted(granted + refused) == sorted(names)
    for name in names:
        if name in granted:
            with pytest.raises(ConflictError):
                fast.leases.acquire("res", name, ttl_seconds=60)
        else:
            fast.leases.acquire("res", name, ttl_seconds=60)
    auth.reconciler.drain(org)
    assert audit_ledger(ledger, org).violations == []


def test_after_a_redis_data_loss_a_hand_back_keeps_fencing_tokens_rising(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """Redis grants a lease and loses its data before the grant reached the ledger; the org
    is then handed back. The ledger's next grant of the resource takes an epoch above every
    epoch of that Redis incarnation, so it never repeats the lost grant's fencing token."""
    # ack="redis": a grant is acknowledged once Redis has it; the ledger gets it later
    quick = RedisAuthority(auth.client, ledger, ack="redis", functions=False)
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=quick)
    slow = Baton(org=org, principal="slow", store=ledger)
    try:
        with quick.drain_paused():
            lost = fast.leases.acquire("file", "a.py", ttl_seconds=600)
            auth.client.delete(*org_keys(org).base)  # Redis loses the org's state
        assert quick.return_to_ledger(org) is True
    finally:
        quick.close()
    granted = slow.leases.acquire("file", "a.py", ttl_seconds=600)
    assert granted.epoch > lost.epoch
    again = slow.leases.acquire("file", "b.py", ttl_seconds=600)
    assert again.epoch > lost.epoch


def test_a_ledger_only_fence_check_is_refused_where_redis_decides(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """A fenced write checked on the ledger's copy of a Redis-decided lease is refused: the
    generation it names ended in Redis (taken over here) before the ledger heard of it, so
    the copy would still call it current and accept a write under a stale fencing token."""
    quick = RedisAuthority(auth.client, ledger, ack="redis", functions=False)
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=quick)
    other = Baton(org=org, principal="other", role="owner", store=ledger, lease_authority=quick)
    as_holder = Baton(org=org, principal="fast", store=ledger)
    try:
        old = fast.leases.acquire("file", "a.py", ttl_seconds=600)
        quick.reconciler.drain(org)
        with quick.drain_paused():
            other.leases.force_release(old.lease_id)
            new = other.leases.acquire("file", "a.py", ttl_seconds=600)
            before = _counts(ledger, org)
            with pytest.raises(ForbiddenError, match="decided by Redis"):
                as_holder.checkpoints.save("a.py", "progress", {"step": 1}, fence=old)
            assert _counts(ledger, org) == before
            assert as_holder.checkpoints.get("a.py", "progress") is None
        assert new.epoch > old.epoch
        # the Redis client's own fenced write is checked in Redis: the old generation is stale
        with pytest.raises(StaleFenceError):
            fast.checkpoints.save("a.py", "progress", {"step": 1}, fence=old)
        assert other.checkpoints.save("a.py", "progress", {"step": 2}, fence=new).version == 1
    finally:
        quick.close()


def test_a_ledger_only_expiry_report_is_refused_where_redis_decides(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """A ledger-only client does not report a lease expired from the ledger's copy: Redis
    renewed it meanwhile (not drained yet; here the copy's expiry is set in the past), so
    ``lease.expired`` would be false."""
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    slow = Baton(org=org, principal="slow", store=ledger)
    held = fast.leases.acquire("file", "a.py", ttl_seconds=600)
    auth.reconciler.drain(org)
    with Session(ledger.engines.write) as s:  # the copy: as before a renewal it has not seen
        row = s.exec(select(GenerationRow).where(GenerationRow.lease_id == held.lease_id)).one()
        row.expires_at_ms = ledger.now_ms() - 1000
        s.add(row)
        s.commit()
    before = _counts(ledger, org)
    with pytest.raises(ForbiddenError, match="decided by Redis"):
        slow.leases.report_expired()
    assert _counts(ledger, org) == before
    assert fast.leases.report_expired() == []


def test_a_rotation_racing_a_hand_back_leaves_the_org_to_the_ledger(
    ledger: LedgerStore, auth: RedisAuthority, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The org is handed back to the ledger between a rotation's read of the incarnation and
    its ledger write: the rotation gives up instead of recording that Redis decides the org
    again, so ledger-only clients keep deciding (with epochs above Redis's), and the next
    Redis client takes the org back with higher epochs still."""
    from prefect_baton._stores.redis import rebuild

    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    slow = Baton(org=org, principal="slow", store=ledger)
    first = fast.leases.acquire("file", "a.py", ttl_seconds=60)
    fast.leases.release(first)
    real_hget = auth.client.hget
    handed_back: list[bool] = []

    def hget_then_hand_back(*args: object) -> object:
        seen = real_hget(*args)
        if not handed_back:
            handed_back.append(auth.return_to_ledger(org))
        return seen

    monkeypatch.setattr(auth.client, "hget", hget_then_hand_back)
    rebuild.rotate(auth, org)
    monkeypatch.undo()
    assert handed_back == [True]
    mine = slow.leases.acquire("file", "a.py", ttl_seconds=60)  # the ledger decides again
    assert mine.epoch > first.epoch
    slow.leases.release(mine)
    again = fast.leases.acquire("file", "a.py", ttl_seconds=60)
    assert again.epoch > mine.epoch
    with pytest.raises(ForbiddenError):
        slow.leases.acquire("file", "b.py", ttl_seconds=60)


def test_a_hand_back_leaves_nothing_of_the_org_in_redis(
    ledger: LedgerStore, auth: RedisAuthority, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``return_to_ledger`` no key of the org is left in Redis (its acquire receipts
    and handoff resolutions included, and the string keys in which an earlier version kept
    them, dropped in several batches here), and a Redis client taking the org back still
    replays a keyed acquire from the ledger's receipt."""
    from prefect_baton._stores.redis import rebuild

    monkeypatch.setattr(rebuild, "SCAN_BATCH", 3)
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=auth)
    leases = [
        fast.leases.acquire("file", f"f{i}.py", ttl_seconds=60, idempotency_key=f"run-{i}")
        for i in range(8)
    ]
    h = fast.handoffs.create("other", "f0.py", lease=leases[0])
    Baton(org=org, principal="other", store=ledger, lease_authority=auth).handoffs.resolve(
        h.handoff_id, "rejected"
    )
    keys = org_keys(org)
    prefix = keys.prefix
    assert auth.client.hlen(keys.base.kept) >= 8 + 1  # the receipts, the resolution, the pad
    for i in range(8):  # an earlier version's string keys
        auth.client.set(f"{prefix}{'ih'[i % 2]}:{i:032x}", "{}", px=60_000)
    assert auth.return_to_ledger(org) is True
    assert list(auth.client.scan_iter(match=f"{prefix}*")) == []
    again = fast.leases.acquire("file", "f1.py", ttl_seconds=60, idempotency_key="run-1")
    assert again.replayed
    assert again.lease_id == leases[1].lease_id


def test_a_handoff_carries_a_lease_only_if_the_authority_says_it_is_held(
    ledger: LedgerStore, auth: RedisAuthority, org: str
) -> None:
    """Creating a handoff that carries a lease asks the org's lease authority whether the
    lease is held: a client without Redis is refused in an org Redis decides (the ledger's
    copy lags), and a Redis client's lease that Redis already ended is LEASE_LOST even
    before the journal brought that end to the ledger; nothing is written."""
    quick = RedisAuthority(auth.client, ledger, ack="redis", functions=False)
    fast = Baton(org=org, principal="fast", store=ledger, lease_authority=quick)
    boss = Baton(org=org, principal="boss", role="owner", store=ledger, lease_authority=quick)
    as_holder = Baton(org=org, principal="fast", store=ledger)
    try:
        held = fast.leases.acquire("file", "a.py", ttl_seconds=600)
        quick.reconciler.drain(org)
        before = _counts(ledger, org)
        with pytest.raises(ForbiddenError, match="decided by Redis"):
            as_holder.handoffs.create("other", "a.py", lease=held)
        assert _counts(ledger, org) == before
        with quick.drain_paused():
            boss.leases.force_release(held.lease_id)
            with pytest.raises(LeaseLostError):
                fast.handoffs.create("other", "a.py", lease=held)
        mine = fast.leases.acquire("file", "b.py", ttl_seconds=600)
        sent = fast.handoffs.create("other", "b.py", lease=mine)
        assert (sent.lease_id, sent.status) == (mine.lease_id, "pending")
    finally:
        quick.close()


def _other_db(url: str) -> str:
    """``url`` with another database number of the same server (another keyspace)."""
    base, _, db = url.rpartition("/")
    return f"{base}/{(int(db or 0) + 1) % 16}"


def test_a_client_on_another_redis_is_refused_not_rebuilt(ledger: LedgerStore, org: str) -> None:
    """A client whose BATON_REDIS_URL names another Redis (here another database of the
    server) finds no state for an org Redis decides. It is refused (FORBIDDEN, naming both
    addresses), not rebuilt as after a data loss: a rebuild would let both Redis grant the
    same resource. A data loss on the org's own Redis still rebuilds there; a hand-back
    goes through the org's own Redis (through another only with force), and a Redis that
    takes the org after it grants higher epochs."""
    require_redis()
    home = RedisAuthority(connect(REDIS_URL), ledger, ack="redis", owns_client=True)
    stray = RedisAuthority(connect(_other_db(REDIS_URL)), ledger, ack="redis", owns_client=True)
    try:
        a = Baton(org=org, principal="a", store=ledger, lease_authority=home)
        b = Baton(org=org, principal="b", store=ledger, lease_authority=stray)
        held = a.leases.acquire("job", "r1", ttl_seconds=60)
        home.reconciler.drain(org)
        before = _counts(ledger, org)
        with pytest.raises(ForbiddenError, match=r"decided by the Redis at .*has no state"):
            b.leases.acquire("job", "r1", ttl_seconds=60)
        with pytest.raises(ForbiddenError, match="return-to-ledger"):
            b.leases.acquire("job", "r2", ttl_seconds=60)
        assert _counts(ledger, org) == before
        assert not stray.client.exists(org_keys(org).base.inc)
        assert a.leases.renew(held, ttl_seconds=60).epoch == held.epoch
        # a data loss on the org's own Redis: rebuilt there, epochs above every earlier one
        home.client.delete(*home.client.keys(org_keys(org).prefix + "*"))
        again = a.leases.acquire("job", "r2", ttl_seconds=60)
        assert again.epoch > held.epoch
        # a hand-back through the other Redis is refused (the org's Redis would go on
        # granting beside the ledger) unless forced; through the org's own Redis it works
        with pytest.raises(ForbiddenError, match="--force"):
            stray.return_to_ledger(org)
        assert home.client.exists(org_keys(org).base.inc)
        a.leases.release(again)
        a.leases.release(held)
        assert home.return_to_ledger(org) is True
        taken = b.leases.acquire("job", "r1", ttl_seconds=60)
        assert taken.epoch > again.epoch
        # the org's Redis is now the other one; say it is gone for good: the first Redis
        # hands the org back only with force, then takes it with higher epochs
        with pytest.raises(ForbiddenError, match="--force"):
            home.return_to_ledger(org)
        stray.reconciler.drain(org)
        assert home.return_to_ledger(org, force=True) is True
        back = a.leases.acquire("job", "r2", ttl_seconds=60)
        assert back.epoch > taken.epoch
    finally:
        for auth in (home, stray):
            auth.client.delete(*(auth.client.keys(org_keys(org).prefix + "*") or ["-"]))
            auth.close()


class _OtherConnection(redis.Connection):
    """A connection class of someone else's (as an in-process fake has): its ``host`` need
    not name a server."""


def test_only_redis_py_socket_connections_have_a_server_address() -> None:
    """The address recorded with an org's Redis incarnation comes from a client's URL when its
    pool makes redis-py's own TCP, TLS or Unix-socket connections; another connection class
    (fakeredis's, whatever the client class) gives no address, so no check is made on it."""
    assert server_address(redis.Redis.from_url("redis://Example.org:6380/3")) == (
        "example.org:6380/3"
    )
    assert server_address(redis.Redis.from_url("rediss://u:p@h:6379/0")) == "h:6379/0"
    assert server_address(redis.Redis.from_url("unix:///tmp/r.sock?db=2")) == "unix:/tmp/r.sock/2"
    pool = redis.ConnectionPool(connection_class=_OtherConnection, host="a-random-name")
    assert server_address(redis.Redis(connection_pool=pool)) is None
    assert server_address(fakeredis.FakeRedis(server=fakeredis.FakeServer())) is None
