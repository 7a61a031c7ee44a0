"""The steps of one leased scope, shared by the sync and async drivers.

A :class:`LeaseScope` is one ``@leased`` call or one ``with lease(...)`` block: it asks
:class:`~prefect_baton.prefect._plan.LeaseCall` what to do after each acquire attempt, makes
the lease current while the body runs (slot push/pop), arms and disarms the
``cancel_on_loss`` guard, and decides the exit (release or keep for a Prefect retry,
interrupt translation, events). It never waits: starting and stopping the keeper, sleeping
between attempts and running the body are the drivers' part (STYLE.md 2), so that
the sync driver blocks and the async driver awaits around the very same steps::

    while (keeper := scope.attempt()) is not None:  # None: the plan says skip the body
        try:
            keeper.start()                          # driver I/O
        except BatonError as exc:
            if (step := scope.acquire_failed(exc)) is not None:
                time.sleep(step.seconds)            # driver sleep
            continue
        with scope.holding(keeper) as held, scope.guarded(held):
            held.result = body()                    # driver I/O
        try:
            keeper.stop(held.failure)               # driver I/O
        except LeaseLostError:
            scope.check_interrupted(held)
            raise
        return scope.finish(held)
    return scope.skipped()

The loop up to the body is :func:`._drive.acquire` (``aacquire``), the rest after it
:func:`._drive.release` (``arelease``). ``@leased`` runs its body between them; ``with
lease(...)`` (:mod:`._lease`) calls them from ``__enter__`` and ``__exit__``.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton.errors import BatonError, LeaseLostError
from prefect_baton.metrics._state import record as record_metric
from prefect_baton.prefect._context import (
    LeaseSlot,
    RunKind,
    pop_slot,
    push_slot,
    resolve_baton,
    run_identity,
)
from prefect_baton.prefect._events import emit_lease_event
from prefect_baton.prefect._interrupt import Interrupt, LeaseInterrupt
from prefect_baton.prefect._logs import expected, run_logger, settle_failed_attempt
from prefect_baton.prefect._options import LeaseOptions
from prefect_baton.prefect._plan import Again, Fail, LeaseCall, Skip, Sleep

__all__ = ["Held", "LeaseScope"]

#: ``(signature, args, kwargs)`` of a call, to fill the resource templates from.
BoundCall = tuple[inspect.Signature, Any, Any]


@dataclass
class Held:
    """What happened while the lease was held (filled by :meth:`LeaseScope.holding`).

    Attributes:
        slot: the current-lease slot of the scope.
        result: what the body returned (set by the driver).
        failure: what the body raised (after interrupt translation), or ``None``.
    """

    slot: LeaseSlot
    result: Any = None
    failure: BaseException | None = None


class _Holding:
    """Makes the lease current for the body and records how the body ended (suppressing
    its exception: :meth:`LeaseScope.finish` raises it after the keeper stopped)."""

    def __init__(self, scope: LeaseScope, keeper: LeaseKeeper) -> None:
        self._scope = scope
        self.held = Held(LeaseSlot(keeper=keeper, baton=scope.baton, identity=scope.call.ident))
        self._token: contextvars.Token[LeaseSlot | None] | None = None

    def __enter__(self) -> Held:
        now = time.monotonic()
        said = self._scope.call.acquired_message(now)
        if said is not None:
            run_logger().info(said)
        lease = self.held.slot.keeper.lease
        waited = now - self._scope.call.started
        record_metric(
            "baton_acquire_wait_seconds", self._scope.baton.org, lease.resource_type, value=waited
        )
        if not self.held.slot.keeper.lease.replayed:
            emit_lease_event(self._scope.baton, "lease.acquired", self.held.slot.keeper.lease)
        self._token = push_slot(self.held.slot)
        return self.held

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        scope, held = self._scope, self.held
        guard = scope.guard
        if guard is not None:
            guard.disarm()  # again, if an interruption landed while it was being disarmed
            exc = guard.translate(exc) if exc is not None else None
        held.failure = exc
        assert self._token is not None
        pop_slot(self._token)
        held.slot.keeper.release_on_exit = scope.call.release_at_exit(held.slot, exc)
        return True


class _Guarded:
    """Arms the ``cancel_on_loss`` guard for the body (a no-op without one)."""

    def __init__(self, guard: Interrupt | None, slot: LeaseSlot) -> None:
        self._guard = guard
        self._slot = slot

    def __enter__(self) -> None:
        if self._guard is not None:
            slot = self._slot
            self._guard.arm(lambda: slot.handed_off)

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._guard is not None:
            self._guard.disarm()


class LeaseScope:
    """One leased scope: the shared steps of the sync and async drivers (no waiting).

    Args:
        opts: the validated :class:`LeaseOptions`.
        name: what runs under the lease (``str``, e.g. the function's qualified name), for
            messages.
        guard_type: the ``cancel_on_loss`` guard of the driver (``SyncInterrupt`` or
            ``AsyncInterrupt``); one is made only when ``opts.cancel_on_loss``.
        prefer: ``"flow"``/``"task"``/``None``, see :func:`run_identity`.
        bound: ``(signature, args, kwargs)`` of the call, when the resource type, id or
            scopes are templates over its parameters.

    Raises:
        ValidationError: a bad principal or setting, or templates the call cannot fill.
        TypeError: ``opts.baton`` is not a client or factory.
    """

    def __init__(
        self,
        opts: LeaseOptions,
        name: str,
        guard_type: type[Interrupt],
        *,
        prefer: RunKind | None = None,
        bound: BoundCall | None = None,
    ) -> None:
        ident = run_identity(prefer)
        self.baton = resolve_baton(opts.baton, ident.principal, opts.principal)
        resource = opts.render(*bound) if bound is not None else opts.literal()
        self.call = LeaseCall(opts, name, ident, resource, time.monotonic())
        self.guard: Interrupt | None = guard_type() if opts.cancel_on_loss else None
        self._skip: Skip | None = None
        # the run's context, to log a loss (noticed on the heartbeat thread) to the run
        self._context = contextvars.copy_context()

    # ---------------------------------------------------------------- acquire

    def attempt(self) -> LeaseKeeper | None:
        """A keeper for the next acquire attempt (the driver starts it), or ``None`` when the
        plan decided to skip the body (then return :meth:`skipped`)."""
        if self._skip is not None:
            return None
        return self.call.keeper(self._on_lost, self.baton)

    def _on_lost(self, keeper: LeaseKeeper) -> None:
        """The keeper's ``on_lost`` (on its heartbeat thread): say so in the run's logs,
        then interrupt the body when ``cancel_on_loss``."""
        try:
            self._context.run(
                lambda: run_logger().warning(
                    "%s: lease %s was lost (%s)",
                    self.call.what,
                    keeper.lease_id,
                    keeper.lost_reason,
                )
            )
        except RuntimeError:  # the context is entered elsewhere at this instant: skip the log
            pass
        if self.guard is not None:
            self.guard.on_lost(keeper)

    def acquire_failed(self, exc: BatonError) -> Sleep | None:
        """After a failed start: :class:`Sleep` (sleep, then attempt again) or ``None``
        (attempt again at once, or skip: :meth:`attempt` then returns ``None``).

        Raises:
            BatonError: the attempt's error, or the one the plan gives up with. A conflict
            the plan gives up on is raised without the chain and marked expected (Prefect
            logs its message, naming the resource and the expiry, without a traceback).
        """
        step = self.call.on_acquire_error(exc, time.monotonic())
        if isinstance(step, Fail):
            if step.error is exc:
                raise exc from None
            raise expected(step.error) from None
        if isinstance(step, Skip):
            self._skip = step
            return None
        if isinstance(step, Again):
            log = run_logger()
            (log.warning if step.warn else log.info)(step.message)
            return None
        if step.message is not None:
            run_logger().info(step.message)
        return step

    @property
    def skip_message(self) -> str | None:
        """Why the body was skipped, or ``None`` (not skipped)."""
        return self._skip.message if self._skip is not None else None

    def skipped(self) -> Any:
        """The result of a skipped body (its message is logged to the run, or to the
        ``prefect_baton.prefect`` logger outside one): inside a run the Prefect state to end
        it with, ``Completed(name="Skipped")`` (``on_conflict="skip"``), ``Cancelled``
        (``"cancel"``) or ``Completed(name="HandedOff")`` (a retry of an attempt whose lease
        was transferred), with the reason as the state message; ``None`` outside a run.

        In a retry of a flow run (``run_count > 1``) the previous attempt failed: its
        exception is no outcome of the run any more (:func:`settle_failed_attempt`), so
        Prefect neither re-raises nor logs it as the run's end."""
        assert self._skip is not None
        message = self._skip.message
        run_logger().info(message)
        ident = self.call.ident
        if not ident.in_run:
            return None
        if ident.kind == "flow" and ident.run_count > 1 and ident.flow_run_id is not None:
            settle_failed_attempt(ident.flow_run_id, self.call.earlier_failure)
        from prefect.exceptions import CancelledRun
        from prefect.states import Cancelled, Completed

        if self._skip.cancel:
            # the exception the state raises is ours, marked expected: Prefect's engine then
            # logs neither its traceback nor "Engine execution exited with unexpected
            # exception" when a deployment run ends Cancelled this way
            return Cancelled(message=message, data=expected(CancelledRun(message)))
        return Completed(name=self._skip.name, message=message)

    # ---------------------------------------------------------------- hold

    def holding(self, keeper: LeaseKeeper) -> _Holding:
        """Context manager for the body, entered once ``keeper`` started: emits
        ``lease.acquired`` (unless replayed), makes the lease current
        (:func:`current_lease`); on exit records the body's result or failure in the
        :class:`Held` it yields (the exception is suppressed here and raised by
        :meth:`finish`), restores the previous lease and decides release or keep."""
        return _Holding(self, keeper)

    def guarded(self, held: Held) -> _Guarded:
        """Context manager arming the ``cancel_on_loss`` guard around the body; use inside
        :meth:`holding` (``with scope.holding(k) as held, scope.guarded(held):``) so that an
        interruption landing while it disarms is still recorded by ``holding``."""
        return _Guarded(self.guard, held.slot)

    # ---------------------------------------------------------------- exit

    def check_interrupted(self, held: Held) -> None:
        """Raise :class:`LeaseLostError` (from ``None``) if the body was interrupted by the
        loss of its lease; call when stopping the keeper raised ``LeaseLostError``."""
        if isinstance(held.failure, LeaseInterrupt):
            keeper = held.slot.keeper
            raise LeaseLostError(
                f"lease {keeper.lease_id} on {keeper.resource_type}/{keeper.resource_id} was "
                f"lost ({keeper.lost_reason}); the body was interrupted (cancel_on_loss=True)"
            ) from None

    def finish(self, held: Held) -> Any:
        """After the keeper stopped: emit ``lease.released``, then return the body's result
        or raise what it raised (an interruption as :class:`LeaseLostError`)."""
        keeper = held.slot.keeper
        if keeper.receipt_status in ("released", "expired"):
            emit_lease_event(
                self.baton, "lease.released", keeper.lease, status=keeper.receipt_status
            )
        self.check_interrupted(held)
        if held.failure is not None:
            raise held.failure
        return held.result
