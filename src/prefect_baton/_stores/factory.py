"""The one place that turns settings into a store: :func:`open_stores`.

:class:`~prefect_baton.Baton` (and so :class:`~prefect_baton.AsyncBaton`), the REST app and
the MCP server all open their ledger, Redis authority or REST API client here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from prefect_baton._rules import core as _core
from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import Caller, LeaseAuthority, RecordStore
from prefect_baton.errors import ForbiddenError, ValidationError

if TYPE_CHECKING:
    from prefect_baton._stores.redis.authority import RedisAuthority
    from prefect_baton._stores.rest.client import RestStore

    def _conforms(
        ledger: LedgerStore, redis_: RedisAuthority, remote: RestStore
    ) -> tuple[LeaseAuthority, RecordStore, LeaseAuthority, LeaseAuthority, RecordStore]:
        """Every store implements the protocols (checked by mypy, never run)."""
        return ledger, ledger, redis_, remote, remote


__all__ = ["Stores", "open_stores"]


@dataclass
class Stores:
    """What a client or a server process runs on.

    Attributes:
        settings: the :class:`BatonSettings` it was opened with.
        authority: the lease authority (the ledger, a Redis authority or the REST API).
        records: the record store (the ledger, or the REST API).
        store: the SQL ledger, ``None`` over the REST API.
        caller: the acting identity of a client (see :func:`open_stores`'s ``identity``),
            else ``None``.
        owns_authority: :meth:`close` closes ``authority`` (it was opened here).
    """

    settings: BatonSettings
    authority: LeaseAuthority
    records: RecordStore
    store: LedgerStore | None
    caller: Caller | None = None
    owns_authority: bool = False

    @property
    def ledger(self) -> LedgerStore:
        """The SQL ledger.

        Raises:
            ForbiddenError: a REST API client has none.
        """
        if self.store is None:
            raise ForbiddenError(
                "a REST API client (api_url) has no ledger store; its operations run "
                "through the API"
            )
        return self.store

    def close(self) -> None:
        """Close the authority when it was opened here (a Redis authority, a REST
        connection pool) and then the ledger (given or not)."""
        if self.owns_authority and self.authority is not self.store:
            self.authority.close()
        if self.store is not None:
            self.store.close()


def open_stores(
    ledger_url: str | None = None,
    redis_url: str | None = None,
    *,
    settings: BatonSettings | None = None,
    ack: str | None = None,
    store: LedgerStore | None = None,
    lease_authority: LeaseAuthority | None = None,
    api_url: str | None = None,
    api_key: str | None = None,
    identity: tuple[str | None, str | None, str | None] | None = None,
) -> Stores:
    """Open the ledger and the lease authority (or the REST API client) of a client or a
    server process.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (``str``; default ``BATON_LEDGER_URL``, else
            ``./.baton/ledger.db``); migrated on first use.
        redis_url: Redis URL of the lease authority (``str``; default ``BATON_REDIS_URL``;
            none: the ledger is the authority). ``BATON_REDIS_ACK``,
            ``BATON_REDIS_POST_LOSS`` and ``BATON_REDIS_MAX_LAG_ENTRIES`` apply, checked
            before a ledger is opened.
        settings: the settings to take defaults from (default: :func:`load_settings`).
        ack: ``"redis"`` or ``"ledger"``, overrides ``BATON_REDIS_ACK``.
        store: an open ledger to use (then ``ledger_url`` is not used; it is closed by
            :meth:`Stores.close` all the same).
        lease_authority: an authority to share (not closed by :meth:`Stores.close`);
            overrides ``redis_url``. One that decides the caller (a REST API client,
            :meth:`~prefect_baton._stores.protocol.LeaseAuthority.bound_caller`) is also the
            record store, and no ledger is opened.
        api_url, api_key: the REST API to run every operation through (``str``), with its
            bearer key (``str``); no ledger or Redis is then opened.
        identity: for a client, the ``(org, principal, role)`` it asks for (each ``None``:
            from settings). A client without ``ledger_url``, ``store``, ``redis_url`` or
            ``lease_authority`` takes ``BATON_API_URL``/``BATON_API_KEY`` when set; on the
            REST API the identity is the key's (an explicit one that differs is refused),
            otherwise it is validated before the ledger is opened. ``Stores.caller`` is it.
            Without ``identity`` (a server) the REST settings do not apply.

    Raises:
        ValidationError: a bad ``BATON_*`` variable or Redis option, a malformed ledger,
            Redis or API URL, a bad key, id or role, or the REST API together with a
            ledger or Redis (nothing is left open then).
        ForbiddenError: ``identity`` differs from the API key's.
        UnavailableError: the ledger, a Redis Cluster or the REST API cannot be reached.
        UnauthenticatedError: the API key is refused.
    """
    s = settings or load_settings()
    if identity is not None:
        local = (ledger_url, store, redis_url, lease_authority)
        remote, owned = _remote_of(s, api_url, api_key, lease_authority, local=local)
        if remote is not None:
            return _rest_stores(s, remote, identity, owned=owned)
        org, principal, role = identity
        caller: Caller | None = Caller(
            org=_core.validate_id("org", s.org if org is None else org),
            principal=_core.validate_principal(
                "principal", s.principal if principal is None else principal
            ),
            role=_core.validate_role(s.role if role is None else role),
        )
    else:
        caller = None
    url = redis_url or (s.redis_url.get_secret_value() if s.redis_url else None)
    redis_options: dict[str, Any] = {}
    if lease_authority is None and url:
        from prefect_baton._stores.redis.base import options_from
        from prefect_baton._stores.redis.connection import check_url

        # refused before a ledger file is created or opened
        check_url(url)
        redis_options = options_from(s, ack=ack)
    ledger = store or LedgerStore.from_settings(s, ledger_url)
    if lease_authority is not None or not url:
        return Stores(s, lease_authority or ledger, ledger, ledger, caller)
    from prefect_baton._stores.redis.authority import RedisAuthority

    try:
        redis_ = RedisAuthority.from_url(url, ledger, **redis_options)
    except BaseException as exc:
        if store is None:  # the ledger this call opened
            ledger.close()
        if isinstance(exc, ValueError):  # redis-py's verdict on a malformed URL
            raise ValidationError(f"bad Redis URL: {exc}") from None
        raise
    return Stores(s, redis_, ledger, ledger, caller, owns_authority=True)


def _remote_of(
    s: BatonSettings,
    api_url: str | None,
    api_key: str | None,
    authority: LeaseAuthority | None,
    *,
    local: tuple[object, ...],
) -> tuple[LeaseAuthority | None, bool]:
    """The REST API a client runs on and whether it is opened here, or ``(None, False)``
    for a local client.

    Raises:
        ValidationError: the REST API together with a ledger or Redis; a key without a URL
            or a URL without a key; a malformed URL or key; httpx is not installed.
    """
    if authority is not None and (api_url is not None or api_key is not None):
        if authority.bound_caller() is not None:
            raise ValidationError("pass either a remote lease_authority or api_url/api_key")
    elif authority is not None and authority.bound_caller() is not None:
        return authority, False
    if api_url is None and any(x is not None for x in local):
        if api_key is not None:
            raise ValidationError("api_key needs api_url (a REST API), not a ledger")
        return None, False
    if api_url is not None and any(x is not None for x in local):
        raise ValidationError(
            "api_url runs every operation through the REST API; do not also pass "
            "ledger_url, store, redis_url or lease_authority"
        )
    url = api_url if api_url is not None else s.api_url
    if url is None:
        if api_key is not None:
            raise ValidationError("api_key needs api_url (a REST API), not a ledger")
        return None, False
    key = api_key if api_key is not None else s.api_key
    if key is None:
        raise ValidationError("api_url needs an api_key (or BATON_API_KEY)")
    try:
        from prefect_baton._stores.rest.client import RestStore
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ValidationError("api_url needs httpx: install prefect-baton[rest]") from None
    return RestStore(url, key, timeout_seconds=s.api_timeout_seconds), True


def _rest_stores(
    s: BatonSettings,
    remote: LeaseAuthority | RestStore,
    identity: tuple[str | None, str | None, str | None],
    *,
    owned: bool,
) -> Stores:
    """The stores of a REST API client: the key decides the caller.

    Raises:
        ForbiddenError: an explicit org, principal or role differs from the key's.
        UnauthenticatedError, UnavailableError, ValidationError: as ``bound_caller``.
    """
    try:
        me = remote.bound_caller()
        assert me is not None
        for name, given, actual in zip(
            ("org", "principal", "role"), identity, (me.org, me.principal, me.role), strict=True
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
    # a store that decides the caller is also the record store (protocol.LeaseAuthority)
    records = cast("RecordStore", remote)
    return Stores(s, remote, records, None, me, owns_authority=owned)
