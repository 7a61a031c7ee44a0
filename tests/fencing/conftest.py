"""Fixtures of the fencing guards: the user's own database on SQLite and PostgreSQL.

``user_db`` is each database in turn (a SQLite file per test; the PostgreSQL server on
127.0.0.1:5432, database ``test``), with the fence table created. Every test writes under
its own namespace and its own tables (``deploys_<hex>``, ``writes_<hex>``), so parallel
runs share the server without seeing each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
)

from prefect_baton.fencing import ensure_fence_table
from tests.conftest import PG_URL, require_postgresql

DATABASES = ["sqlite", "postgresql"]


def engine_for(kind: str, tmp_path: Path) -> Engine:
    """An engine of the user's database ``kind`` (SQLite file under ``tmp_path``)."""
    if kind == "sqlite":
        # writers wait for the write lock instead of failing after SQLite's default 5 s
        return create_engine(f"sqlite:///{tmp_path / 'user.db'}", connect_args={"timeout": 60})
    require_postgresql()
    url = PG_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    return create_engine(url, pool_size=20, max_overflow=20)


@dataclass
class UserDb:
    """The user's database of one test: the engine, a namespace of the guard, a table
    ``deploys`` (the resource's current value) and ``writes`` (every write that landed, in
    the order the database serialised them)."""

    kind: str
    engine: Engine
    url: str
    namespace: str
    deploys: Table
    writes: Table

    def current(self, service: str) -> str | None:
        """The version ``service`` is deployed at, ``None`` if never written."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(self.deploys.c.version).where(self.deploys.c.service == service)
            ).first()
        return None if row is None else str(row[0])

    def landed(self) -> list[tuple[int, str]]:
        """``(token, writer)`` of every write that landed, in commit order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(self.writes.c.token, self.writes.c.writer).order_by(self.writes.c.seq)
            ).all()
        return [(int(t), str(w)) for t, w in rows]

    def seed(self, service: str, version: str = "0") -> None:
        """Create the ``deploys`` row of ``service``."""
        with self.engine.begin() as conn:
            conn.execute(insert(self.deploys).values(service=service, version=version))


def user_tables(suffix: str) -> tuple[MetaData, Table, Table]:
    """The test's own ``deploys_<suffix>`` and ``writes_<suffix>`` tables."""
    md = MetaData()
    deploys = Table(
        f"deploys_{suffix}",
        md,
        Column("service", String(64), primary_key=True),
        Column("version", String(64), nullable=False),
    )
    writes = Table(
        f"writes_{suffix}",
        md,
        Column("seq", Integer, primary_key=True, autoincrement=True),
        Column("token", Integer, nullable=False),
        Column("writer", String(64), nullable=False),
    )
    return md, deploys, writes


@pytest.fixture(params=DATABASES)
def user_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UserDb]:
    """The user's database (each of SQLite and PostgreSQL), fence table created."""
    engine = engine_for(request.param, tmp_path)
    suffix = uuid.uuid4().hex[:10]
    md, deploys, writes = user_tables(suffix)
    ensure_fence_table(engine)
    md.create_all(engine)
    try:
        yield UserDb(
            kind=request.param,
            engine=engine,
            url=engine.url.render_as_string(hide_password=False),
            namespace=f"test-{suffix}",
            deploys=deploys,
            writes=writes,
        )
    finally:
        md.drop_all(engine)
        engine.dispose()
