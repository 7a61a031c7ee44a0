"""``baton serve --metrics-port M``: a bad port is a clear ``VALIDATION_ERROR``, a port that
cannot be bound ``UNAVAILABLE``. (Served with two workers, the metrics summed over them:
``test_serve_workers.py``.)"""

from __future__ import annotations

import socket

from .conftest import Cli
from .test_serve_keys import _free_port


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
