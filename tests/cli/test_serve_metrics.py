"""``baton serve --metrics-port M``: the metrics of every organization, unauthenticated, on
127.0.0.1:M beside the API; with several workers, the counters summed over them
(prometheus_client's multiprocess mode). A bad port is a clear ``VALIDATION_ERROR``, a port
that cannot be bound ``UNAVAILABLE``."""

from __future__ import annotations

import socket
import subprocess

import httpx

from .conftest import BATON_SCRIPT, Cli, process_env
from .test_serve_keys import LEASE, _free_port, _wait_until_listening


def test_two_workers_count_together_on_the_metrics_port(cli: Cli) -> None:
    """Acquires answered by either of two workers are summed on the loopback metrics
    port (no key needed) and on the API's ``/metrics`` (the key's organization)."""
    port, mport = _free_port(), _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2", "--metrics-port", str(mport)]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=process_env()
    )
    try:
        _wait_until_listening(proc, port)
        h = {"Authorization": f"Bearer {alice}"}
        for i in range(6):  # new connections: the kernel spreads them over the workers
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                r = c.post("/v1/leases", json={**LEASE, "resource_id": f"r{i}"}, headers=h)
                assert r.status_code == 201, r.text
        line = (
            f'baton_acquires_total{{organization="{cli.org}",resource_type="deploy",'
            'result="granted"} 6.0'
        )
        open_port = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=60)
        assert open_port.status_code == 200
        assert line in open_port.text
        gauge = f'baton_effective_leases{{organization="{cli.org}",resource_type="deploy"}} 6.0'
        assert gauge in open_port.text
        api = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=h, timeout=60)
        assert api.status_code == 200
        assert line in api.text
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).status_code == 401
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


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
