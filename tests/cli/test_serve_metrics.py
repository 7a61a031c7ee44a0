"""``baton serve --metrics-port M``: a bad port is a clear ``VALIDATION_ERROR``, a port that
cannot be bound ``UNAVAILABLE``; a ``PROMETHEUS_MULTIPROC_DIR`` it cannot write in is refused
at start, and one that fails later never fails a request. (Served with two workers, the
metrics summed over them: ``test_serve_workers.py``.)"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from .conftest import BATON_SCRIPT, Cli, process_env
from .test_serve_keys import LEASE, _free_port, _wait_until_listening


def test_bad_metrics_port_is_a_validation_error(cli: Cli) -> None:
    """Out of range, or the API's own port: exit 2 with ``VALIDATION_ERROR`` naming
    ``--metrics-port``; nothing is served."""
    for args in (["--metrics-port", "0"], ["--metrics-port", "70000"]):
        run = cli("serve", "--port", "8899", *args)
        assert run.code == 2, run.text
        assert run.json["error"]["code"] == "VALIDATION_ERROR"
        assert "--metrics-port must be an integer from 1 to 65535" in run.json["error"]["message"]
    run = cli("serve", "--port", "8899", "--metrics-port", "8899")
    assert run.code == 2, run.text
    assert "--metrics-port must differ from --port" in run.json["error"]["message"]


def test_metrics_port_in_use_is_unavailable(cli: Cli) -> None:
    """A metrics port another socket holds: exit 11 ``UNAVAILABLE`` naming the port,
    before the API is served."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        mport = taken.getsockname()[1]
        run = cli("serve", "--port", str(_free_port()), "--metrics-port", str(mport))
    assert run.code == 11, run.text
    assert run.json["error"]["code"] == "UNAVAILABLE"
    assert f"127.0.0.1:{mport}" in run.json["error"]["message"]


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_an_unwritable_multiprocess_directory_is_refused_at_start(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set to a missing path or to a file: exit 2
    ``VALIDATION_ERROR`` naming the variable, nothing served. (A directory without write
    permission is refused the same way, by ``os.access``; not tested here, since these
    tests may run as root, for whom every directory is writable.)"""
    path = tmp_path / "metrics"
    if kind == "file":
        path.write_text("x")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(path))
    run = cli("serve", "--port", str(_free_port()))
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
    assert "PROMETHEUS_MULTIPROC_DIR" in run.json["error"]["message"]


def test_a_metrics_failure_never_fails_a_committed_write(cli: Cli, tmp_path: Path) -> None:
    """The multiprocess directory removed while serving: prometheus_client then fails to
    record, but a lease acquire still answers ``201`` (it was committed; a ``500`` would make
    the client retry work that is done), and the lease is held (``409`` for another)."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    bob = cli.ok("keys", "create", "--scope", "leases:write", principal="bob")["secret"]
    env = {**process_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _wait_until_listening(proc, port)
        shutil.rmtree(metrics_dir)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as c:
            body = {**LEASE, "resource_id": "metrics-gone"}
            r = c.post("/v1/leases", json=body, headers={"Authorization": f"Bearer {alice}"})
            assert r.status_code == 201, r.text
            refused = c.post("/v1/leases", json=body, headers={"Authorization": f"Bearer {bob}"})
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "CONFLICT"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert "metrics backend" in out
