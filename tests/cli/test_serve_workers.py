"""``baton serve --workers N``: several worker processes answer on one port, each with the
same rules (a lease held through one is refused through the other), and SIGTERM stops
them all; the default number of workers follows the ledger and authority."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from prefect_baton.rest.__main__ import default_workers

from .conftest import BATON_SCRIPT, Cli, process_env
from .test_serve_keys import LEASE, _free_port, _wait_until_listening


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_two_workers_serve_one_port_and_stop_together(cli: Cli) -> None:
    """With --workers 2, pairs over many connections all succeed, a held lease is a
    CONFLICT for another principal whichever worker answers, the metrics port (no key)
    and ``/metrics`` (a key of the org) sum what both workers counted, and SIGTERM ends
    the server and its workers."""
    port, mport = _free_port(), _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2", "--metrics-port", str(mport)]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    bob = cli.ok("keys", "create", "--scope", "leases:write", principal="bob")["secret"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=process_env()
    )
    try:
        _wait_until_listening(proc, port)
        url = f"http://127.0.0.1:{port}"
        for i in range(8):  # new connections: the kernel spreads them over the workers
            with httpx.Client(base_url=url, timeout=60) as c:
                h = {"Authorization": f"Bearer {alice}"}
                body = {**LEASE, "resource_id": f"r{i}"}
                r = c.post("/v1/leases", json=body, headers=h)
                assert r.status_code == 201, r.text
                for _ in range(2):
                    with httpx.Client(base_url=url, timeout=60) as other:
                        h2 = {"Authorization": f"Bearer {bob}"}
                        refused = other.post("/v1/leases", json=body, headers=h2)
                        assert refused.status_code == 409, refused.text
                        assert refused.json()["error"]["code"] == "CONFLICT"
                r = c.delete(f"/v1/leases/{r.json()['data']['lease_id']}", headers=h)
                assert r.status_code == 200, r.text
        _assert_metrics_summed(cli.org, url, mport, alice)
        workers = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
        assert len(workers) == 2
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def test_without_a_metrics_port_a_lean_supervisor_runs_the_workers(cli: Cli) -> None:
    """With --workers 2 and no --metrics-port, the process that checked the ledger replaces
    itself (same process id) with a supervisor that has none of the stores or web libraries
    loaded (no pydantic_core, SQLite or FastAPI code mapped), its workers answer, leases
    held through one are refused through the other, and SIGTERM ends them all (exit 0,
    the metrics directory it made removed)."""
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2"]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    bob = cli.ok("keys", "create", "--scope", "leases:write", principal="bob")["secret"]
    env = process_env()
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _wait_until_listening(proc, port)
        assert "supervise()" in _cmdline(proc.pid)
        with open(f"/proc/{proc.pid}/maps") as f:
            mapped = f.read()
        for heavy in ("pydantic_core", "_sqlite3", "sqlalchemy", "hiredis"):
            assert heavy not in mapped, heavy
        workers = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
        assert len(workers) == 2
        with open(f"/proc/{workers[0]}/environ", "rb") as f:  # set before they started
            environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        metrics_dir = environ[b"PROMETHEUS_MULTIPROC_DIR"].decode()
        assert os.path.isdir(metrics_dir)
        url = f"http://127.0.0.1:{port}"
        for i in range(4):
            with httpx.Client(base_url=url, timeout=60) as c:
                body = {**LEASE, "resource_id": f"lean{i}"}
                r = c.post("/v1/leases", json=body, headers={"Authorization": f"Bearer {alice}"})
                assert r.status_code == 201, r.text
            with httpx.Client(base_url=url, timeout=60) as other:
                refused = other.post(
                    "/v1/leases", json=body, headers={"Authorization": f"Bearer {bob}"}
                )
                assert refused.status_code == 409, refused.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "Uvicorn running on" in out
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    assert not os.path.exists(metrics_dir)


def test_lean_supervisor_ignores_modules_in_the_working_directory(cli: Cli, tmp_path: Path) -> None:
    """Started from a directory holding a ``tempfile.py`` and a ``uvicorn.py`` (as a user's
    project might), the supervisor and its workers import the real modules, not these
    (``python -c`` alone would put the directory first on ``sys.path``), and answer."""
    for name in ("tempfile", "uvicorn", "socket"):
        (tmp_path / f"{name}.py").write_text('raise SystemExit("imported from the cwd")\n')
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2"]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=process_env(),
        cwd=tmp_path,
    )
    try:
        _wait_until_listening(proc, port)  # bound before the supervisor starts: ask too
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/leases",
            json={**LEASE, "resource_id": "cwd"},
            headers={"Authorization": f"Bearer {alice}"},
            timeout=60,
        )
        assert r.status_code == 201, r.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "imported from the cwd" not in out


def _assert_metrics_summed(org: str, url: str, mport: int, key: str) -> None:
    """The 8 grants, 16 conflicts and 8 releases of the test above, whichever worker
    answered them, on the loopback metrics port and on the API's ``/metrics``."""
    labels = f'organization="{org}",resource_type="deploy"'
    lines = [
        f'baton_acquires_total{{{labels},result="granted"}} 8.0',
        f'baton_acquires_total{{{labels},result="conflict"}} 16.0',
        f'baton_releases_total{{{labels},status="released"}} 8.0',
    ]
    open_port = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=60)
    assert open_port.status_code == 200
    api = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert api.status_code == 200
    for line in lines:
        assert line in open_port.text
        assert line in api.text
    assert httpx.get(f"{url}/metrics", timeout=60).status_code == 401


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("ledger_url", "redis_url", "expected"),
    [
        ("sqlite:///x.db", None, 1),
        ("sqlite:///x.db", "redis://127.0.0.1:6379/0", "cpus"),
        ("postgresql://u@h/db", None, "cpus"),
    ],
)
def test_default_workers_follow_the_ledger_and_authority(
    monkeypatch: pytest.MonkeyPatch, ledger_url: str, redis_url: str | None, expected: object
) -> None:
    """One worker on a SQLite ledger alone (one writer at a time); one per CPU, at most
    4, with Redis as the authority or on PostgreSQL."""
    monkeypatch.delenv("BATON_REDIS_URL", raising=False)
    cpus = min(4, len(os.sched_getaffinity(0)))
    assert default_workers(ledger_url, redis_url) == (cpus if expected == "cpus" else expected)


def test_serve_zero_workers_is_validation_error(cli: Cli) -> None:
    """--workers 0 exits 2 before anything is served."""
    run = cli("serve", "--port", str(_free_port()), "--workers", "0")
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
