"""The decisions of ``@leased``: no I/O, it decides what happens after each acquire attempt
and at exit; :class:`~prefect_baton.prefect._scope.LeaseScope` applies them for the sync and
async drivers in ``_decorators``, which only do I/O and sleep (STYLE.md 2)."""

from __future__ import annotations

import logging
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
)
from prefect_baton.prefect._context import LeaseSlot, RunIdentity, retry_follows
from prefect_baton.prefect._options import LeaseOptions

__all__ = ["Again", "Fail", "LeaseCall", "Skip", "Sleep", "Step"]

log = logging.getLogger("prefect_baton.prefect")

_WAIT_FIRST_SECONDS = 0.25
_WAIT_CAP_SECONDS = 5.0

# base execution key -> key actually holding the lease between Prefect retries (this process)
_held_keys: dict[str, str] = {}
_held_lock = threading.Lock()


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
    """Sleep ``seconds`` (``float``), then acquire again (``on_conflict="wait"``)."""

    seconds: float


@dataclass(frozen=True)
class Skip:
    """Do not run the body; complete with ``message`` (``on_conflict="skip"``)."""

    message: str


@dataclass(frozen=True)
class Again:
    """Acquire again at once (under a new execution key)."""


@dataclass(frozen=True)
class Fail:
    """Raise ``error``."""

    error: BaseException


Step = Sleep | Skip | Again | Fail


class LeaseCall:
    """One call of a ``@leased`` function. No I/O: the drivers ask it what to do next."""

    def __init__(
        self,
        opts: LeaseOptions,
        fn_name: str,
        ident: RunIdentity,
        resource: tuple[str, list[str]],
        now: float,
    ) -> None:
        self.opts = opts
        self.fn_name = fn_name
        self.ident = ident
        self.resource_id, self.scopes = resource
        self.base_key = ident.execution_key
        with _held_lock:
            self.key = _held_keys.get(self.base_key, self.base_key)
        self.rekeyed = False
        self.attempts = 0
        timeout = opts.wait_timeout_seconds
        self.deadline = None if timeout is None else now + timeout
        self.started = now

    @property
    def what(self) -> str:
        """``"<resource_type>/<resource_id>"``."""
        return f"{self.opts.resource_type}/{self.resource_id}"

    def on_acquire_error(self, exc: BatonError, now: float) -> Step:
        """Decide after a failed acquire: sleep and retry (``wait``), skip, re-key, or fail."""
        self.attempts += 1
        if isinstance(exc, LeaseLostError) and self.ident.run_count > 1 and not self.rekeyed:
            # A retry whose earlier attempt's lease lapsed meanwhile (retry delay > TTL): the
            # old receipt cannot revive it, so this attempt acquires under a key of its own.
            self.rekeyed = True
            self.key = f"{self.base_key}:attempt-{self.ident.run_count}"
            log.warning("%s: the lease of the previous attempt lapsed (%s)", self.what, exc)
            return Again()
        # Another attempt of this run (a second process that picked it up) holds the lease:
        # refused like a conflict, so on_conflict="wait" waits for it to end or expire.
        busy = isinstance(exc, ConflictError | IdempotencyInFlightError)
        if not busy or self.opts.on_conflict == "raise":
            return Fail(exc)
        expires_at = exc.expires_at if isinstance(exc, ConflictError) else None
        until = expires_at.isoformat(timespec="seconds") if expires_at else "unknown"
        if self.opts.on_conflict == "skip":
            return Skip(
                f"Skipped {self.fn_name}: {self.what} is leased by another holder until "
                f"{until} (on_conflict='skip')."
            )
        if self.deadline is not None and now >= self.deadline:
            return Fail(
                ConflictError(
                    f"{self.what} is still leased by another holder (until {until}) after "
                    f"waiting {now - self.started:.1f} s (wait_timeout_seconds="
                    f"{self.opts.wait_timeout_seconds})",
                    expires_at=expires_at,
                )
            )
        delay = min(_WAIT_CAP_SECONDS, _WAIT_FIRST_SECONDS * 2 ** min(self.attempts - 1, 8))
        delay *= random.uniform(0.5, 1.5)  # jitter, so waiters do not retry in lockstep
        if self.deadline is not None:
            delay = min(delay, max(0.0, self.deadline - now))
        return Sleep(delay)

    def release_at_exit(self, slot: LeaseSlot, exc: BaseException | None) -> bool:
        """Release on success, final failure, cancellation; keep it when a Prefect retry
        follows (that retry then replays this acquire: same lease, same epoch), and never
        release a lease handed off with :func:`handoff_to`."""
        if slot.handed_off:
            return False
        keep = exc is not None and retry_follows(self.ident, exc)
        with _held_lock:
            if keep:
                _held_keys[self.base_key] = self.key
            else:
                _held_keys.pop(self.base_key, None)
        return not keep

    def keeper(self, slot_on_lost: Callable[[LeaseKeeper], Any] | None, b: Any) -> LeaseKeeper:
        """A keeper for the next acquire attempt."""
        lease: LeaseKeeper = b.lease(
            self.opts.resource_type,
            self.resource_id,
            ttl_seconds=self.opts.ttl_seconds,
            purpose=self.opts.purpose,
            scopes=self.scopes,
            idempotency_key=self.key,
            renew_deadline_seconds=self.opts.renew_deadline_seconds,
            max_hold_seconds=self.opts.max_hold_seconds,
            attempt=_process_attempt,
            on_lost=slot_on_lost,
        )
        return lease
