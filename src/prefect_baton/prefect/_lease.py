"""``with lease(...)`` / ``async with lease(...)``: ``@leased`` for a block of code.

The block runs on the same :class:`~prefect_baton.prefect._scope.LeaseScope` steps and
:mod:`~prefect_baton.prefect._drive` drivers as ``@leased``: run identity, execution key
from the task or flow run, :func:`current_lease`, Prefect events, a lease kept for a Prefect
retry (which replays it), ``on_conflict`` and ``cancel_on_loss``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import Any

from prefect_baton._client.keeper import EnterOnce, LeaseKeeper
from prefect_baton.prefect._context import BatonLike
from prefect_baton.prefect._drive import aacquire, acquire, arelease, release
from prefect_baton.prefect._interrupt import AsyncInterrupt, Interrupt, SyncInterrupt
from prefect_baton.prefect._options import LeaseOptions, OnConflict
from prefect_baton.prefect._scope import Held, LeaseScope

__all__ = ["LeaseBlock", "lease"]

_NAME = "the lease block"


class LeaseBlock:
    """One ``with lease(...)`` block (single use; see :func:`lease`).

    Entering it acquires the lease and returns the running :class:`LeaseKeeper` (pass it
    as ``fence=``), or ``None`` when ``on_conflict`` is ``"skip"`` or ``"cancel"`` and the
    resource is taken, or in a Prefect retry whose previous attempt's lease was
    transferred (handed off): the body then runs with ``None`` and should return at once,
    for example ``return block.skip_state``.

    Attributes:
        options: the validated :class:`LeaseOptions`.
        skipped: ``True`` when the block was entered without the lease (``bool``).
        skip_message: why, naming the resource and the holder's expiry (``str`` or ``None``).
        skip_state: inside a Prefect run, the state to return from the task or flow so the
            run ends ``Completed(name="Skipped")`` (``"skip"``), ``Cancelled``
            (``"cancel"``) or ``Completed(name="HandedOff")`` (a retry after the lease was
            transferred) with ``skip_message``; ``None`` otherwise.

    Raises:
        ValidationError: ``options.resource_type`` holds ``{`` or ``}`` (no templates).
    """

    def __init__(self, options: LeaseOptions) -> None:
        options.check_literal("lease()")  # nothing fills templates here
        self.options = options
        self.skipped = False
        self.skip_message: str | None = None
        self.skip_state: Any = None
        self._scope: LeaseScope | None = None
        self._held: Held | None = None
        self._stack = ExitStack()
        self._once = EnterOnce("lease")

    def _begin(self, guard_type: type[Interrupt]) -> LeaseScope:
        self._once.enter()
        self._scope = LeaseScope(self.options, _NAME, guard_type)
        return self._scope

    def _hold(self, scope: LeaseScope, keeper: LeaseKeeper | None) -> LeaseKeeper | None:
        if keeper is None:
            self.skipped = True
            self.skip_message = scope.skip_message
            self.skip_state = scope.skipped()
            return None
        self._held = held = self._stack.enter_context(scope.holding(keeper))
        self._stack.enter_context(scope.guarded(held))
        return keeper

    def _unwind(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> tuple[LeaseScope, Held] | None:
        """Leave the body's contexts (they record how it ended); ``None`` when skipped."""
        if self._held is None or self._scope is None:
            return None
        self._stack.__exit__(et, exc, tb)
        return self._scope, self._held

    def __enter__(self) -> LeaseKeeper | None:
        scope = self._begin(SyncInterrupt)
        return self._hold(scope, acquire(scope))

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if (ending := self._unwind(et, exc, tb)) is not None:
            with _letting_through(exc):
                release(*ending)

    async def __aenter__(self) -> LeaseKeeper | None:
        scope = self._begin(AsyncInterrupt)
        return self._hold(scope, await aacquire(scope))

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if (ending := self._unwind(et, exc, tb)) is not None:
            with _letting_through(exc):
                await arelease(*ending)


@contextmanager
def _letting_through(exc: BaseException | None) -> Iterator[None]:
    """Swallow ``exc`` (the block's own exception, re-raised by the release step) so that
    ``__exit__`` returning lets the original propagate unchanged; raise anything else."""
    try:
        yield
    except BaseException as raised:
        if raised is not exc:
            raise


def lease(
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
) -> LeaseBlock:
    """Hold the lease on ``(resource_type, resource_id)`` for a ``with`` or ``async with``
    block, inside a Prefect task or flow run or outside Prefect.

    It behaves as :func:`leased` does for a function (see there for every argument): inside
    a run the lease is acquired under the run identity (principal, and the task run id or
    flow run id as execution key), :func:`current_lease` returns it in the block, Prefect
    events are emitted, and when the block fails and Prefect will retry the run the lease
    is kept for the retry, which replays it (same ``lease_id`` and epoch), or, if the lease
    was transferred meanwhile (handed off), is entered with ``None`` and
    ``block.skip_state`` ``Completed(name="HandedOff")``. Outside a run the
    principal is ``BATON_PRINCIPAL`` (or ``principal=``) and each block a new execution.

    ``resource_type``, ``resource_id`` and ``scopes`` are used as given (no templates:
    format them yourself); a ``resource_type`` holding ``{`` or ``}`` is refused.
    One run may hold the same resource in several blocks one after the other: each later
    block acquires it anew under the run's key (a new generation with a higher epoch; a
    conflict if someone else took it meanwhile), unless an earlier block handed it off
    (``LEASE_LOST`` on entering, pending handoff or accepted: the work is the
    recipient's). A block nested in
    a block on the same resource of the same run is refused on entering
    (``VALIDATION_ERROR`` naming the resource): use the enclosing block's lease.

    With ``on_conflict="skip"`` or ``"cancel"`` a taken resource does not raise: the block
    is entered with ``None`` instead of the lease, the reason is logged (to the run's
    logs inside a run), and ``block.skip_state`` is the state to return from the task or
    flow (``Completed(name="Skipped")`` or ``Cancelled``)::

        block = lease("deploy", service, ttl_seconds=60, on_conflict="skip")
        with block as held:
            if held is None:
                return block.skip_state
            ...

    Args:
        resource_type, resource_id: the resource (``str``, 1..256 characters each).
        ttl_seconds: lease TTL, integer seconds from 10 to 86,400 (renewed every third).
        purpose, scopes, on_conflict, wait_timeout_seconds, cancel_on_loss, baton,
            principal, renew_deadline_seconds, max_hold_seconds: as for :func:`leased`.

    Returns:
        A single-use :class:`LeaseBlock`; ``with`` / ``async with`` it.

    Raises:
        ValidationError: at once, for a bad id (or ``{``/``}`` in ``resource_type``), TTL,
        option mix or ``baton``; on entering, for a block nested in a block of the same run
        on the same resource. On entering:
        :class:`ConflictError` (``raise``, or ``wait`` timed out; the message names the
        resource and the holder's expiry), what acquiring raises. On leaving:
        :class:`LeaseLostError` (lost during the block), or what the block raised.
    """
    return LeaseBlock(
        LeaseOptions(
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
    )
