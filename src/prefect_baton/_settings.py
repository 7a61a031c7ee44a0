"""Configuration from the environment (pydantic-settings, prefix ``BATON_``)."""

from __future__ import annotations

import getpass
import socket
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_ledger_url() -> str:
    """``sqlite:///<cwd>/.baton/ledger.db``: the embedded default, no server needed."""
    return f"sqlite:///{Path.cwd() / '.baton' / 'ledger.db'}"


def default_principal() -> str:
    """``<user>@<host>``."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "agent"
    return f"{user}@{socket.gethostname()}"


class BatonSettings(BaseSettings):
    """Settings read from ``BATON_*`` environment variables.

    Attributes:
        ledger_url: ``BATON_LEDGER_URL``; SQLAlchemy URL of the ledger (default: SQLite file
            ``./.baton/ledger.db``; ``postgresql://...`` at scale).
        org: ``BATON_ORG``; the organization (default ``default``).
        principal: ``BATON_PRINCIPAL``; the acting identity (default ``user@host``).
        prefect_principal: ``BATON_PREFECT_PRINCIPAL``; the principal that Prefect flow and
            task runs act as (default: none, so each run acts as its deployment's full name
            ``"<flow>/<deployment>"`` or its flow's name; see
            :mod:`prefect_baton.prefect._context`). Set it to keep one identity, and so its
            checkpoints, across deployments and local runs.
        role: ``BATON_ROLE``; ``agent``, ``owner`` or ``admin`` (default ``agent``).
        redis_url: ``BATON_REDIS_URL``; Redis fast path for leases (default: none).
        redis_ack: ``BATON_REDIS_ACK``; ``redis`` (default) or ``ledger``: when a lease call
            on Redis returns (see :class:`prefect_baton.Baton`).
        redis_post_loss: ``BATON_REDIS_POST_LOSS``; ``fence_only`` (default) or
            ``lock_delay``: the grant policy after Redis lost its data.
        redis_max_lag_entries: ``BATON_REDIS_MAX_LAG_ENTRIES``; with ``redis_ack=redis``,
            the most journal entries of an org that may wait for the ledger before acquires
            drain it themselves (default 10,000; ``0``: no limit; see
            :class:`prefect_baton._stores.redis.authority.RedisAuthority`).
        redis_allow_eviction: ``BATON_REDIS_ALLOW_EVICTION``; accept a Redis whose
            ``maxmemory-policy`` is not ``noeviction`` (default ``false``: refused, see
            :func:`prefect_baton._stores.redis.base.check_eviction_policy`).
        receipt_retention_seconds: ``BATON_RECEIPT_RETENTION_SECONDS`` (default 86,400).
        state_max_bytes: ``BATON_STATE_MAX_BYTES``, checkpoint state cap in bytes (default
            1 MiB; 1,024 to 16 MiB: a server buffers up to 3 times it + 64 KiB per request
            body, see :func:`prefect_baton._rules.validation.request_body_limit`).
        api_url: ``BATON_API_URL``; base URL of the REST API (e.g.
            ``http://127.0.0.1:8787``). When set (and no ledger is passed explicitly), a
            :class:`prefect_baton.Baton` runs every operation through the API.
        api_key: ``BATON_API_KEY``; the bearer key for ``api_url`` (a secret: masked in
            reprs).
        api_timeout_seconds: ``BATON_API_TIMEOUT_SECONDS``; per-request timeout of the REST
            client in seconds (default 30).
        key_cache_seconds: ``BATON_KEY_CACHE_SECONDS``; how long the REST server keeps a
            valid bearer key it has looked up, in seconds (default 2, 0 to 300; ``0``
            disables the cache). A key revoked by another process (``baton keys revoke``)
            is refused at the latest this long after the revocation; revoked in the
            server's own process, at once.
    """

    model_config = SettingsConfigDict(env_prefix="BATON_", extra="ignore")

    ledger_url: str = Field(default_factory=default_ledger_url)
    org: str = "default"
    principal: str = Field(default_factory=default_principal)
    prefect_principal: str | None = None
    role: str = "agent"
    redis_url: SecretStr | None = None
    redis_ack: str = "redis"
    redis_post_loss: str = "fence_only"
    redis_max_lag_entries: int = Field(default=10_000, ge=0)
    redis_allow_eviction: bool = False
    receipt_retention_seconds: int = Field(default=86_400, ge=60)
    # At most 16 MiB: a server buffers up to 3 times it + 64 KiB per request body
    # (request_body_limit), and a few concurrent bodies of a larger cap exhaust memory.
    state_max_bytes: int = Field(default=1024 * 1024, ge=1024, le=16 * 1024 * 1024)
    api_url: str | None = None
    api_key: SecretStr | None = None
    api_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    key_cache_seconds: float = Field(default=2.0, ge=0, le=300)


def load_settings(**overrides: object) -> BatonSettings:
    """The ``BATON_*`` settings, with ``overrides`` (keyword: value) taking precedence.

    Raises:
        ValidationError: a variable or override has a bad value (``VALIDATION_ERROR``,
            naming the variable), instead of pydantic's own error.
    """
    from prefect_baton.errors import from_pydantic

    try:
        return BatonSettings(**overrides)  # type: ignore[arg-type]
    except PydanticValidationError as exc:
        raise from_pydantic(
            exc, "bad setting: ", name=lambda loc: "BATON_" + "_".join(map(str, loc)).upper()
        ) from None
