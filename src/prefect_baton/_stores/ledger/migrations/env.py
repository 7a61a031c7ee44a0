"""Alembic environment for the prefect-baton ledger.

Run by :func:`prefect_baton._stores.ledger.migrate.upgrade` with an open connection in
``config.attributes["connection"]``; ``baton db upgrade`` uses the same path.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from prefect_baton._stores.ledger.tables import metadata

config = context.config
connection = config.attributes.get("connection")


def _run(conn: object) -> None:
    context.configure(
        connection=conn,  # type: ignore[arg-type]
        target_metadata=metadata,
        render_as_batch=True,
        version_table="baton_alembic_version",
    )
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:  # plain `alembic` command line with sqlalchemy.url set
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")
    with engine.connect() as conn:
        _run(conn)
