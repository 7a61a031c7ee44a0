"""Engines for the ledger: SQLite (WAL, busy timeout, write transactions that take the lock
up front), PostgreSQL (psycopg 3) and an in-memory SQLite database for tests
(:func:`make_memory_engines`), plus Alembic migrations applied on first use."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from prefect_baton.errors import NotFoundError, UnavailableError, ValidationError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "baton_alembic_version"
#: The newest migration revision shipped in the package. Alembic (and the scan of the
#: migration scripts) is loaded only when a ledger needs upgrading, not at every start;
#: ``tests/unit/test_migrations.py`` checks this against Alembic's script directory.
HEAD_REVISION = "0006"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Connections the SQLite read engine keeps open once opened (10 more may be opened, and
#: are closed on return): AnyIO's default worker-thread limit, so a REST server running that
#: many reads at once neither reopens connections (with their PRAGMAs) nor waits for one.
#: Opened on demand: a single-threaded client still holds one. The write engine has one
#: connection (see :func:`_sqlite_engine`).
SQLITE_POOL_SIZE = 40
#: The URL an in-memory ledger reports (:func:`make_memory_engines`); ``normalize_url`` still
#: refuses it, since every connection of a pool would see its own empty database.
MEMORY_URL = "sqlite://"
_MIGRATION_LOCK_KEY = 0x62A70_0001  # pg advisory lock id for migrations

#: libpq settings applied unless the URL sets them: connect within 3 s, and notice a peer
#: that stops answering within about 4 s (TCP keepalives and tcp_user_timeout), below the
#: renew deadline of the shortest lease (two thirds of 10 s): a lease block's renewal blocked
#: on a dead network ends before its deadline. (A renewal's statements also time out, see
#: :func:`prefect_baton._rules.keeping.heartbeat_call_timeout`; the keeper's renew-deadline
#: timer fires whatever a blocked call is doing.)
#: Milliseconds a PostgreSQL session may sit idle inside a transaction before the server
#: ends it (``idle_in_transaction_session_timeout``). A ledger transaction runs its
#: statements back to back; a client paused inside one (SIGSTOP, a debugger, a VM
#: freeze) would otherwise keep its locks, and every write of the resources it locked
#: would wait until it resumes, long after its lease ran out (a takeover included). Below
#: the shortest TTL (10 s), so a paused holder cannot keep a resource past it by more
#: than this. The paused client's transaction is rolled back: on resuming it gets
#: ``UNAVAILABLE``, and its retry meets the fencing rules as any late write does.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000

PG_CONNECT_DEFAULTS: dict[str, int | str] = {
    "connect_timeout": 3,
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 4_000,
    "options": f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}",
}

_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _dispose_in_child() -> None:
    for eng in list(_engines):
        eng.dispose(close=False)


os.register_at_fork(after_in_child=_dispose_in_child)


@dataclass(frozen=True)
class Engines:
    """A write engine and a read engine over one database (the same one on PostgreSQL)."""

    url: str
    dialect: str
    write: Engine
    read: Engine

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def now_sql(self) -> str:
        """SQL that reads the database clock as epoch milliseconds."""
        if self.is_sqlite:
            return "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
        return "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"

    def dispose(self) -> None:
        self.write.dispose()
        if self.read is not self.write:
            self.read.dispose()


def _parse_url(url: str) -> URL:
    """``url`` parsed by SQLAlchemy (``URL``): the one check of a ledger URL's form.

    Raises:
        ValidationError: ``url`` is not a database URL (a bare path gets the SQLite URL
            of that file as a hint), or is a SQLite URL with a host part (``sqlite://tmp/x.db``
            names the file ``x.db``: SQLAlchemy drops the host).
    """
    try:
        u = make_url(url)
    except Exception as exc:
        hint = "" if "://" in url else f" (for a SQLite file, sqlite:///{url})"
        raise ValidationError(f"ledger URL {url!r} is not a database URL: {exc}{hint}") from None
    if u.get_backend_name() == "sqlite" and (u.host or u.port is not None or u.username):
        authority = url.split("://", 1)[-1].split("/", 1)[0]
        raise ValidationError(
            f"ledger URL {url!r} has a host part ({authority!r}), which SQLite does not use: "
            "a SQLite file is sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    return u


def normalize_url(url: str) -> str:
    """Map ``postgresql://`` / ``postgres://`` to psycopg 3 and create a SQLite file's folder.

    Raises:
        ValidationError: the URL is not a SQLite or PostgreSQL SQLAlchemy URL, or is a
            SQLite URL with a host part (see :func:`_parse_url`).
    """
    u = _parse_url(url)
    backend = u.get_backend_name()
    if backend in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        db = u.database
        if not db or db == ":memory:" or "mode=memory" in str(u.query):
            raise ValidationError(
                "an in-memory SQLite ledger is not supported (every connection would see its "
                "own empty database): use a file, e.g. sqlite:///.baton/ledger.db (in "
                "tests: prefect_baton.testing.memory_baton)"
            )
        if not db.startswith("file:"):
            folder = Path(db).expanduser().resolve().parent
            if not folder.exists():
                if not folder.parent.is_dir():  # only the ledger's own folder is created
                    raise ValidationError(
                        f"ledger folder {folder} does not exist, and neither does its parent "
                        f"{folder.parent} (only the ledger's own folder is created)"
                    )
                try:
                    folder.mkdir(exist_ok=True)  # one level, e.g. ./.baton: never a whole tree
                except OSError as exc:
                    raise ValidationError(f"cannot create ledger folder {folder}: {exc}") from None
            elif not folder.is_dir():
                raise ValidationError(f"{folder} is not a folder")
    else:
        raise ValidationError(f"ledger URL must be sqlite:// or postgresql://, got {backend}://")
    return u.render_as_string(hide_password=False)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite ledger URL (``Path``, as given: relative to the working
    directory when relative), or ``None`` for another database or a ``file:`` URI.

    Raises:
        ValidationError: the URL is not a database URL, or is a SQLite URL with a host part.
    """
    u = _parse_url(url)
    db = u.database
    if u.get_backend_name() != "sqlite" or not db or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def require_ledger_file(url: str, *, configured_by: str) -> None:
    """Refuse to read a SQLite ledger file that does not exist, for a reader that would
    otherwise create an empty ledger and answer from it (a mistyped path would read as
    "nothing there"): the CLI's read commands and the ready-made flows that only read.

    Args:
        url: the ledger URL (``str``); another database, or a ``file:`` URI, passes.
        configured_by: where ``url`` was set (``str``), named in the message (e.g.
            ``"--ledger-url (or BATON_LEDGER_URL)"``).

    Raises:
        NotFoundError: ``url`` is a SQLite URL whose file does not exist (nothing is
            created). ValidationError: ``url`` is not a database URL.
    """
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise NotFoundError(
            f"no ledger at {path}: check {configured_by}; a command that writes (baton "
            "lease acquire, baton db upgrade, ...) creates it"
        )


#: SQLite's result code ``SQLITE_READONLY`` (the low byte of its extended codes, e.g.
#: ``SQLITE_READONLY_DIRECTORY``), and its extended code for a file moved or deleted while
#: open, which is no matter of permissions.
_SQLITE_READONLY = 8
_SQLITE_READONLY_DBMOVED = 1032


def ledger_failure(engines: Engines, exc: Exception) -> UnavailableError:
    """The error of a ledger statement the database failed with ``exc``: ``UNAVAILABLE``
    (the ledger cannot be used; the REST API and the MCP server tell their callers no more
    than that, the detail goes to the server log).

    When a SQLite ledger cannot be written for lack of permission (``SQLITE_READONLY``:
    the file is read-only, or its directory, where SQLite keeps the ``-wal`` and ``-shm``
    files beside it, or one of those files is), the message names the file and says it is
    not writable: a retry meets the same permissions until they are changed. A read of a
    read-only file in a writable directory works. Any other failure reads ``ledger database
    unavailable: ...``. ``exc`` is SQLAlchemy's ``OperationalError`` (the driver's error as
    its ``orig``) or the driver's own error.
    """
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if (
        engines.is_sqlite
        and isinstance(code, int)
        and code & 0xFF == _SQLITE_READONLY
        and code != _SQLITE_READONLY_DBMOVED
    ):
        where = sqlite_file(engines.url) or engines.url
        return UnavailableError(
            f"the SQLite ledger file {where} is not writable by this process ({orig}): "
            "writing needs write permission on the file and on its directory (where SQLite "
            "keeps its -wal and -shm files, which need it too; a read-only file in a "
            "writable directory can still be read); retrying fails until that is changed"
        )
    return UnavailableError(f"ledger database unavailable: {orig}")


def write_turn_timed_out() -> UnavailableError:
    """The error of a SQLite write that waited longer than :data:`SQLITE_BUSY_TIMEOUT_MS`
    for its process's one write connection (the pool's ``sqlalchemy.exc.TimeoutError``,
    see :func:`_sqlite_engine`): as a write lock held that long, ``UNAVAILABLE``."""
    return UnavailableError(
        f"ledger write waited more than {SQLITE_BUSY_TIMEOUT_MS / 1000:g} s for this "
        "process's write connection (another write held the database's write lock); retry"
    )


def _set_wal(cur: Any) -> None:
    """Switch to WAL mode. Two processes opening a new file at once can see SQLITE_BUSY here
    without the busy handler being consulted, so retry for up to the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
    """An engine on the SQLite file ``url``; ``immediate``: the write engine, whose
    transactions begin with ``BEGIN IMMEDIATE`` (the database's write lock, taken up front).

    SQLite has one writer at a time. The write engine holds a single connection, so the
    threads of one process wait for their turn in the pool's queue (in arrival order, woken
    as soon as the connection is returned) instead of in SQLite's busy handler, which polls
    with sleeps of up to 100 ms and lets a late arrival win: with 16 REST clients on one
    server that put the p99 latency near 0.5 s (``benchmarks/rest.py``). A wait longer than
    the busy timeout raises ``sqlalchemy.exc.TimeoutError``, which the store reports as
    ``UnavailableError`` (:func:`write_turn_timed_out`). Writers in other processes still
    meet in the busy handler."""
    eng = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_pre_ping=False,
        pool_size=1 if immediate else SQLITE_POOL_SIZE,
        max_overflow=0 if immediate else 10,
        pool_timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
    )

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _set_wal(cur)
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(eng, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return eng


class _OneAtATimePool(StaticPool):
    """A :class:`StaticPool` (one connection for every thread) that lends its connection to
    one checkout at a time: the others wait until it is returned, so the transactions of
    several threads never interleave on the shared connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turn = threading.Lock()
        self._holder: int | None = None
        self._closed = False

    def recreate(self) -> _OneAtATimePool:
        """The pool an engine keeps after :meth:`Engine.dispose`: the database went with the
        connection, so it refuses every checkout instead of opening a new, empty one
        (:meth:`StaticPool.recreate`'s copy of this pool's settings, closed)."""
        pool = super().recreate()
        assert isinstance(pool, _OneAtATimePool)
        pool._closed = True
        return pool

    def _do_get(self) -> ConnectionPoolEntry:
        if self._closed:
            raise OperationalError(
                None, None, sqlite3.OperationalError("the in-memory ledger was closed")
            )
        if self._holder == threading.get_ident():
            raise RuntimeError(
                "the in-memory ledger's connection is already checked out by this thread"
            )
        self._turn.acquire()
        self._holder = threading.get_ident()
        try:
            return super()._do_get()
        except BaseException:
            self._holder = None
            self._turn.release()
            raise

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        self._holder = None
        self._turn.release()


def make_memory_engines() -> Engines:
    """Engines over a new, private in-memory SQLite database (for tests: see
    :mod:`prefect_baton.testing`).

    One connection (SQLAlchemy ``sqlite://`` on a :class:`StaticPool`,
    ``check_same_thread=False``) serves every thread, one transaction at a time, so all
    threads see the same database; write and read engine are the same engine. No WAL (an
    in-memory database has no journal file). The database lives until
    :meth:`Engines.dispose`. A forked child keeps a private copy of it.
    """
    eng = create_engine(
        MEMORY_URL,
        poolclass=_OneAtATimePool,
        connect_args={"check_same_thread": False},
    )

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves

    @event.listens_for(eng, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return Engines(url=MEMORY_URL, dialect="sqlite", write=eng, read=eng)


def make_engines(url: str) -> Engines:
    """Create the engines for ``url`` (see :func:`normalize_url`)."""
    url = normalize_url(url)
    dialect = make_url(url).get_backend_name()
    if dialect == "sqlite":
        write = _sqlite_engine(url, immediate=True)
        read = _sqlite_engine(url, immediate=False)
    else:
        query = make_url(url).query
        # Fail fast on an unreachable or frozen server instead of hanging on the TCP stack.
        connect_args = {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in query}
        # No ping per checkout (a round trip per transaction): a connection found dead on
        # first use, e.g. after a server restart, is replaced and the transaction retried
        # (see StoreBase._write and StoreBase._read).
        write = create_engine(
            url, pool_pre_ping=False, pool_size=5, max_overflow=10, connect_args=connect_args
        )
        read = write
    _engines.add(write)
    _engines.add(read)
    return Engines(url=url, dialect=dialect, write=write, read=read)


def _alembic_config(conn: Any | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    """The newest migration revision shipped in the package (``str``)."""
    return HEAD_REVISION


def current_revision(engines: Engines) -> str | None:
    """The revision the database is at, ``None`` for an empty database (read from Alembic's
    version table with one query, without loading Alembic)."""
    with _db_errors(engines), engines.read.connect() as conn:
        return _revision_on(conn)


def _revision_on(conn: Any) -> str | None:
    """The revision of the database behind connection ``conn`` (``None``: empty).

    Raises:
        ValidationError: the version table names more than one revision.
    """
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        raise ValidationError(
            f"the ledger's {VERSION_TABLE} names {len(rows)} revisions; expected one"
        )
    return str(rows[0]) if rows else None


def shipped_revisions() -> list[str]:
    """The migration revisions shipped in the package, oldest first (``list[str]``)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config())
    return [s.revision for s in reversed(list(script.walk_revisions()))]


def _command_error() -> type[Exception]:
    """Alembic's ``CommandError``, imported only once an exception is being matched."""
    from alembic.util.exc import CommandError

    return CommandError


@contextmanager
def _db_errors(engines: Engines) -> Iterator[None]:
    from sqlalchemy.exc import DatabaseError, InterfaceError, OperationalError, ProgrammingError

    try:
        yield
    except OperationalError as exc:
        raise ledger_failure(engines, exc) from exc
    except (ProgrammingError, InterfaceError) as exc:
        raise ValidationError(f"ledger URL or database rejected: {exc.orig}") from None
    except DatabaseError as exc:
        raise ValidationError(f"not a usable ledger database: {exc.orig}") from None
    except _command_error() as exc:  # evaluated only when an exception gets here
        raise ValidationError(
            f"the ledger's schema is not one this version of prefect-baton knows "
            f"(newest shipped: {head_revision()}); upgrade prefect-baton: {exc}"
        ) from None
    except OSError as exc:
        raise ValidationError(f"cannot open the ledger: {exc}") from None


def upgrade(engines: Engines, revision: str = "head") -> str | None:
    """Apply the Alembic migrations up to ``revision``; safe when many processes start at
    once (SQLite's write lock or a PostgreSQL advisory lock serialises them).

    Returns the revision the database is at afterwards (see :func:`upgrade_from_to`).
    """
    return upgrade_from_to(engines, revision)[1]


def upgrade_from_to(engines: Engines, revision: str = "head") -> tuple[str | None, str | None]:
    """Apply the Alembic migrations up to ``revision`` (``"head"``, or one of
    :func:`shipped_revisions`) and return ``(before, after)``: the revision the database was
    at when this call took the migration lock (``None``: empty) and the one it is at after.
    Of several processes upgrading at once, each reads ``before`` under the lock, so only
    the one that migrated sees it differ from ``after``.

    Raises:
        ValidationError: ``revision`` is not a shipped revision, the database is past it
            (an upgrade never downgrades), or its schema is not one this version knows.
        UnavailableError: the database is unreachable.
    """
    with _db_errors(engines):
        shipped = [] if revision == "head" else shipped_revisions()
        if revision == "head":
            now = current_revision(engines)
            if now == head_revision():
                return now, now
        elif revision not in shipped:
            raise ValidationError(
                f"unknown revision {revision!r}: this version of prefect-baton ships "
                f"revisions {', '.join(shipped)} (newest: {head_revision()})"
            )
        with engines.write.begin() as conn:
            if not engines.is_sqlite:
                conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})"))
            before = _revision_on(conn)
            if before in shipped and shipped.index(before) > shipped.index(revision):
                raise ValidationError(
                    f"the ledger is at revision {before}, past {revision}: an upgrade never "
                    "downgrades"
                )
            from alembic import command

            command.upgrade(_alembic_config(conn), revision)
        return before, current_revision(engines)
