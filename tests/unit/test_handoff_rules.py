"""The pure handoff rules (``_rules.handoffs``): when a pending handoff has expired, and
what becomes of the lease it carries when it ends unaccepted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prefect_baton._rules.access import check_list_owner
from prefect_baton._rules.core import Generation
from prefect_baton._rules.handoffs import (
    HANDOFF_STATUSES,
    STATUS_NEEDS_PARTY,
    HandoffExpiry,
    accepted_lease_view,
    carried_lease_ended,
    decide_carried_release,
    decide_handoff_expiry,
    expired_message,
    handoff_status,
    listing_status,
    not_pending_message,
    stored_statuses,
    validate_status_filter,
)
from prefect_baton.errors import ForbiddenError, ValidationError

T0 = 1_700_000_000_000
DEADLINE = T0 + 5_000


def _carried(**kw: object) -> Generation:
    g = Generation(
        lease_id="L1",
        resource_type="t",
        resource_id="r",
        owner="alice",
        execution_key="k1",
        version=3,
        epoch=7,
        status="active",
        acquired_at_ms=T0,
        expires_at_ms=T0 + 60_000,
        ttl_ms=60_000,
    )
    return replace(g, **kw)  # type: ignore[arg-type]


def _expiry(
    now_ms: int, *, status: str = "pending", carried: Generation | None = None
) -> HandoffExpiry | None:
    return decide_handoff_expiry(
        "hoff_1",
        status,
        DEADLINE,
        carried=_carried() if carried is None else carried,
        from_principal="alice",
        now_ms=now_ms,
    )


def test_before_the_deadline_nothing_happens() -> None:
    """One millisecond before its deadline a pending handoff is left alone (an accept may
    still win); at the deadline it has expired."""
    assert _expiry(DEADLINE - 1) is None
    assert _expiry(DEADLINE) is not None


def test_expiry_releases_the_senders_effective_lease() -> None:
    """Past the deadline the carried lease, still the sender's and effective, is released:
    version and epoch kept, its event names the reason and the handoff."""
    expiry = _expiry(DEADLINE + 1)
    assert expiry is not None
    assert expiry.release is not None
    new = expiry.release.new
    assert new is not None
    assert (new.status, new.ended_at_ms, new.version, new.epoch) == (
        "released",
        DEADLINE + 1,
        3,
        7,
    )
    assert expiry.release.action == "release"
    assert expiry.release.extra == {"reason": "handoff_expired", "handoff_id": "hoff_1"}


@pytest.mark.parametrize("status", ["accepted", "rejected", "expired"])
def test_a_handoff_no_longer_pending_is_left_alone(status: str) -> None:
    """An accepted (or already ended) handoff never releases anything: applying the rule
    twice, or after an accept just before the deadline, does nothing."""
    assert _expiry(DEADLINE + 1, status=status) is None


@pytest.mark.parametrize(
    "carried",
    [
        _carried(status="transferred", ended_at_ms=DEADLINE - 1),  # accepted just before
        _carried(status="released", ended_at_ms=T0 + 1),  # the sender released it
        _carried(owner="bob"),  # not the sender's
        _carried(expires_at_ms=DEADLINE - 1),  # ran out before the deadline
    ],
    ids=["transferred", "released", "other-owner", "lapsed"],
)
def test_expired_but_lease_not_the_senders_is_not_released(carried: Generation) -> None:
    """The handoff still expires, but a lease that moved on, ended or lapsed is left as it
    is (a lease moved to the recipient is never released under it)."""
    expiry = _expiry(DEADLINE + 1, carried=carried)
    assert expiry is not None
    assert expiry.release is None


@pytest.mark.parametrize("expires_at_ms", [DEADLINE, DEADLINE + 10_000])
def test_a_lease_whose_ttl_ran_out_after_the_deadline_is_released_for_the_handoff(
    expires_at_ms: int,
) -> None:
    """When nobody came between the handoff's deadline and the carried lease's own expiry
    (at or after it), ending the handoff later still releases the lease for it: it ends
    ``released`` with reason ``handoff_expired`` (the deadline ended it first), never left
    to be reported as a ``lapsed`` expiry."""
    expiry = _expiry(expires_at_ms + 1, carried=_carried(expires_at_ms=expires_at_ms))
    assert expiry is not None
    assert expiry.release is not None
    assert expiry.release.receipt_status == "released"
    new = expiry.release.new
    assert new is not None
    assert (new.status, new.ended_at_ms, new.version, new.epoch) == (
        "released",
        expires_at_ms + 1,
        3,
        7,
    )
    assert expiry.release.extra == {"reason": "handoff_expired", "handoff_id": "hoff_1"}
    # a rejection has no deadline: a lease past its TTL is left to be reported lapsed
    lapsed = _carried(expires_at_ms=expires_at_ms)
    rejected = decide_carried_release(
        lapsed,
        handoff_id="hoff_1",
        from_principal="alice",
        reason="handoff_rejected",
        now_ms=expires_at_ms + 1,
    )
    assert rejected is None


def test_a_lapsed_carried_lease_expires_the_handoff_before_its_deadline() -> None:
    """A pending handoff whose carried lease ran out reads expired and is ended before its
    own deadline, with nothing to release."""
    lapsed = _carried(expires_at_ms=T0 + 1_000)
    expiry = _expiry(T0 + 2_000, carried=lapsed)
    assert expiry is not None
    assert expiry.release is None
    assert handoff_status("pending", None, T0 + 2_000, carried_ended=True) == "expired"
    assert handoff_status("pending", None, T0 + 2_000, carried_ended=False) == "pending"


@pytest.mark.parametrize(
    "status", ["released", "transferred", "superseded", "revoked", "expired", "taken_over"]
)
def test_a_carried_lease_no_longer_in_effect_expires_the_handoff(status: str) -> None:
    """Whatever ended the carried generation (its sender released it, it moved to another
    generation, it was force-released, it ran out or was taken over), the pending handoff
    reads expired before its own deadline and is ended, with nothing to release."""
    ended = _carried(status=status, ended_at_ms=T0 + 1)
    assert carried_lease_ended(ended, T0 + 2)
    expiry = _expiry(T0 + 2, carried=ended)
    assert expiry is not None
    assert expiry.release is None


def test_an_effective_or_absent_carried_lease_keeps_the_handoff_pending() -> None:
    """A handoff whose lease is still in effect, or that carries none, stays pending until
    its own deadline."""
    assert not carried_lease_ended(_carried(), T0 + 2)
    assert not carried_lease_ended(None, T0 + 2)
    assert _expiry(T0 + 2) is None
    assert handoff_status("pending", None, T0 + 2, carried_ended=False) == "pending"


def test_rejection_release_names_its_reason() -> None:
    """A rejection releases the same way, with reason ``handoff_rejected``."""
    release = decide_carried_release(
        _carried(),
        handoff_id="hoff_2",
        from_principal="alice",
        reason="handoff_rejected",
        now_ms=T0 + 1,
    )
    assert release is not None
    assert release.new is not None
    assert release.new.status == "released"
    assert release.extra == {"reason": "handoff_rejected", "handoff_id": "hoff_2"}
    assert (
        decide_carried_release(
            _carried(), handoff_id="h", from_principal="bob", reason="x", now_ms=T0 + 1
        )
        is None
    )


@pytest.mark.parametrize("status", HANDOFF_STATUSES)
def test_status_filter_takes_each_status(status: str) -> None:
    """Each status a handoff reads as filters by itself; ``any`` is no filter (``None``)."""
    assert validate_status_filter(status) == status
    assert validate_status_filter("any") is None


@pytest.mark.parametrize("bad", ["", "done", "Pending", None, 1, ["pending"]])
def test_status_filter_refuses_anything_else(bad: object) -> None:
    """Anything else is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        validate_status_filter(bad)


def test_expired_is_looked_for_among_stored_pending_too() -> None:
    """A stored pending handoff may read expired; every other status is stored as it reads."""
    assert stored_statuses("expired") == ("pending", "expired")
    for status in ("pending", "accepted", "rejected"):
        assert stored_statuses(status) == (status,)


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_owner_and_admin_list_anyone_s_handoffs(role: str) -> None:
    """The lease-listing rule decides the handoff listing too: owner/admin list anyone's."""
    check_list_owner(role, "boss", "*", "handoffs")
    check_list_owner(role, "boss", "agent-b", "handoffs")


def test_agent_lists_only_its_own_handoffs() -> None:
    """An agent lists its own handoffs; another's or everyone's is FORBIDDEN, naming them."""
    check_list_owner("agent", "agent-a", "agent-a", "handoffs")
    for who in ("*", "agent-b"):
        with pytest.raises(ForbiddenError, match="another principal's handoffs"):
            check_list_owner("agent", "agent-a", who, "handoffs")


def test_star_is_everyone_s_even_for_an_agent_named_star() -> None:
    """``"*"`` never reads as one's own name: an agent named ``*`` is FORBIDDEN it."""
    with pytest.raises(ForbiddenError, match="another principal's handoffs"):
        check_list_owner("agent", "*", "*", "handoffs")
    check_list_owner("owner", "*", "*", "handoffs")


@pytest.mark.parametrize(
    ("status", "how"),
    [
        ("released", "was released"),
        ("transferred", "moved to another holder"),
        ("revoked", "was force-released"),
        ("superseded", "was re-acquired"),
        ("taken_over", "was taken over"),
    ],
)
def test_expired_message_says_how_the_carried_lease_ended(status: str, how: str) -> None:
    """A handoff read expired because its carried lease ended says how it ended; once the
    handoff's own deadline has passed, or while the lease is in effect, it says only that
    it expired (the lease's end may have been the expiry's own release)."""
    ended = _carried(status=status)
    msg = expired_message("h1", DEADLINE, ended, T0)
    assert msg.startswith("handoff h1 has expired: the lease it carries (L1) " + how)
    assert expired_message("h1", DEADLINE, ended, DEADLINE) == "handoff h1 has expired"
    assert expired_message("h1", DEADLINE, _carried(), T0) == "handoff h1 has expired"
    assert expired_message("h1", None, None, T0) == "handoff h1 has expired"


def test_not_pending_message_names_the_stored_status() -> None:
    """A resolve of an accepted or rejected handoff says it was already resolved so; an
    expired one says why it expired."""
    assert not_pending_message("h1", "accepted", DEADLINE, None, T0).startswith(
        "handoff h1 was already accepted"
    )
    assert "was released" in not_pending_message(
        "h1", "expired", DEADLINE, _carried(status="released"), T0
    )


def test_listing_status_needs_a_party_for_a_status() -> None:
    """Without a party a listing is the inbox (``None``), which has no status filter; with
    one its status defaults to ``pending``. Every surface gives this one message."""
    assert listing_status(None, None) is None
    assert listing_status("*", None) == "pending"
    assert listing_status("agent-a", "any") == "any"
    with pytest.raises(ValidationError) as caught:
        listing_status(None, "pending")
    assert caught.value.code == "VALIDATION_ERROR"
    assert caught.value.message == STATUS_NEEDS_PARTY
    assert "give party as well" in STATUS_NEEDS_PARTY


@pytest.mark.parametrize(
    ("role", "principal", "shown"),
    [
        ("agent", "alice", True),  # the recipient, who holds the accepted generation
        ("agent", "bob", False),  # the sender, who no longer holds it
        ("owner", "carol", True),
        ("admin", "carol", True),
    ],
)
def test_accepted_lease_view(role: str, principal: str, shown: bool) -> None:
    """A handoff's ``lease`` is the accepted generation for whoever may read that lease (as
    ``leases.get``), whether it is still held or ended since; nothing without one."""
    for accepted in (_carried(), _carried(status="released", ended_at_ms=T0 + 1)):
        view = accepted_lease_view(accepted, role=role, principal=principal)
        assert view == (accepted if shown else None)
    assert accepted_lease_view(None, role=role, principal=principal) is None
