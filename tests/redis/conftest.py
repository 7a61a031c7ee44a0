"""Fixtures of the Redis authority tests: a ``redis-server`` of the test's own (on a free
loopback port, no persistence), stopped by process id; a SQLite ledger per test; and a
session's three-master Redis Cluster (``redis_cluster``, ports in 7200..7299).

Without a ``redis-server`` binary (and ``redis-cli`` for the cluster) the tests that need one
are skipped, or fail with ``BATON_REQUIRE_SERVICES=1`` (as in CI).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.redis.authority import RedisAuthority, connect
from tests.conftest import REQUIRE

HOST = "127.0.0.1"


def _free_port() -> int:
    """A free port in 6390..6479, tried from a random one on: a port the previous test's
    server just left is rarely taken again at once, so a client that test left behind (a
    drain or reconciler thread reconnecting) is unlikely to reach this test's server."""
    start = random.randrange(90)
    for port in (6390 + (start + k) % 90 for k in range(90)):
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 6390..6479")


class PortTaken(RuntimeError):
    """Another process's server answers on the port a :class:`RedisServer` was to use."""


def _server_pid(port: int) -> int | None:
    """The ``process_id`` of the Redis server answering on ``port`` (``None``: none)."""
    import redis

    client = redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=1)
    try:
        return int(client.info("server")["process_id"])
    except redis.RedisError:
        return None
    finally:
        client.close()


class RedisServer:
    """A ``redis-server`` child process on ``127.0.0.1:<port>`` without persistence.

    ``kill()`` sends SIGKILL (all data is gone), ``start()`` starts it again empty on the
    same port, ``pause()``/``resume()`` send SIGSTOP/SIGCONT. Only this process id is ever
    signalled. ``start()`` returns only once the server answering on the port is this
    process: a port another test run took between the free-port check and the start (two
    sessions on one machine pick from the same range) raises :class:`PortTaken` instead of
    letting the test run on, and change, the other run's server.
    """

    def __init__(self, binary: str, port: int, workdir: Path) -> None:
        self.binary = binary
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    answered = s.recv(16).startswith(b"+PONG")
            except OSError:
                answered = False
            if answered:
                pid = _server_pid(self.port)
                if pid == self.proc.pid:
                    return
                if pid is not None:
                    self.stop()
                    raise PortTaken(f"port {self.port} is served by another process ({pid})")
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` of this test, on a free port in 6390..6479."""
    binary = shutil.which("redis-server")
    if binary is None:
        msg = "redis-server is not on PATH"
        if REQUIRE:
            pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
        pytest.skip(msg)
    for _attempt in range(5):
        server = RedisServer(binary, _free_port(), tmp_path)
        try:
            server.start()
            break
        except PortTaken:
            continue
    else:
        raise RuntimeError("no free port in 6390..6479 stayed free until redis-server bound it")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerStore]:
    """A SQLite ledger of this test."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield store
    store.close()


@pytest.fixture
def make_authority(
    redis_server: RedisServer, ledger: LedgerStore
) -> Iterator[Callable[..., RedisAuthority]]:
    """``make_authority(**kwargs)``: an authority on the test's server and ledger, with a
    1 s socket timeout; all are closed at the end."""
    made: list[RedisAuthority] = []

    def make(**kwargs: object) -> RedisAuthority:
        client = connect(redis_server.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        auth = RedisAuthority(client, ledger, owns_client=True, **kwargs)  # type: ignore[arg-type]
        made.append(auth)
        return auth

    yield make
    for auth in made:
        try:
            auth.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------- Redis Cluster

CLUSTER_SIZE = 3


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_cluster_ports(n: int) -> list[int]:
    """``n`` consecutive ports in 7200..7299 whose cluster bus ports (+10000) are free too,
    starting at a random offset so that two test runs at once rarely collide."""
    import random

    start = random.randrange(7200, 7300 - n)
    for base in [*range(start, 7300 - n), *range(7200, start)]:
        ports = list(range(base, base + n))
        if all(_port_free(p) and _port_free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports for a Redis Cluster in 7200..7299")


class RedisClusterNodes:
    """A Redis Cluster of ``redis-server`` child processes on ``127.0.0.1`` (three masters,
    no replicas, no persistence, ``cluster-node-timeout`` 1 s, and
    ``cluster-require-full-coverage no`` so that the nodes still up keep serving their own
    slots while one is down). Only the process ids started here are ever signalled.

    ``replace_empty(port)`` SIGKILLs one master and starts a new, empty node with a fresh
    cluster config on the same port, which takes over the lost node's slots.
    """

    def __init__(self, server: str, cli: str, ports: list[int], workdir: Path) -> None:
        self.server = server
        self.cli = cli
        self.ports = ports
        self.workdir = workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._generation = 0

    @property
    def url(self) -> str:
        """The authority URL (any one node is a start-up node)."""
        return f"redis+cluster://{HOST}:{self.ports[0]}"

    def admin(self, port: int) -> Any:
        """A plain ``redis.Redis`` client of one node (for CLUSTER commands)."""
        import redis

        return redis.Redis(host=HOST, port=port, socket_timeout=2.0, decode_responses=True)

    def _spawn(self, port: int) -> None:
        self._generation += 1
        conf = self.workdir / f"nodes-{port}-{self._generation}.conf"
        self.procs[port] = subprocess.Popen(
            [
                self.server,
                "--port",
                str(port),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(conf),
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--bind",
                HOST,
                "--dir",
                str(self.workdir),
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.admin(port).ping():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline or self.procs[port].poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)

    def start(self) -> None:
        """Start the nodes, join them with ``redis-cli --cluster create`` and wait for
        ``cluster_state:ok`` on every node."""
        for port in self.ports:
            self._spawn(port)
        subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"{HOST}:{p}" for p in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_ok()

    def node_id(self, port: int) -> str:
        return str(self.admin(port).execute_command("CLUSTER", "MYID"))

    def slot_ranges(self, port: int) -> list[tuple[int, int]]:
        """The slot ranges the node on ``port`` serves, according to that node."""
        out = []
        for start, end, master, *_ in self.admin(port).execute_command("CLUSTER", "SLOTS"):
            if int(master[1]) == port:
                out.append((int(start), int(end)))
        return out

    def port_of_slot(self, slot: int) -> int:
        """The port of the master serving ``slot`` (asked of the first live node)."""
        live = next(p for p in self.ports if p in self.procs)
        for start, end, master, *_ in self.admin(live).execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise LookupError(f"slot {slot} is not served")

    def keyslot(self, key: str) -> int:
        """``CLUSTER KEYSLOT key``, as the server computes it."""
        return int(self.admin(self.ports[0]).execute_command("CLUSTER", "KEYSLOT", key))

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Wait until every node says ``cluster_state:ok`` and all agree on who serves
        every slot."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                views = []
                for p in self.ports:
                    info = self.admin(p).execute_command("CLUSTER", "INFO")
                    text = info if isinstance(info, str) else str(info)
                    if "cluster_state:ok" not in text:
                        raise RuntimeError(f"node {p} not ok")
                    views.append(
                        sorted(
                            (int(s), int(e), int(m[1]))
                            for s, e, m, *_ in self.admin(p).execute_command("CLUSTER", "SLOTS")
                        )
                    )
                if (
                    all(v == views[0] for v in views)
                    and sum(e - s + 1 for s, e, _ in views[0]) == 16384
                ):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not settle")
            time.sleep(0.05)

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (its data is gone; there is no persistence)."""
        proc = self.procs.pop(port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def restart_empty(self, port: int, ranges: list[tuple[int, int]], old_id: str) -> None:
        """Start a new empty node with a fresh cluster config on ``port`` and make it the
        master of ``ranges``, the slots of the killed node ``old_id``: the other nodes
        forget the old id (which leaves its slots unassigned), the new node claims them
        with a config epoch above every epoch the cluster knows, then meets the cluster."""
        others = [p for p in self.ports if p != port]
        top = 0
        for p in others:
            admin = self.admin(p)
            admin.execute_command("CLUSTER", "FORGET", old_id)
            info = str(admin.execute_command("CLUSTER", "INFO"))
            top = max(top, int(info.split("cluster_current_epoch:", 1)[1].split()[0]))
        self._spawn(port)
        new = self.admin(port)
        new.execute_command("CLUSTER", "SET-CONFIG-EPOCH", top + 1)
        for start, end in ranges:
            new.execute_command("CLUSTER", "ADDSLOTSRANGE", start, end)
        new.execute_command("CLUSTER", "MEET", HOST, others[0])
        self.wait_ok()

    def replace_empty(self, port: int) -> None:
        """SIGKILL the master on ``port`` and restart it empty (see :meth:`restart_empty`)."""
        ranges, old_id = self.slot_ranges(port), self.node_id(port)
        self.kill(port)
        self.restart_empty(port, ranges, old_id)

    def stop(self) -> None:
        """SIGKILL every node started here (by process id)."""
        for port, proc in list(self.procs.items()):
            try:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
            del self.procs[port]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A three-master Redis Cluster for the session, on free ports in 7200..7299; stopped by
    process id at the end. Missing ``redis-server``/``redis-cli`` skips the tests, or fails
    them with ``BATON_REQUIRE_SERVICES=1``."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        msg = "redis-server and redis-cli are needed on PATH for the Redis Cluster tests"
        if REQUIRE:
            pytest.fail(msg + " (BATON_REQUIRE_SERVICES=1)")
        pytest.skip(msg)
    nodes = RedisClusterNodes(
        server, cli, _free_cluster_ports(CLUSTER_SIZE), tmp_path_factory.mktemp("cluster")
    )
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
