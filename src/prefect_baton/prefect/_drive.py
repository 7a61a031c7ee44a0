"""The two thin drivers of :class:`~prefect_baton.prefect._scope.LeaseScope`: they only
start and stop the keeper and sleep between attempts (blocking or awaiting), around the very
same steps (STYLE.md 2). ``@leased`` runs its body between :func:`acquire` and
:func:`release` (or their async twins); ``with lease(...)`` calls them from its enter and
exit methods."""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.to_thread

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton.errors import BatonError, LeaseLostError
from prefect_baton.prefect._scope import Held, LeaseScope

__all__ = ["aacquire", "acquire", "arelease", "release"]


def acquire(scope: LeaseScope) -> LeaseKeeper | None:
    """Acquire as the plan says (sleeping while ``on_conflict="wait"`` waits): the started
    keeper, or ``None`` when the plan skips the body (then use :meth:`LeaseScope.skipped`).

    Raises:
        BatonError: what :meth:`LeaseScope.acquire_failed` raises.
    """
    while (keeper := scope.attempt()) is not None:
        try:
            keeper.start()
        except BatonError as exc:
            if (step := scope.acquire_failed(exc)) is not None:
                time.sleep(step.seconds)
            continue
        return keeper
    return None


async def aacquire(scope: LeaseScope) -> LeaseKeeper | None:
    """:func:`acquire` for async code (the ledger calls run on a worker thread)."""
    while (keeper := scope.attempt()) is not None:
        try:
            await anyio.to_thread.run_sync(keeper.start)
        except BatonError as exc:
            if (step := scope.acquire_failed(exc)) is not None:
                await anyio.sleep(step.seconds)
            continue
        return keeper
    return None


def release(scope: LeaseScope, held: Held) -> Any:
    """Stop the keeper (release, or keep for a Prefect retry), then return the body's result
    or raise what it raised (see :meth:`LeaseScope.finish`).

    Raises:
        LeaseLostError: the lease was lost during the body. What the body raised.
    """
    try:
        held.slot.keeper.stop(held.failure)
    except LeaseLostError:
        scope.check_interrupted(held)
        raise
    return scope.finish(held)


async def arelease(scope: LeaseScope, held: Held) -> Any:
    """:func:`release` for async code."""
    try:
        await anyio.to_thread.run_sync(held.slot.keeper.stop, held.failure)
    except LeaseLostError:
        scope.check_interrupted(held)
        raise
    return scope.finish(held)
