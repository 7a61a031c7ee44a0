"""Redis Cluster as the lease authority's store.

Ask for a cluster with the URL scheme ``redis+cluster://host:port`` (``rediss+cluster://``
for TLS): the ``+`` names the client variant, as SQLAlchemy's ``postgresql+psycopg://`` does.
The host and port are any one node of the cluster (a start-up node); the client discovers
the others with ``CLUSTER SLOTS``. The rest of the URL means what it means to redis-py
(``redis.cluster.RedisCluster.from_url``): user and password, query options such as
``?socket_timeout=2``; a database number other than 0 is refused (a cluster has only db 0).

Why the same scripts work on a cluster (see :mod:`prefect_baton._stores.redis.keys`):

* every key of one organization carries the hash tag ``{sha256(org)[:24]}``, so one org
  lives in one slot, hence on one node, and every script receives all the keys it touches in
  ``KEYS``; redis-py routes an ``EVALSHA`` by its first key, and on ``NOSCRIPT`` (a node
  restarted, or failed over to a replica that never saw the script) loads the script on
  every primary and runs it again (the script did not run the first time);
* expiry is judged on ``TIME`` inside the script, i.e. on the clock of the org's node;
  :func:`node_time_ms` reads the same clock outside scripts;
* the journal stream is one key of the org (``XRANGE``/``XTRIM``/``XLEN``: one node); the
  rebuild pipeline writes only keys of one org; nothing scans or flushes keys;
* ``baton:orgs`` (the set of orgs reconcilers drain) is a key of its own slot, written and
  read with single-key commands, never from a script.

Different orgs land on different nodes, and each org fails and recovers on its own: when
one primary loses its data, only the orgs in its slots fail closed (``UNAVAILABLE``) and are
rebuilt from the ledger; the others keep their state and their epochs.

The client never retries a command on its own (a retried script could run twice after a
timeout); ``MOVED``/``ASK`` redirections are followed (the script did not run on the node
that redirected). redis-py's own cluster errors are turned into ``RedisError`` subclasses,
so that the authority maps them to :class:`~prefect_baton.errors.UnavailableError` like any
other Redis failure.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import (
    ConnectionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
)
from redis.retry import Retry

from prefect_baton.errors import UnavailableError
from redis import Redis

__all__ = [
    "CLUSTER_SCHEMES",
    "BatonRedisCluster",
    "RedisClient",
    "connect_cluster",
    "is_cluster_url",
    "node_time_ms",
]

RedisClient: TypeAlias = Redis | RedisCluster
"""A client the authority and the reconciler accept: one server or a cluster."""

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL scheme asking for a cluster -> the scheme redis-py understands."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` (``str``) asks for Redis Cluster (``redis+cluster://``,
    ``rediss+cluster://``; the scheme is matched in lower case only, as redis-py does)."""
    scheme, sep, _rest = url.partition("://")
    return bool(sep) and scheme in CLUSTER_SCHEMES


def _plain_url(url: str) -> str:
    scheme, _sep, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme]}://{rest}"


def _translate(exc: RedisClusterException) -> Exception:
    if isinstance(exc, SlotNotCoveredError) or "connect" in str(exc).lower():
        return ConnectionError(f"Redis Cluster: {exc}")
    return ResponseError(f"Redis Cluster: {exc}")


class BatonRedisCluster(RedisCluster):
    """``redis.cluster.RedisCluster`` whose client-side cluster errors
    (``RedisClusterException``, which is not a ``RedisError``) are raised as ``RedisError``:
    no reachable node or an uncovered slot as ``redis.exceptions.ConnectionError``, anything
    else (a bug, such as keys of two slots in one script call) as ``ResponseError``."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command as ``RedisCluster.execute_command`` does (routing by key slot,
        following ``MOVED``/``ASK``).

        Raises:
            redis.exceptions.RedisError: every failure, including the cluster client's own.
        """
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            raise _translate(exc) from exc


def connect_cluster(url: str, **opts: Any) -> BatonRedisCluster:
    """A cluster client for the authority, connected to the cluster of ``url``.

    Args:
        url: ``redis+cluster://[user:password@]host:port[/0][?option=value]`` or
            ``rediss+cluster://...``: any one node of the cluster.
        opts: keyword arguments for each node's connections (``socket_timeout``,
            ``socket_connect_timeout``, ``health_check_interval``, ...); ``retry`` is the
            cluster client's retry policy (default and :func:`connect`'s: no retries).

    Raises:
        ValueError: a malformed URL or a database number other than 0 (``Baton`` reports
            it as ``VALIDATION_ERROR``).
        UnavailableError: no node of the cluster answered, or its slots are not all
            covered.
    """
    if not is_cluster_url(url):
        raise ValueError("a Redis Cluster URL starts with redis+cluster:// or rediss+cluster://")
    plain = _plain_url(url)
    options = parse_url(plain)  # type: ignore[no-untyped-call]  # ValueError when malformed
    if options.get("db", 0) != 0:
        raise ValueError("a Redis Cluster has only database 0")
    retry = opts.pop("retry", None) or Retry(NoBackoff(), 0)
    try:
        return BatonRedisCluster(url=plain, retry=retry, **opts)
    except (RedisClusterException, RedisError) as exc:
        raise UnavailableError(f"Redis Cluster unavailable: {exc}") from exc


def node_time_ms(client: RedisClient, key: str) -> int:
    """The Redis clock (``TIME``) in epoch milliseconds, read on the node that holds ``key``
    (``str``) when ``client`` is a cluster client, so that it is the clock the org's
    scripts judge expiry on.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        sec, usec = client.time(target_nodes=node)
    else:
        sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000
