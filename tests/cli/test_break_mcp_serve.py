"""``baton mcp --transport http`` when it cannot serve: a taken port or a host that is not an
address exits with a coded error (UNAVAILABLE 11, VALIDATION_ERROR 2) and a message, never
with uvicorn's own exit status or a pydantic traceback text."""

from __future__ import annotations

import socket

from .conftest import Cli


def test_mcp_http_on_a_taken_port_is_unavailable(cli: Cli) -> None:
    """A port another socket listens on exits 11 with UNAVAILABLE (a real process), as
    ``baton serve`` does; not uvicorn's status 3, which is CONFLICT's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = cli.proc("mcp", "--transport", "http", "--port", str(port))
    assert run.code == 11, run.text
    error = run.json["error"]
    assert error["code"] == "UNAVAILABLE"
    assert str(port) in error["message"]


def test_mcp_http_on_a_host_that_is_no_address_is_validation_error(cli: Cli) -> None:
    """``--host 256.1.1.1`` exits 2 with VALIDATION_ERROR naming the option, not
    INTERNAL_ERROR with a pydantic message."""
    run = cli("mcp", "--transport", "http", "--host", "256.1.1.1", "--port", "18999")
    assert run.code == 2, run.text
    error = run.json["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert "--host" in error["message"]
    assert "pydantic" not in run.text
