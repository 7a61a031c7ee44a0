"""Write scopes (DESIGN.md "Leases"): overlapping globs on other principals' effective leases
conflict; the same principal, disjoint globs and unscoped leases do not."""

from __future__ import annotations

import pytest

from prefect_baton import (
    Baton,
    ConflictError,
    LeaseLostError,
    ValidationError,
    VersionConflictError,
)

from ._util import kinds, pass_deadline

RT = "task"


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (["src/**"], ["src/app/*.py"]),
        (["src/app/*.py"], ["src/**"]),
        (["src/**"], ["**"]),
        (["src/*/main.py"], ["src/app/*"]),
        (["src/app/[a-m]*.py"], ["src/app/b?.py"]),
        (["docs/**", "src/lib/**"], ["src/**/util.py"]),
    ],
)
def test_overlapping_scopes_conflict_across_principals(
    baton: Baton, held: list[str], wanted: list[str]
) -> None:
    """Another principal's acquire with a scope overlapping an effective lease's scope conflicts."""
    lease = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=held)
    b = baton.as_principal("agent-b")
    events = kinds(baton)
    with pytest.raises(ConflictError) as ei:
        b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=wanted)
    err = ei.value
    assert err.expires_at is not None
    assert abs((err.expires_at - lease.expires_at).total_seconds()) <= 0.001
    text = f"{err} {err.to_dict()!r}"
    assert "agent-a" not in text
    for scope in held:
        assert scope not in text
    assert not b.leases.inspect(RT, "t2").held
    assert kinds(baton) == events


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (["src/**"], ["docs/**"]),
        (["src/*.py"], ["src/app/*.py"]),
        (["src/*.py"], ["src/*.md"]),
        (["src/app/[a-m]*.py"], ["src/app/[n-z]*.py"]),
        (["src/app"], ["src/application/**"]),
    ],
)
def test_disjoint_scopes_do_not_conflict(baton: Baton, held: list[str], wanted: list[str]) -> None:
    """Scopes that no single path can match both never conflict."""
    baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=held)
    lease = baton.as_principal("agent-b").leases.acquire(RT, "t2", ttl_seconds=30, scopes=wanted)
    assert lease.owner == "agent-b"


def test_overlapping_scopes_same_principal_allowed(baton: Baton) -> None:
    """The same principal may hold overlapping scopes on different resources."""
    baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["src/**"])
    lease = baton.leases.acquire(RT, "t2", ttl_seconds=30, scopes=["src/app/*.py"])
    assert lease.scopes == ("src/app/*.py",)


def test_unscoped_lease_does_not_conflict_with_scopes(baton: Baton) -> None:
    """A lease without scopes claims no paths: it neither blocks nor is blocked by scoped leases."""
    baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["**"])
    b = baton.as_principal("agent-b")
    assert b.leases.acquire(RT, "t2", ttl_seconds=30).scopes == ()
    assert baton.leases.acquire(RT, "t3", ttl_seconds=30, scopes=["src/**"]).scopes == ("src/**",)


def test_released_scope_is_free(baton: Baton) -> None:
    """Once the scoped lease is released, another principal can claim an overlapping scope."""
    lease = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["src/**"])
    b = baton.as_principal("agent-b")
    with pytest.raises(ConflictError):
        b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=["src/app/*.py"])
    baton.leases.release(lease)
    assert b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=["src/app/*.py"]).owner == "agent-b"


def test_transfer_keeps_scopes_and_checks_receiver(baton: Baton) -> None:
    """A transfer whose kept scopes overlap another principal's lease (the sender's) conflicts."""
    lease = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["src/**"], idempotency_key="r1")
    baton.leases.acquire(RT, "t2", ttl_seconds=30, scopes=["src/app/**"])
    with pytest.raises(ConflictError):
        baton.leases.transfer(lease, to_principal="agent-b", new_execution_key="r2", ttl_seconds=30)
    info = baton.leases.inspect(RT, "t1")
    assert info.lease is not None
    assert info.lease.lease_id == lease.lease_id


def test_a_dotdot_scope_cannot_reach_into_a_held_scope(baton: Baton) -> None:
    """``src/../docs/a`` names a path under ``docs/**``: it is refused, not granted beside
    another principal's ``docs/**`` (overlap is decided on the globs as written); a segment
    that only starts with dots is an ordinary name."""
    baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["docs/**"])
    other = baton.as_principal("bob")
    with pytest.raises(ValidationError, match=r"must not contain a '\.\.' segment"):
        other.leases.acquire(RT, "t2", ttl_seconds=30, scopes=["src/../docs/a"])
    assert not other.leases.inspect(RT, "t2").held
    assert other.leases.acquire(RT, "t3", ttl_seconds=30, scopes=["src/..a/b", "src/..."]).scopes


def test_scopes_are_normalised(baton: Baton) -> None:
    """Scopes come back normalised, de-duplicated and sorted."""
    lease = baton.leases.acquire(
        RT, "t1", ttl_seconds=30, scopes=["./src/**/", "src/**", "docs//*.md"]
    )
    assert lease.scopes == ("docs/*.md", "src/**")


@pytest.mark.parametrize(
    "scopes", ["src/**", [""], ["/"], [3], [None], ["a\nb"], ["src/../docs/a"], [".."], ["a/.."]]
)
def test_bad_scopes_are_validation_errors(baton: Baton, scopes: object) -> None:
    """A bare string, an empty scope, a non-string, a control character or a ``..`` segment
    is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=scopes)  # type: ignore[arg-type]
    assert not baton.leases.inspect(RT, "t1").held
    assert kinds(baton) == []


# No path matches both (one ends in b, the other in c), but finding that out takes 161,203
# steps of the overlap walk, more than one decision may spend (SCOPE_CHECK_STEPS).
COSTLY_HELD = ["a*" * 200 + "b"]
COSTLY_WANTED = ["*a" * 200 + "c"]


def test_scopes_too_costly_to_compare_are_refused_and_nothing_is_written(baton: Baton) -> None:
    """An acquire whose scopes take more than SCOPE_CHECK_STEPS steps to compare with the
    org's held scopes is VALIDATION_ERROR on every store: no lease, no event, and the
    holder's lease and other principals' ordinary scopes are unaffected."""
    held = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=COSTLY_HELD)
    b = baton.as_principal("agent-b")
    events = kinds(baton)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=COSTLY_WANTED)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire_many(
            [{"resource_type": RT, "resource_id": "t3", "scopes": COSTLY_WANTED}],
            ttl_seconds=30,
        )
    assert not b.leases.inspect(RT, "t2").held
    assert not b.leases.inspect(RT, "t3").held
    assert kinds(baton) == events
    # the holder's lease is untouched, and ordinary scopes are compared as before
    assert baton.leases.renew(held).version == held.version + 1
    with pytest.raises(ConflictError):
        b.leases.acquire(RT, "t4", ttl_seconds=30, scopes=["*"])
    assert b.leases.acquire(RT, "t5", ttl_seconds=30, scopes=["docs/**"]).owner == "agent-b"


def test_a_transfer_whose_scopes_are_too_costly_to_compare_is_refused(baton: Baton) -> None:
    """A transfer compares the lease's scopes with the leases of everyone but the receiver;
    past SCOPE_CHECK_STEPS steps it is VALIDATION_ERROR and the lease stays with its holder."""
    lease = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=COSTLY_WANTED)
    baton.leases.acquire(RT, "t2", ttl_seconds=30, scopes=COSTLY_HELD)  # same principal
    with pytest.raises(ValidationError, match="too costly to compare"):
        baton.leases.transfer(
            lease, to_principal="agent-b", new_execution_key="k-b", ttl_seconds=30
        )
    assert baton.leases.inspect(RT, "t1").held
    assert baton.leases.renew(lease).owner == baton.principal


def test_the_longest_allowed_scopes_are_compared(baton: Baton) -> None:
    """Scopes of 1,024 characters are compared like short ones (they overlap here)."""
    lease = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["a" * 1024])
    with pytest.raises(ConflictError) as ei:
        baton.as_principal("agent-b").leases.acquire(
            RT, "t2", ttl_seconds=30, scopes=["a" * 1023 + "*"]
        )
    assert ei.value.expires_at is not None
    assert abs((ei.value.expires_at - lease.expires_at).total_seconds()) <= 0.001


def test_acquire_many_shares_one_step_budget_across_its_resources(baton: Baton) -> None:
    """The steps are counted per request: each resource alone fits SCOPE_CHECK_STEPS, two
    together in one acquire_many do not (VALIDATION_ERROR, neither is held), so a request
    of 1,000 resources cannot spend 1,000 budgets."""
    baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=["a*" * 120 + "b"])
    b = baton.as_principal("agent-b")
    wanted = ["*a" * 120 + "c"]
    events = kinds(baton)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire_many(
            [
                {"resource_type": RT, "resource_id": "t2", "scopes": wanted},
                {"resource_type": RT, "resource_id": "t3", "scopes": wanted},
            ],
            ttl_seconds=30,
        )
    assert not b.leases.inspect(RT, "t2").held
    assert not b.leases.inspect(RT, "t3").held
    assert kinds(baton) == events
    assert b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=wanted).owner == "agent-b"


def _wide_class(first: int) -> list[str]:
    """One scope: a class of 340 ranges of 4,096 code points each (1,022 characters)."""
    return ["[" + "".join(chr(first + k) + "-" + chr(first + k + 4095) for k in range(340)) + "]"]


def test_classes_too_costly_to_compare_are_refused(baton: Baton) -> None:
    """Two classes of 340 ranges cost 115,600 steps to compare (the product of their range
    counts): VALIDATION_ERROR on every store, nothing written, the holder unaffected."""
    held = baton.leases.acquire(RT, "t1", ttl_seconds=30, scopes=_wide_class(0x10000))
    b = baton.as_principal("agent-b")
    events = kinds(baton)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire(RT, "t2", ttl_seconds=30, scopes=_wide_class(0x30000))
    assert not b.leases.inspect(RT, "t2").held
    assert kinds(baton) == events
    assert baton.leases.renew(held).version == held.version + 1


# A literal segment of 400 characters: comparing two scopes that both start with it walks
# it (about 400 steps) before their next segments tell them apart.
LONG = "p" * 400


def _under(tail: str, n: int) -> list[str]:
    return [f"{LONG}/{tail}{k}/**" for k in range(n)]


def test_leases_whose_prefixes_cannot_meet_spend_no_steps(baton: Baton) -> None:
    """A lease whose scopes' literal prefixes cannot nest with the request's is never
    compared (prefect_baton._rules.scopes.prefixes_meet): eight such leases of eight scopes
    each would take about 200,000 steps against eight requested scopes, and every arm grants
    the request; with a lease that overlaps among them every arm answers CONFLICT, whatever
    order it meets them in."""
    for i in range(8):
        baton.leases.acquire(RT, f"far-{i}", ttl_seconds=30, scopes=_under(f"x{i}-", 8))
    b = baton.as_principal("agent-b")
    wanted = _under("y", 8)
    mine = b.leases.acquire(RT, "mine", ttl_seconds=30, scopes=wanted)
    b.leases.release(mine)
    near = baton.leases.acquire(RT, "near", ttl_seconds=30, scopes=[f"{LONG}/y3/deep/*.py"])
    with pytest.raises(ConflictError) as ei:
        b.leases.acquire(RT, "mine", ttl_seconds=30, scopes=wanted)
    assert ei.value.expires_at is not None
    assert abs((ei.value.expires_at - near.expires_at).total_seconds()) <= 0.001


# Two patterns that take between half and all of SCOPE_CHECK_STEPS to compare (see
# test_acquire_many_shares_one_step_budget_across_its_resources).
HALF_HELD = ["a*" * 120 + "b"]
HALF_WANTED = ["*a" * 120 + "c"]


def test_a_request_refused_before_its_scope_check_spends_no_steps(baton: Baton) -> None:
    """The scope check comes after the holder, version and proof checks on every arm: an
    acquire of a held resource is CONFLICT, one with a wrong expected version
    VERSION_CONFLICT, a transfer of a released lease LEASE_LOST, even when comparing their
    scopes would be too costly (VALIDATION_ERROR)."""
    baton.leases.acquire(RT, "held", ttl_seconds=30)
    baton.leases.acquire(RT, "costly", ttl_seconds=30, scopes=COSTLY_HELD)
    b = baton.as_principal("agent-b")
    with pytest.raises(ConflictError):
        b.leases.acquire(RT, "held", ttl_seconds=30, scopes=COSTLY_WANTED)
    with pytest.raises(VersionConflictError):
        b.leases.acquire(RT, "free", ttl_seconds=30, scopes=COSTLY_WANTED, expected_version=3)
    gone = baton.leases.acquire(RT, "gone", ttl_seconds=30, scopes=COSTLY_WANTED)
    baton.leases.release(gone)
    with pytest.raises(LeaseLostError):
        baton.leases.transfer(gone, to_principal="agent-b", new_execution_key="k-b", ttl_seconds=30)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire(RT, "free", ttl_seconds=30, scopes=COSTLY_WANTED)


def test_an_acquire_that_ends_an_expired_handoff_checks_its_scopes_once(baton: Baton) -> None:
    """An acquire of a lease carried by a handoff past its deadline ends the handoff and
    decides again; its scopes are compared once, so scopes that fit SCOPE_CHECK_STEPS once
    (but not twice) are granted on every arm."""
    carried = baton.leases.acquire(RT, "carried", ttl_seconds=300, idempotency_key="w-1")
    sent = baton.handoffs.create("agent-b", "subject", lease=carried, expires_in_seconds=1)
    baton.leases.acquire(RT, "other", ttl_seconds=300, scopes=HALF_HELD)
    pass_deadline(baton, sent)
    c = baton.as_principal("agent-c")
    lease = c.leases.acquire(RT, "carried", ttl_seconds=30, scopes=HALF_WANTED)
    assert lease.owner == "agent-c"
    assert lease.epoch > carried.epoch


def test_an_acquire_deciding_again_does_not_spend_its_steps_twice(baton: Baton) -> None:
    """An acquire that finds a scope conflict on a resource carried by a handoff past its
    deadline ends the handoff and decides again: the conflict found after about 58,000
    steps stands (CONFLICT on every arm), it is not looked for a second time past
    SCOPE_CHECK_STEPS (VALIDATION_ERROR)."""
    c = baton.as_principal("agent-c")
    carried = c.leases.acquire(RT, "carried", ttl_seconds=300)
    sent = c.handoffs.create("agent-b", "subject", lease=carried, expires_in_seconds=1)
    baton.leases.acquire(RT, "costly", ttl_seconds=300, scopes=HALF_HELD)
    near = baton.leases.acquire(RT, "near", ttl_seconds=300, scopes=["*c"])
    pass_deadline(baton, sent)
    with pytest.raises(ConflictError) as ei:
        c.leases.acquire(RT, "carried", ttl_seconds=30, scopes=HALF_WANTED)
    assert ei.value.expires_at is not None
    assert abs((ei.value.expires_at - near.expires_at).total_seconds()) <= 0.001


@pytest.mark.parametrize("later_first", [True, False], ids=["later-first", "later-last"])
def test_a_scope_conflict_reports_the_latest_overlapping_expiry(
    baton: Baton, later_first: bool
) -> None:
    """With two leases of another principal overlapping the requested scopes, CONFLICT
    says until when the later one runs (the request can only succeed once both ended), on
    every arm and whichever was acquired first (the stores meet them in different orders)."""
    made = [("t1", 30, ["src/**"]), ("t2", 90, ["src/app/*.py"])]
    leases = [
        baton.leases.acquire(RT, rid, ttl_seconds=ttl, scopes=scopes)
        for rid, ttl, scopes in (made[::-1] if later_first else made)
    ]
    latest = max(lease.expires_at for lease in leases)
    with pytest.raises(ConflictError) as ei:
        baton.as_principal("agent-b").leases.acquire(
            RT, "t3", ttl_seconds=30, scopes=["src/app/main.py"]
        )
    assert ei.value.expires_at is not None
    assert abs((ei.value.expires_at - latest).total_seconds()) <= 0.001


@pytest.mark.parametrize("cheap_first", [True, False], ids=["conflict-first", "costly-first"])
def test_a_found_conflict_does_not_cut_a_costly_comparison_short(
    baton: Baton, cheap_first: bool
) -> None:
    """Every candidate lease is compared, even after one overlapped: a request that
    overlaps one lease cheaply but would take more than SCOPE_CHECK_STEPS against another is
    VALIDATION_ERROR on every arm, whichever lease was acquired first (before, the verdict
    depended on the order the store met them in: CONFLICT or VALIDATION_ERROR)."""
    made = [("t1", ["**"]), ("t2", COSTLY_HELD)]
    for rid, scopes in made if cheap_first else made[::-1]:
        baton.leases.acquire(RT, rid, ttl_seconds=30, scopes=scopes)
    b = baton.as_principal("agent-b")
    events = kinds(baton)
    with pytest.raises(ValidationError, match="too costly to compare"):
        b.leases.acquire(RT, "t3", ttl_seconds=30, scopes=COSTLY_WANTED)
    assert not b.leases.inspect(RT, "t3").held
    assert kinds(baton) == events
