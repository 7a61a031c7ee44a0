"""``@leased``: hold a lease for the duration of a function, task or flow run.

One core (:class:`_LeaseCall`: no I/O, decides what happens after each acquire attempt and at
exit) and two thin drivers (:func:`_run_sync`, :func:`_run_async`) that only do I/O and
sleep, as STYLE.md section 2 asks.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
import string
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import anyio
import anyio.to_thread
from prefect import Flow, Task

from .._core import validate_id, validate_text, validate_ttl
from .._keeper import LeaseKeeper
from ..errors import BatonError, ConflictError, LeaseLostError, ValidationError
from ._context import (
    BatonLike,
    LeaseSlot,
    RunIdentity,
    pop_slot,
    push_slot,
    resolve_baton,
    retry_follows,
    run_identity,
)
from ._events import emit_lease_event
from ._interrupt import AsyncInterrupt, LeaseInterrupt, SyncInterrupt

__all__ = ["leased"]

log = logging.getLogger("prefect_baton.prefect")

F = TypeVar("F")
OnConflict = Literal["raise", "skip", "wait"]
_ON_CONFLICT = ("raise", "skip", "wait")
_WAIT_FIRST_SECONDS = 0.25
_WAIT_CAP_SECONDS = 5.0

# base execution key -> key actually holding the lease between Prefect retries (this process)
_held_keys: dict[str, str] = {}
_held_lock = threading.Lock()


def _fields(template: str, what: str) -> set[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValidationError(f"{what} template {template!r} is malformed: {exc}") from None
    roots = set()
    for _text, name, _spec, _conv in parsed:
        if name is None:
            continue
        root = name.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValidationError(f"{what} template {template!r}: use parameter names, not {{}}")
        roots.add(root)
    return roots


@dataclass(frozen=True)
class LeaseOptions:
    """The validated options of one ``@leased(...)``."""

    resource_type: str
    resource_id: str
    ttl_seconds: int
    purpose: str | None
    scopes: tuple[str, ...]
    on_conflict: OnConflict
    wait_timeout_seconds: float | None
    cancel_on_loss: bool
    baton: BatonLike | None
    principal: str | None

    def check_function(self, fn: Callable[..., Any]) -> inspect.Signature:
        """Reject templates naming parameters ``fn`` does not have (names the function)."""
        sig = inspect.signature(fn)
        params = sig.parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        name = getattr(fn, "__qualname__", repr(fn))
        for what, tpl in [("resource_id", self.resource_id)] + [("scope", s) for s in self.scopes]:
            missing = sorted(f for f in _fields(tpl, what) if f not in params)
            if missing and not var_kw:
                raise ValidationError(
                    f"@leased on {name}: {what} template {tpl!r} names "
                    f"{', '.join(missing)}, which {name} has no parameter for"
                )
        return sig

    def render(self, sig: inspect.Signature, args: Any, kwargs: Any) -> tuple[str, list[str]]:
        """``(resource_id, scopes)`` with templates filled from the call's arguments."""
        if not any("{" in t for t in (self.resource_id, *self.scopes)):
            return self.resource_id, list(self.scopes)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                values.update(values.pop(p.name, {}))
        try:
            return self.resource_id.format_map(values), [s.format_map(values) for s in self.scopes]
        except (KeyError, AttributeError, IndexError) as exc:
            raise ValidationError(f"cannot fill the lease templates: {exc!r}") from None


# ----------------------------------------------------------------------------- the core


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Skip:
    message: str


@dataclass(frozen=True)
class _Again:
    pass


@dataclass(frozen=True)
class _Fail:
    error: BaseException


_Step = _Sleep | _Skip | _Again | _Fail


class _LeaseCall:
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
        return f"{self.opts.resource_type}/{self.resource_id}"

    def on_acquire_error(self, exc: BatonError, now: float) -> _Step:
        """Decide after a failed acquire: sleep and retry (``wait``), skip, re-key, or fail."""
        self.attempts += 1
        if isinstance(exc, LeaseLostError) and self.ident.run_count > 1 and not self.rekeyed:
            # A retry whose earlier attempt's lease lapsed meanwhile (retry delay > TTL): the
            # old receipt cannot revive it, so this attempt acquires under a key of its own.
            self.rekeyed = True
            self.key = f"{self.base_key}:attempt-{self.ident.run_count}"
            log.warning("%s: the lease of the previous attempt lapsed (%s)", self.what, exc)
            return _Again()
        if not isinstance(exc, ConflictError) or self.opts.on_conflict == "raise":
            return _Fail(exc)
        until = exc.expires_at.isoformat(timespec="seconds") if exc.expires_at else "unknown"
        if self.opts.on_conflict == "skip":
            return _Skip(
                f"Skipped {self.fn_name}: {self.what} is leased by another holder until "
                f"{until} (on_conflict='skip')."
            )
        if self.deadline is not None and now >= self.deadline:
            return _Fail(
                ConflictError(
                    f"{self.what} is still leased by another holder (until {until}) after "
                    f"waiting {now - self.started:.1f} s (wait_timeout_seconds="
                    f"{self.opts.wait_timeout_seconds})",
                    expires_at=exc.expires_at,
                )
            )
        delay = min(_WAIT_CAP_SECONDS, _WAIT_FIRST_SECONDS * 2 ** min(self.attempts - 1, 8))
        delay *= random.uniform(0.5, 1.5)  # jitter, so waiters do not retry in lockstep
        if self.deadline is not None:
            delay = min(delay, max(0.0, self.deadline - now))
        return _Sleep(delay)

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
            on_lost=slot_on_lost,
        )
        return lease


def _skip_result(step: _Skip, ident: RunIdentity) -> Any:
    if not ident.in_run:
        log.info(step.message)
        return None
    from prefect.logging import get_run_logger
    from prefect.states import Completed

    get_run_logger().info(step.message)
    return Completed(message=step.message)


def _after_stop(b: Any, keeper: LeaseKeeper, slot: LeaseSlot) -> None:
    if keeper.receipt_status in ("released", "expired"):
        emit_lease_event(b, "lease.released", keeper.lease, status=keeper.receipt_status)


def _prepare(
    opts: LeaseOptions, sig: inspect.Signature, fn_name: str, prefer: Any, a: Any, kw: Any
) -> tuple[_LeaseCall, Any]:
    ident = run_identity(prefer)
    b = resolve_baton(opts.baton, opts.principal or ident.principal)
    call = _LeaseCall(opts, fn_name, ident, opts.render(sig, a, kw), time.monotonic())
    return call, b


def _interrupt_error(keeper: LeaseKeeper, exc: BaseException) -> LeaseLostError:
    return LeaseLostError(
        f"lease {keeper.lease_id} on {keeper.resource_type}/{keeper.resource_id} was lost "
        f"({keeper.lost_reason}); the body was interrupted (cancel_on_loss=True)"
    )


def _run_sync(
    opts: LeaseOptions,
    fn: Callable[..., Any],
    sig: inspect.Signature,
    prefer: Any,
    args: Any,
    kwargs: Any,
) -> Any:
    call, b = _prepare(opts, sig, fn.__qualname__, prefer, args, kwargs)
    guard = SyncInterrupt() if opts.cancel_on_loss else None
    while True:
        keeper = call.keeper(guard.on_lost if guard else None, b)
        try:
            keeper.start()
            break
        except BatonError as exc:
            step = call.on_acquire_error(exc, time.monotonic())
            if isinstance(step, _Sleep):
                time.sleep(step.seconds)
            elif isinstance(step, _Skip):
                return _skip_result(step, call.ident)
            elif isinstance(step, _Fail):
                raise step.error from (None if step.error is exc else exc)
    if not keeper.lease.replayed:
        emit_lease_event(b, "lease.acquired", keeper.lease)
    slot = LeaseSlot(keeper=keeper, baton=b, identity=call.ident)
    token = push_slot(slot)
    failure: BaseException | None = None
    result: Any = None
    try:
        try:
            if guard is not None:
                guard.arm(lambda: slot.handed_off)
            result = fn(*args, **kwargs)
        finally:
            if guard is not None:
                guard.disarm()
    except BaseException as exc:
        failure = exc
    finally:
        pop_slot(token)
    keeper.release_on_exit = call.release_at_exit(slot, failure)
    keeper.stop(failure)
    _after_stop(b, keeper, slot)
    if isinstance(failure, LeaseInterrupt):
        raise _interrupt_error(keeper, failure) from None
    if failure is not None:
        raise failure
    return result


async def _run_async(
    opts: LeaseOptions,
    fn: Callable[..., Any],
    sig: inspect.Signature,
    prefer: Any,
    args: Any,
    kwargs: Any,
) -> Any:
    call, b = _prepare(opts, sig, fn.__qualname__, prefer, args, kwargs)
    guard = AsyncInterrupt() if opts.cancel_on_loss else None
    while True:
        keeper = call.keeper(guard.on_lost if guard else None, b)
        try:
            await anyio.to_thread.run_sync(keeper.start)
            break
        except BatonError as exc:
            step = call.on_acquire_error(exc, time.monotonic())
            if isinstance(step, _Sleep):
                await anyio.sleep(step.seconds)
            elif isinstance(step, _Skip):
                return _skip_result(step, call.ident)
            elif isinstance(step, _Fail):
                raise step.error from (None if step.error is exc else exc)
    if not keeper.lease.replayed:
        emit_lease_event(b, "lease.acquired", keeper.lease)
    slot = LeaseSlot(keeper=keeper, baton=b, identity=call.ident)
    token = push_slot(slot)
    failure: BaseException | None = None
    result: Any = None
    try:
        try:
            if guard is not None:
                guard.arm(lambda: slot.handed_off)
            result = await fn(*args, **kwargs)
        finally:
            if guard is not None:
                guard.disarm()
    except BaseException as exc:
        failure = guard.translate(exc) if guard is not None else exc
    finally:
        pop_slot(token)
    keeper.release_on_exit = call.release_at_exit(slot, failure)
    await anyio.to_thread.run_sync(keeper.stop, failure)
    _after_stop(b, keeper, slot)
    if isinstance(failure, LeaseInterrupt):
        raise _interrupt_error(keeper, failure) from None
    if failure is not None:
        raise failure
    return result


# ----------------------------------------------------------------------------- decorator


def _wrap(opts: LeaseOptions, fn: Callable[..., Any], prefer: str | None) -> Callable[..., Any]:
    sig = opts.check_function(fn)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            return await _run_async(opts, fn, sig, prefer, args, kwargs)

        wrapper: Callable[..., Any] = awrapper
    else:

        @functools.wraps(fn)
        def swrapper(*args: Any, **kwargs: Any) -> Any:
            return _run_sync(opts, fn, sig, prefer, args, kwargs)

        wrapper = swrapper
    # Prefect derives task keys from the code object: every function wrapped here would get
    # the same key; this (pinned, tested) hook makes Prefect key the task by ``fn`` instead.
    wrapper.__prefect_task_source__ = fn  # type: ignore[attr-defined]
    wrapper.__baton_lease_options__ = opts  # type: ignore[attr-defined]
    return wrapper


def leased(
    resource_type: str,
    resource_id: str,
    *,
    ttl_seconds: int,
    purpose: str | None = None,
    scopes: Iterable[str] = (),
    on_conflict: OnConflict = "raise",
    wait_timeout_seconds: float | None = None,
    cancel_on_loss: bool = False,
    baton: BatonLike | None = None,
    principal: str | None = None,
) -> Callable[[F], F]:
    """Hold the lease on ``(resource_type, resource_id)`` while a function, task or flow runs.

    Works on sync and async functions (an ``async def`` stays async) and on Prefect tasks and
    flows, placed below ``@task``/``@flow`` (recommended: it wraps the function Prefect runs)
    or above them (it wraps the task's function through ``with_options()``, keeping the
    task's options, hooks and a distinct task key per function).

    Inside a run the lease is acquired under the run identity (see
    :mod:`prefect_baton.prefect._context`): principal = the deployment's full name (or the
    flow name), execution key = task run id (flow run id for flows). So:

    - a Prefect **retry** of the same run replays its own acquire (same ``lease_id`` and
      epoch): when the body fails and Prefect will retry, the lease is kept (not released)
      for the retry; it is released on success, on the final failure and on cancellation.
      If the retry delay outlasts the TTL the lease lapses, and the retry acquires anew;
    - a *different* run conflicts, even of the same deployment (seed 004 execution keys).

    A heartbeat thread renews the lease every ``ttl_seconds / 3`` for the body's whole
    duration, for sync and async bodies alike. :func:`current_lease` returns it inside the
    body, to pass as ``fence=``.

    Args:
        resource_type: the resource type (``str``, 1..256 characters).
        resource_id: the resource id, or a template over the call's parameters
            (``"{service}"``, ``"{cfg.name}"``).
        ttl_seconds: lease TTL, integer seconds from 10 to 86,400 (seed service rule).
        purpose: free text kept with the lease (holder-only).
        scopes: write-scope globs (templates allowed); overlapping scopes of another
            principal's effective lease conflict (seed 004).
        on_conflict: ``"raise"`` (default) raises :class:`ConflictError`; ``"skip"``
            completes without running the body (a Prefect run ends ``Completed`` with the
            reason as its state message, and it is logged; a plain call returns ``None``);
            ``"wait"`` retries with jittered exponential backoff (0.25 s doubling to 5 s)
            until ``wait_timeout_seconds`` (``None``: no limit), then raises
            :class:`ConflictError`.
        wait_timeout_seconds: seconds to wait with ``on_conflict="wait"``.
        cancel_on_loss: when the lease is lost, interrupt the body: an async body is
            cancelled; a sync body gets an asynchronous exception at its next Python
            bytecode (a blocking C call finishes first). Either way the call raises
            :class:`LeaseLostError`.
        baton: a :class:`~prefect_baton.Baton` (used as given), a factory
            ``principal -> Baton`` called with the run's default principal, or ``None`` for
            ``Baton.from_settings()`` (``BATON_*`` environment) acting as that principal.
        principal: overrides the run's default principal.

    Raises:
        ValidationError: when applied, for a bad TTL, option combination or a template
            naming a parameter the function lacks (the message names the function).
        At call time: :class:`ConflictError` (``raise``, or ``wait`` timed out),
        :class:`LeaseLostError` (the lease was lost during the body: renewal answered
        ``LEASE_LOST`` or the TTL passed without a renewal; raised at the latest when the
        body returns), and what the body raises.
    """
    validate_id("resource_type", resource_type)
    if not isinstance(resource_id, str) or not resource_id:
        raise ValidationError("resource_id must be a non-empty string (or template)")
    validate_ttl(ttl_seconds)
    validate_text("purpose", purpose)
    if isinstance(scopes, str | bytes):
        raise ValidationError("scopes must be a list of glob strings, not a single string")
    scopes_ = tuple(scopes)
    if on_conflict not in _ON_CONFLICT:
        raise ValidationError(f"on_conflict must be one of {_ON_CONFLICT}, got {on_conflict!r}")
    if wait_timeout_seconds is not None:
        if on_conflict != "wait":
            raise ValidationError("wait_timeout_seconds only applies to on_conflict='wait'")
        if isinstance(wait_timeout_seconds, bool) or not wait_timeout_seconds >= 0:
            raise ValidationError("wait_timeout_seconds must be a number of seconds >= 0")
    if principal is not None:
        validate_id("principal", principal)
    opts = LeaseOptions(
        resource_type=resource_type,
        resource_id=resource_id,
        ttl_seconds=int(ttl_seconds),
        purpose=purpose,
        scopes=scopes_,
        on_conflict=on_conflict,
        wait_timeout_seconds=wait_timeout_seconds,
        cancel_on_loss=bool(cancel_on_loss),
        baton=baton,
        principal=principal,
    )

    def decorate(obj: F) -> F:
        if isinstance(obj, Task):
            new_task = obj.with_options()
            new_task.fn = _wrap(opts, obj.fn, "task")
            return cast(F, new_task)
        if isinstance(obj, Flow):
            new_flow = obj.with_options()
            new_flow.fn = _wrap(opts, obj.fn, "flow")
            return cast(F, new_flow)
        if not callable(obj):
            raise ValidationError(f"@leased needs a function, task or flow, not {obj!r}")
        return cast(F, _wrap(opts, obj, None))

    return decorate
