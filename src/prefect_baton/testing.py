"""Helpers for testing code that uses prefect-baton: an in-memory ledger and a clock you move.

:func:`memory_baton` gives a ready :class:`~prefect_baton.Baton` on a private in-memory
SQLite ledger: the same store, rules and errors as a ``sqlite:///`` ledger (it runs the
project's conformance suite as one of its arms), without a file, a server or ``BATON_*``
settings. Its clock is a :class:`ManualClock`: a lease's TTL, a checkpoint's TTL, a handoff's
expiry and the idempotency receipts' retention run on it, so a test moves time forward with
:meth:`ManualClock.advance` instead of sleeping.

Example (pytest)::

    import pytest
    from prefect_baton import Baton, StaleFenceError
    from prefect_baton.testing import ManualClock, memory_baton

    @pytest.fixture
    def clock() -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def baton(clock: ManualClock):
        with memory_baton(org="test", principal="worker-1", clock=clock) as b:
            yield b

    def test_takeover_after_expiry(baton: Baton, clock: ManualClock) -> None:
        old = baton.leases.acquire("deploy", "svc", ttl_seconds=60)
        clock.advance(61)
        new = baton.as_principal("worker-2").leases.acquire("deploy", "svc", ttl_seconds=60)
        assert new.epoch == old.epoch + 1
        with pytest.raises(StaleFenceError):
            baton.checkpoints.save("svc", "progress", {"step": 3}, fence=old)

Only this process sees the ledger (every thread of it does; threads take turns on its one
connection). A forked child gets its own copy. Lease keepers (``with b.lease(...)``) renew on
their own timer of real seconds, not on the :class:`ManualClock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from prefect_baton._client.sync import Baton
from prefect_baton._settings import BatonSettings
from prefect_baton._stores.ledger.engine import MEMORY_URL
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton.errors import ForbiddenError

__all__ = ["ManualClock", "clock_of", "memory_baton"]


def _to_ms(when: datetime | int, what: str) -> int:
    """``when`` (an aware datetime, or epoch milliseconds) as epoch milliseconds."""
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(UTC))")
        return round(when.timestamp() * 1000)
    if isinstance(when, bool) or not isinstance(when, int):
        raise TypeError(f"{what} must be a datetime or epoch milliseconds (int)")
    if when < 0:
        raise ValueError(f"{what} must not be before 1970 (got {when} ms)")
    return when


class ManualClock:
    """A clock for tests that moves only when told to: epoch milliseconds.

    Pass it as ``clock=`` to :func:`memory_baton`; the ledger then reads "now" from it in
    every operation. Safe to use from several threads. Calling the clock (``clock()``) is
    :meth:`now_ms`.

    Args:
        start: the time it shows first: an aware :class:`~datetime.datetime` or epoch
            milliseconds (``int``); default: the wall clock at creation.
        ticking: ``False`` (default): the clock stands still between calls of
            :meth:`advance` and :meth:`set`. ``True``: it also runs at the speed of real
            time from ``start`` (for code under test that waits in real time), and
            :meth:`advance` and :meth:`set` jump it.

    Raises:
        ValueError: a naive ``start`` datetime, or one before 1970.
        TypeError: ``start`` is neither a datetime nor an ``int``.
    """

    def __init__(self, start: datetime | int | None = None, *, ticking: bool = False) -> None:
        self._lock = threading.Lock()
        self._ms = _to_ms(start, "start") if start is not None else round(time.time() * 1000)
        self._ticking = ticking
        self._since = time.monotonic()

    @property
    def ticking(self) -> bool:
        """Whether the clock also runs with real time (``bool``)."""
        return self._ticking

    def _read(self) -> int:
        if not self._ticking:
            return self._ms
        return self._ms + int((time.monotonic() - self._since) * 1000)

    def now_ms(self) -> int:
        """The time the clock shows, in epoch milliseconds (``int``)."""
        with self._lock:
            return self._read()

    def __call__(self) -> int:
        """The time the clock shows, in epoch milliseconds (``int``): :meth:`now_ms`."""
        return self.now_ms()

    def now(self) -> datetime:
        """The time the clock shows, as an aware UTC :class:`~datetime.datetime`."""
        return datetime.fromtimestamp(self.now_ms() / 1000, UTC)

    def advance(self, seconds: float) -> int:
        """Move the clock forward by ``seconds`` (``float``, rounded to milliseconds).

        Returns:
            The new time in epoch milliseconds (``int``).

        Raises:
            ValueError: ``seconds`` is negative or not finite (use :meth:`set` to go back).
        """
        ms = seconds * 1000
        if not ms >= 0 or ms == float("inf"):
            raise ValueError(f"advance() takes a finite number of seconds >= 0, not {seconds!r}")
        with self._lock:
            self._ms += round(ms)
            return self._read()

    def set(self, when: datetime | int) -> None:
        """Show ``when`` from now on (a ticking clock runs on from there).

        Args:
            when: an aware :class:`~datetime.datetime` or epoch milliseconds (``int``). It
                may be earlier than the current time, to test a clock that steps back; the
                ledger then sees leases granted "later" as lasting longer.

        Raises:
            ValueError: a naive datetime, or a time before 1970.
            TypeError: ``when`` is neither a datetime nor an ``int``.
        """
        ms = _to_ms(when, "when")
        with self._lock:
            self._ms = ms
            self._since = time.monotonic()

    def __repr__(self) -> str:
        kind = "ticking" if self._ticking else "stopped"
        return f"ManualClock({self.now().isoformat()}, {kind})"


def memory_baton(
    org: str = "test",
    principal: str = "agent",
    role: str = "agent",
    *,
    clock: ManualClock | Callable[[], int] | None = None,
) -> Baton:
    """A ready :class:`~prefect_baton.Baton` on a new, private in-memory ledger.

    The ledger is the SQL ledger store (the same rules, results and errors as on
    ``sqlite:///``) on an in-memory SQLite database, migrated on creation. No ``BATON_*``
    environment variable is read. Two calls give two ledgers that do not see each other.
    Other identities of the same ledger: ``b.as_principal("worker-2", role="owner")``; an
    async client: ``AsyncBaton(sync=b)``. ``b.close()`` (or leaving ``with memory_baton()
    as b:``) frees the ledger for every client made from ``b``; an operation after that
    raises :class:`~prefect_baton.errors.UnavailableError`.

    Args:
        org: organization id (default ``"test"``).
        principal: acting identity (default ``"agent"``).
        role: ``"agent"`` (default), ``"owner"`` or ``"admin"``.
        clock: where the ledger reads "now": a :class:`ManualClock`, or any callable
            returning epoch milliseconds (``int``). Default: a new stopped
            :class:`ManualClock` at the current wall-clock time (get it with
            :func:`clock_of`).

    Raises:
        ValidationError: a bad ``org``, ``principal`` or ``role``.
    """
    store = LedgerStore.in_memory(clock=clock if clock is not None else ManualClock())
    try:
        settings = BatonSettings.model_construct(
            ledger_url=MEMORY_URL, org=org, principal=principal, role=role
        )
        return Baton(org=org, principal=principal, role=role, settings=settings, store=store)
    except BaseException:
        store.close()
        raise


def clock_of(baton: Baton) -> ManualClock:
    """The :class:`ManualClock` the ledger of ``baton`` reads (e.g. of a
    :func:`memory_baton` made without ``clock=``).

    Raises:
        ValueError: ``baton``'s ledger does not run on a :class:`ManualClock` (a file or
            server ledger, a REST client, a ``memory_baton`` given another callable).
    """
    try:
        store = baton.store
    except ForbiddenError:
        store = None
    clock = getattr(store, "clock", None)
    if not isinstance(clock, ManualClock):
        raise ValueError("this client's ledger does not run on a ManualClock")
    return clock
