"""Helpers shared by the conformance tests (public surface only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from prefect_baton import Baton, Handoff, Lease, Page
from prefect_baton.testing import ManualClock, clock_of


def kinds(b: Baton, after_seq: int = 0) -> list[str]:
    """The kinds of the org's events after ``after_seq``, in order."""
    return [e.kind for e in b.events.list(after_seq=after_seq, limit=1000)]


def last_seq(b: Baton) -> int:
    """The sequence number of the org's newest event (0 when there is none)."""
    seq = 0
    while True:
        page = b.events.list(after_seq=seq, limit=1000)
        if not page:
            return seq
        seq = page[-1].seq


def assert_nothing_written(b: Baton, *resources: tuple[str, str]) -> None:
    """No event in the org, and none of ``resources`` is held."""
    assert b.events.list(limit=1000) == []
    for rtype, rid in resources:
        info = b.leases.inspect(rtype, rid)
        assert not info.held
        assert info.version == 0


def wait_until_expired(b: Baton, lease: Lease, *, grace: float = 15.0) -> None:
    """Sleep until ``lease`` has run out, then until the authority also says it is not held.
    On a ledger that runs on a :class:`ManualClock` (the memory arm), move the clock past the
    expiry instead of sleeping."""
    try:
        clock: ManualClock | None = clock_of(b)
    except ValueError:
        clock = None
    if clock is not None:
        remaining_ms = round(lease.expires_at.timestamp() * 1000) - clock.now_ms()
        if remaining_ms >= 0:
            clock.advance((remaining_ms + 1) / 1000)
    else:
        remaining = (lease.expires_at - datetime.now(UTC)).total_seconds()
        if remaining > 0:
            time.sleep(remaining + 0.2)
    deadline = time.monotonic() + grace
    while b.leases.inspect(lease.resource_type, lease.resource_id).held:
        assert time.monotonic() < deadline, "the lease never expired on the authority's clock"
        time.sleep(0.1)


def assert_refusal_recorded(b: Baton, before: list[str], lease: Lease, write: str) -> None:
    """The only event since ``before`` (the kinds read before a refused fenced write) is
    the ``fence.rejected`` of ``lease`` and ``write``: the write itself left nothing."""
    assert kinds(b) == [*before, "fence.rejected"]
    (event,) = b.events.list(kind="fence.rejected", after_seq=last_seq(b) - 1)
    assert event.subject == f"{lease.resource_type}/{lease.resource_id}"
    assert event.principal == b.principal
    assert event.payload == {
        "lease_id": lease.lease_id,
        "epoch": lease.epoch,
        "resource_type": lease.resource_type,
        "resource_id": lease.resource_id,
        "write": write,
    }


def pages(fetch: Callable[[str | None], Page[Any]], name: Any, limit: int) -> list[Any]:
    """Every item of a list read ``limit`` at a time, following the cursors: every page but
    the last is full, and the last (``next_cursor`` ``None``) is not empty unless it is the
    only one."""
    out: list[Any] = []
    cursor = None
    for _ in range(50):
        page = fetch(cursor)
        assert len(page) <= limit
        out += page
        cursor = page.next_cursor
        if cursor is None:
            assert page or not out, f"an empty last page of the {name} list"
            return out
        assert len(page) == limit
    raise AssertionError("paging did not end")


def pass_deadline(b: Baton, *handoffs: Handoff) -> None:
    """Move past the latest expiry of ``handoffs``: the memory arm's clock is moved, the
    others wait in real time (the shortest handoff expiry is 1 s)."""
    at = max(h.expires_at for h in handoffs if h.expires_at is not None)
    try:
        clock = clock_of(b)
    except ValueError:
        time.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.05)
        return
    clock.advance(max(0.0, at.timestamp() - clock.now_ms() / 1000) + 0.01)
