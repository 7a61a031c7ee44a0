"""The ledger and lease authority a server process opens once and shares among its requests
(the REST app and the MCP server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import LeaseAuthority
from prefect_baton.errors import ValidationError

__all__ = ["Backend", "open_backend"]


@dataclass
class Backend:
    """An open ledger ``store``, the lease ``authority`` (the store itself, or Redis) and the
    ``settings`` they were opened with."""

    settings: BatonSettings
    store: LedgerStore
    authority: LeaseAuthority

    def close(self) -> None:
        """Close the Redis authority (when there is one), then the ledger connections."""
        if self.authority is not self.store:
            close = getattr(self.authority, "close", None)
            if close is not None:
                close()
        self.store.close()


def open_backend(ledger_url: str | None = None, redis_url: str | None = None) -> Backend:
    """Open the ledger and the lease authority of a server process.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (``str``; default ``BATON_LEDGER_URL``, else
            ``./.baton/ledger.db``); migrated on first use.
        redis_url: Redis URL of the lease authority (``str``; default ``BATON_REDIS_URL``;
            none: the ledger is the authority). ``BATON_REDIS_ACK``,
            ``BATON_REDIS_POST_LOSS`` and ``BATON_REDIS_MAX_LAG_ENTRIES`` apply.

    Raises:
        ValidationError: a bad ``BATON_*`` variable, a malformed ledger or Redis URL (nothing
            is left open). UnavailableError: the ledger (or a Redis Cluster) cannot be reached.
    """
    settings = load_settings()
    if redis_url is None and settings.redis_url is not None:
        redis_url = settings.redis_url.get_secret_value()
    redis_options: dict[str, Any] = {}
    if redis_url:
        from prefect_baton._stores.redis.base import options_from

        # refused before a ledger file is created or opened
        redis_options = options_from(settings)
    store = LedgerStore(
        ledger_url or settings.ledger_url,
        receipt_retention_seconds=settings.receipt_retention_seconds,
        state_max_bytes=settings.state_max_bytes,
    )
    if not redis_url:
        return Backend(settings, store, store)
    from prefect_baton._stores.redis.authority import RedisAuthority

    try:
        redis_ = RedisAuthority.from_url(redis_url, store, **redis_options)
    except ValueError as exc:  # redis-py's verdict on a malformed URL
        store.close()
        raise ValidationError(f"bad Redis URL: {exc}") from None
    except BaseException:
        store.close()
        raise
    return Backend(settings, store, redis_)
