"""Shared fixtures.

Ledger arms: ``sqlite`` (a file per test session) and ``postgresql`` (the server on
127.0.0.1:5432, database ``test``). Every test gets its own organization, so arms share one
database without seeing each other's rows. With ``BATON_REQUIRE_SERVICES=1`` (as in CI) a
missing server fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator

import pytest

from prefect_baton import Baton
from prefect_baton._ledger.store import LedgerStore

PG_URL = os.environ.get("BATON_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BATON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE = os.environ.get("BATON_REQUIRE_SERVICES") == "1"

LEDGER_ARMS = ["sqlite", "postgresql"]


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (CI, ``BATON_REQUIRE_SERVICES=1``) when a server is down."""
    if _answers(host, port):
        return
    msg = f"{name} is not answering on {host}:{port}"
    if REQUIRE:
        pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"


@pytest.fixture(scope="session")
def pg_url() -> str:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    return PG_URL


_stores: dict[str, LedgerStore] = {}


def store_for(url: str) -> LedgerStore:
    """One store (engine pool) per URL for the whole session."""
    if url not in _stores:
        _stores[url] = LedgerStore(url)
    return _stores[url]


@pytest.fixture(params=LEDGER_ARMS)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """The URL of each ledger arm in turn."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def org() -> str:
    """A fresh organization id per test."""
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def baton(ledger_url: str, org: str) -> Iterator[Baton]:
    """A client for principal ``agent-a`` (role agent) in a fresh org, on each ledger arm.

    ``baton.as_principal("agent-b")`` gives another identity of the same org.
    """
    yield Baton(org=org, principal="agent-a", role="agent", store=store_for(ledger_url))


@pytest.fixture
def baton_in_org(baton: Baton) -> Callable[..., Baton]:
    """A factory of clients on the same arm as ``baton`` but in another organization:
    ``baton_in_org(org_id, principal="agent-a", role="agent")`` (for org-isolation tests).
    An arm that gives ``baton`` another authority must give these clients the same one."""

    def make(org_id: str, principal: str = "agent-a", role: str = "agent") -> Baton:
        other = Baton(
            org=org_id, principal=principal, role=role, settings=baton.settings, store=baton.store
        )
        other.authority = baton.authority
        return other

    return make


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for s in _stores.values():
        s.close()
