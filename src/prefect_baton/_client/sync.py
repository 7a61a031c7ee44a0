"""The synchronous Python surface: :class:`Baton` (:class:`~prefect_baton._client.aio.AsyncBaton`
wraps it).

:class:`Baton` opens its stores (ledger, Redis authority or REST API) with
:func:`prefect_baton._stores.factory.open_stores` and carries the
operation groups: :class:`~prefect_baton._client.leases.LeaseAPI` (``b.leases``) and the
record APIs of :mod:`prefect_baton._client.records`. Each operation validates its input first
(a bad request raises :class:`ValidationError` and writes nothing), then hands one atomic
operation to the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from prefect_baton._client.api_base import (
    HANDOFF_RESOLUTIONS,
    OUTCOME_STATUSES,
    FenceLike,
    LeaseLike,
    _fence_lease,
    _Identity,
)
from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._client.leases import AcquireKeywords, LeaseAPI
from prefect_baton._client.records import CheckpointAPI, EventAPI, HandoffAPI, OutcomeAPI
from prefect_baton._ids import random_uuid4_hex
from prefect_baton._rules import core as _core
from prefect_baton._rules.validation import CHECKPOINT_TTL_MAX_SECONDS
from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton._stores.factory import open_stores
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import Caller, Fence, LeaseAuthority, RecordStore
from prefect_baton.errors import ForbiddenError


class Baton(_Identity):
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
        stores = open_stores(
            ledger_url,
            redis_url,
            settings=s,
            ack=ack,
            store=store,
            lease_authority=lease_authority,
            api_url=api_url,
            api_key=api_key,
            identity=(org, principal, role),
        )
        assert stores.caller is not None  # asked for with identity=
        self._stores = stores
        self.caller: Caller = stores.caller
        self.authority: LeaseAuthority = stores.authority
        self._records: RecordStore = stores.records
        self.leases = LeaseAPI(self)
        self.checkpoints = CheckpointAPI(self)
        self.handoffs = HandoffAPI(self)
        self.outcomes = OutcomeAPI(self)
        self.events = EventAPI(self)

    @classmethod
    def from_settings(cls, **overrides: Any) -> Baton:
        """Build a client from ``BATON_*`` environment variables; keyword arguments
        override individual settings (``org=``, ``principal=``, ``ledger_url=`` ...)."""
        return cls(settings=load_settings(**overrides))

    @property
    def store(self) -> LedgerStore:
        """The ledger store of a local client.

        Raises:
            ForbiddenError: a remote client (``api_url``) has no ledger store.
        """
        return self._stores.ledger

    def as_principal(self, principal: str, role: str = "agent") -> Baton:
        """Another identity of the same org sharing this client's ledger connections.

        Raises:
            ValidationError: ``principal`` or ``role`` is not valid (``None`` included).
            ForbiddenError: a remote client (``api_url``): its identity is its API key's,
                so it cannot act as anyone else; create a key for that identity
                (``baton keys create``) and a client with it.
        """
        _core.validate_principal("principal", principal)
        _core.validate_role(role)
        if self.authority.bound_caller() is not None:
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
        renew_every_seconds: float | None = None,
        renew_deadline_seconds: float | None = None,
        max_hold_seconds: float | None = None,
        on_lost: Callable[[LeaseKeeper], Any] | None = None,
        **acquire: Unpack[AcquireKeywords],
    ) -> LeaseKeeper:
        """A lease held for a ``with`` / ``async with`` block, renewed in the background
        (every ``ttl_seconds / 3`` by default) and released on exit.

        ``resource_type``, ``resource_id`` and the keyword arguments ``acquire``
        (:class:`~prefect_baton._client.leases.AcquireKeywords`: ``ttl_seconds``, required,
        ``purpose``, ``scopes``, ``expected_version``, ``idempotency_key``, ``attempt``) as
        :meth:`LeaseAPI.acquire`, except:

        - ``idempotency_key``: the execution key; default a fresh random one per block, so
          two blocks of one principal (two processes) never silently supersede each other:
          the second is refused with ``CONFLICT`` while the first holds the lease
          (DESIGN.md "Leases").
        - ``attempt``: the token of this attempt of the execution; default a fresh random
          one per block. Ten blocks entered at once under one execution key run one body:
          the others are refused with ``IDEMPOTENCY_IN_FLIGHT`` while it holds the lease;
          after it ended or expired (its process died), a new block takes over with a new
          epoch. The block's own acquire is retried under the same attempt after a
          connection error (see :meth:`LeaseKeeper.start`).

        Args:
            renew_every_seconds: seconds between renewals (``float``; default a third of
                the TTL).
            renew_deadline_seconds: the renew deadline (``float`` seconds, below the TTL;
                default two thirds of the TTL): when this long has passed since the last
                confirmed grant or renewal was sent, the lease counts as lost (``held.lost``,
                ``on_lost``), whatever a blocked renewal is doing, so the holder learns of
                its loss before anyone else can be granted the resource.
            max_hold_seconds: stop renewing this many seconds (``float``) after the grant
                (default: renew for as long as the block runs); the lease is then lost at
                its renew deadline.
            on_lost: called with the block (on a background thread) once the lease is lost.

        The block is single use: entering it again (nested in itself, or after it ended)
        raises :class:`RuntimeError` before anything is acquired or released.

        Raises on enter what :meth:`LeaseAPI.acquire` raises, :class:`ValidationError`
        for a bad timing option, and :class:`RuntimeError` for a block entered before; on
        exit :class:`LeaseLostError` if the lease was lost meanwhile (``held.lost`` turns
        true as soon as that is known, and ``on_lost(held)`` is called).
        """
        args: dict[str, Any] = {"resource_type": resource_type, "resource_id": resource_id}
        args |= acquire
        args["scopes"] = tuple(acquire.get("scopes", ()))
        for fresh in ("idempotency_key", "attempt"):  # default: new per block
            if args.get(fresh) is None:
                args[fresh] = random_uuid4_hex()
        return LeaseKeeper(
            self.leases,
            args,
            renew_every_seconds=renew_every_seconds,
            renew_deadline_seconds=renew_deadline_seconds,
            max_hold_seconds=max_hold_seconds,
            on_lost=on_lost,
        )

    def prune_receipts(self) -> int:
        """Delete idempotency receipts older than the retention; returns the count.

        Raises:
            ForbiddenError: on a remote client (``api_url``): not offered over REST.
        """
        return self._records.prune_receipts(self.caller)

    def _ledger_barrier(self) -> None:
        """Let the record store see this client's lease transitions (see
        :meth:`~prefect_baton._stores.protocol.LeaseAuthority.ledger_barrier`)."""
        self.authority.ledger_barrier(self.caller)

    def _fence(self, fence: object) -> Fence | None:
        """The authority's fence for ``fence`` (a lease or lease block, or ``None``).

        Raises:
            ValidationError: ``fence`` is not a lease.
        """
        lease = _fence_lease(fence)
        return None if lease is None else self.authority.fence(self.caller, lease)

    def close(self) -> None:
        """Close the ledger connections (and the Redis authority or REST connection pool
        this client created)."""
        self._stores.close()

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
