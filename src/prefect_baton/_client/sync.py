"""The synchronous Python surface: :class:`Baton` (the coroutine client, ``AsyncBaton``,
wraps it in :mod:`prefect_baton._client.aio`).

:class:`Baton` picks the backend (ledger, Redis authority or REST API) and carries the
operation groups: :class:`~prefect_baton._client.leases.LeaseAPI` (``b.leases``) and the
record APIs of :mod:`prefect_baton._client.records`. Each operation validates its input first
(a bad request raises :class:`ValidationError` and writes nothing), then hands one atomic
operation to the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._rules import core as _core
from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton._stores.ledger.store import Fence, LedgerStore
from prefect_baton._stores.protocol import Caller, LeaseAuthority
from prefect_baton.errors import ForbiddenError, ValidationError

if TYPE_CHECKING:
    from prefect_baton._stores.redis.authority import RedisAuthority
    from prefect_baton._stores.rest.client import RemoteBackend
from prefect_baton._client.api_base import (
    CHECKPOINT_TTL_MAX_SECONDS,
    HANDOFF_RESOLUTIONS,
    OUTCOME_STATUSES,
    FenceLike,
    LeaseLike,
    RecordStore,
    _fence_of,
    _lease_of,
)
from prefect_baton._client.leases import LeaseAPI
from prefect_baton._client.records import CheckpointAPI, EventAPI, HandoffAPI, OutcomeAPI


class Baton:
    """The synchronous client.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (default ``BATON_LEDGER_URL`` or a SQLite
            file ``./.baton/ledger.db``).
        org: organization id (default ``BATON_ORG`` or ``default``).
        principal: acting identity (default ``BATON_PRINCIPAL`` or ``user@host``);
            registered on first use.
        role: ``agent`` (default), ``owner`` or ``admin``.
        settings: a :class:`BatonSettings` to take the defaults from.
        redis_url: Redis URL of the lease authority (default ``BATON_REDIS_URL``; none: the
            ledger is the authority and nothing about Redis applies).
        ack: with Redis, ``"redis"`` (default, ``BATON_REDIS_ACK``: a call returns once
            Redis has the transition; a thread drains the journal into the ledger) or
            ``"ledger"`` (a call returns once the ledger has it).
        lease_authority: an authority to share (e.g. a
            :class:`~prefect_baton._stores.redis.authority.RedisAuthority`); overrides
            ``redis_url``.
        api_url: base URL of the REST API (``str``, e.g. ``http://127.0.0.1:8787``; default
            ``BATON_API_URL`` when no ``ledger_url``, ``store``, ``redis_url`` or
            ``lease_authority`` is given). Every operation then runs through the API over
            HTTP (httpx, one connection pool, ``BATON_API_TIMEOUT_SECONDS`` per request),
            with the same results and errors; no ledger or Redis is opened here.
        api_key: the bearer key for ``api_url`` (``str``; default ``BATON_API_KEY``). It
            decides org, principal and role (asked once, ``GET /v1/me``); an explicit
            ``org``, ``principal`` or ``role`` that differs from the key's raises
            :class:`ForbiddenError`. The key never appears in logs, reprs or messages.

    A remote client (``api_url``) cannot mint identities: :meth:`as_principal` raises
    :class:`ForbiddenError` (make a key per identity instead), so does
    :meth:`prune_receipts` (an operator task on the ledger), and :attr:`store` does not
    exist. Connection failures and timeouts raise :class:`UnavailableError`, a refused key
    ``UNAUTHENTICATED`` (:class:`prefect_baton.errors.UnauthenticatedError`).

    With Redis as the authority, the ledger-backed writes that carry a lease keep their
    guarantees: a fenced checkpoint save or outcome record checks the lease against Redis
    inside its ledger transaction, holding the resource's ledger lock, so fenced writes of a
    resource are judged and committed one at a time and a stale generation is refused
    (``STALE_FENCE``); accepting a lease-carrying handoff transfers the lease in Redis and
    records the acceptance in the ledger through the journal, so that a crash at any point
    ends in (pending, sender holds) or (accepted, recipient holds) (see
    :mod:`prefect_baton._stores.redis.handoffs`). Other ledger operations first drain the journal,
    so they see this client's own lease transitions.

    Raises:
        ValidationError: a bad ``BATON_*`` variable; a bad id, role, URL, key or ``ack``;
            or both ``api_url`` and a ledger.
        UnavailableError: the ledger (or the REST API) cannot be reached.
        ForbiddenError: ``org``/``principal``/``role`` disagree with the API key's.

    Example::

        b = Baton(org="acme", principal="agent-a")
        remote = Baton(api_url="http://127.0.0.1:8787", api_key="bk_...")
        with b.lease("deploy", "checkout-service", ttl_seconds=60) as held:
            ...  # pass fence=held to checkpoint/outcome writes
    """

    def __init__(
        self,
        ledger_url: str | None = None,
        org: str | None = None,
        principal: str | None = None,
        role: str | None = None,
        *,
        settings: BatonSettings | None = None,
        store: LedgerStore | None = None,
        redis_url: str | None = None,
        ack: str | None = None,
        lease_authority: LeaseAuthority | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        s = settings or load_settings()
        self.settings = s
        self._ledger: LedgerStore | None = None
        self._owns_authority = False
        remote = self._remote_of(
            s, api_url, api_key, local=(ledger_url, store, redis_url, lease_authority)
        )
        if remote is not None:
            owned = remote is not lease_authority
            self._init_remote(remote, org, principal, role, owned=owned)
            return
        self.caller = Caller(
            org=_core.validate_id("org", s.org if org is None else org),
            principal=_core.validate_id(
                "principal", s.principal if principal is None else principal
            ),
            role=_core.validate_role(s.role if role is None else role),
        )
        url = redis_url or (s.redis_url.get_secret_value() if s.redis_url else None)
        redis_options: dict[str, Any] = {}
        if lease_authority is None and url:
            from prefect_baton._stores.redis.base import options_from

            # refused before a ledger file is created or opened
            redis_options = options_from(s, ack=ack)
        self._ledger = store or LedgerStore(
            ledger_url or s.ledger_url,
            receipt_retention_seconds=s.receipt_retention_seconds,
            state_max_bytes=s.state_max_bytes,
        )
        self._records: RecordStore = self._ledger
        self.authority: LeaseAuthority = lease_authority or self._ledger
        if lease_authority is None and url:
            from prefect_baton._stores.redis.authority import RedisAuthority

            try:
                self.authority = RedisAuthority.from_url(url, self.store, **redis_options)
            except BaseException as exc:
                if store is None:  # the ledger this call opened
                    self._ledger.close()
                if isinstance(exc, ValueError):  # redis-py's verdict on a malformed URL
                    raise ValidationError(f"bad Redis URL: {exc}") from None
                raise
            self._owns_authority = True
        self._apis()

    def _apis(self) -> None:
        self.leases = LeaseAPI(self)
        self.checkpoints = CheckpointAPI(self)
        self.handoffs = HandoffAPI(self)
        self.outcomes = OutcomeAPI(self)
        self.events = EventAPI(self)

    @staticmethod
    def _remote_of(
        s: BatonSettings,
        api_url: str | None,
        api_key: str | None,
        *,
        local: tuple[object, ...],
    ) -> RemoteBackend | None:
        """The REST backend this client runs on, or ``None`` for a local client."""
        authority = local[3]
        if getattr(authority, "_baton_remote", False):
            if api_url is not None or api_key is not None:
                raise ValidationError("pass either a remote lease_authority or api_url/api_key")
            return cast("RemoteBackend", authority)
        if api_url is None and any(x is not None for x in local):
            if api_key is not None:
                raise ValidationError("api_key needs api_url (a REST API), not a ledger")
            return None
        if api_url is not None and any(x is not None for x in local):
            raise ValidationError(
                "api_url runs every operation through the REST API; do not also pass "
                "ledger_url, store, redis_url or lease_authority"
            )
        url = api_url if api_url is not None else s.api_url
        if url is None:
            if api_key is not None:
                raise ValidationError("api_key needs api_url (a REST API), not a ledger")
            return None
        key = api_key if api_key is not None else s.api_key
        if key is None:
            raise ValidationError("api_url needs an api_key (or BATON_API_KEY)")
        try:
            from prefect_baton._stores.rest.client import RemoteBackend
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise ValidationError("api_url needs httpx: install prefect-baton[rest]") from None
        return RemoteBackend(url, key, timeout_seconds=s.api_timeout_seconds)

    def _init_remote(
        self,
        remote: RemoteBackend,
        org: str | None,
        principal: str | None,
        role: str | None,
        *,
        owned: bool,
    ) -> None:
        self._owns_authority = owned
        try:
            me = remote.identity()
            for name, given, actual in (
                ("org", org, me.org),
                ("principal", principal, me.principal),
                ("role", role, me.role),
            ):
                if given is not None and given != actual:
                    raise ForbiddenError(
                        f"the API key acts as {name} {actual!r}, not {given!r}; a remote "
                        f"client's identity is its key's"
                    )
        except BaseException:
            if owned:
                remote.close()
            raise
        self.caller = Caller(org=me.org, principal=me.principal, role=me.role)
        self._records = remote
        self.authority = remote
        self._apis()

    @classmethod
    def from_settings(cls, **overrides: Any) -> Baton:
        """Build a client from ``BATON_*`` environment variables; keyword arguments
        override individual settings (``org=``, ``principal=``, ``ledger_url=`` ...)."""
        return cls(settings=load_settings(**overrides))

    @property
    def org(self) -> str:
        return self.caller.org

    @property
    def principal(self) -> str:
        return self.caller.principal

    @property
    def role(self) -> str:
        return self.caller.role

    @property
    def store(self) -> LedgerStore:
        """The ledger store of a local client.

        Raises:
            ForbiddenError: a remote client (``api_url``) has no ledger store.
        """
        if self._ledger is None:
            raise ForbiddenError(
                "a REST API client (api_url) has no ledger store; its operations run "
                "through the API"
            )
        return self._ledger

    def as_principal(self, principal: str, role: str = "agent") -> Baton:
        """Another identity of the same org sharing this client's ledger connections.

        Raises:
            ValidationError: ``principal`` or ``role`` is not valid (``None`` included).
            ForbiddenError: a remote client (``api_url``): its identity is its API key's,
                so it cannot act as anyone else; create a key for that identity
                (``baton keys create``) and a client with it.
        """
        _core.validate_id("principal", principal)
        _core.validate_role(role)
        if self._remote is not None:
            raise ForbiddenError(
                "a REST API client cannot act as another principal: its identity is its API "
                "key's; use a key created for that principal"
            )
        return Baton(
            org=self.org,
            principal=principal,
            role=role,
            settings=self.settings,
            store=self.store,
            lease_authority=self.authority,
        )

    def lease(
        self,
        resource_type: str,
        resource_id: str,
        *,
        ttl_seconds: int,
        purpose: str | None = None,
        scopes: Iterable[str] = (),
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        renew_every_seconds: float | None = None,
        on_lost: Callable[[LeaseKeeper], Any] | None = None,
    ) -> LeaseKeeper:
        """A lease held for a ``with`` / ``async with`` block, renewed in the background
        (every ``ttl_seconds / 3`` by default) and released on exit.

        Raises on enter what :meth:`LeaseAPI.acquire` raises; on exit
        :class:`LeaseLostError` if the lease was lost meanwhile (``held.lost`` turns true as
        soon as that is known, and ``on_lost(held)`` is called).
        """
        return LeaseKeeper(
            self.leases,
            resource_type,
            resource_id,
            ttl_seconds=ttl_seconds,
            purpose=purpose,
            scopes=tuple(scopes),
            expected_version=expected_version,
            idempotency_key=idempotency_key,
            renew_every_seconds=renew_every_seconds,
            on_lost=on_lost,
        )

    def prune_receipts(self) -> int:
        """Delete idempotency receipts older than the retention; returns the count.

        Raises:
            ForbiddenError: on a remote client (``api_url``): not offered over REST.
        """
        return self._records.prune_receipts(self.caller)

    @property
    def _redis(self) -> RedisAuthority | None:
        if getattr(self.authority, "_baton_redis", False):
            return cast("RedisAuthority", self.authority)
        return None

    @property
    def _remote(self) -> RemoteBackend | None:
        if getattr(self.authority, "_baton_remote", False):
            return cast("RemoteBackend", self.authority)
        return None

    def _ledger_barrier(self) -> None:
        redis_ = self._redis
        if redis_ is not None:
            redis_.sync_ledger(self.caller.org)

    def _fence(self, fence: object) -> Fence | None:
        """The store's fence for ``fence``; with Redis as the authority it carries the
        resource (whose ledger lock serialises fenced writes) and a check that reads the
        generation from Redis inside the write transaction."""
        plain = _fence_of(fence)
        redis_ = self._redis
        if plain is None or redis_ is None:
            return plain
        lease = _lease_of(fence)
        resource = (lease.resource_type, lease.resource_id)
        caller = self.caller
        redis_.ensure_ready(caller.org)
        return Fence(
            plain.lease_id,
            plain.epoch,
            resource,
            lambda: redis_.fence_check(caller, plain.lease_id, resource),
        )

    def close(self) -> None:
        """Close the ledger connections (and the Redis authority or REST connection pool
        this client created)."""
        remote = self._remote
        if remote is not None:
            if self._owns_authority:
                remote.close()
            return
        if self._owns_authority:
            redis_ = self._redis
            if redis_ is not None:
                redis_.close()
        self.store.close()

    def __enter__(self) -> Baton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CHECKPOINT_TTL_MAX_SECONDS",
    "HANDOFF_RESOLUTIONS",
    "OUTCOME_STATUSES",
    "Baton",
    "CheckpointAPI",
    "EventAPI",
    "FenceLike",
    "HandoffAPI",
    "LeaseAPI",
    "LeaseLike",
    "OutcomeAPI",
]
