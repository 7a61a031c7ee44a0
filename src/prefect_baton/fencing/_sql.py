"""The SQL guard: the highest fencing token per resource, in a table of the user's database,
checked inside the user's own transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from sqlalchemy import BigInteger, Column, ColumnElement, MetaData, String, Table, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from prefect_baton._rules.validation import MAX_ID_LENGTH, validate_id
from prefect_baton.errors import ValidationError
from prefect_baton.fencing._token import Fenceable, FencingToken, checked_token

__all__ = [
    "DEFAULT_NAMESPACE",
    "FENCE_TABLE_NAME",
    "ensure_fence_table",
    "fence_metadata",
    "fence_table",
    "guard",
    "highest_token",
]

FENCE_TABLE_NAME = "baton_fences"
#: The namespace of :func:`guard` when none is given.
DEFAULT_NAMESPACE = "default"

#: The :class:`~sqlalchemy.MetaData` holding only :data:`fence_table` (for Alembic's
#: ``target_metadata``, or use :func:`ensure_fence_table` on your own metadata).
fence_metadata = MetaData()

#: ``baton_fences``: one row per (namespace, resource type, resource id) with the highest
#: fencing token that has written there.
fence_table = Table(
    FENCE_TABLE_NAME,
    fence_metadata,
    Column("namespace", String(MAX_ID_LENGTH), primary_key=True),
    Column("resource_type", String(MAX_ID_LENGTH), primary_key=True),
    Column("resource_id", String(MAX_ID_LENGTH), primary_key=True),
    Column("token", BigInteger, nullable=False),
)

_INSERTS: dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}
#: ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` needs SQLite 3.35 (2021-03).
_SQLITE_MIN = (3, 35, 0)


def ensure_fence_table(target: Engine | Connection | MetaData) -> Table:
    """Create the ``baton_fences`` table, or add it to your metadata.

    Args:
        target: an :class:`~sqlalchemy.engine.Engine` of your database: the table is
            created unless it exists (safe to call on every start, from several processes
            at once). A :class:`~sqlalchemy.engine.Connection`: the same, in its
            transaction, left for you to commit. Or your :class:`~sqlalchemy.MetaData`
            (e.g. ``Base.metadata``): the table is added to it, so ``create_all`` and
            Alembic autogenerate include it.

    Returns:
        The :class:`~sqlalchemy.Table` (:data:`fence_table`, or its copy in ``target``).

    Raises:
        ValidationError: ``target`` is none of these.
        sqlalchemy.exc.DBAPIError: the database refused the ``CREATE TABLE``.
    """
    if isinstance(target, MetaData):
        existing = target.tables.get(FENCE_TABLE_NAME)
        return existing if existing is not None else fence_table.to_metadata(target)
    if not isinstance(target, Engine | Connection):
        raise ValidationError(
            f"ensure_fence_table takes an Engine, a Connection or a MetaData, got "
            f"{type(target).__name__}"
        )
    if isinstance(target, Connection):
        fence_metadata.create_all(target, checkfirst=True)
        return fence_table
    try:
        fence_metadata.create_all(target, checkfirst=True)
    except DBAPIError:
        # another process created it between the check and the CREATE
        if not inspect(target).has_table(FENCE_TABLE_NAME):
            raise
    return fence_table


def _connection(bind: Connection | Session) -> Connection:
    if isinstance(bind, Session):
        return bind.connection()
    if isinstance(bind, Connection):
        return bind
    raise ValidationError(
        f"guard takes a SQLAlchemy Connection or Session, got {type(bind).__name__} (an "
        "AsyncSession or AsyncConnection: await conn.run_sync(guard, lease))"
    )


def _namespace(namespace: object) -> str:
    return validate_id("namespace", namespace)


def guard(
    bind: Connection | Session, fence: Fenceable, *, namespace: str = DEFAULT_NAMESPACE
) -> int:
    """Refuse a write made under a lease that a newer holder has since written under.

    Call it inside the transaction that makes the write, before the write, and commit as
    usual::

        with engine.begin() as conn:
            fencing.guard(conn, lease)  # StaleFenceError: a newer holder has written
            conn.execute(update(deploys).values(version="1.4.2"))

    It records ``fence``'s epoch as the highest token of its resource in ``baton_fences``
    (:func:`ensure_fence_table`) and locks that row until your transaction ends, so the
    check and your write are one atomic step: once a writer with a higher token has
    committed, a writer with a lower token is refused, however long it was paused. The same
    token passes any number of times (one holder writes many times under one epoch). The
    rule is :func:`prefect_baton._rules.core.check_fencing_token`.

    Writers of one resource take turns from ``guard`` to commit; keep those transactions
    short, and guard several resources in one fixed order (sorted) to avoid deadlocks.
    On SQLite the guard's write takes the database's write lock: call it first in the
    transaction. On PostgreSQL at ``REPEATABLE READ`` or ``SERIALIZABLE`` a concurrent
    writer makes the guard raise a serialization failure; retry the transaction.

    Args:
        bind: your :class:`~sqlalchemy.engine.Connection` or
            :class:`~sqlalchemy.orm.Session` (SQLModel's too), in the transaction of the
            write. Async: ``await conn.run_sync(guard, lease)``.
        fence: the lease the write is made under: a :class:`~prefect_baton.models.Lease`,
            the lease block, or a :class:`~prefect_baton.fencing.FencingToken`.
        namespace: separates independent token sequences in one table (``str``, default
            ``"default"``): use the Baton organization when several share a database.

    Returns:
        The highest token of the resource (``int``), now ``fence``'s epoch.

    Raises:
        StaleFenceError: a higher token has written to the resource (the write must not
            happen; roll the transaction back).
        ValidationError: bad arguments, or a database other than SQLite (3.35 or later) or
            PostgreSQL.
    """
    token = FencingToken.of(fence)
    ns = _namespace(namespace)
    conn = _connection(bind)
    highest = _lock_row(conn, ns, token)
    new = checked_token(highest, token, "sql")
    if new != highest:
        key = _key(ns, token.resource_type, token.resource_id)
        conn.execute(fence_table.update().where(*key).values(token=new))
    return new


def _insert(conn: Connection) -> Callable[[Table], postgresql.Insert | sqlite.Insert]:
    name = conn.dialect.name
    if name == "sqlite" and sqlite3.sqlite_version_info < _SQLITE_MIN:
        raise ValidationError(
            f"the fencing guard needs SQLite 3.35 or later, this Python has "
            f"{sqlite3.sqlite_version}"
        )
    if name not in _INSERTS:
        raise ValidationError(f"the fencing guard supports SQLite and PostgreSQL, not {name}")
    return _INSERTS[name]


def _lock_row(conn: Connection, namespace: str, token: FencingToken) -> int:
    """The highest token of the resource, its row locked until the transaction ends.

    One statement: insert the row with ``token`` (a first write), or on conflict update it
    to itself (which takes the row's lock in PostgreSQL and the write lock in SQLite), and
    return the stored token.
    """
    insert = _insert(conn)
    values = {
        "namespace": namespace,
        "resource_type": token.resource_type,
        "resource_id": token.resource_id,
        "token": token.epoch,
    }
    stmt = (
        insert(fence_table)
        .values(**values)
        .on_conflict_do_update(
            index_elements=["namespace", "resource_type", "resource_id"],
            set_={"token": fence_table.c.token},
        )
        .returning(fence_table.c.token)
    )
    return int(conn.execute(stmt).scalar_one())


def _key(namespace: str, resource_type: str, resource_id: str) -> tuple[ColumnElement[bool], ...]:
    c = fence_table.c
    return (
        c.namespace == namespace,
        c.resource_type == resource_type,
        c.resource_id == resource_id,
    )


def highest_token(
    bind: Connection | Session,
    resource_type: str,
    resource_id: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
) -> int | None:
    """The highest fencing token that has written to a resource through :func:`guard`
    (``int``), or ``None`` if none has. A read, for inspection: it locks nothing.

    Raises:
        ValidationError: bad arguments.
    """
    key = _key(
        _namespace(namespace),
        validate_id("resource_type", resource_type),
        validate_id("resource_id", resource_id),
    )
    conn = _connection(bind)
    found = conn.execute(fence_table.select().with_only_columns(fence_table.c.token).where(*key))
    value = found.scalar_one_or_none()
    return None if value is None else int(value)
