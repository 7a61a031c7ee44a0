"""``with b.lease(...)``: acquire, keep renewing off the caller's thread, release on exit.

The heartbeat runs on the process's keeper threads (:mod:`prefect_baton._client.timers`: one
timer thread, and worker threads that run the renewals) for sync and async bodies alike, so
a busy event loop cannot starve it. It renews every third of the TTL (by default), for as
long as the block runs or up to ``max_hold_seconds``; a transient error (``UNAVAILABLE``, a
dropped connection) is retried with backoff until the **renew deadline**: by default two
thirds of the TTL after the last confirmed renewal was *sent*
(:mod:`prefect_baton._rules.keeping`). A renewal answered ``LEASE_LOST``, or a renew deadline
that passes without a confirmed renewal, marks the lease lost: :attr:`LeaseKeeper.lost`
turns true, the ``on_lost`` callback runs (and with it ``cancel_on_loss``), and leaving the
block raises :class:`LeaseLostError`. The deadline is timed apart from the renewals and
checked on a worker of its own, so it fires even while a renewal is blocked in a network
call, a third of the TTL before anyone else can be granted the resource.

The timer holds the keeper by a weak reference: a keeper dropped without being stopped stops
renewing. A keeper (or :class:`Lease`) inherited by a ``fork()``-ed child neither renews nor
releases there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

import anyio.to_thread

from prefect_baton._client.timers import every, forget
from prefect_baton._rules.keeping import KeepTimes, keep_times
from prefect_baton.errors import (
    BatonError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
)
from prefect_baton.metrics._state import enabled as metrics_enabled
from prefect_baton.metrics._state import record as record_metric
from prefect_baton.models import Handoff, Lease, LeaseStatus

if TYPE_CHECKING:
    from prefect_baton._client.leases import LeaseAPI

log = logging.getLogger("prefect_baton.lease")

T = TypeVar("T")

_LOST_ERRORS: tuple[type[BatonError], ...] = (LeaseLostError, NotFoundError, StaleFenceError)


def _retry_unavailable(call: Callable[[], T], *, within_seconds: float = 10.0) -> T:
    """``call()``, retried with backoff (0.1 s doubling to 1 s) while it raises
    :class:`UnavailableError`, for up to ``within_seconds``; then the error is raised."""
    delay = 0.1
    deadline = time.monotonic() + within_seconds
    while True:
        try:
            return call()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class EnterOnce:
    """The single use of a lease block (``with b.lease(...)``, ``with lease(...)``): the
    first entry passes, any later one (nested in the block, or after it ended) is refused,
    so an inner block can never release the lease an outer one still works under.

    Args:
        maker: the call that makes the block, as the message names it (``str``, e.g.
            ``"lease"``).
    """

    def __init__(self, maker: str) -> None:
        self._maker = maker
        self._entered = False
        self._lock = threading.Lock()

    def enter(self) -> None:
        """Mark the block entered.

        Raises:
            RuntimeError: it was entered before (``a <maker>(...) block can be entered
                once; call <maker>() again``).
        """
        with self._lock:
            if self._entered:
                raise RuntimeError(
                    f"a {self._maker}(...) block can be entered once; call {self._maker}() again"
                )
            self._entered = True


class _LeaseView(Generic[T]):
    """A read-only attribute of :class:`LeaseKeeper` that is the attribute of the same name
    of its current lease (:attr:`LeaseKeeper.lease`), so the keeper reads as its lease.

    Reading it before the block is entered raises :class:`RuntimeError` (as
    :attr:`LeaseKeeper.lease`).
    """

    def __init__(self) -> None:
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, keeper: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, keeper: LeaseKeeper, owner: type | None = None) -> T: ...

    def __get__(self, keeper: LeaseKeeper | None, owner: type | None = None) -> T | Self:
        if keeper is None:
            return self
        value: T = getattr(keeper.lease, self._name)
        return value


class LeaseKeeper:
    """A lease held for the duration of a ``with`` / ``async with`` block.

    Create it with :meth:`prefect_baton.Baton.lease`. Inside the block it behaves like the
    current :class:`Lease` and can be passed as ``fence=`` to checkpoint and outcome writes:
    every field of :class:`Lease` (``lease_id``, ``resource_type``, ``resource_id``,
    ``owner``, ``execution_key``, ``version``, ``epoch`` (the fencing token),
    ``acquired_at``, ``expires_at``, ...) reads as that of the current lease (:attr:`lease`).
    It is single use: a second entry (nested, or after the block ended) raises
    :class:`RuntimeError` (see :meth:`start`).

    Args:
        api: the lease operations (``b.leases``) it acquires, renews and releases with.
        acquire: the keyword arguments of :meth:`LeaseAPI.acquire
            <prefect_baton._client.leases.LeaseAPI.acquire>` (``resource_type``,
            ``resource_id``, ``ttl_seconds``, ...), as :meth:`prefect_baton.Baton.lease`
            makes them.
        renew_every_seconds: seconds between renewals (``None``: a third of the TTL).
        renew_deadline_seconds: the renew deadline, seconds after the last confirmed grant or
            renewal was sent (``None``: two thirds of the TTL; must be below the TTL).
        max_hold_seconds: stop renewing this many seconds after the grant (``None``: no
            cap); the lease is then lost at its renew deadline.
        on_lost, release_on_exit: as :meth:`prefect_baton.Baton.lease`.

    Attributes:
        lost: ``True`` once the lease is known or presumed lost (``bool``).
        renewals: how many renewals succeeded (``int``).
        receipt_status: how the block's exit left the lease (``str``): ``"released"`` or
            ``"expired"`` (the release receipt), ``"handed_off"`` (it rides on
            :attr:`handoff`, so the exit left it to that handoff), ``None`` (not ended yet,
            or not released: ``release_on_exit`` false).
        handoff: the handoff this lease rides on (:class:`Handoff`, as created), set by
            :meth:`attach_handoff`; ``None`` until then.
        release_on_exit: release the lease when the block ends (``bool``); a lease that
            rides on a handoff is never released by the block, whatever this says.
    """

    def __init__(
        self,
        api: LeaseAPI,
        acquire: Mapping[str, Any],
        *,
        renew_every_seconds: float | None = None,
        renew_deadline_seconds: float | None = None,
        max_hold_seconds: float | None = None,
        on_lost: Callable[[LeaseKeeper], Any] | None = None,
        release_on_exit: bool = True,
    ) -> None:
        self._api = api
        self._args = dict(acquire)
        self._timing: dict[str, Any] = {
            "renew_every_seconds": renew_every_seconds,
            "renew_deadline_seconds": renew_deadline_seconds,
            "max_hold_seconds": max_hold_seconds,
        }
        self._times: KeepTimes | None = None
        self._on_lost = on_lost
        self.release_on_exit = release_on_exit
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        # held while a renewal is decided and sent (reentrant: stop() may be called inside
        # heartbeat_paused() or from on_lost)
        self._renewing = threading.RLock()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._started_at = 0.0  # time.monotonic() when the acquire was sent
        self._deadline = 0.0  # time.monotonic() renew deadline of the last confirmed grant
        self._capped = False  # renewals stopped at max_hold_seconds
        self._backoff = 0.1  # seconds before retrying a failed renewal (doubles to 2 s)
        self._lost = False
        # set unless a loss was flagged and its warning and on_lost have not run yet; the
        # thread flagging it tells (stop() waits for it, see _wait_told)
        self._told = threading.Event()
        self._told.set()
        self._teller: int | None = None
        self._running = False
        self.lost_reason: str | None = None
        self._lost_kind = ""
        self._lost_status: str | None = None  # how the generation ended, when the refusal said
        self.renewals = 0
        self.receipt_status: str | None = None
        self.handoff: Handoff | None = None
        self._handoff_accepted: Callable[[], bool] | None = None
        self._once = EnterOnce("Baton.lease")

    # ------------------------------------------------------------------ lease view

    @property
    def lost(self) -> bool:
        """``True`` once the lease is known or presumed lost: a renewal was answered
        ``LEASE_LOST``, or the renew deadline passed without a confirmed renewal, even while
        a renewal call is still blocked on the network. Once it reads ``True``, the loss's
        ``on_lost`` has run (read on another thread than the heartbeat's, it waits up to
        5 s for the callback)."""
        if self._lost:
            if not self._told.is_set():
                self._wait_told()
            return True
        if self._running and time.monotonic() >= self._deadline:
            self._mark_lost(self._deadline_reason(), self._deadline_kind())
            return True
        return False

    @property
    def lease(self) -> Lease:
        """The newest :class:`Lease` of this block (updated by every renewal)."""
        if self._lease is None:
            raise RuntimeError("the lease is not acquired yet: enter the block first")
        return self._lease

    @property
    def fencing_token(self) -> int:
        """The epoch of the current lease, as a fencing token (``int``)."""
        return self.lease.epoch

    lease_id = _LeaseView[str]()
    resource_type = _LeaseView[str]()
    resource_id = _LeaseView[str]()
    owner = _LeaseView[str]()
    execution_key = _LeaseView[str | None]()
    version = _LeaseView[int]()
    epoch = _LeaseView[int]()
    scopes = _LeaseView[tuple[str, ...]]()
    status = _LeaseView[LeaseStatus]()
    purpose = _LeaseView[str | None]()
    acquired_at = _LeaseView[datetime]()
    expires_at = _LeaseView[datetime]()
    ttl_seconds = _LeaseView[int]()
    released_at = _LeaseView[datetime | None]()
    replayed = _LeaseView[bool]()

    def attach_handoff(self, handoff: Handoff, resolved: Callable[[], bool]) -> None:
        """Note that this lease rides on ``handoff`` (what :meth:`HandoffAPI.create
        <prefect_baton._client.records.HandoffAPI.create>` does when given the block as
        ``lease=``, and so :func:`prefect_baton.prefect.handoff_to`).

        From then on the block gives the lease to the handoff: its exit does not release it
        (it stays held, unrenewed, until the recipient accepts it, or the handoff is
        rejected or expires, which releases it, or its TTL runs out) and ends with
        ``receipt_status == "handed_off"``. ``resolved()`` (``bool``) tells whether the
        handoff has ended: accepted (the lease moved on), rejected or expired (its end
        released the lease); a lease that moved on or was released that way is not a loss,
        so the block ends cleanly instead of raising :class:`LeaseLostError`.

        Args:
            handoff: the handoff carrying this lease (:class:`Handoff`).
            resolved: asks the ledger whether that handoff has ended (no arguments).
        """
        self.handoff = handoff
        self._handoff_accepted = resolved

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LeaseKeeper:
        """Acquire the lease and schedule its heartbeat and renew deadline on the process's
        keeper threads (what ``__enter__`` does).

        An acquire cut off by a connection error (``UNAVAILABLE``) is retried for up to
        10 s with the same execution key and attempt, so a grant whose response was lost
        comes back replayed.

        A keeper is single use: it starts once (a block nested in itself, or entered again
        after it ended, is refused before anything is acquired or released); make a new
        one with :meth:`prefect_baton.Baton.lease`.

        Raises:
            RuntimeError: the keeper was started (entered) before.
            ValidationError: a bad TTL or timing option (nothing is acquired).
            What :meth:`LeaseAPI.acquire` raises.
        """
        self._once.enter()
        times = keep_times(self._args["ttl_seconds"], **self._timing)
        self._times = times
        sent = time.monotonic()
        self._lease = _retry_unavailable(lambda: self._api.acquire(**self._args))
        self._started_at = sent
        self._deadline = times.deadline(sent)
        self._running = True
        every(self, times.renew_every, LeaseKeeper._renew_once)
        every(self, max(0.0, self._deadline - time.monotonic()), LeaseKeeper._check_deadline)
        return self

    def _keeping(self) -> bool:
        """``True`` until :meth:`stop` (its timer steps are still wanted)."""
        return not self._stop.is_set()

    def _deadline_reason(self) -> str:
        if self._capped and self._times is not None:
            return (
                f"max_hold_seconds ({self._times.max_hold:g} s) reached: renewals stopped and "
                "the renew deadline passed"
            )
        return "the renew deadline passed without a confirmed renewal"

    def _deadline_kind(self) -> str:
        """The ``reason`` label of a loss at the renew deadline (``baton_leases_lost``)."""
        return "max_hold" if self._capped else "renew_deadline"

    def _flag_lost(self, reason: str, kind: str, status: str | None = None) -> bool:
        """Set :attr:`lost` with ``reason`` (and ``kind``, its bounded label for
        ``baton_leases_lost``, and ``status``, how the generation ended when known: the
        :attr:`LeaseLostError.status` raised at exit); ``False`` if it was already set."""
        with self._lock:
            if self._lost:
                return False
            self._lost = True
            self.lost_reason = reason
            self._lost_kind = kind
            self._lost_status = status
            self._teller = threading.get_ident()
            self._told.clear()
            return True

    def _tell_lost(self, reason: str) -> None:
        """Warn, count (``baton_leases_lost``) and run ``on_lost`` for a loss just flagged
        (not for a lease that moved on through an accepted handoff)."""
        try:
            self._tell(reason)
        finally:
            self._told.set()

    def _tell(self, reason: str) -> None:
        if self._handoff_accepted is not None and self._handoff_accepted():
            return  # moved on through an accepted handoff: not worth a warning
        if self._lease is not None and metrics_enabled():
            caller = getattr(self._api, "_caller", None)  # a test's stand-in may have none
            org = caller.org if caller is not None else ""
            record_metric("baton_leases_lost", org, self._lease.resource_type, self._lost_kind)
        log.warning("lease %s lost: %s", self._lease.lease_id if self._lease else "?", reason)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("on_lost callback failed")

    def _mark_lost(self, reason: str, kind: str, status: str | None = None) -> None:
        if self._flag_lost(reason, kind, status):
            self._tell_lost(reason)

    @staticmethod
    def _loss(err: BatonError) -> tuple[str, str, str | None]:
        """The ``(reason, kind, status)`` of a loss answered by the authority with ``err``
        (one of :data:`_LOST_ERRORS`): the reason names the error, the status is the
        error's own (:attr:`LeaseLostError.status`, ``None`` when it has none)."""
        return f"{err.code}: {err.message}", err.code.lower(), getattr(err, "status", None)

    def _check_deadline(self) -> float | None:
        """The renew-deadline step: seconds until the renew deadline, or ``None`` once the
        lease is lost (marking it lost if the deadline has passed), the block stopped, or
        it was forked away."""
        if self._stop.is_set() or os.getpid() != self._pid or self._lost:
            return None
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            self._mark_lost(self._deadline_reason(), self._deadline_kind())
            return None
        return remaining

    def _renew_once(self) -> float | None:
        """The heartbeat's step: one renewal attempt; the seconds to wait before the next,
        or ``None`` to stop renewing (stopped, lost, forked, or ``max_hold_seconds``
        reached). Decided and sent under ``_renewing``, so no renewal is in flight once
        :meth:`stop` or :meth:`heartbeat_paused` holds it."""
        times = self._times
        assert times is not None
        with self._renewing:
            if self._stop.is_set() or os.getpid() != self._pid or self._lost:
                return None
            now = time.monotonic()
            status: str | None = None
            if now >= self._deadline:
                reason, kind = self._deadline_reason(), self._deadline_kind()
            elif not times.may_renew(self._started_at, now):
                self._capped = True
                log.info("lease %s: max_hold_seconds reached, renewals stop", self.lease.lease_id)
                return None
            else:
                try:
                    lease = self._api.renew(self.lease, ttl_seconds=int(times.ttl))
                except _LOST_ERRORS as exc:
                    if self._handoff_accepted is not None and self._handoff_accepted():
                        return None  # the lease moved on through an accepted handoff
                    reason, kind, status = self._loss(exc)
                except (UnavailableError, OSError, Exception) as exc:  # transient: retry
                    log.info("renewal of %s failed, retrying: %s", self.lease.lease_id, exc)
                    self._backoff = min(self._backoff * 2, 2.0)
                    return min(self._backoff, max(0.05, self._deadline - time.monotonic()))
                else:
                    with self._lock:
                        self._lease = lease
                        self._deadline = times.deadline(now)
                        self.renewals += 1
                    self._backoff = 0.1
                    return times.renew_every
            flagged = self._flag_lost(reason, kind, status)
        if flagged:  # warn and call back outside the lock (on_lost may stop the block)
            self._tell_lost(reason)
        return None

    @contextmanager
    def heartbeat_paused(self) -> Iterator[None]:
        """Hold the heartbeat between renewals for the block: waits for a renewal in flight
        to finish, and none is sent until the block ends (the renew deadline still runs, so a
        long pause ends with the lease marked lost). For a process about to be stopped
        (``SIGSTOP``): a renewal stopped inside its ledger transaction would hold the
        database's write lock on SQLite and block every other writer."""
        with self._renewing:
            yield

    def stop(self, exc: BaseException | None = None) -> None:
        """Stop the heartbeat and release (what ``__exit__`` does); a lease that rides on a
        handoff (:meth:`attach_handoff`) is left to it instead of released
        (``receipt_status == "handed_off"``).

        Raises:
            LeaseLostError: the lease was lost during the block, or had already run out
                when released (``expired`` receipt).
        """
        self._stop.set()
        if os.getpid() != self._pid:
            return  # a forked child neither renews nor releases the parent's lease
        _ = self.lost  # judge the renew deadline before the heartbeat stops
        self._running = False
        stuck = False
        if self._times is not None:
            forget(2, LeaseKeeper._keeping)  # its heartbeat and deadline steps end
            # A renewal blocked on an unresponsive server must not hold the block's exit
            # forever: wait at most until the renew deadline (plus a margin).
            wait = max(1.0, self._deadline - time.monotonic()) + 1.0
            if self._renewing.acquire(timeout=wait):
                self._renewing.release()  # none in flight now, and none is sent after this
            else:
                stuck = True
                if time.monotonic() >= self._deadline:
                    self._mark_lost(
                        "the renew deadline passed while a renewal was still blocked",
                        "renew_deadline",
                    )
        self._wait_told()
        if self._lease is None:
            return
        # Releasing by proof is safe even when the lease is presumed lost: it cleans up an
        # expired lease nobody took, and answers LEASE_LOST without touching a new holder's.
        if self.release_on_exit and self.handoff is None and not stuck:
            try:
                receipt = self._release_with_retry()
                self.receipt_status = receipt
                if receipt == "expired":
                    self._mark_lost(
                        "the lease had expired before it was released", "expired", "expired"
                    )
            except _LOST_ERRORS as err:
                self._mark_lost(*self._loss(err))
            except BatonError as err:
                # A lease already known lost stays a LEASE_LOST at exit even when the
                # clean-up release is refused for another reason (e.g. a revoked API key).
                if not self._lost:
                    raise
                log.info("release of lost lease %s refused: %s", self._lease.lease_id, err)
        if self.handoff is not None:
            if self._lost and self._handoff_accepted is not None and self._handoff_accepted():
                self._lost = False  # it moved on, or the handoff's end released it
            if not self._lost:
                self.receipt_status = "handed_off"
                return
        if self._lost:
            raise LeaseLostError(
                f"lease {self._lease.lease_id} on {self._lease.resource_type}/"
                f"{self._lease.resource_id} was lost: {self.lost_reason}",
                status=self._lost_status,
            ) from exc

    def _wait_told(self, timeout: float = 5.0) -> None:
        """Wait until a loss the heartbeat flagged has been told (its warning logged and
        ``on_lost`` run), so the block never ends, nor raises ``LEASE_LOST``, before the
        callback ran; at most ``timeout`` seconds (a callback that waits for the block's end
        must not hold it), and not on the thread telling it (``on_lost`` may call
        :meth:`stop`)."""
        if self._teller != threading.get_ident():
            self._told.wait(timeout)

    def _release_with_retry(self) -> str:
        # The handle keeps its proof until the authority confirms, so a release cut off by
        # a connection error can be retried (a retry of a completed release is no_change).
        return _retry_unavailable(lambda: self._api.release(self.lease).status)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(exc)

    async def __aenter__(self) -> LeaseKeeper:
        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await anyio.to_thread.run_sync(self.stop, exc)
