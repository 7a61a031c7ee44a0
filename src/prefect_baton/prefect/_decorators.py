"""``@leased``: hold a lease for the duration of a function, task or flow run.

The decisions live in :class:`._plan.LeaseCall` (no I/O), the shared steps in
:class:`._scope.LeaseScope` and the acquire/release drivers in :mod:`._drive`;
:func:`_run_sync` and :func:`_run_async` only run the body between them (STYLE.md 2).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from prefect import Flow, Task

from prefect_baton.errors import ValidationError
from prefect_baton.prefect._context import BatonLike, RunKind
from prefect_baton.prefect._drive import aacquire, acquire, arelease, release
from prefect_baton.prefect._interrupt import AsyncInterrupt, SyncInterrupt
from prefect_baton.prefect._options import LeaseOptions, OnConflict
from prefect_baton.prefect._scope import LeaseScope

__all__ = ["leased"]

F = TypeVar("F")


def _run_sync(scope: LeaseScope, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    keeper = acquire(scope)
    if keeper is None:
        return scope.skipped()
    with scope.holding(keeper) as held, scope.guarded(held):
        held.result = fn(*args, **kwargs)
    return release(scope, held)


async def _run_async(scope: LeaseScope, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    keeper = await aacquire(scope)
    if keeper is None:
        return scope.skipped()
    with scope.holding(keeper) as held, scope.guarded(held):
        held.result = await fn(*args, **kwargs)
    return await arelease(scope, held)


# ----------------------------------------------------------------------------- decorator


def _wrap(opts: LeaseOptions, fn: Callable[..., Any], prefer: RunKind | None) -> Callable[..., Any]:
    sig = opts.check_function(fn)
    name = fn.__qualname__
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            scope = LeaseScope(opts, name, AsyncInterrupt, prefer=prefer, bound=(sig, args, kwargs))
            return await _run_async(scope, fn, args, kwargs)

        wrapper: Callable[..., Any] = awrapper
    else:

        @functools.wraps(fn)
        def swrapper(*args: Any, **kwargs: Any) -> Any:
            scope = LeaseScope(opts, name, SyncInterrupt, prefer=prefer, bound=(sig, args, kwargs))
            return _run_sync(scope, fn, args, kwargs)

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
    renew_deadline_seconds: float | None = None,
    max_hold_seconds: float | None = None,
) -> Callable[[F], F]:
    """Hold the lease on ``(resource_type, resource_id)`` while a function, task or flow runs.

    Works on sync and async functions (an ``async def`` stays async) and on Prefect tasks and
    flows, placed below ``@task``/``@flow`` (recommended: it wraps the function Prefect runs)
    or above them (it wraps the task's function through ``with_options()``, keeping the
    task's options, hooks and a distinct task key per function).

    Inside a run the lease is acquired under the run identity (see
    :mod:`prefect_baton.prefect._context`): principal = ``principal=``, else the block's
    (``baton="baton/<name>"``), else ``BATON_PREFECT_PRINCIPAL``, else the deployment's full
    name (or the flow name); execution key = task run id (flow run id for flows). So:

    - a Prefect **retry** of the same run replays its own acquire (same ``lease_id`` and
      epoch): when the body fails and Prefect will retry, the lease is kept (not released)
      for the retry; it is released on success, on the final failure and on cancellation.
      If the retry delay outlasts the TTL the lease lapses, and the retry acquires anew.
      If the lease was *transferred* meanwhile (a :func:`handoff_to` the recipient
      accepted), the work is the recipient's: the retry neither acquires nor runs the
      body, and the run ends ``Completed(name="HandedOff")`` naming the resource (and the
      handoff and its recipient, when this process sent it), in whichever process the
      retry runs (the ledger refuses every attempt of the run's execution key once its
      lease was transferred). A flow ending so after a failed attempt returns ``None``
      (the failed attempt's exception is neither re-raised nor logged as the run's end);
    - a *different* run conflicts, even of the same deployment (seed 004 execution keys).

    A heartbeat thread renews the lease every ``ttl_seconds / 3`` for the body's whole
    duration (or up to ``max_hold_seconds``), for sync and async bodies alike. The lease
    counts as lost at the latest at its renew deadline (two thirds of the TTL after the last
    confirmed renewal, by default), a third of the TTL before anyone else can be granted it,
    whatever a blocked renewal is doing. :func:`current_lease` returns it inside the
    body, to pass as ``fence=``.

    Args:
        resource_type: the resource type (``str``, 1..256 characters once filled), or a
            template over the call's parameters, as ``resource_id``.
        resource_id: the resource id, or a template over the call's parameters
            (``"{service}"``, ``"{cfg.name}"``); a field whose value is ``None`` is refused
            at call time (it would lease a resource named ``None``).
        ttl_seconds: lease TTL, integer seconds from 10 to 86,400 (seed service rule).
        purpose: free text kept with the lease (holder-only).
        scopes: write-scope globs (templates allowed); overlapping scopes of another
            principal's effective lease conflict (seed 004).
        on_conflict: ``"raise"`` (default) raises :class:`ConflictError`, whose message
            names the resource and the holder's expiry (Prefect logs it without a
            traceback); ``"skip"`` does not run the body: a Prefect run ends
            ``Completed(name="Skipped")`` with the reason as its state message (the caller
            of a task receives that state, of a flow ``None``) and a plain call returns
            ``None``; ``"cancel"`` is ``"skip"`` ending the run ``Cancelled``; ``"wait"``
            retries with jittered exponential backoff (0.25 s doubling to 5 s) until
            ``wait_timeout_seconds`` (``None``: no limit), then raises
            :class:`ConflictError`. Waiting, skipping and a lost lease are logged to the
            run's logs.
        wait_timeout_seconds: seconds to wait with ``on_conflict="wait"``.
        cancel_on_loss: when the lease is lost, interrupt the body: an async body is
            cancelled; a sync body gets an asynchronous exception at its next Python
            bytecode (a blocking C call finishes first). Either way the call raises
            :class:`LeaseLostError`.
        baton: a :class:`~prefect_baton.Baton` (used as given, or as ``principal`` when
            that is given), a factory ``principal -> Baton`` called with the principal,
            ``"baton/<block name>"`` (a saved :class:`BatonBlock`, loaded once per process),
            or ``None`` for ``Baton.from_settings()`` (``BATON_*`` environment, one client
            per process) acting as the principal.
        principal: the principal to act as (``str``), instead of the run's default.
        renew_deadline_seconds: seconds (``float``, below the TTL; default two thirds of it)
            after the last confirmed renewal was sent at which the lease counts as lost
            (``cancel_on_loss`` then interrupts the body).
        max_hold_seconds: stop renewing this many seconds (``float``) after the grant
            (default: no cap); the lease is then lost at its renew deadline.

    Raises:
        ValidationError: when applied, for a bad TTL, option combination or a template
            naming a parameter the function lacks (the message names the function).
        At call time: :class:`NotFoundError` (``baton="baton/<name>"`` and the Prefect
        API has no such Baton block), :class:`ValidationError` (a block reference outside a
        run without ``PREFECT_API_URL``, or a template field whose value is ``None``: the
        message names the template and the parameter; nothing is leased),
        :class:`ConflictError` (``raise``, or ``wait`` timed out),
        :class:`LeaseLostError` (the lease was lost during the body: renewal answered
        ``LEASE_LOST`` or the TTL passed without a renewal; raised at the latest when the
        body returns), and what the body raises.
    """
    opts = LeaseOptions(
        resource_type,
        resource_id,
        ttl_seconds=ttl_seconds,
        purpose=purpose,
        scopes=scopes,
        on_conflict=on_conflict,
        wait_timeout_seconds=wait_timeout_seconds,
        cancel_on_loss=cancel_on_loss,
        baton=baton,
        principal=principal,
        renew_deadline_seconds=renew_deadline_seconds,
        max_hold_seconds=max_hold_seconds,
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
