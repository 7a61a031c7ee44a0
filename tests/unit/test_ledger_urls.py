"""Bad ledger and Redis URLs get a coded error, never a raw exception or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_baton import Baton, UnavailableError, ValidationError


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://u@127.0.0.1/x"])
def test_unsupported_ledger_urls_are_validation_errors(url: str) -> None:
    """In-memory SQLite and other databases are refused with VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        Baton(ledger_url=url, org="o", principal="a")


@pytest.mark.parametrize(
    "url", ["sqlite://tmp/x.db", "sqlite://localhost/x.db", "sqlite://u@/x.db"]
)
def test_sqlite_url_with_a_host_part_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite://tmp/x.db`` (two slashes) would be the file ``x.db``, SQLAlchemy dropping
    the host ``tmp``: refused with VALIDATION_ERROR naming both right forms, by the client
    and by the check of a ledger file that must exist (CLI reads), and no file is made."""
    from prefect_baton._stores.ledger.engine import sqlite_file

    forms = "sqlite:///relative/path.db or sqlite:////absolute/path.db"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="has a host part") as ei:
        Baton(ledger_url=url, org="o", principal="a")
    assert forms in ei.value.message
    with pytest.raises(ValidationError, match="has a host part"):
        sqlite_file(url)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "hint"),
    [("/tmp/x.db", "sqlite:////tmp/x.db"), ("ledger.db", "sqlite:///ledger.db")],
)
def test_bare_path_as_ledger_url_hints_at_the_sqlite_url(url: str, hint: str) -> None:
    """A file path given as the ledger URL is VALIDATION_ERROR with the SQLite URL of that
    file as a hint."""
    with pytest.raises(ValidationError, match="not a database URL") as ei:
        Baton(ledger_url=url, org="o", principal="a")
    assert ei.value.message.endswith(f"(for a SQLite file, {hint})")


def test_sqlite_path_problems_are_validation_errors(tmp_path: Path) -> None:
    """A file where a folder should be, a missing folder tree, or a non-database file are
    VALIDATION_ERROR, and no folder tree is created."""
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello")
    for url in (
        f"sqlite:///{not_db}/x.db",
        f"sqlite:///{tmp_path}/a/b/c/x.db",
        f"sqlite:///{not_db}",
    ):
        with pytest.raises(ValidationError):
            Baton(ledger_url=url, org="o", principal="a")
    assert not (tmp_path / "a").exists()


def test_missing_folder_tree_names_the_ledgers_own_folder(tmp_path: Path) -> None:
    """``sqlite:///<missing>/dir/x.db`` names the ledger's folder (``<missing>/dir``), not
    only its parent, and says why it is not created; a missing folder whose parent exists
    is created (one level)."""
    folder = tmp_path / "nonexistent" / "dir"
    with pytest.raises(ValidationError) as ei:
        Baton(ledger_url=f"sqlite:///{folder}/x.db", org="o", principal="a")
    assert ei.value.message == (
        f"ledger folder {folder} does not exist, and neither does its parent "
        f"{folder.parent} (only the ledger's own folder is created)"
    )
    Baton(ledger_url=f"sqlite:///{tmp_path}/one/x.db", org="o", principal="a").close()
    assert (tmp_path / "one" / "x.db").is_file()


def test_newer_schema_is_a_validation_error(tmp_path: Path) -> None:
    """A ledger at a migration revision this package does not ship is refused clearly."""
    import sqlite3

    db = tmp_path / "l.db"
    Baton(ledger_url=f"sqlite:///{db}", org="o", principal="a").close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE baton_alembic_version SET version_num = '0099'")
    conn.commit()
    conn.close()
    with pytest.raises(ValidationError, match="schema"):
        Baton(ledger_url=f"sqlite:///{db}", org="o", principal="a")


def test_postgres_port_that_never_answers_is_unavailable() -> None:
    """A PostgreSQL URL pointing at a server that accepts but never speaks the protocol
    (here Redis's port) is UNAVAILABLE after the connect timeout, not a hang."""
    from ..conftest import require_service

    require_service("Redis", "127.0.0.1", 6379)
    with pytest.raises(UnavailableError):
        Baton(ledger_url="postgresql://postgres@127.0.0.1:6379/test", org="o", principal="a")


def test_malformed_redis_url_is_a_validation_error(tmp_path: Path) -> None:
    """A Redis URL with the wrong scheme is VALIDATION_ERROR."""
    with pytest.raises(ValidationError):
        Baton(
            ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
            org="o",
            principal="a",
            redis_url="http://127.0.0.1:6379",
        )
