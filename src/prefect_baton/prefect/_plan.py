"""The decisions of ``@leased``: no I/O, it decides what happens after each acquire attempt
and at exit; :class:`~prefect_baton.prefect._scope.LeaseScope` applies them for the sync and
async drivers in ``_decorators``, which only do I/O and sleep (STYLE.md 2)."""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton.errors import (
    BatonError,
    ConflictError,
    IdempotencyInFlightError,
    LeaseLostError,
    ValidationError,
)
from prefect_baton.prefect._context import LeaseSlot, RunIdentity, retry_follows
from prefect_baton.prefect._options import LeaseOptions, Resource

__all__ = ["Again", "Fail", "LeaseCall", "Skip", "Sleep", "Step", "refused"]

_WAIT_FIRST_SECONDS = 0.25
_WAIT_CAP_SECONDS = 5.0

# What this process remembers of a run between its Prefect retries (per execution key). It
# never decides whether a retry acquires or runs the body: the store does (a replayed acquire
# under the run's key is refused LEASE_LOST "transferred" by every attempt once the lease was
# handed off), so a retry in another process decides the same way.
# execution key -> attempt token that holds the lease kept for the retry (when it is not this
# process's own token: an attempt that acquired anew after its previous lease lapsed)
_held_attempts: dict[str, str] = {}
# execution key -> "handoff <id> to <principal>" the previous attempt sent its lease on
_handed_to: dict[str, str] = {}
# execution key -> what the previous attempt raised (Prefect retries the run after it)
_failed: dict[str, BaseException] = {}
# (execution key, resource type, resource id) of the blocks of this process that hold (or are
# acquiring) the lease now: a second block on the resource under the key is refused
_open: set[tuple[str, str, str]] = set()
# (execution key, resource type, resource id) -> ("handoff <id> to <principal>", run_count) of
# a block of this process that handed its lease off: a later block of the same attempt of
# the run on the resource is refused (the lease rides on the handoff, even while pending)
_handed_blocks: dict[tuple[str, str, str], tuple[str, int]] = {}
_held_lock = threading.Lock()


def refused(resource_type: str, resource_id: str, exc: ConflictError, why: str) -> ConflictError:
    """The conflict to end a run with when ``exc`` refused the lease on the resource: one
    line naming it and the holder's expiry, then ``why`` in parentheses
    (``"deploy/checkout: Resource is leased by another principal until <UTC>. (why)"``);
    ``expires_at`` is kept. Mark it ``expected`` when raising (no traceback in the logs)."""
    message = f"{resource_type}/{resource_id}: {exc.message} ({why})"
    return ConflictError(message, expires_at=exc.expires_at)


def _new_process_attempt() -> None:
    global _process_attempt
    _process_attempt = f"process-{uuid.uuid4().hex}"


#: The attempt token of this process's acquires (a forked child draws its own): a Prefect
#: retry in the same process replays its run's acquire, while another process that picks
#: the same run up is another attempt (``IDEMPOTENCY_IN_FLIGHT`` while the lease is held).
_process_attempt = ""
_new_process_attempt()
os.register_at_fork(after_in_child=_new_process_attempt)


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds`` (``float``), then acquire again (``on_conflict="wait"``); log
    ``message`` first when it is not ``None``."""

    seconds: float
    message: str | None = None


@dataclass(frozen=True)
class Skip:
    """Do not run the body; end with ``message`` (``on_conflict="skip"`` or ``"cancel"``:
    ``cancel`` is true for the latter; a Prefect retry of an attempt that handed its lease
    off). A run that is not cancelled ends ``Completed`` with the state name ``name``."""

    message: str
    cancel: bool = False
    name: str = "Skipped"


@dataclass(frozen=True)
class Again:
    """Acquire again at once (under the run's execution key, as a new attempt); log
    ``message`` (a warning, or at info level when ``warn`` is false)."""

    message: str
    warn: bool = True


@dataclass(frozen=True)
class Fail:
    """Raise ``error``."""

    error: BaseException


Step = Sleep | Skip | Again | Fail


class LeaseCall:
    """One call of a ``@leased`` function. No I/O: the drivers ask it what to do next.

    Attributes:
        resource_type, resource_id, scopes: what it leases (templates filled).
        key: the execution key it acquires under (``str``, the run's, see
            :class:`RunIdentity`).
        attempt: the attempt token it acquires as (``str``): this process's, or the one
            that acquired the lease kept for this retry.
        handed_to: ``"handoff <id> to <principal>"`` when an earlier attempt in this
            process handed its lease off, else ``None`` (for messages only).
        earlier_failure: what the previous attempt raised when it failed in this process
            and Prefect retried the run, else ``None``.
    """

    def __init__(
        self,
        opts: LeaseOptions,
        fn_name: str,
        ident: RunIdentity,
        resource: Resource,
        now: float,
    ) -> None:
        self.opts = opts
        self.fn_name = fn_name
        self.ident = ident
        self.resource_type, self.resource_id, self.scopes = resource
        self.key = ident.execution_key
        with _held_lock:
            self.attempt = _held_attempts.get(self.key, _process_attempt)
            self.handed_to = _handed_to.get(self.key)
            self.earlier_failure = _failed.get(self.key)
        self.acquiring_anew = False
        self.attempts = 0
        self._claimed = False
        timeout = opts.wait_timeout_seconds
        self.deadline = None if timeout is None else now + timeout
        self.started = now

    @property
    def what(self) -> str:
        """``"<resource_type>/<resource_id>"``."""
        return f"{self.resource_type}/{self.resource_id}"

    def refusal(self, exc: BatonError) -> str:
        """Why ``exc`` refused the lease, naming the resource and the holder's expiry
        (``"deploy/checkout: Resource is leased by another principal until <UTC>."``)."""
        return f"{self.what}: {exc.message}"

    def acquired_message(self, now: float) -> str | None:
        """What to log once the lease is held: after waiting, how long; else ``None``."""
        if self.attempts == 0 or self.opts.on_conflict != "wait":
            return None
        return f"{self.what}: acquired after waiting {now - self.started:.1f} s"

    def on_acquire_error(self, exc: BatonError, now: float) -> Step:
        """Decide after a failed acquire: sleep and retry (``wait``), skip, acquire anew as
        a new attempt (a retry whose previous lease lapsed), or fail."""
        self.attempts += 1
        step = self._decide(exc, now)
        if isinstance(step, Skip | Fail):
            self._forget()  # no lease is kept for a later retry: nothing to remember
        return step

    def _decide(self, exc: BatonError, now: float) -> Step:
        if isinstance(exc, LeaseLostError) and not self.acquiring_anew:
            if self.ident.run_count > 1:
                return self.after_previous_attempt(exc)
            return self.after_earlier_block(exc)
        mode = self.opts.on_conflict
        # Another attempt of this run (a second process that picked it up) holds the lease:
        # refused like a conflict, so on_conflict="wait" waits for it to end or expire.
        if not isinstance(exc, ConflictError | IdempotencyInFlightError):
            return Fail(exc)
        expires_at = exc.expires_at if isinstance(exc, ConflictError) else None
        why = self.refusal(exc)
        if mode == "raise":
            if isinstance(exc, IdempotencyInFlightError):
                return Fail(exc)
            return Fail(refused(self.resource_type, self.resource_id, exc, "on_conflict='raise'"))
        if mode in ("skip", "cancel"):
            verb = "Skipped" if mode == "skip" else "Cancelled"
            return Skip(f"{verb} {self.fn_name}: {why} (on_conflict={mode!r})", mode == "cancel")
        waited = now - self.started
        if self.deadline is not None and now >= self.deadline:
            return Fail(
                ConflictError(
                    f"{why} Gave up after waiting {waited:.1f} s "
                    f"(wait_timeout_seconds={self.opts.wait_timeout_seconds})",
                    expires_at=expires_at,
                )
            )
        delay = min(_WAIT_CAP_SECONDS, _WAIT_FIRST_SECONDS * 2 ** min(self.attempts - 1, 8))
        delay *= random.uniform(0.5, 1.5)  # jitter, so waiters do not retry in lockstep
        if self.deadline is not None:
            delay = min(delay, max(0.0, self.deadline - now))
        message = None
        if self.attempts == 1 or self.attempts % 10 == 0:  # the first time, then now and then
            limit = self.opts.wait_timeout_seconds
            until = "without a limit" if limit is None else f"for up to {limit} s"
            message = f"{why} Waiting {until} (on_conflict='wait'; waited {waited:.1f} s so far)"
        return Sleep(delay, message)

    def after_previous_attempt(self, exc: LeaseLostError) -> Skip | Again:
        """Decide what a Prefect retry does when its acquire under the run's execution key
        raised ``exc``: the lease an earlier attempt of the run acquired is no longer held.
        The store says so, not this process's memory, so a retry run by another process (a
        worker re-running the flow run) decides the same way.

        - ``exc.status == "transferred"``: the lease moved on (a handoff sent with
          :func:`handoff_to` was accepted, or the body transferred it). The store refuses
          every attempt of the run then, whichever process makes it: the work is the
          recipient's, so the retry neither acquires the resource again nor runs the body:
          :class:`Skip`, a Prefect run ending ``Completed(name="HandedOff")`` with a message
          naming the resource and, when this process sent it, the handoff and its recipient;
        - otherwise it lapsed (expired, released, revoked, taken over: retry delay > TTL):
          the old receipt cannot revive it, so this attempt acquires anew under the same
          key as a new attempt (:class:`Again`, logged as a warning; a new epoch, or a
          conflict when someone else took the resource meanwhile). Its receipt replaces the
          lapsed one, so a later retry in another process finds this lease: refused
          ``IDEMPOTENCY_IN_FLIGHT`` (a conflict, as ``on_conflict`` says) while it is held,
          ``transferred`` once handed off.
        """
        if exc.status == "transferred":
            via = f" ({self.handed_to})" if self.handed_to is not None else ""
            return Skip(
                f"Handed off {self.fn_name}: the lease of the previous attempt on {self.what} "
                f"was transferred{via}; the work is the recipient's, so this retry does not "
                "acquire it again nor run the body",
                name="HandedOff",
            )
        self._anew()
        return Again(self.lapsed_message(exc.status))

    def after_earlier_block(self, exc: LeaseLostError) -> Fail | Again:
        """Decide what a first attempt of a run (``run_count == 1``) does when its acquire
        under the run's execution key raised ``exc``: an earlier block of the same run
        acquired the resource under that key and its lease is no longer held (two ``with
        lease(...)`` blocks on one resource, one after the other, in one run).

        - ``exc.status == "transferred"``: that block handed the lease off; the work is the
          recipient's, and no attempt of the run acquires it again under the key (the store
          refuses every one): :class:`Fail` with a :class:`LeaseLostError` naming the
          resource, without the store's advice of a new execution key (the key is the run
          id);
        - otherwise (released, expired, revoked, taken over): this block is a new use of the
          resource, not a retry of the earlier block, so it acquires anew under the same key
          as a new attempt (:class:`Again`, logged at info level): a new generation with a
          new epoch, or a conflict when someone else holds the resource now.
        """
        if exc.status == "transferred":
            return Fail(
                LeaseLostError(
                    f"{self.what}: an earlier lease block of this run handed the lease off "
                    "(transferred); the work is the recipient's, so this run does not acquire "
                    "it again",
                    status="transferred",
                )
            )
        self._anew()
        why = exc.status or "no longer held"
        return Again(
            f"{self.what}: the lease of an earlier block of this run has ended ({why}); "
            "acquiring it anew for this block",
            warn=False,
        )

    def _anew(self) -> None:
        """Acquire as a new attempt of the run: an attempt token of its own, so a later block
        or retry that acquires anew again is another attempt still."""
        self.acquiring_anew = True
        self.attempt = f"{_process_attempt}:{uuid.uuid4().hex}"

    def lapsed_message(self, status: str | None) -> str:
        """The warning of a retry whose previous attempt's lease is no longer held
        (``status``: how it ended, :attr:`LeaseLostError.status`). Not the store's message,
        whose advice (a new execution key) a Prefect user cannot follow: the key is the run
        id. When it expired, what keeps it for the next retry: a TTL longer than the retry
        delay."""
        why = status or "no longer held"
        message = (
            f"{self.what}: the lease of the previous attempt is no longer held ({why}); "
            "acquiring anew as a new attempt of this run"
        )
        if status == "expired":
            message += (
                f" (it expired before this retry: choose ttl_seconds (now {self.opts.ttl_seconds})"
                " longer than the retry delay to keep the lease across retries)"
            )
        return message

    def _forget(self) -> None:
        with _held_lock:
            _held_attempts.pop(self.key, None)
            _handed_to.pop(self.key, None)
            _failed.pop(self.key, None)
        self._unclaim()

    def _claim(self) -> None:
        """Note that this block holds (or is acquiring) the resource under the run's key.

        Raises:
            LeaseLostError: an earlier block of this attempt of the run handed the resource
                off (:func:`~prefect_baton.prefect.handoff_to`), whatever became of the
                handoff: a block taking its lease back would replay it (pending) and
                release it at exit, ending the handoff the recipient has yet to accept.
            ValidationError: another block of this process holds it under the key (a block
                nested in a block on the same resource, or running beside one, in one run):
                its acquire would replay that block's lease, and its exit would release
                the lease that block still runs under.
        """
        if self._claimed:
            return
        entry = (self.key, self.resource_type, self.resource_id)
        with _held_lock:
            handed = _handed_blocks.get(entry)
            if handed is not None and handed[1] == self.ident.run_count:
                raise LeaseLostError(
                    f"{self.what}: an earlier lease block of this run handed the lease off "
                    f"({handed[0]}); the work is the recipient's, so this run does not "
                    "acquire it again"
                )
            if entry in _open:
                raise ValidationError(
                    f"{self.what} is already held by another lease block of this run that "
                    f"has not ended (execution key {self.key!r}); a run holds a resource in "
                    "one block at a time: use that block's lease (current_lease()) instead "
                    "of nesting a block on it"
                )
            _open.add(entry)
        self._claimed = True

    def _unclaim(self) -> None:
        if self._claimed:
            with _held_lock:
                _open.discard((self.key, self.resource_type, self.resource_id))
            self._claimed = False

    def release_at_exit(self, slot: LeaseSlot, exc: BaseException | None) -> bool:
        """Release on success, final failure, cancellation; keep it when a Prefect retry
        follows (that retry then replays this acquire: same lease, same epoch, or ends
        ``HandedOff`` if it was transferred meanwhile, see :meth:`after_previous_attempt`).
        A lease handed off with :func:`handoff_to` is never released: the keeper leaves it
        to its handoff (:meth:`LeaseKeeper.attach_handoff`) whatever this returns."""
        self._unclaim()
        if slot.handed_to is not None:
            with _held_lock:
                entry = (self.key, self.resource_type, self.resource_id)
                _handed_blocks[entry] = (slot.handed_to, self.ident.run_count)
        retry = exc is not None and retry_follows(self.ident, exc)
        if not retry:
            self._forget()
            return True
        assert exc is not None
        with _held_lock:
            if self.attempt != _process_attempt:
                _held_attempts[self.key] = self.attempt
            if slot.handed_to is not None:
                _handed_to[self.key] = slot.handed_to
            _failed[self.key] = exc
        return False

    def keeper(self, slot_on_lost: Callable[[LeaseKeeper], Any] | None, b: Any) -> LeaseKeeper:
        """A keeper for the next acquire attempt.

        Raises:
            ValidationError, LeaseLostError: a block of this process already holds the
                resource under the run's execution key, or handed it off (:meth:`_claim`).
        """
        self._claim()
        lease: LeaseKeeper = b.lease(
            self.resource_type,
            self.resource_id,
            ttl_seconds=self.opts.ttl_seconds,
            purpose=self.opts.purpose,
            scopes=self.scopes,
            idempotency_key=self.key,
            renew_deadline_seconds=self.opts.renew_deadline_seconds,
            max_hold_seconds=self.opts.max_hold_seconds,
            attempt=self.attempt,
            on_lost=slot_on_lost,
        )
        return lease
