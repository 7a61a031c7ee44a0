"""Bad input gets a coded VALIDATION_ERROR and writes nothing (issue #2 "Done when"), and
every error is a BatonError carrying a documented code (DESIGN.md "Surfaces")."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

import prefect_baton
from prefect_baton import (
    Baton,
    BatonError,
    ConflictError,
    ForbiddenError,
    IdempotencyInFlightError,
    IdempotencyMismatchError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
    ValidationError,
    VersionConflictError,
)

from ._util import assert_nothing_written, kinds

RT = "deploy"
RID = "svc"

BAD_TTLS = [9, 0, -1, -30, 86_401, 10**20, 10.5, 9.99, 60.0, True, False, "30", None, float("nan")]
BAD_IDS = ["", " ", "   \t ", "x" * 10_000, "a\x00b", "line\nbreak", "bell\x07", "del\x7f", 7, None]
BAD_ID_NAMES = [
    "empty",
    "space",
    "blank",
    "10k",
    "nul",
    "newline",
    "bell",
    "del",
    "int",
    "none",
]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=[repr(t) for t in BAD_TTLS])
def test_bad_ttl_on_acquire(baton: Baton, ttl: object) -> None:
    """An acquire TTL outside the integers 10..86,400 is VALIDATION_ERROR and writes nothing."""
    with pytest.raises(ValidationError) as ei:
        baton.leases.acquire(RT, RID, ttl_seconds=ttl)  # type: ignore[arg-type]
    assert ei.value.code == "VALIDATION_ERROR"
    assert_nothing_written(baton, (RT, RID))


@pytest.mark.parametrize("ttl", [10, 86_400])
def test_ttl_bounds_are_inclusive(baton: Baton, ttl: int) -> None:
    """TTLs of exactly 10 and 86,400 seconds are accepted."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=ttl)
    assert lease.ttl_seconds == ttl
    assert abs((lease.expires_at - lease.acquired_at).total_seconds() - ttl) <= 0.001


@pytest.mark.parametrize("ttl", [9, 86_401, 10.5, 60.0, True])
def test_bad_ttl_on_renew_and_transfer(baton: Baton, ttl: object) -> None:
    """A bad TTL on renew or transfer is VALIDATION_ERROR and leaves the lease as it was."""
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30, idempotency_key="r1")
    events = kinds(baton)
    with pytest.raises(ValidationError):
        baton.leases.renew(lease, ttl_seconds=ttl)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        baton.leases.transfer(
            lease,
            to_principal="agent-b",
            new_execution_key="r2",
            ttl_seconds=ttl,  # type: ignore[arg-type]
        )
    assert kinds(baton) == events
    info = baton.leases.inspect(RT, RID)
    assert info.lease is not None
    assert (info.lease.lease_id, info.version) == (lease.lease_id, lease.version)


@pytest.mark.parametrize("seconds", [60.0, True])
def test_every_duration_in_seconds_refuses_a_float_or_bool(baton: Baton, seconds: object) -> None:
    """A float (even a whole one, ``60.0``) or ``bool`` is not a number of seconds for any
    duration: a batch acquire's TTL, a handoff's ``expires_in_seconds``, a checkpoint's
    ``ttl_seconds`` and an accept's ``ttl_seconds`` are VALIDATION_ERROR and write nothing."""
    h = baton.handoffs.create("agent-b", "subj")
    events = kinds(baton)
    calls = [
        lambda: baton.leases.acquire_many(
            [{"resource_type": RT, "resource_id": RID}], ttl_seconds=seconds
        ),
        lambda: baton.handoffs.create("agent-b", "subj", expires_in_seconds=seconds),
        lambda: baton.checkpoints.save("subj", "draft", {"n": 1}, ttl_seconds=seconds),
        lambda: baton.as_principal("agent-b").handoffs.resolve(
            h.handoff_id, "accepted", ttl_seconds=seconds
        ),
    ]
    for call in calls:
        with pytest.raises(ValidationError) as ei:
            call()
        assert ei.value.code == "VALIDATION_ERROR"
    assert kinds(baton) == events
    assert baton.handoffs.get(h.handoff_id).status == "pending"


ACQUIRE_ID_CASES = [
    pytest.param(field, bad, id=f"{field}-{name}")
    for field in ("resource_type", "resource_id", "idempotency_key")
    for bad, name in zip(BAD_IDS, BAD_ID_NAMES, strict=True)
    if not (field == "idempotency_key" and bad is None)  # no key is valid
]


@pytest.mark.parametrize(("field", "bad"), ACQUIRE_ID_CASES)
def test_bad_ids_on_acquire(baton: Baton, field: str, bad: object) -> None:
    """An empty, blank, 10,000-character, control-character or non-string id is VALIDATION_ERROR."""
    args: dict[str, Any] = {"resource_type": RT, "resource_id": RID, "idempotency_key": "k"}
    args[field] = bad
    with pytest.raises(ValidationError):
        baton.leases.acquire(ttl_seconds=30, **args)
    assert_nothing_written(baton, (RT, RID))


def _writes(b: Baton, bad: Any) -> list[tuple[str, Callable[[], object]]]:
    ev = [{"kind": "file", "uri": "u"}]
    return [
        ("checkpoint subject", lambda: b.checkpoints.save(bad, "k", {"n": 1})),
        ("checkpoint kind", lambda: b.checkpoints.save("s", bad, {"n": 1})),
        ("checkpoint key", lambda: b.checkpoints.save("s", "k", {"n": 1}, idempotency_key=bad)),
        ("handoff to", lambda: b.handoffs.create(bad, "s")),
        ("handoff subject", lambda: b.handoffs.create("agent-b", bad)),
        ("handoff context", lambda: b.handoffs.create("agent-b", "s", context_id=bad)),
        ("outcome subject", lambda: b.outcomes.record(bad, "succeeded", evidence=ev)),
        ("outcome key", lambda: b.outcomes.record("s", "failed", evidence=[], idempotency_key=bad)),
        (
            "transfer to",
            lambda: b.leases.transfer(
                _lease(b), to_principal=bad, new_execution_key="n", ttl_seconds=30
            ),
        ),
    ]


def _lease(b: Baton) -> Any:
    info = b.leases.inspect("held", "one")
    if info.lease is not None:
        return info.lease
    return b.leases.acquire("held", "one", ttl_seconds=30, idempotency_key="held-1")


@pytest.mark.parametrize(
    "bad", ["", "  ", "x" * 10_000, "ctl\x01"], ids=["empty", "blank", "10k", "ctl"]
)
def test_bad_ids_on_other_writes(baton: Baton, bad: str) -> None:
    """Bad ids on checkpoint, handoff, outcome and transfer writes: VALIDATION_ERROR, no write."""
    lease = _lease(baton)
    events = kinds(baton)
    for name, call in _writes(baton, bad):
        with pytest.raises(ValidationError):
            call()
        assert kinds(baton) == events, name
    assert baton.checkpoints.get("s", "k") is None
    assert baton.outcomes.list() == []
    assert baton.as_principal("agent-b").handoffs.inbox() == []
    assert baton.leases.inspect("held", "one").version == lease.version


@pytest.mark.parametrize("bad", ["", "x" * 10_000, "a\nb"], ids=["empty", "10k", "newline"])
def test_bad_ids_on_reads(baton: Baton, bad: str) -> None:
    """Bad ids on reads and by-id operations are VALIDATION_ERROR."""
    calls: list[Callable[[], object]] = [
        lambda: baton.leases.inspect(bad, RID),
        lambda: baton.leases.release_by_id(bad),
        lambda: baton.leases.get(bad),
        lambda: baton.checkpoints.get(bad, "k"),
        lambda: baton.checkpoints.get_by_id(bad),
        lambda: baton.handoffs.resolve(bad, "accepted"),
        lambda: baton.outcomes.list(bad),
    ]
    for call in calls:
        with pytest.raises(ValidationError):
            call()


@pytest.mark.parametrize("version", [-1, True, "1", 1.0, 2**53])
def test_bad_expected_version(baton: Baton, version: object) -> None:
    """An expected_version that is not an integer from 0 to 2**53 - 1 is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.leases.acquire(RT, RID, ttl_seconds=30, expected_version=version)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        baton.checkpoints.save("s", "k", {"n": 1}, expected_version=version)  # type: ignore[arg-type]
    assert_nothing_written(baton, (RT, RID))


@pytest.mark.parametrize("purpose", [42, b"bytes", ["a"]])
def test_bad_purpose(baton: Baton, purpose: object) -> None:
    """A purpose that is not text is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.leases.acquire(RT, RID, ttl_seconds=30, purpose=purpose)  # type: ignore[arg-type]
    assert_nothing_written(baton, (RT, RID))


@pytest.mark.parametrize(
    ("principal", "role"),
    [("", "agent"), ("x" * 10_000, "agent"), ("a\x00", "agent"), ("ok", "root"), ("ok", "")],
)
def test_bad_identity(baton: Baton, principal: str, role: str) -> None:
    """A client with a bad principal name or an unknown role is refused with VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        baton.as_principal(principal, role=role)


def test_lease_argument_must_be_a_lease(baton: Baton) -> None:
    """Passing something that is not a lease to renew/release/transfer is VALIDATION_ERROR."""
    for call in (
        lambda: baton.leases.renew("lease_x"),  # type: ignore[arg-type]
        lambda: baton.leases.release({"lease_id": "x"}),  # type: ignore[arg-type]
        lambda: baton.leases.transfer(
            None,  # type: ignore[arg-type]
            to_principal="b",
            new_execution_key="k",
            ttl_seconds=30,
        ),
    ):
        with pytest.raises(ValidationError):
            call()


# ------------------------------------------------------------------------------- error classes

CODES = {
    ValidationError: "VALIDATION_ERROR",
    ConflictError: "CONFLICT",
    VersionConflictError: "VERSION_CONFLICT",
    NotFoundError: "NOT_FOUND",
    ForbiddenError: "FORBIDDEN",
    IdempotencyMismatchError: "IDEMPOTENCY_MISMATCH",
    IdempotencyInFlightError: "IDEMPOTENCY_IN_FLIGHT",
    LeaseLostError: "LEASE_LOST",
    StaleFenceError: "STALE_FENCE",
    UnavailableError: "UNAVAILABLE",
}


def test_every_error_is_a_baton_error_with_its_code() -> None:
    """Every error class derives from BatonError and carries its documented code."""
    assert set(CODES.values()) == set(prefect_baton.errors.ERROR_CODES)
    for cls, code in CODES.items():
        assert issubclass(cls, BatonError)
        assert cls.code == code
        assert getattr(prefect_baton, cls.__name__) is cls


def test_errors_carry_fields_and_survive_pickling() -> None:
    """Errors keep code, message and fields through pickling (process boundaries)."""
    vc = VersionConflictError("stale", current_version=5, expected_version=3)
    exp = datetime(2030, 1, 1, tzinfo=UTC)
    cf = ConflictError("taken", expires_at=exp)
    for err in (vc, cf, LeaseLostError("gone")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert (back.code, back.message, str(back)) == (err.code, err.message, str(err))
    assert pickle.loads(pickle.dumps(vc)).to_dict() == {
        "code": "VERSION_CONFLICT",
        "message": "stale",
        "current_version": 5,
        "expected_version": 3,
    }
    assert pickle.loads(pickle.dumps(cf)).expires_at == exp


def test_raised_errors_have_codes(baton: Baton) -> None:
    """Errors raised by real operations are BatonErrors whose code matches their class."""
    raised: list[BatonError] = []
    lease = baton.leases.acquire(RT, RID, ttl_seconds=30)
    for call in (
        lambda: baton.as_principal("b").leases.acquire(RT, RID, ttl_seconds=30),
        lambda: baton.leases.renew(lease, expected_version=9),
        lambda: baton.leases.release_by_id("lease_nope"),
        lambda: baton.leases.force_release(lease.lease_id),
        lambda: baton.leases.acquire(RT, RID, ttl_seconds=1),
    ):
        with pytest.raises(BatonError) as ei:
            call()
        raised.append(ei.value)
    assert [e.code for e in raised] == [
        "CONFLICT",
        "VERSION_CONFLICT",
        "NOT_FOUND",
        "FORBIDDEN",
        "VALIDATION_ERROR",
    ]
    for err in raised:
        assert CODES[type(err)] == err.code


def test_longest_ids_work_end_to_end(baton: Baton) -> None:
    """Ids of the documented maximum (256 characters) and long texts work through every write."""
    n = 256
    a = baton.as_principal("a" * n)
    rt, rid = "t" * n, "i" * n
    lease = a.leases.acquire(
        rt, rid, ttl_seconds=30, idempotency_key="k" * n, purpose="p" * 4096, scopes=["s" * 1000]
    )
    lease = a.leases.renew(lease)
    moved = a.leases.transfer(
        lease, to_principal="b" * n, new_execution_key="x" * n, ttl_seconds=30
    )
    b = baton.as_principal("b" * n)
    ck = b.checkpoints.save("s" * n, "k" * n, {"n": 1}, idempotency_key="q" * n, fence=moved)
    h = b.handoffs.create(
        "c" * n,
        "s" * n,
        checkpoint_id=ck.checkpoint_id,
        context_id="c" * n,
        message="m" * 4096,
        lease=moved,
        idempotency_key="h" * n,
    )
    c = baton.as_principal("c" * n)
    done = c.handoffs.resolve(h.handoff_id, "accepted", note="n" * 4096, execution_key="e" * n)
    assert done.lease is not None
    item = {"kind": "k" * 256, "uri": "u" * 4096, "digest": "d" * 512, "note": "n" * 4096}
    out = c.outcomes.record("s" * n, "succeeded", evidence=[item], fence=done.lease)
    assert out.evidence[0].uri == "u" * 4096
    receipt = baton.as_principal("boss", role="admin").leases.force_release(done.lease.lease_id)
    assert receipt.lease.resource_id == rid
    assert len(kinds(baton)) == 9


@pytest.mark.parametrize("bad", ["\ud800", "a\udcffb"])
def test_lone_surrogates_are_validation_errors(baton: Baton, bad: str) -> None:
    """Text that is not valid UTF-8 (lone surrogates) is VALIDATION_ERROR everywhere and
    writes nothing."""
    calls = [
        lambda: baton.leases.acquire("t", bad, ttl_seconds=10),
        lambda: baton.leases.acquire("t", "x", ttl_seconds=10, purpose=bad),
        lambda: baton.leases.acquire("t", "x", ttl_seconds=10, idempotency_key=bad),
        lambda: baton.checkpoints.save("s", "k", {"a": bad}),
        lambda: baton.checkpoints.save("s", "k", {bad: 1}),
        lambda: baton.handoffs.create("agent-b", "s", message=bad),
    ]
    for call in calls:
        with pytest.raises(ValidationError):
            call()
    assert baton.events.list() == []


def test_nul_in_free_text_is_a_validation_error(baton: Baton) -> None:
    """A NUL character in purpose, message or note is VALIDATION_ERROR on every backend."""
    with pytest.raises(ValidationError):
        baton.leases.acquire("t", "x", ttl_seconds=10, purpose="a\x00b")
    with pytest.raises(ValidationError):
        baton.handoffs.create("agent-b", "s", message="hi\x00")
    assert baton.events.list() == []


@pytest.mark.parametrize("field", ["kind", "uri", "digest", "note"])
def test_nul_in_evidence_is_a_validation_error(baton: Baton, field: str) -> None:
    """A NUL character in an evidence item's kind, uri, digest or note is VALIDATION_ERROR
    and records nothing, as in every other text field."""
    item = {"kind": "file", "uri": "file:///a", "digest": "sha256:00", "note": "n"}
    item[field] = "a\x00b"
    with pytest.raises(ValidationError):
        baton.outcomes.record("s", "succeeded", evidence=[item])
    assert baton.outcomes.list("s") == []
    assert baton.events.list() == []


@pytest.mark.parametrize("kind", ["a\x01b", "log\n", "a\x7f", "a\x85b", "a\u200bb", " file"])
def test_an_evidence_kind_is_an_id(baton: Baton, kind: str) -> None:
    """An evidence item's kind follows the id rule of a checkpoint's kind (no control or
    format characters, no white space at either end) on every backend: VALIDATION_ERROR
    naming it, nothing recorded."""
    with pytest.raises(ValidationError) as refused:
        baton.outcomes.record("s", "failed", evidence=[{"kind": kind, "uri": "file:///a"}])
    assert "kind" in refused.value.message, refused.value.message
    assert baton.outcomes.list("s") == []
    assert baton.events.list() == []


def test_event_cursor_past_the_range_is_a_validation_error(baton: Baton) -> None:
    """after_seq beyond 2**63 - 1 is VALIDATION_ERROR; 2**63 - 1 itself reads nothing."""
    with pytest.raises(ValidationError):
        baton.events.list(after_seq=2**63)
    assert baton.events.list(after_seq=2**63 - 1) == []
