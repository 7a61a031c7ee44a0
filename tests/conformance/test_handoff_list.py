"""The handoff listing (``b.handoffs.list``, ``GET /v1/handoffs?party=``): one's own
handoffs (sent or received) for anyone, another principal's or everyone's in the
organization for ``owner``/``admin`` only (the rule of the lease list,
``_rules.access.check_list_owner``), filtered by status (pending by default), never
another organization's, in keyset pages, on every store arm."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prefect_baton import Baton, ForbiddenError, Handoff, ValidationError
from prefect_baton._rules.paging import encode_cursor

from ._util import pages, pass_deadline

SUBJ = "report-2024"


def _ids(handoffs: list[Handoff]) -> list[str]:
    return [h.handoff_id for h in handoffs]


@pytest.mark.parametrize("role", ["owner", "admin"])
def test_owner_and_admin_list_every_pending_handoff_of_the_org(baton: Baton, role: str) -> None:
    """An owner or admin who took part in none of them lists every pending handoff of the
    org, oldest first; a resolved one is left out."""
    c = baton.as_principal("agent-c")
    first = baton.handoffs.create("agent-b", SUBJ)
    second = c.handoffs.create("agent-d", SUBJ)
    done = c.handoffs.create("agent-b", SUBJ)
    baton.as_principal("agent-b").handoffs.resolve(done.handoff_id, "accepted")
    boss = baton.as_principal("boss", role=role)
    listed = boss.handoffs.list(party="*")
    assert _ids(listed) == [first.handoff_id, second.handoff_id]
    assert all(h.status == "pending" for h in listed)
    assert [(h.from_principal, h.to_principal) for h in listed] == [
        ("agent-a", "agent-b"),
        ("agent-c", "agent-d"),
    ]
    assert boss.handoffs.list() == []  # its own: none
    assert _ids(boss.handoffs.list(party="agent-d")) == [second.handoff_id]


def test_own_handoffs_are_those_sent_and_received(baton: Baton) -> None:
    """Without ``party`` (or with one's own name) an agent lists the pending handoffs it
    sent and those it received, and no one else's."""
    c = baton.as_principal("agent-c")
    sent = baton.handoffs.create("agent-b", SUBJ)
    received = c.handoffs.create("agent-a", SUBJ)
    c.handoffs.create("agent-d", SUBJ)
    assert _ids(baton.handoffs.list()) == [sent.handoff_id, received.handoff_id]
    assert _ids(baton.handoffs.list(party="agent-a")) == [sent.handoff_id, received.handoff_id]
    assert _ids(baton.as_principal("agent-b").handoffs.list()) == [sent.handoff_id]


@pytest.mark.parametrize("party", ["*", "agent-c"])
def test_agent_asking_for_others_handoffs_is_forbidden(baton: Baton, party: str) -> None:
    """An agent asking for everyone's or another principal's handoffs is FORBIDDEN."""
    baton.as_principal("agent-c").handoffs.create("agent-d", SUBJ)
    with pytest.raises(ForbiddenError) as ei:
        baton.handoffs.list(party=party)
    assert ei.value.code == "FORBIDDEN"


def test_no_principal_may_be_named_star(baton: Baton) -> None:
    """``"*"`` means every principal in a listing (``party="*"``, ``owner="*"``), so no
    caller, handoff recipient or transfer recipient may carry that name: each is
    VALIDATION_ERROR and nothing is written."""
    lease = baton.leases.acquire("deploy", "svc", ttl_seconds=60)
    with pytest.raises(ValidationError) as ei:
        baton.as_principal("*")
    assert ei.value.code == "VALIDATION_ERROR"
    with pytest.raises(ValidationError):
        baton.handoffs.create("*", SUBJ)
    with pytest.raises(ValidationError):
        baton.leases.transfer(lease, to_principal="*", new_execution_key="x", ttl_seconds=60)
    owner = baton.as_principal("boss", role="owner")
    assert owner.handoffs.list(party="*", status="any") == []
    assert [x.lease_id for x in owner.leases.list(owner="*")] == [lease.lease_id]


def test_no_handoff_of_another_org_is_listed(
    baton: Baton, baton_in_org: Callable[..., Baton], org: str
) -> None:
    """Everyone's handoffs are those of the caller's org: another org's owner sees none of
    them (and this org's owner none of the other's)."""
    mine = baton.handoffs.create("agent-b", SUBJ)
    other = baton_in_org(f"{org}-other", "agent-a")
    theirs = other.handoffs.create("agent-b", SUBJ)
    assert baton_in_org(f"{org}-other", "boss", "owner").handoffs.list(party="*") == [theirs]
    owner_here = baton.as_principal("boss", role="owner")
    assert _ids(owner_here.handoffs.list(party="*")) == [mine.handoff_id]
    assert owner_here.handoffs.list(party="*", status="any") == [
        owner_here.handoffs.get(mine.handoff_id)
    ]


def test_status_filter(baton: Baton) -> None:
    """``status`` lists those that read as it: accepted, rejected, pending (the default),
    expired (a pending one past its expiry) or any."""
    b = baton.as_principal("agent-b")
    accepted = baton.handoffs.create("agent-b", SUBJ)
    rejected = baton.handoffs.create("agent-b", SUBJ)
    pending = baton.handoffs.create("agent-b", SUBJ)
    lapsing = baton.handoffs.create("agent-b", SUBJ, expires_in_seconds=1)
    b.handoffs.resolve(accepted.handoff_id, "accepted")
    b.handoffs.resolve(rejected.handoff_id, "rejected")
    pass_deadline(baton, lapsing)
    boss = baton.as_principal("boss", role="owner")
    assert _ids(boss.handoffs.list(party="*")) == [pending.handoff_id]
    assert _ids(boss.handoffs.list(party="*", status="pending")) == [pending.handoff_id]
    assert _ids(boss.handoffs.list(party="*", status="accepted")) == [accepted.handoff_id]
    assert _ids(baton.handoffs.list(status="rejected")) == [rejected.handoff_id]
    expired = boss.handoffs.list(party="*", status="expired")
    assert [(h.handoff_id, h.status) for h in expired] == [(lapsing.handoff_id, "expired")]
    everything = boss.handoffs.list(party="*", status="any")
    # oldest first, as documented: by creation time (ms), then id (two made in one ms)
    made = sorted(
        [accepted, rejected, pending, lapsing], key=lambda h: (h.created_at, h.handoff_id)
    )
    assert _ids(everything) == _ids(made)
    status = {
        accepted.handoff_id: "accepted",
        rejected.handoff_id: "rejected",
        pending.handoff_id: "pending",
        lapsing.handoff_id: "expired",
    }
    assert [h.status for h in everything] == [status[h.handoff_id] for h in made]


@pytest.mark.parametrize("limit", [0, -1, 10_001, True, "5", 2.5])
def test_bad_limit_is_validation_error(baton: Baton, limit: object) -> None:
    """A limit that is not an integer from 1 to 10,000 is VALIDATION_ERROR."""
    boss = baton.as_principal("boss", role="owner")
    with pytest.raises(ValidationError) as ei:
        boss.handoffs.list(party="*", limit=limit)  # type: ignore[arg-type]
    assert ei.value.code == "VALIDATION_ERROR"


@pytest.mark.parametrize(
    ("party", "status"),
    [("*", "done"), ("*", ""), ("*", "PENDING"), ("", "pending"), ("a\x00b", "pending")],
)
def test_bad_party_or_status_is_validation_error(baton: Baton, party: str, status: str) -> None:
    """An unknown status or a party that is no principal id is VALIDATION_ERROR."""
    boss = baton.as_principal("boss", role="owner")
    with pytest.raises(ValidationError):
        boss.handoffs.list(party=party, status=status)


def test_everyone_s_handoffs_page_by_cursor(baton: Baton) -> None:
    """Read two at a time, everyone's pending handoffs come once each, oldest first, as in
    one read; a lease list's cursor is VALIDATION_ERROR."""
    made = [
        baton.as_principal(f"agent-{i}").handoffs.create(f"agent-{i + 1}", SUBJ) for i in range(5)
    ]
    boss = baton.as_principal("boss", role="admin")
    whole = boss.handoffs.list(party="*")
    assert set(_ids(whole)) == set(_ids(made))
    paged = pages(lambda c: boss.handoffs.list(party="*", limit=2, cursor=c), "handoffs", 2)
    assert _ids(paged) == _ids(whole)
    keys = [(h.created_at, h.handoff_id) for h in paged]
    assert keys == sorted(keys)
    with pytest.raises(ValidationError):
        boss.handoffs.list(party="*", cursor=encode_cursor("leases", (1, "lease_x")))
