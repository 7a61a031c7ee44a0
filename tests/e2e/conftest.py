"""A real Prefect server for the end-to-end tests, and deployments served against it.

With ``BATON_TEST_PREFECT_API_URL`` set (``.ci/run`` does), that server is used. Otherwise
the session starts ``prefect server start --host 127.0.0.1 --port <free port>`` with its own
temporary ``PREFECT_HOME`` (SQLite database inside it, analytics off), waits for
``/api/health`` and stops it by process group at the end. It skips when the server cannot
start, and fails instead with ``BATON_REQUIRE_SERVICES=1``.

Each test gets its own SQLite ledger file and organization, and its own
``python tests/e2e/served_flows.py`` subprocess (``prefect.serve``) with ``PREFECT_API_URL``,
``BATON_LEDGER_URL`` and ``BATON_ORG`` in its environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

pytest.importorskip("prefect")

from prefect_baton import Baton
from tests.conftest import REQUIRE

REPO = Path(__file__).resolve().parents[2]
SERVED = REPO / "tests" / "e2e" / "served_flows.py"
DEPLOYMENTS = (
    "baton-e2e-contend/contend",
    "baton-e2e-sender/sender",
    "baton-e2e-receiver/receiver",
    "baton-e2e-flaky/flaky",
    "baton-e2e-rerun/rerun",
)


def _unavailable(msg: str) -> None:
    if REQUIRE:
        pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
    pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc`` and its children (its own process group, by id)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _prefect_env(home: Path) -> dict[str, str]:
    """The environment of a Prefect subprocess: no inherited Prefect or Baton settings,
    its own ``PREFECT_HOME``, and this checkout's ``src`` first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "BATON_"))}
    path = [str(REPO / "src")]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    return env


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API URL (``http://127.0.0.1:<port>/api``) of a real Prefect server."""
    given = os.environ.get("BATON_TEST_PREFECT_API_URL")
    if given:
        url = given.rstrip("/")
        deadline = time.monotonic() + 60
        while not _healthy(url):
            if time.monotonic() > deadline:
                _unavailable(f"the Prefect server at {url} is not healthy")
            time.sleep(1)
        yield url
        return
    prefect = Path(sys.executable).with_name("prefect")
    exe = str(prefect) if prefect.exists() else shutil.which("prefect")
    if exe is None:
        _unavailable("the prefect command is not installed")
    home = tmp_path_factory.mktemp("prefect-server-home")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = _prefect_env(home)
    env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{home / 'prefect.db'}"
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(exe), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (home / "server.log").read_text(errors="replace")[-2000:]
                _unavailable(f"prefect server start did not become healthy on {url}:\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc)
        log.close()


@pytest.fixture
def prefect_settings(prefect_server: str) -> Iterator[str]:
    """Point this process's Prefect client at the real server for the test."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        yield prefect_server


@dataclass
class Served:
    """The deployments of ``served_flows.py`` served for one test.

    Attributes:
        api_url: the Prefect API. ledger_url: the test's SQLite ledger. org: its
            organization. deployment_ids: full deployment name -> id.
    """

    api_url: str
    ledger_url: str
    org: str
    deployment_ids: dict[str, Any]

    def baton(self, principal: str) -> Baton:
        """A client of the test's ledger and organization acting as ``principal``."""
        return Baton(ledger_url=self.ledger_url, org=self.org, principal=principal)


def _serve_log(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def served(prefect_settings: str, tmp_path: Path) -> Iterator[Served]:
    """Serve ``served_flows.py`` in a subprocess (its own process group) for the test."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    org = f"org-{uuid.uuid4().hex[:12]}"
    env = _prefect_env(tmp_path / "prefect-home")
    env.update(
        PREFECT_API_URL=prefect_settings,
        PREFECT_RUNNER_POLL_FREQUENCY="1",
        PREFECT_LOGGING_LEVEL="INFO",  # the runs' logs in the API: what the UI shows
        BATON_LEDGER_URL=ledger_url,
        BATON_ORG=org,
    )
    log_path = tmp_path / "serve.log"
    log: IO[bytes] = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(SERVED)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    ids: dict[str, Any] = {}
    try:
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 120
            while len(ids) < len(DEPLOYMENTS):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"serving the e2e deployments failed:\n{_serve_log(log_path)}")
                for name in DEPLOYMENTS:
                    try:
                        ids[name] = client.read_deployment_by_name(name).id
                    except ObjectNotFound:
                        pass
                time.sleep(0.5)
        yield Served(api_url=prefect_settings, ledger_url=ledger_url, org=org, deployment_ids=ids)
    finally:
        _stop(proc)
        log.close()
        with get_client(sync_client=True) as client:
            for dep_id in ids.values():
                try:
                    client.delete_deployment(dep_id)
                except ObjectNotFound:
                    pass
