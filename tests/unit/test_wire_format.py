"""The wire form of times (the seed service's ``2026-07-30T10:58:13.829Z``, one function:
:func:`prefect_baton.models.wire_time`), what older clients and servers sent still parsing,
and the list cursors of :mod:`prefect_baton._rules.paging`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from prefect_baton._rules.paging import decode_cursor, encode_cursor, page_of, store_limit
from prefect_baton.errors import ConflictError, LeaseLostError, ValidationError, error_for_code
from prefect_baton.models import Event, Lease, from_ms, wire_time

MS = 1_785_409_093_829  # 2026-07-30T10:58:13.829Z


def _lease(**times: object) -> Lease:
    fields: dict[str, object] = {
        "lease_id": "lease_1",
        "resource_type": "deploy",
        "resource_id": "svc",
        "owner": "a",
        "execution_key": None,
        "version": 1,
        "epoch": 1,
        "acquired_at": from_ms(MS),
        "expires_at": from_ms(MS + 600_000),
        "ttl_seconds": 600,
    }
    return Lease.model_validate({**fields, **times})


def test_wire_time_is_milliseconds_z() -> None:
    """UTC, three fraction digits, ``Z``; another offset is converted to UTC."""
    at = from_ms(MS)
    assert at is not None
    assert wire_time(at) == "2026-07-30T10:58:13.829Z"
    assert wire_time(datetime(2026, 7, 30, 12, 0, tzinfo=timezone(timedelta(hours=2)))) == (
        "2026-07-30T10:00:00.000Z"
    )
    assert wire_time(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000Z"


def test_models_write_the_wire_form_and_read_every_form() -> None:
    """A model's JSON has the wire form; JSON with ``Z``, ``+00:00`` or microseconds (as
    older servers wrote it) reads back to the same time."""
    lease = _lease()
    dumped = lease.model_dump(mode="json")
    assert (dumped["acquired_at"], dumped["expires_at"]) == (
        "2026-07-30T10:58:13.829Z",
        "2026-07-30T11:08:13.829Z",
    )
    assert lease.model_dump()["acquired_at"] == from_ms(MS)  # Python mode keeps datetimes
    assert Lease.model_validate(dumped) == lease
    for old in ("2026-07-30T10:58:13.829000+00:00", "2026-07-30T10:58:13.829+00:00"):
        assert _lease(acquired_at=old).acquired_at == from_ms(MS)
    event = Event(
        seq=1,
        event_id="e",
        kind="k",
        principal="a",
        subject="s",
        payload={},
        occurred_at=from_ms(MS),
    )
    assert event.model_dump(mode="json")["occurred_at"] == "2026-07-30T10:58:13.829Z"


def test_conflict_expires_at_round_trips_in_both_forms() -> None:
    """A CONFLICT's ``expires_at`` is written in the wire form and read back from it and
    from the ``+00:00`` form older servers sent."""
    at = datetime(2026, 7, 30, 10, 58, 13, 829000, tzinfo=UTC)
    assert ConflictError("taken", expires_at=at).to_dict()["expires_at"] == (
        "2026-07-30T10:58:13.829Z"
    )
    for text in ("2026-07-30T10:58:13.829Z", "2026-07-30T10:58:13.829000+00:00"):
        err = error_for_code("CONFLICT", "taken", expires_at=text)
        assert isinstance(err, ConflictError)
        assert err.expires_at == at


def test_cursor_round_trip_and_refusals() -> None:
    """A cursor decodes to its key for its own list only; anything else is refused."""
    assert decode_cursor("leases", encode_cursor("leases", (MS, "lease_x"))) == (MS, "lease_x")
    assert decode_cursor("events", encode_cursor("events", (7,))) == (7,)
    for bad in ("", "x", "c1.", "c1.e30", encode_cursor("events", (7,)), "c1." + "A" * 2000):
        with pytest.raises(ValidationError):
            decode_cursor("leases", bad)
    with pytest.raises(ValidationError):
        decode_cursor("events", encode_cursor("events", (-1,)))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", ["\ud800", "lease\x00x", "lease\nx", " ", "x" * 257])
def test_cursor_naming_an_impossible_id_is_refused(bad_id: str) -> None:
    """A forged cursor whose id no lease or handoff can have (a lone surrogate, which no
    database can encode; NUL, which PostgreSQL refuses; other control characters; blank;
    over 256 characters) is refused as VALIDATION_ERROR, not passed on to a query."""
    for name in ("leases", "handoffs"):
        with pytest.raises(ValidationError, match=f"not a cursor of the {name} list"):
            decode_cursor(name, encode_cursor(name, (MS, bad_id)))


def test_a_page_has_a_cursor_only_when_an_item_follows() -> None:
    """``page_of`` reads the store's answer to ``limit + 1``: up to ``limit`` items (an
    exactly full last page included) have no next cursor; one more item makes a page of
    ``limit`` whose cursor names its last item."""
    leases = [_lease(lease_id=f"lease_{i}") for i in range(4)]
    assert page_of("leases", leases[:3], 4).next_cursor is None
    assert page_of("leases", [], 1) == []
    exactly_full = page_of("leases", leases[:3], 3)
    assert exactly_full == leases[:3]
    assert exactly_full.next_cursor is None
    page = page_of("leases", leases, 3)
    assert page == leases[:3]
    assert page.next_cursor is not None
    assert decode_cursor("leases", page.next_cursor) == (MS, "lease_2")


def test_store_limit_serves_one_more_than_the_largest_page() -> None:
    """The store serves ``limit + 1`` at the largest page (to learn whether a page
    follows), never more, never less than 1."""
    assert store_limit("leases", 10_001) == 10_001
    assert store_limit("handoffs", 10_002) == 10_001
    assert store_limit("events", 1_001) == 1_001
    assert store_limit("events", 5_000) == 1_001
    assert store_limit("leases", 0) == 1


def test_lease_lost_status_round_trips() -> None:
    """``LeaseLostError.status`` (how the lease ended) is in the JSON error when known and is
    read back from it; absent, it stays ``None``."""
    err = LeaseLostError("lease l1 is no longer held (transferred)", status="transferred")
    d = err.to_dict()
    assert d == {
        "code": "LEASE_LOST",
        "message": "lease l1 is no longer held (transferred)",
        "status": "transferred",
    }
    back = error_for_code(**d)
    assert isinstance(back, LeaseLostError)
    assert back.status == "transferred"
    bare = error_for_code("LEASE_LOST", "gone")
    assert isinstance(bare, LeaseLostError)
    assert (bare.status, "status" in bare.to_dict()) == (None, False)
