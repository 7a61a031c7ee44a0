"""The ledger store's statements on the driver's cursor: :class:`Statements`, the part of
:class:`~prefect_baton._stores.ledger.base.StoreBase` that runs SQL on a write session's
pooled DBAPI connection without the ORM (:meth:`Statements._sql`), defers writes nobody
reads to one PostgreSQL pipeline per round trip (:meth:`Statements._defer`), and wraps the
driver's errors as SQLAlchemy would.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from prefect_baton._stores.ledger.engine import Engines

__all__ = ["Statements"]

#: Statements of :meth:`Statements._sql` with PostgreSQL's placeholders, by their SQLite text.
_PG_SQL: dict[str, str] = {}
#: The key of a session's :attr:`~sqlalchemy.orm.Session.info` under which
#: :meth:`Statements._sql` keeps the session's pooled DBAPI connection.
_DBAPI_CONNECTION = "baton_dbapi_connection"

#: The key of a pooled connection's ``info`` under which writes wait to be sent
#: (PostgreSQL, :meth:`Statements._defer`): ``(statement, params)`` pairs.
_DEFERRED = "baton_deferred"


def _forget_deferred(_dbapi_connection: Any, record: Any) -> None:
    """The pool's ``checkin`` event: a connection back in the pool has no deferred writes
    (those of a rolled-back transaction are dropped with it)."""
    record.info.pop(_DEFERRED, None)


class Statements:
    """SQL on the driver's cursor for a store over ``engines`` (set by the store's setup,
    then :meth:`_listen` called once)."""

    engines: Engines
    #: The driver's base exception class (``sqlite3.Error``, ``psycopg.Error``).
    _driver_error: type[Exception]

    def _listen(self) -> None:
        """Set :attr:`_driver_error` from the write engine, and on PostgreSQL have deferred
        writes go first, before any other statement on a connection; a connection
        returned to the pool (committed or rolled back) has none left."""
        self._driver_error = self.engines.write.dialect.loaded_dbapi.Error
        if not self.engines.is_sqlite:
            event.listen(self.engines.write, "before_cursor_execute", self._before_execute)
            event.listen(self.engines.write, "checkin", _forget_deferred)

    def _sql(self, session: Session, statement: str, params: Any = ()) -> Any:
        """Run ``statement`` (SQL with ``?`` placeholders, no literal ``%``) with ``params``
        (a tuple, or a list of tuples for many rows) with the driver's cursor on
        ``session``'s connection, in its transaction: no ORM unit of work, no statement
        compilation, no result wrapping on the paths run once per lease operation.

        Returns:
            The driver's cursor (``fetchone()`` gives a tuple, ``rowcount`` the rows
            written).

        Raises:
            sqlalchemy.exc.DBAPIError: the driver's error, wrapped as SQLAlchemy wraps it
                for any statement (``IntegrityError``, ``OperationalError``, ...).
        """
        dbapi = self._dbapi(session)
        if not self.engines.is_sqlite:
            if dbapi.info.get(_DEFERRED):
                self._send_deferred(dbapi)
            statement = self._pg_statement(statement)
        cursor = dbapi.cursor()
        try:
            if isinstance(params, list) and len(params) != 1:
                cursor.executemany(statement, params)
            elif isinstance(params, list):  # one row: no batch (psycopg's is a pipeline)
                cursor.execute(statement, params[0])
            else:
                cursor.execute(statement, params)
        except self._driver_error as exc:
            raise self._wrap(dbapi, cursor, statement, params, exc) from exc
        return cursor

    def _defer(self, session: Session, statement: str, params: tuple[Any, ...]) -> None:
        """Run write ``statement`` (as :meth:`_sql`, one row) whose result nobody reads: on
        PostgreSQL it waits, and the writes waiting go together in one pipeline (one round
        trip) before the next statement on the connection or the ``COMMIT``; their errors
        are raised there. On SQLite it runs at once."""
        if self.engines.is_sqlite:
            self._sql(session, statement, params)
            return
        dbapi = self._dbapi(session)
        dbapi.info.setdefault(_DEFERRED, []).append((self._pg_statement(statement), params))

    def _dbapi(self, session: Session) -> Any:
        """``session``'s pooled DBAPI connection (found once per session: each holds one
        transaction on one connection)."""
        dbapi = session.info.get(_DBAPI_CONNECTION)
        if dbapi is None:
            dbapi = session.info[_DBAPI_CONNECTION] = session.connection().connection
        return dbapi

    @staticmethod
    def _pg_statement(statement: str) -> str:
        """``statement`` with PostgreSQL's placeholders (psycopg's ``%s``)."""
        return _PG_SQL.get(statement) or _PG_SQL.setdefault(statement, statement.replace("?", "%s"))

    def _send_deferred(self, dbapi: Any) -> None:
        """Send the writes waiting on pooled connection ``dbapi`` (:meth:`_defer`), in their
        order, in one psycopg pipeline."""
        pending = dbapi.info.pop(_DEFERRED, None)
        if not pending:
            return
        driver = dbapi.driver_connection
        cursor = driver.cursor()
        first: Exception | None = None
        try:
            with driver.pipeline():
                try:
                    for statement, params in pending:
                        cursor.execute(statement, params)
                except self._driver_error as exc:
                    # leave the pipeline with no exception in flight: psycopg would log its
                    # own "pipeline aborted" on the way out as a warning (an expected
                    # refusal, a unique key taken by a concurrent writer, is not one)
                    first = exc
        except self._driver_error as exc:
            first = first or exc
        if first is not None:
            statements = "; ".join(statement for statement, _params in pending)
            raise self._wrap(dbapi, cursor, statements, None, first) from first

    def _before_execute(self, conn: Any, *_args: Any) -> None:
        """SQLAlchemy's ``before_cursor_execute`` (PostgreSQL): the writes waiting on the
        connection go first."""
        if conn.info.get(_DEFERRED):
            self._send_deferred(conn.connection)

    def _wrap(
        self, dbapi: Any, cursor: Any, statement: str, params: Any, exc: Exception
    ) -> DBAPIError:
        """The driver's error ``exc`` wrapped as SQLAlchemy wraps it for any statement; a
        connection found closed is invalidated, as SQLAlchemy does for its own statements."""
        lost = self.engines.write.dialect.is_disconnect(
            cast(Any, exc), dbapi.driver_connection, cursor
        )
        wrapped = cast(
            DBAPIError,
            DBAPIError.instance(
                statement, params, exc, self._driver_error, connection_invalidated=lost
            ),
        )
        if lost:
            dbapi.invalidate(wrapped)
        return wrapped
