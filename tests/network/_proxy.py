"""A loopback TCP proxy whose forwarding can be stopped without closing its sockets (a
network that black-holes traffic: the client's reads then block, its writes are accepted)."""

from __future__ import annotations

import select
import socket
import threading


class BlackholeProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port) on threads of its own.

    :meth:`blackhole` stops forwarding in both directions, keeping every socket open;
    :meth:`heal` forwards again; :meth:`close` closes them all (blocked clients then see
    the connection drop).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        assert target[0] in ("127.0.0.1", "localhost", "::1"), "loopback targets only"
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._holed = threading.Event()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def blackhole(self) -> None:
        """Stop forwarding (sockets stay open, nothing is answered)."""
        self._holed.set()

    def heal(self) -> None:
        """Forward again (what was held back is delivered)."""
        self._holed.clear()

    def close(self) -> None:
        """Stop the proxy and close every socket."""
        self._closed.set()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    upstream.close()
                    return
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self._closed.is_set():
            if self._holed.is_set():
                self._closed.wait(0.05)
                continue
            try:
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready or self._holed.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except (OSError, ValueError):
                return
