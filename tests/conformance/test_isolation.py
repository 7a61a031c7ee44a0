"""Organization isolation (DESIGN.md "Names": nothing crosses an org, not even a 404-vs-409
difference): another org's ids are NOT_FOUND exactly like unknown ids."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from prefect_baton import Baton, BatonError, NotFoundError, StaleFenceError

from ._util import kinds

RT = "deploy"
RID = "checkout-service"
UNKNOWN_LEASE = "lease_" + "0" * 32


@pytest.fixture
def foreign(baton_in_org: Callable[..., Baton]) -> Callable[..., Baton]:
    """Clients of one other, fresh organization on the same arm."""
    other_org = f"org-{uuid.uuid4().hex[:12]}"
    return lambda principal="agent-a", role="agent": baton_in_org(other_org, principal, role)


def _code_and_shape(call: Callable[[], object], ident: str) -> tuple[str, str]:
    with pytest.raises(BatonError) as ei:
        call()
    return ei.value.code, str(ei.value).replace(ident, "<id>")


def test_same_resource_in_two_orgs_does_not_conflict(
    baton: Baton, foreign: Callable[..., Baton]
) -> None:
    """Two orgs lease the same resource name independently, each from epoch 1."""
    mine = baton.leases.acquire(RT, RID, ttl_seconds=30)
    theirs = foreign().leases.acquire(RT, RID, ttl_seconds=30)
    assert (mine.epoch, theirs.epoch) == (1, 1)
    assert theirs.lease_id != mine.lease_id
    other = foreign("agent-b").leases.inspect(RT, RID)
    assert other.held
    assert other.version == 1


def test_scopes_do_not_cross_orgs(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """Overlapping write scopes in different orgs do not conflict."""
    baton.leases.acquire(RT, "a", ttl_seconds=30, scopes=["src/**"])
    assert foreign("agent-b").leases.acquire(RT, "b", ttl_seconds=30, scopes=["src/app/*.py"])


def test_foreign_lease_id_is_not_found_like_unknown(
    baton: Baton, foreign: Callable[..., Baton]
) -> None:
    """Another org's lease id is NOT_FOUND for release, get and force release, as an unknown id."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    agent = foreign()  # same principal name as the holder, in another org
    admin = foreign("boss", "admin")
    for call in (agent.leases.release_by_id, admin.leases.get, admin.leases.force_release):
        got = _code_and_shape(lambda c=call: c(lease.lease_id), lease.lease_id)
        unknown = _code_and_shape(lambda c=call: c(UNKNOWN_LEASE), UNKNOWN_LEASE)
        assert got == unknown
        assert got[0] == "NOT_FOUND"
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (lease.lease_id, lease.version)


def test_foreign_lease_handle_is_not_found(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """Another org's lease presented to renew, release or transfer is NOT_FOUND."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="run-1")
    twin = foreign()  # same principal name and key, other org
    with pytest.raises(NotFoundError):
        twin.leases.renew(lease)
    with pytest.raises(NotFoundError):
        twin.leases.release(lease)
    with pytest.raises(NotFoundError):
        twin.leases.transfer(lease, to_principal="agent-b", new_execution_key="r2", ttl_seconds=30)
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (lease.lease_id, lease.version)
    assert kinds(twin) == []


def test_foreign_lease_as_fence_is_stale_like_unknown(
    baton: Baton, foreign: Callable[..., Baton]
) -> None:
    """Another org's lease used as a fence is refused exactly like an unknown lease."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    twin = foreign()
    with pytest.raises(StaleFenceError) as ei:
        twin.checkpoints.save("s", "k", {"n": 1}, fence=lease)
    unknown = lease.model_copy(update={"lease_id": UNKNOWN_LEASE})
    with pytest.raises(StaleFenceError) as ei2:
        twin.checkpoints.save("s", "k", {"n": 1}, fence=unknown)
    assert str(ei.value).replace(lease.lease_id, "<id>") == str(ei2.value).replace(
        UNKNOWN_LEASE, "<id>"
    )
    with pytest.raises(StaleFenceError):
        twin.outcomes.record("s", "failed", evidence=[], fence=lease)
    assert twin.checkpoints.get("s", "k") is None


def test_foreign_handoff_is_not_found(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """Another org's handoff is NOT_FOUND (not FORBIDDEN), even for a same-named recipient."""
    h = baton.handoffs.create("agent-b", "subj")
    twin_b = foreign("agent-b")
    assert twin_b.handoffs.inbox() == []
    unknown_id = "hoff_" + "0" * 32
    resolve = twin_b.handoffs.resolve
    for status in ("accepted", "rejected"):
        got = _code_and_shape(lambda s=status: resolve(h.handoff_id, s), h.handoff_id)
        unknown = _code_and_shape(lambda s=status: resolve(unknown_id, s), unknown_id)
        assert got == unknown
        assert got[0] == "NOT_FOUND"
    with pytest.raises(NotFoundError):
        foreign("boss", "admin").handoffs.get(h.handoff_id)
    assert baton.handoffs.get(h.handoff_id).status == "pending"


def test_foreign_checkpoint_is_not_found(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """Another org's checkpoint is invisible: by id NOT_FOUND, by key None, unattachable."""
    ck = baton.checkpoints.save("subj", "progress", {"secret": 1})
    twin = foreign()
    with pytest.raises(NotFoundError):
        twin.checkpoints.get_by_id(ck.checkpoint_id)
    with pytest.raises(NotFoundError):
        foreign("boss", "admin").checkpoints.get_by_id(ck.checkpoint_id)
    assert twin.checkpoints.get("subj", "progress") is None
    assert twin.checkpoints.get("subj", "progress", principal="agent-a") is None
    assert twin.checkpoints.history("subj", "progress") == []
    with pytest.raises(NotFoundError):
        twin.handoffs.create("agent-b", "subj", checkpoint_id=ck.checkpoint_id)
    assert twin.checkpoints.save("subj", "progress", {"mine": 1}).version == 1


def test_foreign_ids_cannot_be_linked_from_outcomes(
    baton: Baton, foreign: Callable[..., Baton]
) -> None:
    """An outcome cannot link another org's lease, handoff or checkpoint (NOT_FOUND)."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    ck = baton.checkpoints.save("subj", "progress", {"n": 1})
    h = baton.handoffs.create("agent-b", "subj")
    twin = foreign()
    for link in (
        {"lease_id": lease.lease_id},
        {"checkpoint_id": ck.checkpoint_id},
        {"handoff_id": h.handoff_id},
    ):
        with pytest.raises(NotFoundError):
            twin.outcomes.record("subj", "failed", evidence=[], **link)
    assert twin.outcomes.list() == []


def test_foreign_lease_cannot_ride_a_handoff(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """A handoff cannot carry another org's lease."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    with pytest.raises(NotFoundError):
        foreign().handoffs.create("agent-b", "subj", lease=lease)


def test_reads_do_not_cross_orgs(baton: Baton, foreign: Callable[..., Baton]) -> None:
    """Events, outcomes, inboxes and lease lists of one org are empty in another."""
    baton.leases.acquire(RT, RID, ttl_seconds=30)
    baton.handoffs.create("agent-b", "subj")
    baton.outcomes.record("subj", "failed", evidence=[])
    assert len(kinds(baton)) == 3
    twin = foreign()
    assert twin.events.list() == []
    assert twin.outcomes.list() == []
    assert twin.outcomes.list("subj") == []
    assert foreign("agent-b").handoffs.inbox() == []
    assert twin.leases.list() == []
    assert foreign("boss", "admin").leases.list(owner="*", include_ended=True) == []
