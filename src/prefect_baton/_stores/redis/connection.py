"""The Redis connection and error plumbing of the lease authority.

:func:`connect` makes the client (no automatic retries, so a script runs at most once per
call), :func:`redis_error` maps every Redis error to :class:`ValidationError` for a
configuration error (a database index the server does not have, a wrong password, a command
the server refuses) and to :class:`UnavailableError` otherwise (connection errors, timeouts,
busy/failover replies, any other error reply),
:func:`direct_pool` and :func:`evalsha` are the direct call path (``FCALL`` of the function
library, or ``EVALSHA``), and
:func:`as_text` reads a reply field as ``str``.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    NoScriptError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from prefect_baton._stores.redis.cluster import RedisClient, connect_cluster, is_cluster_url
from prefect_baton._stores.redis.scripts import Scripts, library
from prefect_baton.errors import BatonError, UnavailableError, ValidationError
from redis import Connection, ConnectionPool, Redis, SSLConnection, UnixDomainSocketConnection

__all__ = [
    "DirectConnections",
    "as_text",
    "check_url",
    "connect",
    "direct_pool",
    "evalsha",
    "is_config_error",
    "redis_error",
]

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


def _db_index(text: str) -> int | None:
    """``text`` as a database index (ASCII digits only), ``None`` when it is not one."""
    return int(text) if text.isascii() and text.isdigit() else None


def check_url(url: str) -> None:
    """Refuse a Redis URL whose database part would silently mean another database:
    redis-py reads a path that is not one integer (``/abc``, ``/10/x``) as database 0, and
    lets a ``?db=`` query override the path. The database is written once, as the path
    (``redis://host:6379/7``) or the ``db`` query (``?db=7``, the only way for ``unix://``;
    both may be given when they agree); no database means 0. A number the server does not
    have (``/99``) is the server's to refuse (:func:`redis_error`: ``DB index is out of
    range``). The messages name the part of the URL at fault and never show credentials.

    Args:
        url: a Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
            ``rediss+cluster://``); the scheme itself is left to redis-py.

    Raises:
        ValidationError: the path is not one integer (``/abc``), has more than one segment
            (``/10/x``), the ``db`` query is not an integer or is given twice differently, or
            the path and the ``db`` query name different databases (``/10?db=3``).
    """
    parts = urlsplit(url)
    queried = {q for q in parse_qs(parts.query).get("db", []) if q}
    for q in queried:
        if _db_index(q) is None:
            raise ValidationError(
                f"bad Redis URL: the query's db={q!r} is not a database index (an integer "
                "from 0, e.g. ?db=7)"
            )
    if len(queried) > 1:
        raise ValidationError(
            f"bad Redis URL: the query gives db more than once ({', '.join(sorted(queried))}): "
            "name the database once"
        )
    path = unquote(parts.path)
    if parts.scheme.lower() == "unix" or path in ("", "/"):
        return  # a unix:// path is the socket's; no path: the query's database, or 0
    # a path holding "@" is most likely a password with an unescaped "/": never show it
    shown = repr(path) if "@" not in path else "(not shown: it holds '@')"
    segments = path.removeprefix("/").split("/")
    if len(segments) > 1:
        raise ValidationError(
            f"bad Redis URL: the path {shown} has more than one segment: the path is the "
            "database index alone (an integer from 0, e.g. redis://host:6379/7)"
        )
    db = _db_index(segments[0])
    if db is None:
        raise ValidationError(
            f"bad Redis URL: the path {shown} is not a database index (an integer from 0, "
            "e.g. redis://host:6379/7)"
        )
    if queried and int(next(iter(queried))) != db:
        raise ValidationError(
            f"bad Redis URL: the path names database {db} and the query db="
            f"{next(iter(queried))}: name the database once (the path, or ?db= alone)"
        )


def connect(url: str, **kwargs: Any) -> RedisClient:
    """A Redis client for the authority: 5 s socket timeout, 2 s connect timeout (so a
    lease block's renewal on a dead network ends before the renew deadline of the shortest
    lease, two thirds of 10 s), and no automatic retries (a retried script could run twice).

    Args:
        url: ``redis://host:port/db`` (or ``rediss://``, ``unix://``): one server, a lazy
            ``redis.Redis`` client. ``redis+cluster://host:port`` (or
            ``rediss+cluster://``): Redis Cluster, any one node of it; a
            ``redis.cluster.RedisCluster`` client that connects at once and routes each
            org's scripts to the node of its hash tag (see
            :mod:`prefect_baton._stores.redis.cluster`).
        kwargs: overrides passed to ``from_url`` of the client class.

    Raises:
        ValidationError: a database part that is not one integer, or named twice
            differently (:func:`check_url`).
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
    check_url(url)
    if is_cluster_url(url):
        return connect_cluster(url, **opts)
    return Redis.from_url(url, **opts)


#: Error replies of a connection that is configured wrong (every command gets them): the
#: URL's database index, its user or password. Retrying cannot help.
_CONNECTION_CONFIG_REPLIES = ("DB index is out of range", "NOAUTH", "WRONGPASS", "invalid password")

#: Error replies refusing one command (an ACL, a server without it).
_COMMAND_CONFIG_REPLIES = ("NOPERM", "unknown command")


def is_config_error(exc: RedisError, *, command: bool = True) -> bool:
    """Whether ``exc`` says the Redis URL or server configuration is wrong, so retrying
    cannot help: a database index the server does not have, a wrong user or password
    (``NOAUTH``, ``WRONGPASS``) and, with ``command`` (default), a command the server
    refuses (``NOPERM``, ``unknown command``, e.g. ``FUNCTION`` when functions are
    required)."""
    if isinstance(exc, AuthenticationError):
        return True
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return False
    if command and isinstance(exc, NoPermissionError):
        return True
    text = str(exc)
    replies = _CONNECTION_CONFIG_REPLIES + (_COMMAND_CONFIG_REPLIES if command else ())
    return isinstance(exc, ResponseError) and any(r.lower() in text.lower() for r in replies)


def redis_error(exc: RedisError) -> BatonError:
    """The error to raise for ``exc`` (a documented code): :class:`ValidationError` for a
    configuration error (:func:`is_config_error`: ``Redis configuration error: DB index is
    out of range`` for ``redis://host:6379/99``, a wrong password; not retried), else
    :class:`UnavailableError`, whose message tells a connection error, a timeout, a
    busy/failover reply (``BUSY``, ``LOADING``, ``READONLY``, ...) or a script flushed
    during the call from any other error reply (``Redis refused the operation: ...``)."""
    if is_config_error(exc):
        return ValidationError(f"Redis configuration error: {exc} (check the Redis URL and server)")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return UnavailableError(f"Redis unavailable: {exc}")
    if isinstance(exc, NoScriptError) or str(exc).startswith("Function not found"):
        # flushed (SCRIPT FLUSH, FUNCTION FLUSH) again after the client loaded it: the
        # operation did not run
        return UnavailableError(f"Redis unavailable: the script was flushed during the call: {exc}")
    code = getattr(exc, "status_code", None) or str(exc).split(" ", 1)[0]  # stripped by redis-py
    if isinstance(exc, ResponseError) and code.upper() in _BUSY:
        return UnavailableError(f"Redis unavailable: {exc}")
    if isinstance(exc, ResponseError):
        return UnavailableError(f"Redis refused the operation: {exc}")
    return UnavailableError(f"Redis unavailable: {exc}")


#: redis-py's own connection classes, whose ``host``/``port``/``path`` arguments name the
#: socket they open: only a client connecting through one of these has a server address
#: (:func:`server_address`).
_SOCKET_CONNECTIONS: tuple[type[Any], ...] = (Connection, SSLConnection, UnixDomainSocketConnection)


def server_address(client: RedisClient) -> str | None:
    """Where ``client`` (one Redis server, ``redis.Redis``) keeps its data: ``host:port/db``
    or ``unix:path/db`` (``str``, no credentials), as its URL named it. ``None`` when that
    cannot be told: a Redis Cluster client, and a client whose connection pool makes
    connections of another class than redis-py's TCP, TLS and Unix-socket connections (an
    in-process fake, a Sentinel-managed pool), whose ``host`` argument need not name a
    server. The ledger records it with an org's Redis incarnation, so that a client whose
    Redis lacks the org's state can tell a data loss on that server from another server
    (:func:`prefect_baton._stores.redis.rebuild.bump_incarnation`)."""
    if not isinstance(client, Redis):
        return None
    pool = client.connection_pool
    if getattr(pool, "connection_class", None) not in _SOCKET_CONNECTIONS:
        return None
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}/{db}"
    return f"{str(kwargs.get('host', 'localhost')).lower()}:{kwargs.get('port', 6379)}/{db}"


def as_text(value: Any) -> str:
    """A reply field (``bytes`` or any value) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


#: ``tcp_info.tcpi_state`` of a TCP connection on which neither side has closed (Linux).
_TCP_ESTABLISHED = 1
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def _established(conn: Any) -> bool:
    """Whether ``conn`` is a plain TCP connection that is open and that the server has not
    closed, told by the kernel's TCP state (``getsockopt(TCP_INFO)``, Linux), without
    releasing the GIL: the readiness poll that tells it otherwise (redis-py's
    ``can_read``) is a blocking system call, and in a process whose other threads are busy
    (Prefect's engine, its events worker) each one costs about 0.2 ms waiting to take the
    GIL back. A server that exits, restarts or drops the client closes the socket, which
    moves it out of ``ESTABLISHED``. Unread data cannot wait on such a connection: every
    command sent on it has its reply read, and any failure disconnects it (:func:`evalsha`).
    ``False`` (check with the poll) for TLS and Unix-socket connections, off Linux, and
    when redis-py keeps its socket elsewhere."""
    if _TCP_INFO is None or type(conn) is not Connection:
        return False
    sock = getattr(conn, "_sock", None)
    if not isinstance(sock, socket.socket):
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)
    except OSError:
        return False
    return info[0] == _TCP_ESTABLISHED


class DirectConnections:
    """One connection per thread for the direct call path, made like the pool's own and kept
    by the thread (redis-py's pool spends about 7 µs per command taking a connection and
    giving it back). A finished thread's connection is closed when another thread makes one
    (or when it is collected), a forked child makes its own, and :meth:`close` closes all.

    Args:
        pool: the ``redis.Redis`` client's connection pool (its connection class and
            arguments are used; it does not count these connections).
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._local = threading.local()
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()
        self._owners: list[tuple[weakref.ref[threading.Thread], Any]] = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        """This thread's connection (made on first use in a thread or process), connected
        and with nothing unread: a socket the server closed (a restart) is replaced before
        anything is sent on it, as redis-py's pool does.

        Raises:
            redis.exceptions.ConnectionError, TimeoutError: Redis does not answer.
        """
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self.pool.connection_class(**self.pool.connection_kwargs)
            local.conn, local.pid = conn, os.getpid()
            with self._lock:
                self._all.add(conn)
                # A finished thread's connection would stay open until the garbage collector
                # finds it: close those now, so threads that come and go hold no sockets.
                alive = []
                for owner, owned in self._owners:
                    thread = owner()
                    if thread is not None and thread.is_alive():
                        alive.append((owner, owned))
                    elif getattr(owned, "pid", None) == os.getpid():
                        owned.disconnect()
                alive.append((weakref.ref(threading.current_thread()), conn))
                self._owners = alive
        if _established(conn):
            return conn
        try:
            conn.connect()
            if conn.can_read():
                raise RedisConnectionError("connection has unread data")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            conn.connect()
        return conn

    def close(self) -> None:
        """Disconnect every thread's connection (a later :meth:`get` connects again)."""
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            if getattr(conn, "pid", os.getpid()) == os.getpid():
                conn.disconnect()


def direct_pool(client: RedisClient) -> DirectConnections | None:
    """The connections :func:`evalsha` uses directly: those of a plain ``redis.Redis``
    client without a dedicated connection; ``None`` otherwise (a cluster client, or a
    client bound to one connection), which runs scripts through the registered script."""
    if isinstance(client, Redis) and client.connection is None:
        return DirectConnections(client.connection_pool)
    return None


def _packer() -> Callable[[tuple[Any, ...]], bytes] | None:
    try:
        from hiredis import pack_command
    except ImportError:  # redis-py without hiredis: its own packer
        return None
    return pack_command


_pack = _packer()


def _send(conn: Any, *args: Any) -> None:
    """Send one command of ``str`` arguments: packed by hiredis in one call where it is
    installed (redis-py's packer walks the arguments in Python first, which costs about
    2 µs per 10 arguments), by the connection's packer otherwise."""
    if _pack is None:
        conn.send_command(*args)
    else:
        conn.send_packed_command([_pack(args)])


def _refuses_functions(exc: ResponseError) -> bool:
    """Whether ``exc`` (the reply to ``FCALL`` or ``FUNCTION LOAD``) says this server or
    user cannot run functions at all: an unknown command (before Redis 7) or an ACL without
    those commands. Other errors (out of memory, a read-only replica, a key the user may not
    touch) are raised: they would refuse the script as well."""
    text = str(exc)
    if text.startswith("unknown command"):
        return True
    return isinstance(exc, NoPermissionError) and ("'fcall'" in text or "'function" in text)


#: How many times a call loads the library again when it finds it gone before giving up
#: with ``UNAVAILABLE`` (someone runs ``FUNCTION FLUSH`` again and again).
LOADS_PER_CALL = 3


def _fcall(scripts: Scripts, conn: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Call operation ``name`` through the function library on ``conn``; load the library
    when the server does not have it (first use, restart, ``FUNCTION FLUSH``) and call
    again, up to :data:`LOADS_PER_CALL` times. Returns ``_SCRIPTS`` when the server refuses
    functions (the operation did not run): the caller runs the script instead, as it will
    from then on.

    Raises:
        UnavailableError: the library was gone at every attempt (the operation never ran).
        redis.exceptions.RedisError: any other error.
    """
    lib = library()
    function = lib.functions[name]
    for _attempt in range(LOADS_PER_CALL + 1):
        _send(conn, "FCALL", function, str(len(keys)), *keys, *args)
        try:
            reply = conn.read_response()
        except ResponseError as exc:
            if _refuses_functions(exc):
                scripts.functions = False
                return _SCRIPTS
            if not str(exc).startswith("Function not found"):
                raise
            try:
                conn.send_command("FUNCTION", "LOAD", "REPLACE", lib.text)
                conn.read_response()
            except ResponseError as load_error:
                if _refuses_functions(load_error):
                    scripts.functions = False
                    return _SCRIPTS
                raise
            continue
        scripts.functions = True
        return reply
    raise UnavailableError(
        f"the Redis function library {lib.name} was removed {LOADS_PER_CALL + 1} times during "
        "one call (FUNCTION FLUSH); the operation did not run: retry"
    )


_SCRIPTS = object()


def evalsha(
    scripts: Scripts,
    pool: DirectConnections | None,
    name: str,
    keys: Sequence[str],
    args: Sequence[Any],
) -> list[Any]:
    """Run operation ``name`` once on a pooled connection of a plain ``redis.Redis`` client
    (redis-py's own steps for one command, without its per-command bookkeeping): ``FCALL``
    of the function library where the server has functions, ``EVALSHA`` otherwise (on
    ``NOSCRIPT`` the script did not run; the registered script loads it and runs it).
    Through the registered script when ``pool`` is ``None`` (a cluster client). Any
    failure other than an error reply leaves the connection disconnected, so no unread
    reply can be taken for the next command's."""
    script = scripts[name]
    if pool is None:
        reply: list[Any] = script(keys=keys, args=args)
        return reply
    conn = None
    try:
        conn = pool.get()
        if scripts.functions is not False:
            reply = _fcall(scripts, conn, name, keys, args)
            if reply is not _SCRIPTS:
                return reply
        _send(conn, "EVALSHA", script.sha, str(len(keys)), *keys, *args)
        reply = conn.read_response()
    except NoScriptError:
        try:
            reply = script(keys=keys, args=args)
        except NoScriptError as exc:  # flushed again between the load and the call
            raise UnavailableError(
                "the Redis script cache was flushed during the call (SCRIPT FLUSH); the "
                "operation did not run: retry"
            ) from exc
    except ResponseError:
        raise
    except BaseException:
        if conn is not None:
            conn.disconnect()
        raise
    return reply
