"""MCP over stdio: one line a message, read on a daemon thread; the answers to the requests
already read are written before the server stops (a closed stdin, SIGINT or SIGTERM).
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp.types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage

from prefect_baton._client.sync import Baton
from prefect_baton.mcp._envelope import Dropped, Refusal, is_request_id, read_bytes
from prefect_baton.mcp._server import build_server

__all__ = ["EOF_GRACE_S", "serve_stdio"]

#: How long (seconds) a closed stdin, SIGINT or SIGTERM waits for the answers to the
#: requests already read.
EOF_GRACE_S = 60.0


def _stdin_lines(fd: int) -> Iterator[bytes]:
    """The lines (``bytes``, each with its ``\\n``; the last one may lack it) read from the
    file descriptor ``fd`` with :func:`os.read`, without Python's buffered reader (whose
    lock a thread still blocked in it at exit would turn into a fatal error)."""
    pending = bytearray()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                yield bytes(pending)
            return
        start = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", start)) >= 0:
            yield bytes(pending[: end + 1])
            del pending[: end + 1]
            start = 0


def _read_stdin(send: MemoryObjectSendStream[bytes], token: Any) -> None:
    """Pass the process's stdin (file descriptor 0), one line at a time, to ``send`` on
    the event loop of ``token``, until stdin ends (then ``send`` is closed) or the server
    stops reading. Runs on a daemon thread of its own, so a read still blocked when the
    server stops on a signal does not keep the process alive (a worker thread of
    ``anyio`` would)."""
    try:
        for raw in _stdin_lines(0):
            anyio.from_thread.run(send.send, raw, token=token)
        anyio.from_thread.run_sync(send.close, token=token)
    except Exception:  # the server stopped reading: nobody wants the line
        return


class _NoLines:
    """An empty stdin for :func:`mcp.server.stdio.stdio_server`: :func:`_run_stdio`
    reads the process's stdin itself (:func:`_read_stdin`)."""

    def __aiter__(self) -> _NoLines:
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration


class _Unanswered:
    """The ids of the requests passed to the server and not yet answered (a response or
    an error written, or the client's ``notifications/cancelled``), each counted under its
    id as the ``mcp`` package matches ids (:func:`~mcp.shared.dispatcher.coerce_request_id`:
    ``"1"`` names request ``1``), so a request the package cancelled is not waited for."""

    def __init__(self) -> None:
        self._ids: Counter[types.RequestId] = Counter()
        self._changed = anyio.Event()

    def _drop(self, rid: Any) -> None:
        if not is_request_id(rid):  # a cancel naming no request: an object, a list, true
            return
        key = coerce_request_id(rid)
        if self._ids.get(key):
            self._ids[key] -= 1
            if not self._ids[key]:
                del self._ids[key]
            self._changed.set()

    def read(self, message: types.JSONRPCMessage) -> None:
        """Note a message from the client."""
        if isinstance(message, types.JSONRPCRequest):
            self._ids[coerce_request_id(message.id)] += 1
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            self._drop((message.params or {}).get("requestId"))

    def written(self, message: types.JSONRPCMessage) -> None:
        """Note a message to the client."""
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self._drop(message.id)

    async def none_left(self) -> None:
        """Return once every request read has been answered."""
        while self._ids:
            self._changed = anyio.Event()
            await self._changed.wait()


async def _run_stdio(server: Server[Any]) -> int | None:
    """Serve ``server`` over stdin/stdout; returns the number of the signal that stopped
    it (``SIGINT``, ``SIGTERM``), or ``None`` when stdin ended.

    Stdin is read here, one line at a time on a worker thread, and each line is parsed
    once (:func:`~prefect_baton.mcp._envelope.read_bytes`: strict UTF-8, no repeated keys,
    request ids that are strings or integers); a line that is not a JSON-RPC message is
    answered with its JSON-RPC error at once (the ``mcp`` package would only log it), so a
    client waiting on that request's reply learns that it was not read; a notification is
    never answered (JSON-RPC 2.0), so a refused one is only logged to stderr.

    When stdin ends, or on the first SIGINT or SIGTERM, no further line is read, and the
    server is stopped only once every request already read has been answered (for at most
    :data:`EOF_GRACE_S` seconds; a second signal stops the wait), so ``printf '...' | baton
    mcp`` and Ctrl-C during a call get every answer: the ``mcp`` package would stop at
    once and drop the answers of calls still running, whose effects (a lease taken, its
    fencing token) stay."""
    async with stdio_server(stdin=cast(Any, _NoLines())) as (read_stream, write_stream):
        await read_stream.aclose()
        to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        from_server, to_client = anyio.create_memory_object_stream[SessionMessage](0)
        unanswered = _Unanswered()
        reading, grace, watching = anyio.CancelScope(), anyio.CancelScope(), anyio.CancelScope()
        send_line, lines = anyio.create_memory_object_stream[bytes](0)
        token = anyio.lowlevel.current_token()
        threading.Thread(
            target=_read_stdin, args=(send_line, token), name="baton-mcp-stdin", daemon=True
        ).start()
        signalled: list[int] = []

        async def watch_signals(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with watching, anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    signalled.append(int(signum))
                    (reading if len(signalled) == 1 else grace).cancel()

        async def client_to_server() -> None:
            async with to_server:
                with reading:
                    async for raw in lines:
                        message = read_bytes(raw)
                        # A line read is passed on whole even when a signal stops the
                        # reading meanwhile: its request is then waited for.
                        with anyio.CancelScope(shield=True):
                            if isinstance(message, Refusal):
                                await write_stream.send(SessionMessage(message))
                            elif message is not None and not isinstance(message, Dropped):
                                unanswered.read(message)
                                await to_server.send(SessionMessage(message))
                lines.close()
                with grace, anyio.move_on_after(EOF_GRACE_S):
                    await unanswered.none_left()

        async def server_to_client() -> None:
            async with to_client:
                async for item in to_client:
                    unanswered.written(item.message)
                    await write_stream.send(item)
            await write_stream.aclose()

        async with anyio.create_task_group() as tg:
            await tg.start(watch_signals)
            tg.start_soon(client_to_server)
            tg.start_soon(server_to_client)
            async with from_server:
                await server.run(from_client, from_server, server.create_initialization_options())
            watching.cancel()
    return signalled[0] if signalled else None


def serve_stdio(baton: Baton) -> int | None:
    """Serve the tools over stdin/stdout until the client closes stdin or the process gets
    SIGINT or SIGTERM; either way the calls already read are answered first (for at most
    :data:`EOF_GRACE_S` seconds; a second signal stops that wait), and no new line is read.

    Every call acts as ``baton``'s identity (its org, principal and role): over stdio the
    process is trusted with the identity it was configured with, as every ``baton``
    command is.

    Args:
        baton: the client (:class:`~prefect_baton.Baton`); the caller closes it.

    Returns:
        The number of the signal that stopped the server (``signal.SIGINT`` or
        ``signal.SIGTERM``, ``int``), or ``None`` when stdin ended.
    """
    server = build_server(lambda _ctx: (baton, None))
    return anyio.run(_run_stdio, server)
