"""The PostgreSQL ledger's deferred writes (one psycopg pipeline per transaction,
``Statements._send_deferred``) when one of them is refused by the server."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from prefect_baton._stores.ledger.store import LedgerStore
from tests.conftest import store_for


def test_a_refused_deferred_write_raises_it_and_logs_no_pipeline_abort(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A unique key taken (as by a concurrent writer) among many deferred writes raises
    the server's IntegrityError, as SQLAlchemy would, and psycopg logs no "error ignored
    terminating ... pipeline aborted" warning on the way out (an expected refusal, such as
    two processes creating one handoff under one idempotency key, is not worth one)."""
    store_for(pg_url)
    store = LedgerStore(pg_url, migrate=False)
    caplog.set_level(logging.WARNING, logger="psycopg")
    try:
        with Session(store.engines.write) as session, session.begin():
            session.execute(text("CREATE TEMP TABLE deferred_t (id int primary key)"))
            for i in [1, 1, *range(2, 2000)]:
                store._defer(session, "INSERT INTO deferred_t (id) VALUES (?)", (i,))
            with pytest.raises(IntegrityError, match="deferred_t_pkey"):
                session.execute(text("SELECT 1"))  # sends the deferred writes first
            session.rollback()
    finally:
        store.close()
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
