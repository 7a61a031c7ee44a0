"""uvicorn's h11 protocol with the limits a server facing untrusted clients needs.

uvicorn bounds only the idle time after a response (``timeout_keep_alive``); a connection
that never sends a complete request head, or a body that never ends, is kept forever, and
nothing bounds the number of open connections, so idle connections can use up the
process's file descriptors (``EMFILE``) until no request is answered. :class:`GuardedH11Protocol`
adds, per connection:

* a **header deadline**: the request head must be complete within
  :data:`HEADER_TIMEOUT_SECONDS` of the connection opening (or of the previous response),
  else the connection is closed;
* a **body deadline**: the body must be complete within :data:`BODY_TIMEOUT_SECONDS` of
  its head, else the connection is closed (the app sees ``http.disconnect``);
* a **connection cap** (:func:`max_connections`, below the file descriptor limit): a new
  connection over the cap closes the connection that has waited longest for a request
  (idle, or with a half-sent head); when every connection is busy with a request, the new
  connection's request is answered ``503 UNAVAILABLE`` and it is closed;
* ``TCP_NODELAY`` on every TCP connection, also in uvicorn's worker processes;
* a malformed or oversized request head (over :data:`MAX_HEAD_BYTES`) is answered with the
  JSON error envelope (``400 VALIDATION_ERROR``) rather than uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from prefect_baton.rest._http import error_response

__all__ = [
    "ACCEPT_BATCH",
    "BODY_TIMEOUT_SECONDS",
    "HEADER_TIMEOUT_SECONDS",
    "MAX_HEAD_BYTES",
    "GuardedH11Protocol",
    "max_connections",
]

#: Seconds a connection may take to send a complete request head.
HEADER_TIMEOUT_SECONDS = 10.0
#: Seconds a request may take to send its body once its head has arrived.
BODY_TIMEOUT_SECONDS = 30.0
#: Largest request head (request line and headers) read, in bytes (h11's default).
MAX_HEAD_BYTES = 16 * 1024
#: Connections accepted per wake-up of the listening socket, and its listen queue (uvicorn's
#: ``backlog``). asyncio accepts a whole batch before the cap below can close any
#: connection, so the cap leaves room for two batches.
ACCEPT_BATCH = 100
#: File descriptors kept free of client connections: two accept batches, the ledger and
#: Redis pools, log files (at most a quarter of the limit).
FD_RESERVE = 2 * ACCEPT_BATCH + 100

_SATURATED = error_response("UNAVAILABLE", "the server has too many open connections; retry later")
_SATURATED.headers["connection"] = "close"


def max_connections() -> int:
    """The most client connections served at once (``int``): the soft ``RLIMIT_NOFILE``
    less :data:`FD_RESERVE` (a quarter of it when the limit is small), at least 16."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - min(FD_RESERVE, soft // 4))


async def _saturated(scope: Any, receive: Any, send: Any) -> None:
    await _SATURATED(scope, receive, send)


class GuardedH11Protocol(H11Protocol):
    """:class:`uvicorn.protocols.http.h11_impl.H11Protocol` with a header deadline, a body
    deadline, a connection cap and JSON answers to malformed request heads (see the module
    docstring). Pass it as uvicorn's ``http`` protocol class."""

    header_timeout: float = HEADER_TIMEOUT_SECONDS
    body_timeout: float = BODY_TIMEOUT_SECONDS
    cap: int | None = None  # None: max_connections() at the first connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: object = None
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since = time.monotonic()

    # ------------------------------------------------------------------ connection cap

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Register the connection; over the cap, close the longest-waiting idle one (or
        answer this one's request ``503`` when none is idle); start the header deadline."""
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets it only when the listening socket says IPPROTO_TCP, which the
            # socket uvicorn hands to worker processes does not (Kludex/uvicorn#3149):
            # without it every keep-alive response waits about 40 ms (Nagle + delayed ACK).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cls = type(self)
        if cls.cap is None:
            cls.cap = max_connections()
        # Connections closed earlier in this loop iteration are still registered.
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_) > cls.cap:
            idle = [c for c in open_ if c is not self and isinstance(c, GuardedH11Protocol)]
            idle = [c for c in idle if c._idle()]
            if idle:
                min(idle, key=lambda c: c._waiting_since)._close()
            else:
                self.app = _saturated
                self.logger.warning("connection limit reached: answering 503")
        self._rearm()

    def _idle(self) -> bool:
        """Whether this connection waits for a request (idle or with a half-sent head)."""
        return self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete
        )

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ read deadlines

    def _rearm(self) -> None:
        """Arm the deadline of the phase the client is in: the head (``IDLE``) or the body
        (``SEND_BODY``); none while the app or the response runs."""
        phase = self.conn.their_state
        if phase is self._phase:
            return
        self._phase = phase
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if phase is h11.IDLE:
            self._waiting_since = time.monotonic()
            self._deadline = self.loop.call_later(self.header_timeout, self._expire, phase)
        elif phase is h11.SEND_BODY:
            self._deadline = self.loop.call_later(self.body_timeout, self._expire, phase)

    def _expire(self, phase: Any) -> None:
        self._deadline = None
        if self.conn.their_state is phase:
            self._close()

    def handle_events(self) -> None:
        """uvicorn's event handling, then the deadline of the phase reached."""
        super().handle_events()
        self._rearm()

    def on_response_complete(self) -> None:
        """uvicorn's end of a response, then the deadline of the next request's head."""
        super().on_response_complete()
        self._rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the deadline and unregister the connection."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    # ------------------------------------------------------------------ malformed heads

    def send_400_response(self, msg: str) -> None:
        """Answer a request head h11 refused (malformed, or over :data:`MAX_HEAD_BYTES`)
        with the JSON error envelope ``400 VALIDATION_ERROR``, then close."""
        body = json.dumps(
            {
                "error": {
                    "code": "VALIDATION_ERROR",
                    "message": "malformed HTTP request, or its head is over "
                    f"{MAX_HEAD_BYTES} bytes",
                }
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass
        self.transport.close()
