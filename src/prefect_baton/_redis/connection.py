"""The Redis connection and error plumbing of the lease authority.

:func:`connect` makes the client (no automatic retries, so a script runs at most once per
call), :func:`redis_unavailable` maps a Redis error to :class:`UnavailableError` (connection
errors, timeouts and the busy/failover replies) or a plain :class:`BatonError`,
:func:`direct_pool` and :func:`evalsha` are the direct ``EVALSHA`` call path, and
:func:`as_text` reads a reply field as ``str``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from redis import ConnectionPool, Redis

from ..errors import BatonError, UnavailableError
from .cluster import RedisClient, connect_cluster, is_cluster_url
from .scripts import Scripts

__all__ = ["as_text", "connect", "direct_pool", "evalsha", "redis_unavailable"]

_BUSY = (
    "BUSY",
    "LOADING",
    "OOM",
    "MASTERDOWN",
    "NOREPLICAS",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "READONLY",
)


def connect(url: str, **kwargs: Any) -> RedisClient:
    """A Redis client for the authority: 5 s socket timeout, 2 s connect timeout, and no
    automatic retries (a retried script could run twice).

    Args:
        url: ``redis://host:port/db`` (or ``rediss://``, ``unix://``): one server, a lazy
            ``redis.Redis`` client. ``redis+cluster://host:port`` (or
            ``rediss+cluster://``): Redis Cluster, any one node of it; a
            ``redis.cluster.RedisCluster`` client that connects at once and routes each
            org's scripts to the node of its hash tag (see
            :mod:`prefect_baton._redis.cluster`).
        kwargs: overrides passed to ``from_url`` of the client class.

    Raises:
        ValueError: a malformed URL (``Baton`` reports it as ``VALIDATION_ERROR``).
        UnavailableError: a cluster URL whose nodes do not answer.
    """
    opts: dict[str, Any] = {
        "socket_timeout": 5.0,
        "socket_connect_timeout": 2.0,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 15,
    }
    opts.update(kwargs)
    if is_cluster_url(url):
        return connect_cluster(url, **opts)
    return Redis.from_url(url, **opts)


def redis_unavailable(exc: RedisError) -> BatonError:
    """The error to raise for ``exc``: :class:`UnavailableError` for a connection error, a
    timeout or a busy/failover reply (``BUSY``, ``LOADING``, ``READONLY``, ...), a plain
    :class:`BatonError` for any other error reply."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return UnavailableError(f"Redis unavailable: {exc}")
    code = getattr(exc, "status_code", None) or str(exc).split(" ", 1)[0]  # stripped by redis-py
    if isinstance(exc, ResponseError) and code.upper() in _BUSY:
        return UnavailableError(f"Redis unavailable: {exc}")
    if isinstance(exc, ResponseError):
        return BatonError(f"Redis lease authority error: {exc}")
    return UnavailableError(f"Redis unavailable: {exc}")


def as_text(value: Any) -> str:
    """A reply field (``bytes`` or any value) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def direct_pool(client: RedisClient) -> ConnectionPool | None:
    """The connection pool :func:`evalsha` uses directly: that of a plain ``redis.Redis``
    client without a dedicated connection; ``None`` otherwise (a cluster client, or a
    client bound to one connection), which runs scripts through the registered script."""
    return (
        client.connection_pool if isinstance(client, Redis) and client.connection is None else None
    )


def evalsha(
    scripts: Scripts,
    pool: ConnectionPool | None,
    name: str,
    keys: Sequence[str],
    args: Sequence[Any],
) -> list[Any]:
    """Run script ``name`` once: ``EVALSHA`` on a pooled connection of a plain
    ``redis.Redis`` client (redis-py's own steps for one command, without its per-command
    bookkeeping), through the registered script otherwise. On ``NOSCRIPT`` the script
    did not run; the registered script loads it and runs it."""
    script = scripts[name]
    if pool is None:
        reply: list[Any] = script(keys=keys, args=args)
        return reply
    conn: Any = pool.get_connection()
    try:
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        reply = conn.read_response()
    except NoScriptError:
        reply = script(keys=keys, args=args)
    except (RedisConnectionError, RedisTimeoutError):
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return reply
