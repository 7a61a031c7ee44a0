"""Shared fixtures.

Ledger arms: ``sqlite`` (a file per test session) and ``postgresql`` (the server on
127.0.0.1:5432, database ``test``). Every test gets its own organization, so arms share one
database without seeing each other's rows. With ``BATON_REQUIRE_SERVICES=1`` (as in CI) a
missing server fails the test instead of skipping it.

Redis arms (the lease authority on Redis, the SQLite ledger behind it): ``fakeredis``
(fakeredis with Lua, ``ack="ledger"``, operations run as scripts with ``EVALSHA``) and
``redis`` (the server on 127.0.0.1:6379, ``BATON_TEST_REDIS_URL``, ``ack="redis"`` with the
drain thread, operations run through the function library with ``FCALL``); each test's own
organization is its own Redis hash tag, so tests share the server without seeing each other.

REST arm ``rest``: the REST API served by uvicorn (real HTTP) on a free 127.0.0.1 port in a
background thread, once per session, over the session's SQLite ledger; ``baton`` is
``Baton(api_url=..., api_key=...)`` with a key made for (org, ``agent-a``, agent).

Memory arm ``memory``: :func:`prefect_baton.testing.memory_baton`, the ledger store on a new
in-memory SQLite database per test, on a ticking :class:`~prefect_baton.testing.ManualClock`
(it runs with real time, so tests that sleep work; ``wait_until_expired`` moves it past a
lease's expiry instead of sleeping).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore

PG_URL = os.environ.get("BATON_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BATON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE = os.environ.get("BATON_REQUIRE_SERVICES") == "1"

LEDGER_ARMS = ["sqlite", "postgresql", "fakeredis", "redis", "rest", "memory"]
REDIS_ARMS = ("fakeredis", "redis")
REST_ARM = "rest"
MEMORY_ARM = "memory"


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def require_redis() -> None:
    """:func:`require_service` for the Redis of ``BATON_TEST_REDIS_URL``."""
    require_service("Redis", *_host_port(REDIS_URL, 6379))


def require_postgresql() -> None:
    """:func:`require_service` for the PostgreSQL of ``BATON_TEST_PG_URL``."""
    require_service("PostgreSQL", *_host_port(PG_URL, 5432))


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
    require_postgresql()
    return PG_URL


_stores: dict[str, LedgerStore] = {}


def store_for(url: str) -> LedgerStore:
    """One store (engine pool) per URL for the whole session."""
    if url not in _stores:
        _stores[url] = LedgerStore(url)
    return _stores[url]


@pytest.fixture(params=LEDGER_ARMS)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """The URL of each ledger arm in turn (the Redis arms keep their ledger on SQLite; the
    memory arm's ledger has no URL to open: ``sqlite://`` names it, see ``baton``)."""
    if request.param == MEMORY_ARM:
        from prefect_baton._stores.ledger.engine import MEMORY_URL

        return MEMORY_URL
    if request.param in ("sqlite", *REDIS_ARMS, REST_ARM):
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def org() -> str:
    """A fresh organization id per test."""
    return f"org-{uuid.uuid4().hex[:12]}"


def redis_authority(arm: str, store: LedgerStore) -> Any:
    """A Redis lease authority for a Redis arm: fakeredis (``ack="ledger"``) or the real
    server (``ack="redis"``)."""
    from prefect_baton._stores.redis.authority import RedisAuthority, connect

    if arm == "fakeredis":
        import fakeredis

        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        return RedisAuthority(client, store, ack="ledger", owns_client=True, functions=False)
    require_redis()
    return RedisAuthority(connect(REDIS_URL), store, ack="redis", owns_client=True)


def arm_of(request: pytest.FixtureRequest) -> str | None:
    """The ledger arm of the running test (``None`` outside the arms)."""
    callspec = getattr(request.node, "callspec", None)
    return None if callspec is None else callspec.params.get("ledger_url")


def not_on_rest(request: pytest.FixtureRequest, reason: str) -> None:
    """Skip the running test on the REST arm, which cannot do what it inspects."""
    if arm_of(request) == REST_ARM:
        pytest.skip(f"not applicable over REST: {reason}")


@pytest.fixture(scope="session")
def rest_api(sqlite_url: str) -> Iterator[str]:
    """Base URL of the REST API served by uvicorn on 127.0.0.1 (a free port) in a
    background thread over the session's SQLite ledger; stopped at the session's end."""
    import uvicorn

    from prefect_baton.rest import create_app

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = uvicorn.Config(
        create_app(sqlite_url), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="rest-arm-uvicorn", daemon=True)
    thread.start()
    started = threading.Event()
    while thread.is_alive() and not server.started:
        started.wait(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class RestBaton(Baton):
    """Test-only REST client whose :meth:`as_principal` mints a key for the identity
    (the library's remote client refuses to: its identity is its key's)."""

    mint: Callable[[str, str, str], str]

    def as_principal(self, principal: str, role: str = "agent") -> Baton:
        """A client for ``principal`` of this org, on a key minted for it."""
        return self.for_identity(self.org, principal, role)

    def for_identity(self, org: str, principal: str, role: str = "agent") -> RestBaton:
        """A client sharing this one's connection pool, on a new key for the identity."""
        from prefect_baton._stores.rest.client import RestStore

        remote = self.authority
        assert isinstance(remote, RestStore)
        other = RestBaton(lease_authority=remote.with_key(self.mint(org, principal, role)))
        other.mint = self.mint
        return other


def rest_baton(api_url: str, ledger_url: str, org: str) -> RestBaton:
    """A :class:`RestBaton` for (``org``, ``agent-a``, agent) at ``api_url``."""
    from prefect_baton.rest import create_key

    engines = store_for(ledger_url).engines

    def mint(org_: str, principal: str, role: str) -> str:
        return create_key(org=org_, principal=principal, role=role, engines=engines)[0]

    b = RestBaton(api_url=api_url, api_key=mint(org, "agent-a", "agent"))
    b.mint = mint
    return b


@pytest.fixture
def baton(request: pytest.FixtureRequest, ledger_url: str, org: str) -> Iterator[Baton]:
    """A client for principal ``agent-a`` (role agent) in a fresh org, on each ledger arm.

    ``baton.as_principal("agent-b")`` gives another identity of the same org (on the REST
    arm: a client on a key minted for it).
    """
    arm = arm_of(request)
    if arm == MEMORY_ARM:
        from prefect_baton.testing import ManualClock, memory_baton

        mem = memory_baton(org=org, principal="agent-a", clock=ManualClock(ticking=True))
        yield mem
        mem.close()
        return
    if arm == REST_ARM:
        b = rest_baton(str(request.getfixturevalue("rest_api")), ledger_url, org)
        yield b
        b.close()
        return
    if arm in REDIS_ARMS:
        store = store_for(ledger_url)
        authority = redis_authority(arm, store)
        yield Baton(
            org=org, principal="agent-a", role="agent", store=store, lease_authority=authority
        )
        authority.close()
        return
    yield Baton(org=org, principal="agent-a", role="agent", store=store_for(ledger_url))


@pytest.fixture
def baton_in_org(baton: Baton) -> Callable[..., Baton]:
    """A factory of clients on the same arm as ``baton`` but in another organization:
    ``baton_in_org(org_id, principal="agent-a", role="agent")`` (for org-isolation tests).
    An arm that gives ``baton`` another authority must give these clients the same one."""

    def make(org_id: str, principal: str = "agent-a", role: str = "agent") -> Baton:
        if isinstance(baton, RestBaton):
            return baton.for_identity(org_id, principal, role)
        other = Baton(
            org=org_id, principal=principal, role=role, settings=baton.settings, store=baton.store
        )
        other.authority = baton.authority
        return other

    return make


@pytest.fixture(autouse=True)
def _metric_label_caps_from_zero() -> None:
    """Each test starts with no organization counted against the metrics label caps: a REST
    app enables metrics for the rest of the process, and the suite makes thousands of
    organizations, which would fold a later test's organization into ``_other``."""
    state = sys.modules.get("prefect_baton.metrics._state")
    if state is not None:
        state.forget_label_values()


@pytest.fixture
def metrics_recording() -> Iterator[None]:
    """Metrics recorded during the test (:func:`prefect_baton.metrics.enable`); the
    backends enabled before it are restored after (a REST app enables them for good)."""
    from prefect_baton import metrics
    from prefect_baton.metrics import _state

    before = _state.SINKS
    metrics.enable()
    yield
    _state.set_sinks(before)


def metric_value(name: str, **labels: str) -> float:
    """The current value of the sample ``name`` with ``labels`` in prefect-baton's
    registry (0 when never recorded)."""
    from prefect_baton import metrics

    return metrics.registry().get_sample_value(name, labels) or 0.0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for s in _stores.values():
        s.close()


#: A raw ``initialize`` request (protocol 2025-06-18), for tests that write JSON-RPC lines.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
