"""The ``redis_server`` fixture's server is the test's own: a port another process's server
answers on (a concurrent test run took it between the free-port check and the start) is
refused, so a test never runs on, and changes, another run's server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.redis.conftest import PortTaken, RedisServer, _server_pid


def test_start_refuses_a_port_another_server_answers_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    assert redis_server.proc is not None
    assert _server_pid(redis_server.port) == redis_server.proc.pid
    second = RedisServer(redis_server.binary, redis_server.port, tmp_path)
    with pytest.raises(PortTaken):
        second.start()
    assert second.proc is None  # its own process (which could not bind) was stopped
    assert _server_pid(redis_server.port) == redis_server.proc.pid
