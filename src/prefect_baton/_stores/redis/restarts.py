"""A Redis server that restarted counts as a data loss, even when it kept its data.

A Redis with persistence (RDB snapshots, AOF other than ``always``) that restarts, or a
failover to a replica that lagged, comes back with the state of an earlier instant: the
incarnation marker is still there, so the scripts alone cannot tell, yet the heads, the
epochs and the receipts are older than what clients were told since. Served as they are,
the same fencing token would be handed out twice and a released holder's fenced writes would
be accepted again.

Every server process has its own ``run_id`` (``INFO server``); a restart, a failover or a
new replica has another one, and every connection to it is a new connection. So, for a
``redis.Redis`` client (one server, or a Sentinel-managed primary), each new connection,
before any command of the authority runs on it (redis-py's ``redis_connect_func``, after the
handshake), compares the server's ``run_id`` with the one
kept in :data:`RUN_KEY`. They differ on the first connection to a new server process: then,
in one script call, the incarnation marker of every org listed in ``baton:orgs`` is deleted
and :data:`RUN_KEY` is set to the new ``run_id``. From then on those orgs' operations find no
marker and are rebuilt from the ledger with a higher epoch floor
(:mod:`prefect_baton._stores.redis.rebuild`), exactly as after a restart without
persistence. A rebuild adds its org to ``baton:orgs`` before it installs the marker, so any
snapshot that holds a marker lists its org too.

Not covered: ``DEBUG RELOAD`` (the same process loads its snapshot again; a debugging
command), a Redis Cluster client (each node has its own ``run_id`` and no key spans the
nodes), and clients of a version without this check on the same server. The authority's
Redis user needs the ``INFO`` command; without it the connection is refused as a
configuration error (``VALIDATION_ERROR``), since restarts could not be seen.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from redis.sentinel import SentinelConnectionPool

from prefect_baton._stores.redis.cluster import RedisClient
from prefect_baton._stores.redis.connection import server_address
from prefect_baton._stores.redis.keys import ORGS_KEY, org_keys
from redis import Redis

__all__ = ["RUN_KEY", "check_server_run", "watch_restarts"]

log = logging.getLogger("prefect_baton.redis")

#: The ``run_id`` of the Redis server process whose incarnation markers are current.
RUN_KEY = "baton:run"

_RUN_ID = re.compile(rb"run_id:([0-9a-fA-F]+)")

#: KEYS[1] RUN_KEY, KEYS[2..] incarnation markers; ARGV[1] the server's run_id. Deletes the
#: markers and records the run_id unless another connection did it first; returns how many
#: markers it deleted (-1: already current).
_FORGET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return -1 end
local n = 0
for i = 2, #KEYS do n = n + redis.call('DEL', KEYS[i]) end
redis.call('SET', KEYS[1], ARGV[1])
return n
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _command(conn: Any, *args: Any) -> Any:
    conn.send_command(*args)
    return conn.read_response()


def server_run_id(conn: Any) -> str:
    """The ``run_id`` of the server process at the other end of ``conn`` (a connected
    redis-py connection), from ``INFO server``.

    Raises:
        redis.exceptions.RedisError: the server refused ``INFO`` or did not answer.
        ValueError: the reply holds no ``run_id``.
    """
    info = _command(conn, "INFO", "server")
    if isinstance(info, dict):  # a RESP3 parser that splits the reply itself
        run = info.get("run_id") or info.get(b"run_id")
        if run:
            return _text(run)
        raise ValueError("INFO server answered without a run_id")
    match = _RUN_ID.search(info if isinstance(info, bytes) else str(info).encode())
    if match is None:
        raise ValueError("INFO server answered without a run_id")
    return match.group(1).decode()


def check_server_run(conn: Any) -> int:
    """On the connection ``conn`` (connected, nothing unread): when the server process is
    not the one :data:`RUN_KEY` names, delete every listed org's incarnation marker and
    record this process's ``run_id``, in one script call. Returns how many markers it
    deleted (``-1`` when the server was already current, ``0`` for a new server with no
    markers).

    Raises:
        redis.exceptions.RedisError: the server refused a command (``NOPERM`` for ``INFO``
            under an ACL without it) or did not answer; the caller's connect fails.
        ValueError: ``INFO server`` held no ``run_id``.
    """
    run = server_run_id(conn)
    if _text(_command(conn, "GET", RUN_KEY) or b"") == run:
        return -1
    orgs = sorted(_text(o) for o in _command(conn, "SMEMBERS", ORGS_KEY) or [])
    markers = [org_keys(org).base.inc for org in orgs]
    deleted = int(_command(conn, "EVAL", _FORGET, str(1 + len(markers)), RUN_KEY, *markers, run))
    if deleted > 0:
        log.warning(
            "Redis server process %s is new (restart or failover): the lease state of %d "
            "org(s) kept in it is treated as lost and rebuilt from the ledger",
            run,
            deleted,
        )
    return deleted


def _connect_and_check(conn: Any) -> None:
    """redis-py's ``redis_connect_func``: the usual handshake, then :func:`check_server_run`."""
    conn.on_connect()
    check_server_run(conn)


def watch_restarts(client: RedisClient) -> bool:
    """Make every new connection of ``client`` run :func:`check_server_run` before its first
    command: a ``redis.Redis`` client of redis-py's TCP, TLS or Unix-socket connections, or
    of a Sentinel-managed pool (whose connections follow the primary through failovers); a
    cluster client, a client bound to one connection, or one of other connection classes (an
    in-process fake) is left as it is. Connections already open are closed, so that the next
    command connects and checks. Returns whether the check is installed."""
    if not isinstance(client, Redis) or client.connection is not None:
        return False
    pool = client.connection_pool
    if server_address(client) is None and not isinstance(pool, SentinelConnectionPool):
        return False  # an in-process fake (no INFO), or connections of a caller's own class
    kwargs = pool.connection_kwargs
    if kwargs.get("redis_connect_func") is _connect_and_check:
        return True
    if kwargs.get("redis_connect_func") is not None:
        return False  # a connection function of the caller's own: not replaced
    kwargs["redis_connect_func"] = _connect_and_check
    pool.disconnect()
    return True
