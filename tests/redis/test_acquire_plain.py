"""``acquire_plain.lua`` (acquire_many without keys, scopes or versions, one TTL and purpose)
decides exactly as ``acquire_many.lua``: each scenario runs twice on a redis-server of the
test's own, once through each script, in two organizations with the same history, and the
outcomes (leases, refusals, ledger history) must be equal."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.codec import encode_gen, from_gen, is_plain, lease_from_gen
from prefect_baton._stores.redis.keys import org_keys, resource_digest
from prefect_baton.audit import audit_ledger
from prefect_baton.errors import BatonError, ConflictError


def _expire(auth: RedisAuthority, org: str, resource_id: str) -> None:
    """Make the head of ("res", resource_id) run out long ago, still marked active."""
    heads = org_keys(org).base[1]
    rd = resource_digest("res", resource_id)
    head = from_gen(auth.client.hget(heads, rd))
    sid = head.lease_id if head.scopes else None
    ran_out = dataclasses.replace(head, expires_at_ms=head.acquired_at_ms + 1)
    auth.client.hset(heads, rd, encode_gen(ran_out, sid=sid))


def _fresh(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    pass


def _released_heads(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    for rid in ("a", "b"):
        b.leases.release(b.leases.acquire("res", rid, ttl_seconds=30))
    other.leases.release(other.leases.acquire("res", "a", ttl_seconds=30))


def _held_by_other(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    b.leases.release(b.leases.acquire("res", "a", ttl_seconds=30))
    other.leases.acquire("res", "b", ttl_seconds=30)


def _held_by_self(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    b.leases.acquire("res", "b", ttl_seconds=30)  # unkeyed: a new acquire supersedes it


def _held_by_self_keyed(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    b.leases.acquire("res", "c", ttl_seconds=30, idempotency_key="run-1")


def _ran_out(b: Baton, other: Baton, auth: RedisAuthority) -> None:
    other.leases.acquire("res", "a", ttl_seconds=30)
    b.leases.acquire("res", "c", ttl_seconds=30, scopes=["src/**"])
    _expire(auth, b.org, "a")
    _expire(auth, b.org, "c")


SCENARIOS: dict[str, Callable[[Baton, Baton, RedisAuthority], None]] = {
    "fresh": _fresh,
    "released_heads": _released_heads,
    "held_by_other": _held_by_other,
    "held_by_self": _held_by_self,
    "held_by_self_keyed": _held_by_self_keyed,
    "ran_out": _ran_out,
}


def _outcome(b: Baton, auth: RedisAuthority, request: list[Any]) -> dict[str, Any]:
    try:
        leases = b.leases.acquire_many(request, ttl_seconds=45, purpose="batch")
        got: Any = [
            (x.resource_id, x.version, x.epoch, x.status, x.replayed, x.ttl_seconds, x.purpose)
            for x in leases
        ]
        # Each returned lease is, field for field, the generation Redis stored.
        heads = org_keys(b.org).base[1]
        for x in leases:
            stored = auth.client.hget(heads, resource_digest("res", x.resource_id))
            assert lease_from_gen(stored, replayed=x.replayed) == x
    except BatonError as exc:
        got = (exc.code, type(exc).__name__)
    auth.reconciler.drain(b.org)
    _rows, transitions = auth.store.lease_history(b.org)
    held = {rid: b.leases.inspect("res", rid).held for rid in ("a", "b", "c")}
    assert audit_ledger(auth.store, b.org).ok
    return {
        "result": got,
        "history": [(t.action, t.version, t.epoch) for t in transitions],
        "held": held,
    }


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_plain_and_general_scripts_decide_alike(
    make_authority: Callable[..., RedisAuthority],
    monkeypatch: pytest.MonkeyPatch,
    scenario: str,
    functions: bool,
) -> None:
    auth = make_authority(ack="ledger", functions=functions)
    request = [("res", "a"), ("res", "b"), ("res", "c")]
    used: list[str] = []
    run = auth._run

    def spy(org: str, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        used.append(name)
        return run(org, name, *args, **kwargs)

    monkeypatch.setattr(auth, "_run", spy)
    outcomes = []
    for plain in (True, False):
        monkeypatch.setattr(
            "prefect_baton._stores.redis.authority.is_plain", lambda r, k, p=plain: p
        )
        b = Baton(
            org=f"org-{scenario}-{plain}",
            principal="agent-a",
            store=auth.store,
            lease_authority=auth,
        )
        other = b.as_principal("agent-b")
        SCENARIOS[scenario](b, other, auth)
        used.clear()
        outcomes.append(_outcome(b, auth, request))
        assert ("acquire_plain" if plain else "acquire_many") in used
    assert outcomes[0] == outcomes[1]


def test_lock_delay_refuses_a_plain_claim(make_authority: Callable[..., RedisAuthority]) -> None:
    auth = make_authority(ack="ledger", post_loss="lock_delay", lock_delay_seconds=60)
    b = Baton(org="org-delay", principal="agent-a", store=auth.store, lease_authority=auth)
    b.leases.acquire("res", "a", ttl_seconds=30)
    auth.client.flushall()
    with pytest.raises(BatonError) as ei:
        b.leases.acquire_many([("res", "b"), ("res", "c")], ttl_seconds=30)
    assert ei.value.code == "CONFLICT"
    assert not b.leases.inspect("res", "b").held


def test_plain_claim_is_chosen_only_for_plain_requests() -> None:
    from prefect_baton._stores.protocol import AcquireRequest

    plain = [AcquireRequest("res", "a", 30_000), AcquireRequest("res", "b", 30_000)]
    assert is_plain(plain, None)
    assert not is_plain(plain, "key")
    assert not is_plain([*plain, AcquireRequest("res", "c", 60_000)], None)
    assert not is_plain([AcquireRequest("res", "a", 30_000, ("src/**",))], None)
    assert not is_plain([AcquireRequest("res", "a", 30_000, (), None, 3)], None)
    assert not is_plain([*plain, AcquireRequest("res", "c", 30_000, (), "p")], None)


@pytest.mark.parametrize("past_now_ms", [0, 1], ids=["expires_at_now", "expires_at_now_plus_1"])
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "general"])
def test_run_out_boundary_on_a_pinned_clock(
    ledger: LedgerStore, monkeypatch: pytest.MonkeyPatch, plain: bool, past_now_ms: int
) -> None:
    """Both acquire scripts judge a head whose expires_at_ms is the script's now exactly as
    the core rule (:meth:`Generation.effective`: in effect only while expires_at > now): at
    expires_at == now it ran out (taken over), at now + 1 it is still held (conflict). The
    Redis clock is pinned (fakeredis's TIME), so the boundary is hit exactly."""
    import fakeredis
    from fakeredis.commands_mixins import server_mixin

    now_ms = 1_800_000_000_000
    monkeypatch.setattr(server_mixin, "time", SimpleNamespace(time=lambda: now_ms / 1000))
    monkeypatch.setattr("prefect_baton._stores.redis.authority.is_plain", lambda r, k: plain)
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    auth = RedisAuthority(client, ledger, ack="ledger", functions=False)
    try:
        b = Baton(org="org-boundary", principal="agent-a", store=ledger, lease_authority=auth)
        b.as_principal("agent-b").leases.acquire("res", "a", ttl_seconds=30)
        heads = org_keys(b.org).base[1]
        rd = resource_digest("res", "a")
        head = dataclasses.replace(
            from_gen(auth.client.hget(heads, rd)), expires_at_ms=now_ms + past_now_ms
        )
        auth.client.hset(heads, rd, encode_gen(head))
        in_effect = head.effective(now_ms)
        assert in_effect is (past_now_ms > 0)
        if in_effect:
            with pytest.raises(ConflictError):
                b.leases.acquire_many([("res", "a"), ("res", "b")], ttl_seconds=45)
        else:
            leases = b.leases.acquire_many([("res", "a"), ("res", "b")], ttl_seconds=45)
            assert [(x.resource_id, x.version, x.owner) for x in leases] == [
                ("a", 2, "agent-a"),
                ("b", 1, "agent-a"),
            ]
        auth.reconciler.drain(b.org)
        _rows, transitions = auth.store.lease_history(b.org)
        actions = [t.action for t in transitions]
        assert ("takeover" in actions) is not in_effect
    finally:
        auth.close()
