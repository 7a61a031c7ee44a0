"""A handoff that carries a lease and expires unaccepted releases that lease (DESIGN.md
"Handoffs"; ``_rules.handoffs.decide_handoff_expiry``), on every arm: whoever comes first
after the deadline (an acquire of the resource, a read of the handoff, a resolve, the
sweep) ends it, the release is recorded once, and a handoff accepted before its deadline
keeps its lease."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from prefect_baton import (
    Baton,
    ConflictError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
)

from ._util import pass_deadline, wait_until_expired

SUBJ = "report-2024"
RT = "delivery"


def _released(b: Baton, lease_id: str) -> list[dict[str, object]]:
    return [
        e.payload
        for e in b.events.list(kind="lease.released", limit=1000)
        if e.payload["lease_id"] == lease_id
    ]


def test_expired_handoff_releases_its_lease(baton: Baton) -> None:
    """Past its deadline a lease-carrying handoff reads ``expired`` and its lease is
    released once (``lease.released``, reason ``handoff_expired``): by an acquire of the
    resource (which then succeeds with a higher epoch, long before the lease's TTL), by a
    read of the handoff (whose result names the released lease), by a resolve (``NOT_FOUND``)
    or by the sweep. Accepting
    it afterwards is ``NOT_FOUND``; a handoff accepted before its deadline keeps its lease."""
    b = baton.as_principal("agent-b")
    c = baton.as_principal("agent-c")
    leases = {
        name: baton.leases.acquire(RT, name, ttl_seconds=300, idempotency_key=f"w-{name}")
        for name in ("by-acquire", "by-read", "by-resolve", "by-sweep", "accepted")
    }
    sent = {
        name: baton.handoffs.create("agent-b", SUBJ, lease=lease, expires_in_seconds=1)
        for name, lease in leases.items()
    }
    moved = b.handoffs.resolve(sent["accepted"].handoff_id, "accepted").lease
    assert moved is not None
    pass_deadline(baton, *sent.values())

    # an acquire of the resource ends the handoff and gets the resource at once
    taker = c.leases.acquire(RT, "by-acquire", ttl_seconds=60)
    assert taker.epoch > leases["by-acquire"].epoch
    h = baton.handoffs.get(sent["by-acquire"].handoff_id)
    assert (h.status, h.released_lease) == ("expired", None)  # ended by the acquire
    assert h.resolved_at is not None

    # the first read ends it and names the released lease; the next read changes nothing
    first = b.handoffs.get(sent["by-read"].handoff_id)
    assert first.status == "expired"
    assert first.released_lease is not None
    assert first.released_lease.lease_id == leases["by-read"].lease_id
    assert first.released_lease.status == "released"
    assert baton.handoffs.get(sent["by-read"].handoff_id).released_lease is None
    assert not c.leases.inspect(RT, "by-read").held

    # a resolve is NOT_FOUND and ends it on the way
    for status in ("rejected", "accepted"):
        with pytest.raises(NotFoundError):
            b.handoffs.resolve(sent["by-resolve"].handoff_id, status)
    assert not c.leases.inspect(RT, "by-resolve").held

    # the sweep ends the rest: two sweepers at once, then a third (a duplicate delivery),
    # record one release
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda who: who.leases.report_expired(), [baton, c]))
    baton.leases.report_expired()
    assert baton.handoffs.get(sent["by-sweep"].handoff_id).status == "expired"
    assert c.leases.acquire(RT, "by-sweep", ttl_seconds=60).epoch > leases["by-sweep"].epoch

    for name in ("by-acquire", "by-read", "by-resolve", "by-sweep"):
        (payload,) = _released(baton, leases[name].lease_id)
        assert payload["reason"] == "handoff_expired"
        assert payload["handoff_id"] == sent[name].handoff_id
        assert payload["status"] == "released"
        with pytest.raises(NotFoundError) as refused:
            b.handoffs.resolve(sent[name].handoff_id, "accepted")
        assert refused.value.code == "NOT_FOUND"
    assert b.handoffs.inbox() == []

    # accepted just before the deadline: untouched, the recipient still holds it
    assert b.handoffs.get(sent["accepted"].handoff_id).status == "accepted"
    assert _released(baton, leases["accepted"].lease_id) == []
    assert _released(baton, moved.lease_id) == []
    with pytest.raises(ConflictError):
        c.leases.acquire(RT, "accepted", ttl_seconds=60)
    assert b.leases.renew(moved).epoch == moved.epoch


def test_carried_lease_is_over_at_the_handoff_deadline(baton: Baton) -> None:
    """From a lease-carrying handoff's deadline on, the carried lease is over for every
    operation, before any acquire or read of the handoff ends it: a write fenced by it is
    ``STALE_FENCE``, a transfer or renew is ``LEASE_LOST``, and the first refusal ends the
    handoff (its lease released once, reason ``handoff_expired``); a retried renew does not
    revive it, and another principal's acquire gets a higher epoch
    (``_rules.core.handoff_deadline_passed``)."""
    b = baton.as_principal("agent-b")
    c = baton.as_principal("agent-c")
    lease = baton.leases.acquire(RT, "renew-late", ttl_seconds=300, idempotency_key="w-late")
    sent = baton.handoffs.create("agent-b", SUBJ, lease=lease, expires_in_seconds=1)
    other = baton.leases.acquire(RT, "transfer-late", ttl_seconds=300)
    other_sent = baton.handoffs.create("agent-b", SUBJ, lease=other, expires_in_seconds=1)
    assert baton.leases.renew(lease).version == lease.version + 1  # before the deadline
    pass_deadline(baton, sent, other_sent)

    with pytest.raises(StaleFenceError) as stale:
        baton.checkpoints.save(SUBJ, "notes", {"n": 1}, fence=lease)
    assert stale.value.code == "STALE_FENCE"
    for _retry in range(2):  # a duplicate delivery of the renew is refused the same way
        with pytest.raises(LeaseLostError) as lost:
            baton.leases.renew(lease)
        assert lost.value.code == "LEASE_LOST"
    (payload,) = _released(baton, lease.lease_id)
    assert payload["reason"] == "handoff_expired"
    assert payload["handoff_id"] == sent.handoff_id
    assert baton.leases.get(lease.lease_id).status == "released"
    h = b.handoffs.get(sent.handoff_id)
    assert (h.status, h.released_lease) == ("expired", None)  # ended by the fenced write
    assert h.resolved_at is not None
    with pytest.raises(NotFoundError):
        b.handoffs.resolve(sent.handoff_id, "accepted")

    with pytest.raises(LeaseLostError):
        baton.leases.transfer(other, to_principal="agent-c", new_execution_key="k", ttl_seconds=60)
    (payload,) = _released(baton, other.lease_id)
    assert (payload["reason"], payload["handoff_id"]) == ("handoff_expired", other_sent.handoff_id)

    taker = c.leases.acquire(RT, "renew-late", ttl_seconds=60)
    assert taker.epoch > lease.epoch
    with pytest.raises(LeaseLostError):
        baton.leases.renew(lease)
    assert len(_released(baton, lease.lease_id)) == 1


def _lease_events(b: Baton, lease_id: str) -> list[tuple[str, object, object]]:
    """The ``(kind, reason, status)`` of the events naming lease ``lease_id``, oldest first,
    leaving out the refusals (``fence.rejected``)."""
    return [
        (e.kind, e.payload.get("reason"), e.payload.get("status"))
        for e in b.events.list(limit=1000)
        if e.payload.get("lease_id") == lease_id and e.kind != "fence.rejected"
    ]


def test_fenced_write_past_the_deadline_ends_the_handoff(baton: Baton) -> None:
    """A write fenced by a lease that a pending handoff carries, after the handoff's deadline,
    is ``STALE_FENCE`` and ends the handoff as a refused renew does, before anyone reads it:
    the handoff is stored ``expired``, the lease is released once (``lease.released``, reason
    ``handoff_expired``, the same events as the renew's), and another principal's acquire
    gets the resource with a higher epoch."""
    b = baton.as_principal("agent-b")
    c = baton.as_principal("agent-c")
    written = baton.leases.acquire(RT, "write-late", ttl_seconds=300)
    written_sent = baton.handoffs.create("agent-b", SUBJ, lease=written, expires_in_seconds=1)
    renewed = baton.leases.acquire(RT, "renew-late", ttl_seconds=300)
    renewed_sent = baton.handoffs.create("agent-b", SUBJ, lease=renewed, expires_in_seconds=1)
    pass_deadline(baton, written_sent, renewed_sent)

    with pytest.raises(StaleFenceError) as stale:
        baton.checkpoints.save(SUBJ, "notes", {"n": 1}, fence=written)
    assert stale.value.code == "STALE_FENCE"
    with pytest.raises(LeaseLostError):
        baton.leases.renew(renewed)

    # ended by the refusals themselves: released once, before any read of the handoffs
    (payload,) = _released(baton, written.lease_id)
    assert (payload["reason"], payload["handoff_id"]) == (
        "handoff_expired",
        written_sent.handoff_id,
    )
    assert _lease_events(baton, written.lease_id) == _lease_events(baton, renewed.lease_id)
    assert [e.kind for e in baton.events.list(kind="fence.rejected", limit=1000)] == [
        "fence.rejected"
    ]
    for sent in (written_sent, renewed_sent):
        h = b.handoffs.get(sent.handoff_id)
        assert (h.status, h.released_lease) == ("expired", None)
        assert h.resolved_at is not None
    assert baton.leases.get(written.lease_id).status == "released"

    # the lease is over: a second refused write ends nothing more, another principal takes over
    with pytest.raises(StaleFenceError):
        baton.checkpoints.save(SUBJ, "notes", {"n": 2}, fence=written)
    taker = c.leases.acquire(RT, "write-late", ttl_seconds=60)
    assert taker.epoch > written.epoch
    assert len(_released(baton, written.lease_id)) == 1


def _lease_only(b: Baton, lease_id: str) -> list[tuple[str, object, object]]:
    """:func:`_lease_events` of kind ``lease.*`` only."""
    return [e for e in _lease_events(b, lease_id) if e[0].startswith("lease.")]


def test_sweep_after_the_deadline_and_the_ttl_releases_for_the_handoff(baton: Baton) -> None:
    """When both a lease-carrying handoff's deadline and, after it, the lease's own TTL
    passed before anyone came, the sweep (``report_expired``) still releases the lease for
    the handoff (``lease.released``, reason ``handoff_expired``, status ``released``) and
    reports no ``lapsed`` expiry, which a resume Automation would act on: the deadline
    ended it first (``_rules.handoffs.deadline_came_first``). A lease whose TTL ran out
    before the deadline of the handoff carrying it is reported ``lapsed`` as before."""
    first = baton.leases.acquire(RT, "deadline-first", ttl_seconds=10, idempotency_key="w-d")
    first_sent = baton.handoffs.create("agent-b", SUBJ, lease=first, expires_in_seconds=1)
    ttl = baton.leases.acquire(RT, "ttl-first", ttl_seconds=10, idempotency_key="w-t")
    ttl_sent = baton.handoffs.create("agent-b", SUBJ, lease=ttl, expires_in_seconds=11)
    assert first_sent.expires_at is not None
    assert first_sent.expires_at <= first.expires_at
    assert ttl_sent.expires_at is not None
    assert ttl_sent.expires_at > ttl.expires_at
    wait_until_expired(baton, first)
    pass_deadline(baton, ttl_sent)

    reported = baton.leases.report_expired()
    assert [lease.lease_id for lease in reported] == [ttl.lease_id]
    assert _lease_only(baton, first.lease_id) == [
        ("lease.acquired", None, None),
        ("lease.released", "handoff_expired", "released"),
    ]
    (payload,) = _released(baton, first.lease_id)
    assert payload["handoff_id"] == first_sent.handoff_id
    assert baton.leases.get(first.lease_id).status == "released"
    assert _lease_only(baton, ttl.lease_id) == [
        ("lease.acquired", None, None),
        ("lease.expired", "lapsed", None),
    ]
    for sent in (first_sent, ttl_sent):
        assert baton.handoffs.get(sent.handoff_id).status == "expired"
    assert baton.leases.report_expired() == []
    assert len(_released(baton, first.lease_id)) == 1
