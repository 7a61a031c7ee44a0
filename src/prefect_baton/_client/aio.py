"""The asynchronous client: :class:`AsyncBaton`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._settings import BatonSettings

if TYPE_CHECKING:
    pass
from prefect_baton._client.sync import Baton


class _AsyncAPI:
    """Runs the wrapped sync API's methods on a worker thread, as coroutines."""

    def __init__(self, api: object) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._api, name)
        if not callable(fn):
            return fn  # type: ignore[no-any-return]

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

        return call


class AsyncBaton:
    """The asynchronous client: the same methods as :class:`Baton`, as coroutines
    (``await ab.leases.acquire(...)``), and ``async with ab.lease(...)``.

    Blocking database (or HTTP) calls run on worker threads (anyio), so the event loop
    stays free. Arguments as :class:`Baton` (``api_url``/``api_key`` run it through the REST
    API); ``sync`` wraps an existing :class:`Baton` instead.
    """

    def __init__(
        self,
        ledger_url: str | None = None,
        org: str | None = None,
        principal: str | None = None,
        role: str | None = None,
        *,
        settings: BatonSettings | None = None,
        sync: Baton | None = None,
        redis_url: str | None = None,
        ack: str | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.sync = sync or Baton(
            ledger_url,
            org,
            principal,
            role,
            settings=settings,
            redis_url=redis_url,
            ack=ack,
            api_url=api_url,
            api_key=api_key,
        )
        self.leases: Any = _AsyncAPI(self.sync.leases)
        self.checkpoints: Any = _AsyncAPI(self.sync.checkpoints)
        self.handoffs: Any = _AsyncAPI(self.sync.handoffs)
        self.outcomes: Any = _AsyncAPI(self.sync.outcomes)
        self.events: Any = _AsyncAPI(self.sync.events)

    @classmethod
    def from_settings(cls, **overrides: Any) -> AsyncBaton:
        """As :meth:`Baton.from_settings`."""
        return cls(sync=Baton.from_settings(**overrides))

    @property
    def org(self) -> str:
        return self.sync.org

    @property
    def principal(self) -> str:
        return self.sync.principal

    def as_principal(self, principal: str, role: str = "agent") -> AsyncBaton:
        """Another identity of the same org sharing this client's connections (as
        :meth:`Baton.as_principal`; ``FORBIDDEN`` on a REST API client)."""
        return AsyncBaton(sync=self.sync.as_principal(principal, role))

    def lease(self, resource_type: str, resource_id: str, **kwargs: Any) -> LeaseKeeper:
        """As :meth:`Baton.lease`; use with ``async with``."""
        return self.sync.lease(resource_type, resource_id, **kwargs)

    async def aclose(self) -> None:
        """Close the ledger connections (or the REST connection pool)."""
        await anyio.to_thread.run_sync(self.sync.close)
