"""The Alembic migrations shipped in the package build exactly the schema of ``tables.py``, on
SQLite and PostgreSQL, and many processes may apply them to one fresh database at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from prefect_baton._stores.ledger.engine import (
    VERSION_TABLE,
    current_revision,
    head_revision,
    make_engines,
    upgrade,
)
from prefect_baton._stores.ledger.tables import metadata
from prefect_baton.errors import ValidationError


def _schema_diff(url: str) -> list[Any]:
    """Differences between the database at ``url`` and the models, as Alembic sees them."""
    engines = make_engines(url)
    try:
        with engines.read.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "version_table": VERSION_TABLE,
                    "compare_type": True,
                    "target_metadata": metadata,
                },
            )
            return list(compare_metadata(ctx, metadata))
    finally:
        engines.dispose()


def _partial_indexes(url: str) -> dict[str, str]:
    """Index name -> SQL definition, for the indexes the models declare partial."""
    names = [
        ix.name
        for table in metadata.tables.values()
        for ix in table.indexes
        if ix.dialect_options["sqlite"].get("where") is not None
    ]
    engines = make_engines(url)
    try:
        with engines.read.connect() as conn:
            if engines.is_sqlite:
                sql = "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
            else:
                sql = "SELECT indexname, indexdef FROM pg_indexes"
            found = {row[0]: row[1] for row in conn.exec_driver_sql(sql)}
        return {n: found.get(n) or "" for n in names if n}
    finally:
        engines.dispose()


def _assert_partial_indexes(url: str) -> None:
    """Alembic's comparison ignores index predicates, so check them here."""
    defs = _partial_indexes(url)
    assert set(defs) >= {"uq_lease_active", "ix_lease_active_scoped"}
    for name, sql in defs.items():
        assert "WHERE" in sql.upper(), (name, sql)
        assert "active" in sql, (name, sql)
    assert "has_scopes" in defs["ix_lease_active_scoped"]
    assert "UNIQUE" in defs["uq_lease_active"].upper()


def _tables(url: str) -> set[str]:
    engines = make_engines(url)
    try:
        return set(inspect(engines.read).get_table_names())
    finally:
        engines.dispose()


def _upgrade_fresh(url: str) -> str | None:
    engines = make_engines(url)
    try:
        assert current_revision(engines) is None
        rev = upgrade(engines)
        assert upgrade(engines) == rev  # a second run is a no-op
        return rev
    finally:
        engines.dispose()


def test_sqlite_migration_matches_models(tmp_path: Path) -> None:
    """A fresh SQLite ledger upgraded by the shipped migrations has exactly the model schema."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert _upgrade_fresh(url) == head_revision()
    assert _schema_diff(url) == []
    assert _tables(url) == set(metadata.tables) | {VERSION_TABLE}
    _assert_partial_indexes(url)


@pytest.fixture
def pg_fresh_url(pg_url: str) -> Iterator[str]:
    """A throwaway PostgreSQL database on the test server, dropped afterwards."""
    import psycopg

    name = f"baton_migr_{uuid.uuid4().hex[:12]}"
    admin = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_postgresql_migration_matches_models(pg_fresh_url: str) -> None:
    """A fresh PostgreSQL ledger upgraded by the shipped migrations has exactly the model
    schema."""
    assert _upgrade_fresh(pg_fresh_url) == head_revision()
    assert _schema_diff(pg_fresh_url) == []
    assert _tables(pg_fresh_url) == set(metadata.tables) | {VERSION_TABLE}
    _assert_partial_indexes(pg_fresh_url)


_UPGRADER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from prefect_baton._stores.ledger.engine import make_engines, upgrade

    url, go, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    engines = make_engines(url)
    ready.touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    print(upgrade(engines))
    engines.dispose()
    """
)


def test_two_processes_upgrade_one_fresh_sqlite_file(tmp_path: Path) -> None:
    """Two processes starting on the same new ledger file both migrate it without error."""
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _UPGRADER, url, str(go), str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in ready
    ]
    # start both at once, after each has imported everything and opened its engines
    deadline = time.monotonic() + 60
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == head_revision()
    assert _schema_diff(url) == []
    _assert_partial_indexes(url)
    assert _tables(url) == set(metadata.tables) | {VERSION_TABLE}


def test_head_revision_is_alembics_head() -> None:
    """The revision a ledger is checked against at start (without loading Alembic) is the
    head of the shipped migration scripts: a new migration must move ``HEAD_REVISION``."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from prefect_baton._stores.ledger.engine import HEAD_REVISION, MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION


def test_a_ledger_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    """A ledger at a revision this release does not ship is refused with VALIDATION_ERROR
    naming the newest revision shipped, and is left as it was."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert _upgrade_fresh(url) == head_revision()
    engines = make_engines(url)
    try:
        with engines.write.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
        with pytest.raises(ValidationError, match="newest shipped") as raised:
            upgrade(engines)
        assert raised.value.code == "VALIDATION_ERROR"
        assert current_revision(engines) == "9999"
    finally:
        engines.dispose()


#: Events as a ledger at 0005 holds them: (kind, payload), ``lease_id`` as 0006 fills it in.
_EVENTS_0005 = [
    ("lease.acquired", '{"epoch":1,"lease_id":"lease_a","resource_id":"r","resource_type":"t"}'),
    ("fence.rejected", '{"epoch":1,"lease_id":"lease_a","resource_id":"r","write":"x"}'),
    ("handoff.created", '{"handoff_id":"ho_1","lease_id":"lease_a","to_principal":"b"}'),
    ("handoff.created", '{"handoff_id":"ho_2","lease_id":null,"to_principal":"b"}'),
    ("checkpoint.saved", '{"checkpoint_id":"ck_1","kind":"plan","version":1}'),
    ("outcome.recorded", '{"evidence_count":0,"outcome_id":"oc_1","status":"failed"}'),
]


def _upgrade_from_0005_fills_event_lease_ids(url: str) -> None:
    engines = make_engines(url)
    try:
        assert upgrade(engines, "0005") == "0005"
        with engines.write.begin() as conn:
            for n, (kind, payload) in enumerate(_EVENTS_0005):
                conn.execute(
                    text(
                        "INSERT INTO baton_events (event_id, org_id, kind, principal, subject,"
                        " payload, occurred_at_ms) VALUES (:e, 'o', :k, 'p', 's', :p, 1)"
                    ),
                    {"e": f"evt_{n}", "k": kind, "p": payload},
                )
        assert upgrade(engines) == head_revision()
        with engines.read.connect() as conn:
            rows = conn.execute(text("SELECT lease_id FROM baton_events ORDER BY seq")).all()
        assert [r[0] for r in rows] == ["lease_a", "lease_a", "lease_a", None, None, None]
    finally:
        engines.dispose()
    assert _schema_diff(url) == []


def test_sqlite_0006_fills_event_lease_ids(tmp_path: Path) -> None:
    """0006 on a SQLite ledger at 0005 fills each event's ``lease_id`` from its payload
    (lease, fence and carrying handoff events; none for the others) and builds the model
    schema."""
    _upgrade_from_0005_fills_event_lease_ids(f"sqlite:///{tmp_path / 'ledger.db'}")


def test_postgresql_0006_fills_event_lease_ids(pg_fresh_url: str) -> None:
    """As on SQLite, on PostgreSQL."""
    _upgrade_from_0005_fills_event_lease_ids(pg_fresh_url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_of_concurrent_upgrades_exactly_one_reports_the_change(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Four threads upgrade one empty ledger at once: each reads the revision it started
    from under the migration lock, so exactly one reports ``None -> head`` (``baton db
    upgrade``'s ``ok``) and the others ``head -> head`` (``no_change``)."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect_baton.ledger import upgrade_ledger

    url = (
        f"sqlite:///{tmp_path / 'ledger.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_fresh_url"))
    )
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda _i: upgrade_ledger(url), range(4)))
    moves = sorted((r.previous_revision or "", r.revision or "") for r in reports)
    head = head_revision()
    assert moves == [("", head)] + [(head, head)] * 3


def test_an_unknown_or_older_target_revision_is_refused(tmp_path: Path) -> None:
    """``db upgrade --revision``: a revision the package does not ship is named as such (not
    as an unknown ledger schema), and one older than the ledger's is refused (an upgrade
    never downgrades); neither changes the ledger."""
    from prefect_baton.ledger import upgrade_ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with pytest.raises(ValidationError, match=r"unknown revision '9999'.*ships revisions 0001"):
        upgrade_ledger(url, "9999")
    assert upgrade_ledger(url, "0003").revision == "0003"
    assert upgrade_ledger(url, "0003").previous_revision == "0003"
    assert upgrade_ledger(url).revision == head_revision()
    with pytest.raises(ValidationError, match=r"past 0002: an upgrade never downgrades"):
        upgrade_ledger(url, "0002")
    engines = make_engines(url)
    try:
        assert current_revision(engines) == head_revision()
    finally:
        engines.dispose()
