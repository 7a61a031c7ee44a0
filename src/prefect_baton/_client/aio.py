"""The asynchronous client: :class:`AsyncBaton` and its operation groups.

Every operation of :class:`~prefect_baton.Baton` is here a coroutine with the same
signature: :func:`_to_async` turns a sync method into an ``async def`` that runs it on a
worker thread (anyio), so the class bodies below only name the sync methods they mirror and
the type checker sees their real parameters (a misspelt keyword is an error, as on
:class:`Baton`).

Only this module imports :mod:`prefect_baton._client.sync`, never the other way round.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import anyio.to_thread

from prefect_baton._client.api_base import _Identity
from prefect_baton._client.leases import LeaseAPI
from prefect_baton._client.records import CheckpointAPI, EventAPI, HandoffAPI, OutcomeAPI
from prefect_baton._client.sync import Baton

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


def _parameters_of(
    source: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """For the type checker: a decorator that gives a method the parameters of the method
    ``source`` (``self`` aside), e.g. an ``@overload`` of :meth:`AsyncBaton.__init__` taking
    :class:`Baton`'s. At run time it returns the method unchanged."""

    def apply(method: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        return method

    return apply


class _Wrapper(Generic[S]):
    """Base of the async objects: holds the sync object (``sync``) whose methods the
    async ones run on worker threads."""

    sync: S

    def __init__(self, sync: S) -> None:
        self.sync = sync


def _to_async(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[_Wrapper[S], P], Coroutine[Any, Any, R]]:
    """The coroutine version of a sync ``method``, for the class body of a
    :class:`_Wrapper` of the sync class.

    Awaiting it calls the method of that name on ``self.sync`` (so a subclass's override
    runs) on an anyio worker thread, so the blocking database or HTTP call does not hold the
    event loop. Parameters, docstring and :func:`inspect.signature` are the sync method's
    (``functools.wraps``); the result and the errors raised are the sync method's too.
    """
    name = method.__name__

    @functools.wraps(method)
    async def call(self: _Wrapper[S], /, *args: P.args, **kwargs: P.kwargs) -> R:
        bound: Callable[P, R] = getattr(self.sync, name)
        return await anyio.to_thread.run_sync(functools.partial(bound, *args, **kwargs))

    return call


def _delegate(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[_Wrapper[S], P], R]:
    """A plain (non-blocking) sync ``method``, called by name on ``self.sync`` in the
    caller's thread, with the same signature and docstring (e.g. :meth:`Baton.lease`, which
    only builds the lease block)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: _Wrapper[S], /, *args: P.args, **kwargs: P.kwargs) -> R:
        bound: Callable[P, R] = getattr(self.sync, name)
        return bound(*args, **kwargs)

    return call


class AsyncLeaseAPI(_Wrapper[LeaseAPI]):
    """Lease operations of an :class:`AsyncBaton` (``ab.leases``): the methods of
    :class:`~prefect_baton.LeaseAPI` as coroutines, with the same arguments, results and
    errors (``ConflictError``, ``LeaseLostError``, ``ValidationError`` ...).

    Args:
        sync: the :class:`~prefect_baton.LeaseAPI` whose methods run on worker threads.
    """

    acquire = _to_async(LeaseAPI.acquire)
    acquire_many = _to_async(LeaseAPI.acquire_many)
    renew = _to_async(LeaseAPI.renew)
    transfer = _to_async(LeaseAPI.transfer)
    release = _to_async(LeaseAPI.release)
    release_by_id = _to_async(LeaseAPI.release_by_id)
    force_release = _to_async(LeaseAPI.force_release)
    inspect = _to_async(LeaseAPI.inspect)
    get = _to_async(LeaseAPI.get)
    report_expired = _to_async(LeaseAPI.report_expired)
    list = _to_async(LeaseAPI.list)


class AsyncCheckpointAPI(_Wrapper[CheckpointAPI]):
    """Checkpoints of an :class:`AsyncBaton` (``ab.checkpoints``): the methods of
    :class:`~prefect_baton.CheckpointAPI` as coroutines, with the same arguments, results
    and errors (``VersionConflictError``, ``StaleFenceError``, ``NotFoundError`` ...).

    Args:
        sync: the :class:`~prefect_baton.CheckpointAPI` whose methods run on worker threads.
    """

    save = _to_async(CheckpointAPI.save)
    get = _to_async(CheckpointAPI.get)
    get_by_id = _to_async(CheckpointAPI.get_by_id)
    history = _to_async(CheckpointAPI.history)
    delete = _to_async(CheckpointAPI.delete)


class AsyncHandoffAPI(_Wrapper[HandoffAPI]):
    """Handoffs of an :class:`AsyncBaton` (``ab.handoffs``): the methods of
    :class:`~prefect_baton.HandoffAPI` as coroutines, with the same arguments, results and
    errors (``NotFoundError``, ``ForbiddenError``, ``LeaseLostError`` ...).

    Args:
        sync: the :class:`~prefect_baton.HandoffAPI` whose methods run on worker threads.
    """

    create = _to_async(HandoffAPI.create)
    inbox = _to_async(HandoffAPI.inbox)
    list = _to_async(HandoffAPI.list)
    get = _to_async(HandoffAPI.get)
    resolve = _to_async(HandoffAPI.resolve)


class AsyncOutcomeAPI(_Wrapper[OutcomeAPI]):
    """Outcomes of an :class:`AsyncBaton` (``ab.outcomes``): the methods of
    :class:`~prefect_baton.OutcomeAPI` as coroutines, with the same arguments, results and
    errors (``ValidationError``, ``StaleFenceError``, ``NotFoundError`` ...).

    Args:
        sync: the :class:`~prefect_baton.OutcomeAPI` whose methods run on worker threads.
    """

    record = _to_async(OutcomeAPI.record)
    list = _to_async(OutcomeAPI.list)


class AsyncEventAPI(_Wrapper[EventAPI]):
    """The event stream of an :class:`AsyncBaton` (``ab.events``): the methods of
    :class:`~prefect_baton.EventAPI` as coroutines (``ValidationError`` on bad input).

    Args:
        sync: the :class:`~prefect_baton.EventAPI` whose methods run on worker threads.
    """

    list = _to_async(EventAPI.list)


class AsyncBaton(_Wrapper[Baton], _Identity):
    """The asynchronous client: the operations of :class:`Baton` as coroutines
    (``await ab.leases.acquire(...)``), with the same arguments, results and errors, and
    ``async with ab.lease(...)``.

    Blocking database (or HTTP) calls run on worker threads (anyio), so the event loop
    stays free; the lease block's heartbeat runs on a thread of its own. ``ab.sync`` is the
    :class:`Baton` underneath. ``async with AsyncBaton(...) as ab:`` closes it on exit (as
    :meth:`aclose`).

    Args:
        ledger_url, org, principal, role, settings, store, redis_url, ack,
            lease_authority, api_url, api_key: as :class:`Baton`, whose parameters these
            are (``api_url``/``api_key`` run every operation through the REST API).
        sync: a :class:`Baton` to wrap instead of building one (given alone).

    Raises:
        ValidationError: a bad ``BATON_*`` variable, id, role, URL, key or ``ack``; or both
            ``api_url`` and a ledger (as :class:`Baton`).
        UnavailableError: the ledger (or the REST API) cannot be reached.
        ForbiddenError: ``org``/``principal``/``role`` disagree with the API key's.

    Example::

        async with AsyncBaton(org="acme", principal="agent-a") as ab:
            async with ab.lease("deploy", "checkout-service", ttl_seconds=60) as held:
                await ab.checkpoints.save("checkout-service", "plan", {"step": 1}, fence=held)
    """

    @overload
    def __init__(self, *, sync: Baton) -> None: ...

    @overload
    @_parameters_of(Baton.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def __init__(self, *args: Any, sync: Baton | None = None, **kwargs: Any) -> None:
        if sync is None:
            sync = Baton(*args, **kwargs)
        super().__init__(sync)
        self.caller = sync.caller
        self.leases = AsyncLeaseAPI(sync.leases)
        self.checkpoints = AsyncCheckpointAPI(sync.checkpoints)
        self.handoffs = AsyncHandoffAPI(sync.handoffs)
        self.outcomes = AsyncOutcomeAPI(sync.outcomes)
        self.events = AsyncEventAPI(sync.events)

    @classmethod
    def from_settings(cls, **overrides: Any) -> AsyncBaton:
        """As :meth:`Baton.from_settings`: a client from ``BATON_*`` environment variables,
        keyword arguments overriding individual settings."""
        return cls(sync=Baton.from_settings(**overrides))

    def as_principal(self, principal: str, role: str = "agent") -> AsyncBaton:
        """Another identity of the same org sharing this client's connections (as
        :meth:`Baton.as_principal`).

        Raises:
            ValidationError: ``principal`` or ``role`` is not valid.
            ForbiddenError: a remote client (``api_url``).
        """
        return AsyncBaton(sync=self.sync.as_principal(principal, role))

    lease = _delegate(Baton.lease)
    prune_receipts = _to_async(Baton.prune_receipts)

    async def aclose(self) -> None:
        """Close the wrapped :class:`Baton` (:meth:`Baton.close`: its ledger connections,
        and the Redis authority or REST connection pool it created) on a worker thread."""
        await anyio.to_thread.run_sync(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
