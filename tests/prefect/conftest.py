"""One Prefect test harness for the whole session, plus ledger fixtures.

Prefect's embedded server takes about 20 s to start here, so it starts once: a temporary
``PREFECT_HOME`` for the session, a generous start-up timeout, analytics off, quiet logs.
Served deployments run their flows in subprocesses; they find the ledger through the
``BATON_LEDGER_URL`` / ``BATON_ORG`` variables that the ``baton_env`` fixture sets.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

_HOME = tempfile.mkdtemp(prefix="baton-prefect-home-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
os.environ.pop("PREFECT_API_URL", None)

from prefect_baton import Baton  # noqa: E402
from prefect_baton._stores.ledger.store import LedgerStore  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

_stores: dict[str, LedgerStore] = {}


@pytest.fixture(scope="session", autouse=True)
def prefect_api() -> Iterator[str]:
    """Prefect's test harness (embedded server on a temporary database), once per session;
    yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="session")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite ledger file shared by the session (every test has its own org)."""
    return tmp_path_factory.mktemp("prefect-ledger") / "ledger.db"


@pytest.fixture(scope="session")
def ledger_db(ledger_path: Path) -> str:
    """SQLAlchemy URL of the session's SQLite ledger."""
    return f"sqlite:///{ledger_path}"


def _store(url: str) -> LedgerStore:
    if url not in _stores:
        _stores[url] = LedgerStore(url)
    return _stores[url]


@pytest.fixture
def org() -> str:
    """A fresh organization per test."""
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_baton(ledger_db: str, org: str) -> Callable[..., Baton]:
    """``make_baton(principal, role="agent")``: a client of the test's org on the shared
    ledger (usable as the ``baton=`` factory of ``@leased``)."""

    def make(principal: str, role: str = "agent") -> Baton:
        return Baton(org=org, principal=principal, role=role, store=_store(ledger_db))

    return make


@pytest.fixture
def baton_env(monkeypatch: pytest.MonkeyPatch, ledger_db: str, org: str) -> dict[str, str]:
    """``BATON_LEDGER_URL`` and ``BATON_ORG`` of the test, for code that uses
    ``Baton.from_settings()`` (served flows in subprocesses included)."""
    monkeypatch.setenv("BATON_LEDGER_URL", ledger_db)
    monkeypatch.setenv("BATON_ORG", org)
    return {"BATON_LEDGER_URL": ledger_db, "BATON_ORG": org}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for s in _stores.values():
        s.close()


def load_script(relative: str) -> Any:
    """Import a script of the repository (``examples/...``, ``flows/...``) by path."""
    import importlib.util
    import sys

    path = REPO / relative
    name = "baton_script_" + path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
