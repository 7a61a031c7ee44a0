"""The Redis authority beyond the conformance suite: the Lua overlap check against Python,
keys, the post-loss grant policies, epoch ranges, the reconciler, handoff crash recovery and
acquire_many (all-or-nothing on every arm)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

import redis
from prefect_baton import (
    Baton,
    ConflictError,
    IdempotencyInFlightError,
    IdempotencyMismatchError,
    LeaseLostError,
    NotFoundError,
    UnavailableError,
    ValidationError,
    VersionConflictError,
)
from prefect_baton._rules.scopes import (
    ScopeCheckBudget,
    normalize_scope,
    prefixes_meet,
    sets_overlap,
)
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.ledger.tables import HandoffRow
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.codec import scope_tokens
from prefect_baton._stores.redis.handoffs import mark_rejected
from prefect_baton._stores.redis.keys import org_keys, resource_digest
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton._stores.redis.scripts import source
from prefect_baton.audit import audit_ledger
from prefect_baton.reconcile import run_reconciler
from tests.conftest import REDIS_URL, _answers

from ._util import kinds_of

# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def fake() -> fakeredis.FakeRedis:
    """A fakeredis client (Lua 5.1) on a server of its own."""
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


@pytest.fixture
def auth(fake: fakeredis.FakeRedis, ledger: LedgerStore) -> Iterator[RedisAuthority]:
    """An authority on fakeredis with ``ack="ledger"``."""
    a = RedisAuthority(fake, ledger, ack="ledger")
    yield a
    a.close()


def _baton(a: RedisAuthority, org: str | None = None, principal: str = "agent-a") -> Baton:
    org = org or f"org-{uuid.uuid4().hex[:12]}"
    return Baton(org=org, principal=principal, store=a.store, lease_authority=a)


# --------------------------------------------------------------------------- overlap parity

SEGMENT_TOKENS = [
    *("a", "b", "é", ".", "*", "?", "[ab]", "[!a]", "[a-b]", "[!ab]", "[é-ê]", "[z-a]"),
    # wide, several-range and overlapping classes (compared by their ranges)
    *("[ -\u2000]", "[\u3000-\u5000]", "[!b-\u5000]", "[a-cx-z]", "[!a-cb-d]", "[!\u3000-\u4000]"),
]
segment = st.one_of(
    st.just("**"),
    st.lists(st.sampled_from(SEGMENT_TOKENS), min_size=1, max_size=3).map("".join),
)
glob = (
    st.lists(segment, min_size=1, max_size=4)
    .map(lambda s: normalize_scope("/".join(s)))
    .filter(bool)
)
glob_sets = st.lists(glob, min_size=1, max_size=3)


def _overlap_clients() -> list[Any]:
    clients: list[Any] = [fakeredis.FakeRedis(server=fakeredis.FakeServer())]
    if _answers("127.0.0.1", 6379):
        clients.append(redis.Redis.from_url(REDIS_URL))
    return clients


STEPS_SCRIPT = (
    source("inspect").split("-- inspect.lua")[0]
    + "\nS().steps(1000000000)"
    + "\nlocal hit = S().sets_overlap(cjson.decode(ARGV[1]), cjson.decode(ARGV[2]))"
    + "\nreturn {hit and 1 or 0, S().steps()}\n"
)
CLIENTS = _overlap_clients()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=glob_sets, b=glob_sets)
def test_lua_overlap_matches_python(a: list[str], b: list[str]) -> None:
    """The scripts' scope overlap check answers exactly as prefect_baton._rules.scopes does,
    and spends the same steps of the decision's budget (ScopeCheckBudget), so a decision
    runs out of steps on every store alike."""
    budget = ScopeCheckBudget(10**9)
    want = sets_overlap(tuple(a), tuple(b), budget)
    ta = json.dumps([scope_tokens(s) for s in a])
    tb = json.dumps([scope_tokens(s) for s in b])
    for client in CLIENTS:
        got, left = client.eval(STEPS_SCRIPT, 0, ta, tb)
        assert (bool(got), int(left)) == (want, budget.left), (client, a, b)


# Leases (sid, literal prefixes) filed in the scope index, all expired at the call's `now`:
# scope_conflict drops from the index exactly the candidates it visits (a lease that ran
# out is forgotten when met), so the sids left are the ones it skipped.
CANDIDATES_SCRIPT = (
    source("inspect").split("-- inspect.lua")[0]
    + """
local leases = cjson.decode(ARGV[1])
for _, l in ipairs(leases) do
  S().idx_add(l[1], cjson.encode({r = 'r', t = {}, pf = l[2]}), l[2], 5, 'other')
end
S().scope_conflict(cjson.decode(ARGV[2]), {}, 'me', 'rd', 10)
local skipped = {}
for _, l in ipairs(leases) do
  if redis.call('HEXISTS', KEYS[9], l[1]) == 1 then skipped[#skipped + 1] = l[1] end
end
redis.call('DEL', KEYS[7], KEYS[8], KEYS[9])
return skipped
"""
)
literal_prefixes = st.lists(
    st.lists(st.sampled_from(["a", "b", "ab"]), max_size=3).map("/".join),
    min_size=1,
    max_size=3,
    unique=True,
).map(sorted)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mine=literal_prefixes, leases=st.lists(literal_prefixes, max_size=6))
def test_lua_scope_candidates_are_the_leases_whose_prefixes_meet(
    mine: list[str], leases: list[list[str]]
) -> None:
    """The scripts' prefix index visits exactly the leases for which
    prefect_baton._rules.scopes.prefixes_meet holds (the rule the ledger skips others by),
    so both stores spend steps on the same leases."""
    keys = org_keys(f"org-{uuid.uuid4().hex[:12]}").base
    filed = [[f"s{i}", pf] for i, pf in enumerate(leases)]
    want = [sid for sid, pf in filed if not prefixes_meet(mine, pf)]
    for client in CLIENTS:
        got = client.eval(CANDIDATES_SCRIPT, len(keys), *keys, json.dumps(filed), json.dumps(mine))
        assert [g.decode() if isinstance(g, bytes) else g for g in got] == want, (client, mine)


@pytest.mark.parametrize(
    ("mine", "theirs", "conflict"),
    [
        (["src/**"], ["src/app/*.py"], True),
        (["src/*.py"], ["src/*.md"], False),
        (["docs/**"], ["src/**"], False),
        (["**/*.py"], ["src/app/main.py"], True),
        (["src/a[0-9]/x"], ["src/a5/*"], True),
        (["src/a[!0-9]/x"], ["src/a5/*"], False),
        (["a/b/c"], ["a/b"], False),
        (["a/b"], ["a/b/**"], True),
    ],
)
def test_scoped_acquire_conflicts_exactly(
    auth: RedisAuthority, mine: list[str], theirs: list[str], conflict: bool
) -> None:
    """A scoped acquire conflicts exactly when a scope overlaps another principal's lease."""
    a = _baton(auth)
    a.leases.acquire("res", "one", ttl_seconds=30, scopes=theirs)
    b = a.as_principal("agent-b")
    if conflict:
        with pytest.raises(ConflictError):
            b.leases.acquire("res", "two", ttl_seconds=30, scopes=mine)
    else:
        b.leases.acquire("res", "two", ttl_seconds=30, scopes=mine)


def test_scope_index_forgets_released_and_expired(auth: RedisAuthority) -> None:
    """Released leases leave the scope index; unrelated prefixes are never candidates."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "one", ttl_seconds=30, scopes=["src/**", "docs/x"])
    sx = org_keys(a.org).base[6]
    assert auth.client.zcard(sx) == 3  # two prefixes and the pad member
    a.leases.release(lease)
    assert auth.client.zcard(sx) == 1
    a.leases.acquire("res", "two", ttl_seconds=30, scopes=["lib/**"])
    a.as_principal("agent-b").leases.acquire("res", "three", ttl_seconds=30, scopes=["src/**"])


# --------------------------------------------------------------------------- keys


def test_keys_share_one_hash_tag_and_hide_ids() -> None:
    """Every key of an org carries one hash tag; ids never appear in key names."""
    org = "acme:{evil}:baton"
    keys = org_keys(org)
    tag = keys.prefix.split("{")[1].split("}")[0]
    for name in [*keys.base, keys.rebuild]:
        assert name.split("{")[1].split("}")[0] == tag
        assert "evil" not in name
    for field in [keys.receipt_field("p:x", "k}", "a:b", "c"), keys.handoff_field("h")]:
        assert re.fullmatch("[ih]:[0-9a-f]{32}", field), field
    assert org_keys("acme") != org_keys("acme ")
    assert resource_digest("a:b", "c") != resource_digest("a", "b:c")


# --------------------------------------------------------------------------- data loss


def test_lock_delay_refuses_new_grants_after_loss(fake: Any, ledger: LedgerStore) -> None:
    """With lock_delay, after a loss no new grant is made until the delay has passed; the
    restored lease can still be renewed and released."""
    auth = RedisAuthority(fake, ledger, ack="ledger", post_loss="lock_delay", lock_delay_seconds=1)
    a = _baton(auth)
    held = a.leases.acquire("res", "r0", ttl_seconds=30)
    fake.flushall()
    b = a.as_principal("agent-b")
    with pytest.raises(ConflictError) as ei:
        b.leases.acquire("res", "r1", ttl_seconds=30)
    assert ei.value.expires_at is not None
    renewed = a.leases.renew(held)
    assert renewed.epoch == held.epoch
    deadline = ei.value.expires_at
    while True:
        try:
            fresh = b.leases.acquire("res", "r1", ttl_seconds=30)
            break
        except ConflictError:
            time.sleep(0.1)
    assert fresh.epoch == EPOCH_RANGE + 1
    assert fresh.acquired_at >= deadline
    assert a.leases.release(renewed).status == "released"
    auth.close()


def test_fence_only_grants_at_once_with_higher_epochs(auth: RedisAuthority) -> None:
    """With fence_only, a loss is followed by grants at once, above every earlier epoch."""
    a = _baton(auth)
    for _ in range(3):
        a.leases.acquire("res", "r0", ttl_seconds=30)
    auth.client.flushall()
    lease = a.leases.acquire("res", "r1", ttl_seconds=30)
    assert lease.epoch == EPOCH_RANGE + 1
    again = a.leases.acquire("res", "r0", ttl_seconds=30)
    assert again.epoch == EPOCH_RANGE + 1
    assert again.version == 4
    assert audit_ledger(auth.store, a.org).ok


def test_replay_survives_loss(auth: RedisAuthority) -> None:
    """Acquire receipts are rebuilt from the ledger: an exact retry still replays, and a
    changed request is still a mismatch."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=30, idempotency_key="run-1")
    auth.client.flushall()
    again = a.leases.acquire("res", "r0", ttl_seconds=30, idempotency_key="run-1")
    assert again.replayed
    assert again.lease_id == lease.lease_id
    with pytest.raises(IdempotencyMismatchError):
        a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="run-1")


def test_epoch_range_rotates_when_used_up(auth: RedisAuthority) -> None:
    """When an incarnation's epoch range is used up the org moves to the next range."""
    a = _baton(auth)
    first = a.leases.acquire("res", "r0", ttl_seconds=30)
    inc = org_keys(a.org).base.inc
    auth.client.hset(inc, "ceil", str(first.epoch + 1))
    nxt = a.leases.acquire("res", "r0", ttl_seconds=30)
    assert nxt.epoch == EPOCH_RANGE + 1
    assert int(auth.client.hget(inc, "floor")) == EPOCH_RANGE
    assert audit_ledger(auth.store, a.org).ok


# --------------------------------------------------------------------------- reconciler


def test_lag_and_run_reconciler(fake: Any, ledger: LedgerStore) -> None:
    """With ack='redis' and no drain yet, the lag counts the entries; run_reconciler applies
    them all once, and the ledger then has every transition and event."""
    auth = RedisAuthority(fake, ledger, ack="redis", reconcile_interval_seconds=3600)
    a = _baton(auth)
    auth._acked = lambda org, eid: None  # type: ignore[method-assign]
    lease = a.leases.acquire("res", "r0", ttl_seconds=30)
    a.leases.renew(lease)
    a.leases.release(lease)
    lag = auth.reconciler.lag(a.org)
    assert lag.entries == 3
    assert lag.oldest_id is not None
    report = run_reconciler(client=fake, store=ledger, orgs=[a.org])
    assert report.applied == 3
    assert report.lag[a.org].entries == 0
    assert kinds_of(ledger, a) == ["lease.acquired", "lease.renewed", "lease.released"]
    assert run_reconciler(client=fake, store=ledger, orgs=[a.org]).applied == 0
    auth.close()


def test_reapplying_the_journal_changes_nothing(
    fake: Any, ledger: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries applied twice (cursor lost, stream not trimmed) leave the ledger unchanged."""
    auth = RedisAuthority(fake, ledger, ack="ledger")
    monkeypatch.setattr(fake, "xtrim", lambda *a, **k: 0)
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=30, scopes=["x/**"], idempotency_key="k")
    moved = a.leases.transfer(lease, to_principal="agent-b", new_execution_key="k2", ttl_seconds=30)
    a.as_principal("agent-b").leases.release(moved)
    before = (ledger.lease_history(a.org), kinds_of(ledger, a))
    with ledger.engines.write.begin() as conn:
        conn.execute(
            text("DELETE FROM baton_receipts WHERE org_id = :o AND operation = 'redis.journal'"),
            {"o": a.org},
        )
    assert auth.reconciler.drain(a.org) == 3
    after = (ledger.lease_history(a.org), kinds_of(ledger, a))
    assert [(h.lease_id, h.status, h.version) for h in after[0][0]] == [
        (h.lease_id, h.status, h.version) for h in before[0][0]
    ]
    assert len(after[0][1]) == len(before[0][1])
    assert after[1] == before[1]
    assert audit_ledger(ledger, a.org).ok
    auth.close()


def test_postgresql_ledger_behind_redis(fake: Any, pg_url: str) -> None:
    """The reconciler writes the PostgreSQL ledger as it writes SQLite (audit passes)."""
    from tests.conftest import store_for

    store = store_for(pg_url)
    auth = RedisAuthority(fake, store, ack="ledger")
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=30, scopes=["p/**"], idempotency_key="k")
    lease = a.leases.renew(lease)
    moved = a.leases.transfer(lease, to_principal="agent-b", new_execution_key="k2", ttl_seconds=30)
    a.as_principal("boss", role="admin").leases.force_release(moved.lease_id)
    a.leases.acquire("res", "r0", ttl_seconds=30)
    assert audit_ledger(store, a.org).ok
    assert kinds_of(store, a) == [
        "lease.acquired",
        "lease.renewed",
        "lease.transferred",
        "lease.released",
        "lease.acquired",
    ]
    auth.close()


# --------------------------------------------------------------------------- handoffs


def _crash(*args: Any, **kwargs: Any) -> int:
    raise UnavailableError("the ledger went away")


def test_handoff_accept_interrupted_after_transfer_completes_on_retry(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the Redis transfer and the ledger: an exact retry finds the handoff
    accepted (NOT_FOUND, as a second resolve on the ledger), the recipient holding."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    real = auth.reconciler.drain

    monkeypatch.setattr(auth.reconciler, "drain", _crash)
    with pytest.raises(UnavailableError):
        b.handoffs.resolve(h.handoff_id, "accepted")
    monkeypatch.setattr(auth.reconciler, "drain", real)
    with auth.store._read() as (s, _now):
        row = s.get(HandoffRow, h.handoff_id)
        assert row is not None
        assert row.status == "pending"
    with pytest.raises(NotFoundError):
        b.handoffs.resolve(h.handoff_id, "accepted")
    done = b.handoffs.get(h.handoff_id)
    assert done.status == "accepted"
    assert done.lease is not None
    assert done.lease.owner == "agent-b"
    with pytest.raises(LeaseLostError):
        a.leases.renew(lease)
    assert kinds_of(auth.store, a)[-2:] == ["lease.transferred", "handoff.accepted"]


def test_handoff_accept_interrupted_then_redis_lost_stays_pending(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the Redis transfer, then Redis loses its data before any drain: the
    rebuilt state is (pending, sender holds), and the handoff can then be accepted."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")

    with monkeypatch.context() as m:
        m.setattr(auth.reconciler, "drain", _crash)
        with pytest.raises(UnavailableError):
            b.handoffs.resolve(h.handoff_id, "accepted")
    auth.client.flushall()
    assert a.handoffs.get(h.handoff_id).status == "pending"
    info = a.leases.inspect("res", "r0")
    assert info.lease is not None
    assert info.lease.lease_id == lease.lease_id
    done = b.handoffs.resolve(h.handoff_id, "accepted")
    assert done.lease is not None
    assert done.lease.epoch > EPOCH_RANGE
    assert audit_ledger(auth.store, a.org).ok


def test_background_drain_completes_an_interrupted_accept(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery without a retry: any later drain records the acceptance in the ledger."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60)
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    real = auth.reconciler.drain
    with monkeypatch.context() as m:
        m.setattr(auth.reconciler, "drain", _crash)
        with pytest.raises(UnavailableError):
            b.handoffs.resolve(h.handoff_id, "accepted")
    real(a.org)
    got = a.handoffs.get(h.handoff_id)
    assert got.status == "accepted"
    assert b.leases.inspect("res", "r0").lease is not None


def test_reject_settles_before_a_late_accept(auth: RedisAuthority) -> None:
    """Once a lease-carrying handoff is rejected in Redis, an accept cannot transfer its
    lease; a reject after the first one crashed (settled, nothing released or recorded)
    completes that rejection and is answered as a second resolve (NOT_FOUND)."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60)
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    assert mark_rejected(auth, b.caller, h.handoff_id)  # the reject's first step, a crash
    with pytest.raises(NotFoundError):
        b.handoffs.resolve(h.handoff_id, "accepted")
    with pytest.raises(NotFoundError, match="not found"):
        b.handoffs.resolve(h.handoff_id, "rejected")
    assert b.handoffs.get(h.handoff_id).status == "rejected"
    assert not a.leases.inspect("res", "r0").held  # the rejection released the carried lease
    assert kinds_of(auth.store, a).count("handoff.rejected") == 1


def test_a_rejection_is_not_settled_past_the_handoffs_deadline(auth: RedisAuthority) -> None:
    """Settling a rejection in Redis is refused past the handoff's deadline on the Redis
    clock, as an accept is: a later mark never decides the end of an expired handoff."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60)
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    with pytest.raises(NotFoundError, match="has expired"):
        mark_rejected(auth, b.caller, h.handoff_id, int(time.time() * 1000) - 1)
    assert mark_rejected(auth, b.caller, h.handoff_id)  # before the deadline: settles it
    assert not mark_rejected(auth, b.caller, h.handoff_id)  # a second mark is not its own


def test_a_rejection_the_sweep_recorded_first_is_answered_as_its_own(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reject that settled in Redis and released the lease, whose ledger record the
    expiry sweep made first (it completes settled rejections), is answered as the
    rejection (not NOT_FOUND): exactly one handoff.rejected, the lease released once."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    real = auth.store._handoff_resolve

    def sweep_first(caller: Any, resolution: Any, *, carried_released: bool = False) -> Any:
        if carried_released and caller.principal == "agent-b":
            monkeypatch.setattr(auth.store, "_handoff_resolve", real)
            a.leases.report_expired()  # the sweep comes between release and record
        return real(caller, resolution, carried_released=carried_released)

    monkeypatch.setattr(auth.store, "_handoff_resolve", sweep_first)
    assert b.handoffs.resolve(h.handoff_id, "rejected").status == "rejected"
    got = kinds_of(auth.store, a)
    assert got.count("handoff.rejected") == 1
    assert got.count("lease.released") == 1


def _interrupt_rejection(auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the next rejection stop after it settled in Redis and released the lease,
    before the ledger records it (as a crash, or a slow caller, would)."""
    real = auth.store._handoff_resolve

    def stop(caller: Any, resolution: Any, *, carried_released: bool = False) -> Any:
        if carried_released:
            monkeypatch.setattr(auth.store, "_handoff_resolve", real)
            raise UnavailableError("the ledger went away")
        return real(caller, resolution, carried_released=carried_released)

    monkeypatch.setattr(auth.store, "_handoff_resolve", stop)


@pytest.mark.parametrize("then", ["rejected", "accepted", "sweep"])
def test_an_interrupted_rejection_ends_rejected(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A rejection that released the carried lease in Redis but did not reach the ledger
    (interrupted, or still running when another resolve comes) ends the handoff
    ``rejected``, never ``expired``: another reject or an accept completes it and is
    NOT_FOUND (it was rejected), and so does the expiry sweep (one handoff.rejected, the
    lease released once)."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    _interrupt_rejection(auth, monkeypatch)
    with pytest.raises(UnavailableError):
        b.handoffs.resolve(h.handoff_id, "rejected")
    assert not a.leases.inspect("res", "r0").held
    if then in ("rejected", "accepted"):
        with pytest.raises(NotFoundError, match="was rejected"):
            b.handoffs.resolve(h.handoff_id, then, execution_key="run-2")
    else:
        a.leases.report_expired()
    assert b.handoffs.get(h.handoff_id).status == "rejected"
    assert not a.leases.inspect("res", "r0").held
    got = kinds_of(auth.store, a)
    assert got.count("handoff.rejected") == 1
    assert got.count("lease.released") == 1
    assert "handoff.expired" not in got


def test_an_acquire_past_the_deadline_of_a_half_rejected_handoff_gets_the_lease(
    auth: RedisAuthority,
) -> None:
    """A rejection interrupted after it settled in Redis (before the deadline) but before
    it released the lease: once the handoff's deadline passes, another principal's acquire
    completes that rejection (the handoff ends ``rejected``, its lease released) and is
    granted at once."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease, expires_in_seconds=1)
    b = a.as_principal("agent-b")
    mark_rejected(auth, b.caller, h.handoff_id)  # the reject's first step, then a crash
    time.sleep(1.1)
    got = a.as_principal("agent-c").leases.acquire("res", "r0", ttl_seconds=60)
    assert got.owner == "agent-c"
    assert got.epoch > lease.epoch
    assert b.handoffs.get(h.handoff_id).status == "rejected"


@pytest.mark.parametrize("key", ["run-2", None, "run-1"])
def test_a_concurrent_accept_under_another_key_gets_no_lease(
    auth: RedisAuthority, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    """An accept that finds the handoff already accepted in Redis (the first accept's
    ledger step not done when it read the handoff) gets the lease back only under the same
    explicit execution key (the retry of that execution); under another key, or the
    default one, it is NOT_FOUND, so no two runs hold the lease with one fencing token."""
    a = _baton(auth)
    lease = a.leases.acquire("res", "r0", ttl_seconds=60, idempotency_key="w1")
    h = a.handoffs.create("agent-b", "subject", lease=lease)
    b = a.as_principal("agent-b")
    real_sync = auth.sync_ledger
    with monkeypatch.context() as m:
        m.setattr(auth.reconciler, "drain", _crash)
        with pytest.raises(UnavailableError):
            b.handoffs.resolve(h.handoff_id, "accepted", execution_key="run-1")
    # the next accept reads the handoff while the ledger still says pending
    monkeypatch.setattr(
        auth, "sync_ledger", lambda org, strict=False: real_sync(org, strict=True) if strict else 0
    )
    if key == "run-1":
        done = b.handoffs.resolve(h.handoff_id, "accepted", execution_key=key)
        assert done.lease is not None
        assert done.lease.execution_key == "run-1"
    else:
        with pytest.raises(NotFoundError, match="not found"):
            b.handoffs.resolve(h.handoff_id, "accepted", execution_key=key)
    got = b.handoffs.get(h.handoff_id)
    assert got.status == "accepted"
    assert got.lease is not None
    assert got.lease.execution_key == "run-1"


# --------------------------------------------------------------------------- acquire_many


def test_acquire_many_grants_all(baton: Baton) -> None:
    """acquire_many returns one lease per resource, in order, each version 1 epoch 1."""
    leases = baton.leases.acquire_many(
        [("res", "a"), {"resource_type": "res", "resource_id": "b", "ttl_seconds": 60}],
        ttl_seconds=30,
    )
    assert [(x.resource_id, x.version, x.epoch) for x in leases] == [("a", 1, 1), ("b", 1, 1)]
    assert [x.ttl_seconds for x in leases] == [30, 60]
    assert all(baton.leases.inspect("res", r).held for r in ("a", "b"))


def test_acquire_many_is_all_or_nothing(baton: Baton) -> None:
    """If one resource is taken, acquire_many raises its conflict and acquires none."""
    other = baton.as_principal("agent-b")
    other.leases.acquire("res", "b", ttl_seconds=30)
    before = [e.kind for e in baton.events.list(limit=1000)]
    with pytest.raises(ConflictError, match=r"\(acquire_many item 1: res/b\)$") as err:
        baton.leases.acquire_many([("res", "a"), ("res", "b"), ("res", "c")], ttl_seconds=30)
    assert err.value.expires_at is not None
    assert not baton.leases.inspect("res", "a").held
    assert not baton.leases.inspect("res", "c").held
    assert [e.kind for e in baton.events.list(limit=1000)] == before


def test_acquire_many_scope_conflict_is_all_or_nothing(baton: Baton) -> None:
    """A scope overlap on one item refuses the whole claim."""
    baton.as_principal("agent-b").leases.acquire("res", "x", ttl_seconds=30, scopes=["src/**"])
    with pytest.raises(ConflictError, match=r"write scope.*\(acquire_many item 1: res/b\)$"):
        baton.leases.acquire_many(
            [("res", "a"), {"resource_type": "res", "resource_id": "b", "scopes": ["src/a/*"]}],
            ttl_seconds=30,
        )
    assert not baton.leases.inspect("res", "a").held


def test_acquire_many_version_conflict_names_the_item(baton: Baton) -> None:
    """A compare-and-swap refusal keeps its versions and names the refused item."""
    receipt = baton.leases.release(baton.leases.acquire("res", "v", ttl_seconds=30))
    with pytest.raises(VersionConflictError, match=r"\(acquire_many item 2: res/v\)$") as err:
        baton.leases.acquire_many(
            [
                ("res", "a"),
                ("res", "b"),
                {"resource_type": "res", "resource_id": "v", "expected_version": 7},
            ],
            ttl_seconds=30,
        )
    assert err.value.current_version == receipt.lease.version
    assert err.value.expected_version == 7
    assert not baton.leases.inspect("res", "a").held


def test_acquire_many_replays_with_its_key(baton: Baton) -> None:
    """An exact retry of a keyed acquire_many replays every lease."""
    first = baton.leases.acquire_many(
        [("res", "a"), ("res", "b")], ttl_seconds=30, idempotency_key="k"
    )
    again = baton.leases.acquire_many(
        [("res", "a"), ("res", "b")], ttl_seconds=30, idempotency_key="k"
    )
    assert [x.lease_id for x in again] == [x.lease_id for x in first]
    assert all(x.replayed for x in again)


@pytest.mark.parametrize(
    ("item", "call_ttl"),
    [
        ({"resource_type": "res", "resource_id": "b", "ttl_seconds": 5}, 30),
        (("res", ""), 30),
        ({"resource_type": "res", "resource_id": "b", "colour": "red"}, 30),
    ],
)
def test_acquire_many_bad_item_names_its_index(baton: Baton, item: Any, call_ttl: int) -> None:
    """A bad item is a VALIDATION_ERROR naming its index (the REST server's own check
    names it as ``resources.1``); a bad call-level TTL names no item."""
    with pytest.raises(ValidationError, match=r"\(acquire_many item 1\)$|resources\.1\b"):
        baton.leases.acquire_many([("res", "a"), item], ttl_seconds=call_ttl)
    with pytest.raises(ValidationError) as err:
        baton.leases.acquire_many([("res", "a")], ttl_seconds=5)
    assert "item" not in err.value.message
    assert not baton.leases.inspect("res", "a").held


@pytest.mark.parametrize(
    "bad",
    [[], [("res", "a"), ("res", "a")], [("res",)], [{"resource_type": "res"}], "res/a"],
)
def test_acquire_many_validation(baton: Baton, bad: Any) -> None:
    """Empty, duplicated or malformed resource lists are VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.leases.acquire_many(bad, ttl_seconds=30)
    assert baton.events.list() == []


def test_attempt_survives_a_redis_data_loss(
    auth: RedisAuthority, fake: fakeredis.FakeRedis
) -> None:
    """The attempt of a keyed acquire travels with its receipt through the journal into the
    ledger, so after Redis lost the org's data the rebuilt receipt still replays to that
    attempt only: another attempt, or an anonymous one, is IDEMPOTENCY_IN_FLIGHT."""
    b = _baton(auth)
    kw: dict[str, Any] = {"ttl_seconds": 60, "idempotency_key": "run-123"}
    first = b.leases.acquire("res", "r0", attempt="pod-1", **kw)
    auth.sync_ledger(b.org, strict=True)
    fake.delete(*fake.keys(org_keys(b.org).prefix + "*"))  # Redis lost the org's data
    again = b.leases.acquire("res", "r0", attempt="pod-1", **kw)
    assert again.replayed
    assert (again.lease_id, again.epoch) == (first.lease_id, first.epoch)
    for other in ("pod-2", None):
        with pytest.raises(IdempotencyInFlightError):
            b.leases.acquire("res", "r0", attempt=other, **kw)
