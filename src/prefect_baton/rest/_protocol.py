"""uvicorn's HTTP protocols with the limits a server facing untrusted clients needs.

uvicorn bounds only the idle time after a response (``timeout_keep_alive``); a connection
that never sends a complete request head, or a body that never ends, is kept forever, and
nothing bounds the number of open connections, so idle connections can use up the
process's file descriptors (``EMFILE``) until no request is answered.
:class:`GuardedHttpToolsProtocol` (uvicorn's ``httptools`` protocol, the default when
``httptools`` is installed) and :class:`GuardedH11Protocol` (uvicorn's ``h11`` protocol, the
fallback) add the same guarantees, per connection:

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
* a malformed request head, or an incomplete one over :data:`MAX_HEAD_BYTES`, is answered
  with the JSON error envelope (``400 VALIDATION_ERROR``, with a request id in
  ``meta.request_id`` and ``X-Request-ID`` as every answer) rather than uvicorn's plain
  text, and the connection is closed; so is a head whose framing either parser would take
  differently from the other (:func:`head_problem`: ``Transfer-Encoding`` other than
  ``chunked``, or with ``Content-Length``; no ``Host`` in HTTP/1.1, or two).

:data:`GuardedProtocol` is the one :func:`~prefect_baton.rest.__main__.run_app` serves with.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from collections.abc import Iterable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from prefect_baton.rest._http import error_response, new_request_id
from prefect_baton.rest._limits import ACCEPT_BATCH, MAX_HEAD_BYTES

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools missing: the h11 fallback
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

__all__ = [
    "ACCEPT_BATCH",
    "BODY_TIMEOUT_SECONDS",
    "HEADER_TIMEOUT_SECONDS",
    "MAX_HEAD_BYTES",
    "GuardedH11Protocol",
    "GuardedHttpToolsProtocol",
    "GuardedProtocol",
    "head_problem",
    "max_connections",
]

#: Seconds a connection may take to send a complete request head.
HEADER_TIMEOUT_SECONDS = 10.0
#: Seconds a request may take to send its body once its head has arrived.
BODY_TIMEOUT_SECONDS = 30.0
#: File descriptors kept free of client connections: two accept batches, the ledger and
#: Redis pools, log files (at most a quarter of the limit).
FD_RESERVE = 2 * ACCEPT_BATCH + 100

_SATURATED_MESSAGE = "the server has too many open connections; retry later"
_BAD_HEAD_MESSAGE = f"malformed HTTP request, or its head is over {MAX_HEAD_BYTES} bytes"


def _bad_head() -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of the ``400`` answer to a refused request head: the JSON
    error envelope (``VALIDATION_ERROR``) with a new request id in ``meta.request_id`` and
    ``X-Request-ID``, as every other answer carries one; the connection closes after it."""
    request_id = new_request_id()
    body = bytes(error_response("VALIDATION_ERROR", _BAD_HEAD_MESSAGE, request_id=request_id).body)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-request-id", request_id.encode()),
    ]
    return headers, body


# The phases of a connection the deadlines follow.
_WAITING = "waiting for a request head"  # idle, or part of a head received
_BODY = "receiving a request body"
_BUSY = "the app or the response runs"


def head_problem(
    http_version: str, target: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> str | None:
    """Why a request head that its parser took is refused anyway (``str``), or ``None``.
    httptools and h11 disagree on these heads (one answers ``400``, the other serves the
    request); both protocols refuse them, with ``400 VALIDATION_ERROR``, so a client (or a
    proxy in front) sees one answer whichever is installed, and no two parties can frame
    the body differently (request smuggling): a ``Transfer-Encoding`` other than
    ``chunked`` (httptools took ``gzip, chunked`` and handed the app the still-encoded
    body), ``Transfer-Encoding`` together with ``Content-Length`` (h11 took it), several
    ``Host`` headers, or none in an HTTP/1.1 request (httptools took both; RFC 9112
    section 3.2 requires ``400``). Also a complete head over :data:`MAX_HEAD_BYTES`
    (counted as the request target plus each header line, ``name: value`` and its line
    end): both parsers limit only a head still incomplete, so one that arrived whole in
    one read was served.

    Args:
        http_version: the request's HTTP version (``str``, e.g. ``"1.1"``).
        target: its request target (``bytes``, e.g. ``b"/v1/leases"``).
        headers: its header fields as ``(name, value)`` byte pairs, names in any case.
    """
    hosts = 0
    encodings = []
    has_length = False
    size = len(target)
    for name, value in headers:
        size += len(name) + len(value) + 4
        name = name.lower()
        if name == b"host":
            hosts += 1
        elif name == b"transfer-encoding":
            encodings.append(value.strip().lower())
        elif name == b"content-length":
            has_length = True
    if encodings and encodings != [b"chunked"]:
        return "Transfer-Encoding must be chunked, once"
    if encodings and has_length:
        return "Transfer-Encoding and Content-Length together"
    if hosts > 1 or (hosts == 0 and http_version == "1.1"):
        return "an HTTP/1.1 request needs one Host header"
    if size > MAX_HEAD_BYTES:
        return "request head too long"
    return None


class _CheckedConnection(h11.Connection):
    """h11's server connection, refusing the heads :func:`head_problem` names as malformed."""

    def next_event(self) -> Any:
        """h11's next event; a request whose head :func:`head_problem` refuses raises.

        Raises:
            h11.RemoteProtocolError: malformed, or refused by :func:`head_problem`.
        """
        event = super().next_event()
        if isinstance(event, h11.Request):
            problem = head_problem(event.http_version.decode("ascii"), event.target, event.headers)
            if problem is not None:
                raise h11.RemoteProtocolError(problem, error_status_hint=400)
        return event


def max_connections() -> int:
    """The most client connections served at once (``int``): the soft ``RLIMIT_NOFILE``
    less :data:`FD_RESERVE` (a quarter of it when the limit is small), at least 16."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - min(FD_RESERVE, soft // 4))


async def _saturated(scope: Any, receive: Any, send: Any) -> None:
    """Answer ``503 UNAVAILABLE`` (with a new request id, as every answer has one) and close."""
    request_id = new_request_id()
    response = error_response("UNAVAILABLE", _SATURATED_MESSAGE, request_id=request_id)
    response.headers["connection"] = "close"
    response.headers["x-request-id"] = request_id
    await response(scope, receive, send)


class _Guard:
    """The guard itself, over either uvicorn protocol (a mixin placed before it): the
    connection cap, the deadlines and ``TCP_NODELAY``. A subclass says which phase the
    connection is in (:meth:`_phase`) and calls :meth:`_rearm` when it may have changed."""

    header_timeout: float = HEADER_TIMEOUT_SECONDS
    body_timeout: float = BODY_TIMEOUT_SECONDS
    cap: int | None = None  # None: max_connections() at the first connection

    # Set by uvicorn's protocol classes.
    app: Any
    connections: set[Any]
    cycle: Any
    logger: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase_armed: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since = time.monotonic()

    def _phase(self) -> str:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    # ------------------------------------------------------------------ connection cap

    def connection_made(self, transport: asyncio.Transport) -> None:
        """Register the connection; over the cap, close the longest-waiting idle one (or
        answer this one's request ``503`` when none is idle); start the header deadline."""
        super().connection_made(transport)  # type: ignore[misc]
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
            idle = [c for c in open_ if c is not self and isinstance(c, _Guard) and c._idle()]
            if idle:
                min(idle, key=lambda c: c._waiting_since)._close()
            else:
                self.app = _saturated
                self.logger.warning("connection limit reached: answering 503")
        self._rearm()

    def _idle(self) -> bool:
        """Whether this connection waits for a request (idle or with a half-sent head)."""
        return self._phase() is _WAITING and (self.cycle is None or self.cycle.response_complete)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ read deadlines

    def _rearm(self) -> None:
        """Arm the deadline of the phase the client is in: the head (:data:`_WAITING`) or
        the body (:data:`_BODY`); none while the app or the response runs."""
        phase = self._phase()
        if phase is self._phase_armed:
            return
        self._phase_armed = phase
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if phase is _WAITING:
            self._waiting_since = time.monotonic()
            self._deadline = self.loop.call_later(self.header_timeout, self._expire, phase)
        elif phase is _BODY:
            self._deadline = self.loop.call_later(self.body_timeout, self._expire, phase)

    def _expire(self, phase: str) -> None:
        self._deadline = None
        if self._phase() is phase:
            self._close()

    def on_response_complete(self) -> None:
        """uvicorn's end of a response, then the deadline of the next request's head."""
        super().on_response_complete()  # type: ignore[misc]
        self._rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the deadline and unregister the connection."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)  # type: ignore[misc]


class GuardedH11Protocol(_Guard, H11Protocol):  # type: ignore[misc]
    """:class:`uvicorn.protocols.http.h11_impl.H11Protocol` with a header deadline, a body
    deadline, a connection cap and JSON answers to malformed request heads (see the module
    docstring). Pass it as uvicorn's ``http`` protocol class, with
    ``h11_max_incomplete_event_size=MAX_HEAD_BYTES``."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.conn = _CheckedConnection(
            h11.SERVER, config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        )

    def _phase(self) -> str:
        state = self.conn.their_state
        if state is h11.IDLE:
            return _WAITING
        return _BODY if state is h11.SEND_BODY else _BUSY

    def handle_events(self) -> None:
        """uvicorn's event handling, then the deadline of the phase reached."""
        super().handle_events()
        self._rearm()

    # ------------------------------------------------------------------ malformed heads

    def send_400_response(self, msg: str) -> None:
        """Answer a request head h11 refused (malformed, or over :data:`MAX_HEAD_BYTES`)
        with the JSON error envelope ``400 VALIDATION_ERROR``, then close."""
        headers, body = _bad_head()
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


if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):  # type: ignore[misc]
        """:class:`uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` with the
        guarantees of :class:`GuardedH11Protocol` (see the module docstring); the parser
        has no head size limit of its own, so this class answers ``400`` once more than
        :data:`MAX_HEAD_BYTES` of a head have arrived without its end (as h11 does). Pass
        it as uvicorn's ``http`` protocol class. Defined only when ``httptools`` is
        installed."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_body = False  # between a head's end and its message's end
            self._head_bytes = 0  # bytes received since the last head ended
            self._refused = False  # a message was refused; its 400 ends the connection
            self._refused_cycle: Any = None  # the request whose body was refused
            self._running: Any = None  # the request uvicorn started last

        def _phase(self) -> str:
            if self._in_body:
                return _BODY
            if (self.cycle is None or self.cycle.response_complete) and not self.pipeline:
                return _WAITING
            return _BUSY

        def data_received(self, data: bytes) -> None:
            """uvicorn's parsing (its callbacks start requests), then the head size limit
            and the deadline of the phase reached. Nothing more is read once a head was
            refused."""
            if self._refused:
                return
            if not self._in_body:
                self._head_bytes += len(data)
            super().data_received(data)
            if self.transport.is_closing():
                return
            if not self._in_body and self._head_bytes > MAX_HEAD_BYTES:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("request head too long")
                return
            self._rearm()

        def on_headers_complete(self) -> None:
            """A head ended: its body (if any) follows; then uvicorn starts the request.

            Raises:
                ValueError: :func:`head_problem` refuses the head (the parser then stops,
                    and the connection is answered ``400``).
            """
            problem = head_problem(self.parser.get_http_version(), self.url, self.headers)
            if problem is not None:
                raise ValueError(problem)
            self._head_bytes = 0
            self._in_body = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            """The request's body ended; then uvicorn tells the app."""
            self._in_body = False
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            """Answer a request head the parser refused (malformed, or an incomplete one
            over :data:`MAX_HEAD_BYTES`) with the JSON error envelope
            ``400 VALIDATION_ERROR``, then close; when requests sent before it on this
            connection are still running or queued (pipelining), only after their
            responses, in order, as h11 answers: the parser reads ahead of the app, so
            answering at once would cut a response in progress or drop a request that has
            already run. A request whose body the parser refused never runs (if queued)
            or sees ``http.disconnect`` (if running)."""
            if not self._refused:
                self._refused = True
                self.flow.pause_reading()
                if self._in_body:  # the refused message is the latest request
                    self._in_body = False
                    self._refused_cycle = self.cycle
                    if self.pipeline and self.pipeline[0][0] is self.cycle:
                        self.pipeline.popleft()  # queued behind a running one
            running = self._running
            done = running is None or running.response_complete or running is self._refused_cycle
            if done and not self.pipeline:
                headers, body = _bad_head()
                head = [b"HTTP/1.1 400 Bad Request\r\n"]
                head += [name + b": " + value + b"\r\n" for name, value in headers]
                self.transport.write(b"".join(head) + b"\r\n" + body)
                self.transport.close()

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            """uvicorn's start of a request's app (noted: the refusal waits for it)."""
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def on_response_complete(self) -> None:
            """uvicorn's end of a response (which starts the next pipelined request); then
            the refusal of a head that followed them, once none is left."""
            super().on_response_complete()
            if self._refused and not self.transport.is_closing():
                self.send_400_response("")

    #: The protocol :func:`~prefect_baton.rest.__main__.run_app` serves with:
    #: :class:`GuardedHttpToolsProtocol` when ``httptools`` is installed (uvicorn's fast
    #: parser, a C library), else :class:`GuardedH11Protocol`.
    GuardedProtocol: type[asyncio.Protocol] = GuardedHttpToolsProtocol
else:  # pragma: no cover - httptools missing
    GuardedProtocol = GuardedH11Protocol
