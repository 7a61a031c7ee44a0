"""The Redis authority's storage format: generations and journal entries as NUL-separated
fields, read back exactly, and state written by earlier versions as JSON still served."""

from __future__ import annotations

import json
import uuid
from typing import Any

import fakeredis
import pytest

from prefect_baton import Baton
from prefect_baton._rules.core import Generation
from prefect_baton._stores.ledger.store import LedgerStore, generation_to_lease
from prefect_baton._stores.redis.authority import RedisAuthority
from prefect_baton._stores.redis.codec import (
    encode_gen,
    from_gen,
    journal_payload,
    lease_from_gen,
    to_gen,
)
from prefect_baton._stores.redis.keys import org_keys, resource_digest
from prefect_baton.audit import audit_ledger
from prefect_baton.errors import LeaseLostError

from ._util import kinds_of

HOLDINGS = [
    Generation(
        lease_id="lease_" + "a" * 32,
        resource_type="res",
        resource_id="r/1 é",
        owner="agent-a",
        execution_key=None,
        version=1,
        epoch=2**53 - 2,
        status="active",
        acquired_at_ms=1_700_000_000_123,
        expires_at_ms=1_700_000_030_123,
        ttl_ms=30_000,
    ),
    Generation(
        lease_id="lease_" + "b" * 32,
        resource_type="t",
        resource_id="=x",
        owner="o",
        execution_key="key=1",
        version=7,
        epoch=3,
        status="revoked",
        acquired_at_ms=1,
        expires_at_ms=2,
        ttl_ms=10_000,
        scopes=("src/**", "docs/ü/*.md"),
        purpose="",
        ended_at_ms=3,
        ended_by="boss",
    ),
    Generation(
        lease_id="lease_" + "c" * 32,
        resource_type="t",
        resource_id="r",
        owner="o",
        execution_key=None,
        version=2,
        epoch=2,
        status="released",
        acquired_at_ms=10,
        expires_at_ms=20,
        ttl_ms=10_000,
        purpose='multi\nline "purpose" = with \x01 control',
        ended_at_ms=15,
    ),
]


@pytest.mark.parametrize("h", HOLDINGS)
def test_generation_round_trip(h: Generation) -> None:
    """Every field survives encoding (empty purpose and None differ, large epochs stay
    exact), in the current format and in the JSON format of earlier versions."""
    for raw in (encode_gen(h), json.dumps(to_gen(h)), encode_gen(h).encode()):
        assert from_gen(raw) == h
        assert lease_from_gen(raw, replayed=True) == generation_to_lease(h, replayed=True)


def test_a_malformed_generation_is_refused() -> None:
    """Text that is not a generation raises instead of producing a wrong lease."""
    with pytest.raises(ValueError):
        from_gen("a\x00b")


def _baton(auth: RedisAuthority) -> Baton:
    return Baton(
        org=f"org-{uuid.uuid4().hex[:12]}",
        principal="agent-a",
        store=auth.store,
        lease_authority=auth,
    )


def test_journal_entry_fields() -> None:
    """A journal entry lists its header and each item's generations and receipt."""
    new, ended = HOLDINGS[0], HOLDINGS[1]
    empty = "\x00" * 16
    raw = "\x00".join(
        [
            "inc1",
            "agent-a",
            "agent",
            "123",
            "h1",
            "=note",
            "2",
            "takeover",
            "d1",
            "99",
            encode_gen(new),
            encode_gen(ended),
            "release",
            "",
            "",
            encode_gen(ended),
            empty,
        ]
    )
    p = journal_payload(raw)
    assert (p["i"], p["ac"], p["ro"], p["at"]) == ("inc1", "agent-a", "agent", "123")
    assert p["ho"] == {"id": "h1", "nt": "note"}
    first, second = p["it"]
    assert first["a"] == "takeover"
    assert first["rc"] == {"d": "d1", "ex": "99"}
    assert from_gen(first["n"]) == new
    assert from_gen(first["x"]) == ended
    assert second["a"] == "release"
    assert "x" not in second
    assert "rc" not in second
    with pytest.raises(ValueError):
        journal_payload(raw + "\x00extra")


def test_state_written_as_json_by_an_earlier_version_is_served(
    ledger: LedgerStore,
) -> None:
    """A head stored as a JSON object and a JSON journal entry (the earlier format): the
    holder still renews and releases its lease, a takeover of the resource retires the JSON
    generation, and the reconciler applies the JSON entry."""
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    auth = RedisAuthority(fake, ledger, ack="redis", reconcile_in_client=False)
    b = _baton(auth)
    keys = org_keys(b.org)
    lease = b.leases.acquire("res", "r0", ttl_seconds=30, scopes=["src/**"], purpose="p")
    # Rewrite the head and the journal entry as the earlier version wrote them.
    rd = resource_digest("res", "r0")
    head = from_gen(fake.hget(keys.base[1], rd))
    gen = to_gen(head, sid=lease.lease_id)
    fake.hset(keys.base[1], rd, json.dumps(gen))
    [(_eid, fields)] = fake.xrange(keys.base.journal)
    p = journal_payload(fields[b"p"])
    legacy: dict[str, Any] = {
        "i": p["i"],
        "ac": p["ac"],
        "ro": p["ro"],
        "at": p["at"],
        "it": [{"a": "acquire", "n": gen}],
    }
    fake.delete(keys.base.journal)
    fake.xadd(keys.base.journal, {"p": json.dumps(legacy)})

    renewed = b.leases.renew(lease)
    assert (renewed.version, renewed.scopes, renewed.purpose) == (2, ("src/**",), "p")
    assert b.leases.release(renewed).status == "released"
    other = b.as_principal("agent-b").leases.acquire("res", "r0", ttl_seconds=30)
    assert other.epoch == lease.epoch + 1
    assert b.leases.release(renewed).status == "no_change"  # the retired generation

    assert auth.reconciler.drain(b.org) == 4
    assert kinds_of(ledger, b) == [
        "lease.acquired",
        "lease.renewed",
        "lease.released",
        "lease.acquired",
    ]
    assert audit_ledger(ledger, b.org).ok
    auth.close()


@pytest.mark.parametrize("functions", [True, False])
def test_a_json_head_is_released_and_taken_over_directly(
    ledger: LedgerStore, functions: bool
) -> None:
    """A JSON head (earlier format) released without being rewritten first, and another
    JSON head whose lease ran out taken over: both end with the right status and times."""
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    auth = RedisAuthority(fake, ledger, ack="ledger", functions=functions)
    b = _baton(auth)
    keys = org_keys(b.org)
    first = b.leases.acquire("res", "r1", ttl_seconds=30)
    second = b.leases.acquire("res", "r2", ttl_seconds=30)
    for lease, expires in ((first, None), (second, 1)):
        rd = resource_digest("res", lease.resource_id)
        gen = to_gen(from_gen(fake.hget(keys.base[1], rd)))
        if expires is not None:
            gen["x"] = expires  # ran out long ago
        fake.hset(keys.base[1], rd, json.dumps(gen))

    receipt = b.leases.release(first)
    assert receipt.status == "released"
    assert receipt.lease.released_at is not None
    assert receipt.lease.epoch == first.epoch
    assert b.leases.release(first).status == "no_change"

    other = b.as_principal("agent-b").leases.acquire("res", "r2", ttl_seconds=30)
    assert other.epoch > second.epoch
    with pytest.raises(LeaseLostError):
        b.leases.release(second)
    assert audit_ledger(ledger, b.org).ok
    auth.close()
