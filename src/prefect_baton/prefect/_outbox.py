"""In-run Prefect events, sent in batches on a thread of their own, in order.

``@leased`` emits two Prefect events per task (``lease.acquired``, ``lease.released``). Sent
one by one through ``prefect.events.emit_event``, each costs about 0.6 ms of CPU in the
run's process (the ``Event`` model on the calling thread; on Prefect's events worker the
run's related resources, serialisation and the websocket send) and most of what a lease
adds to a task on Redis (``benchmarks/README.md``). So the run's thread only queues the
event's fields with its context (:func:`later`); one daemon thread per process collects
what was queued during :data:`LINGER_SECONDS` (at most :data:`MAX_BATCH` events) and hands
the batch to Prefect in one request:

- to a Prefect server named by ``PREFECT_API_URL``: one ``POST /api/events`` (the server's
  route for a batch of events) with each event built as Prefect's ``Event`` model, its run's
  related resources attached by Prefect's own ``related_resources_from_run_context`` (run in
  the context that queued it, computed once per flow or task run);
- anywhere else (Prefect Cloud, the ephemeral server), or when the server has no batch
  route (``404``/``405``): through ``prefect.events.emit_event``, one by one, as Prefect
  sends its own. With Prefect's events client override set (Prefect's test fixtures, a
  process pool's forwarding client) :func:`later` hands them to ``emit_event`` at once.

An event is delivered within about :data:`LINGER_SECONDS` of the transition. At interpreter
exit the queue is flushed at once (for up to :data:`FLUSH_SECONDS`) before Prefect's events
worker drains; a ``fork()``-ed child starts with an empty queue of its own. Events are a
mirror of the ledger: a batch that cannot be sent is logged as a warning and dropped, and
:func:`~prefect_baton.prefect.relay_events` still delivers every ledger event.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prefect.events.worker import EventsWorker
from prefect.exceptions import EventTooLarge

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.events.schemas.events import Event

__all__ = [
    "FLUSH_SECONDS",
    "LINGER_SECONDS",
    "MAX_BATCH",
    "MAX_QUEUED",
    "PendingEvent",
    "flush_events",
    "later",
]

log = logging.getLogger("prefect_baton.prefect.events")

#: The longest the exit flush waits for queued events (seconds).
FLUSH_SECONDS = 10.0
#: How long the events thread collects events into one batch after the first (seconds).
LINGER_SECONDS = 0.1
#: The most events one batch holds.
MAX_BATCH = 200
#: The most events waiting to be sent (while Prefect is unreachable); more are dropped, with
#: a warning.
MAX_QUEUED = 10_000
#: Flow and task runs whose related resources are remembered (one entry per run).
_RELATED_RUNS = 256


@dataclass(frozen=True)
class PendingEvent:
    """The fields of one Prefect event waiting to be sent (as ``emit_event`` takes them).

    Attributes:
        event: the event name (``str``). resource: the resource (labels, ``dict``).
        related: related resources before the run's (``list`` of label ``dict``).
        payload: the payload (JSON object). id: the event id (``uuid.UUID``).
        occurred: when it happened (aware ``datetime``).
    """

    event: str
    resource: dict[str, str]
    related: list[dict[str, str]]
    payload: dict[str, Any]
    id: uuid.UUID
    occurred: datetime

    def as_kwargs(self) -> dict[str, Any]:
        """The fields as ``prefect.events.emit_event`` and Prefect's ``Event`` take them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def emit_one(self) -> Any:
        """Hand this event to Prefect's events worker (``prefect.events.emit_event``);
        returns what that returns (the ``Event``, or ``None`` when Prefect skipped it)."""
        from prefect.events import emit_event

        return emit_event(**self.as_kwargs())


_Item = tuple[contextvars.Context, PendingEvent]


def _batch_url() -> str | None:
    """The Prefect server that takes this context's events in one ``POST /events``
    (``PREFECT_API_URL``), or ``None`` when they go through ``emit_event`` (Cloud, the
    ephemeral server, an events client override)."""
    from prefect.events.worker import emit_events_to_cloud
    from prefect.settings import PREFECT_API_URL

    if getattr(EventsWorker, "_client_override", None) is not None or emit_events_to_cloud():
        return None
    url = PREFECT_API_URL.value()
    return url if isinstance(url, str) and url else None


def _run_ids() -> tuple[Any, Any]:
    """``(flow run id, task run id)`` of this context (``None`` where there is none)."""
    from prefect.context import FlowRunContext, TaskRunContext

    flow_ctx, task_ctx = FlowRunContext.get(), TaskRunContext.get()
    flow_run = getattr(flow_ctx, "flow_run", None)
    task_run = getattr(task_ctx, "task_run", None)
    return getattr(flow_run, "id", None), getattr(task_run, "id", None)


@dataclass
class _Delivery:
    """The events thread's state: its event loop, one Prefect client per server, the run
    related resources it computed, and the servers without a batch route."""

    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    clients: dict[str, PrefectClient] = field(default_factory=dict)
    related: OrderedDict[tuple[str, Any, Any], list[dict[str, str]]] = field(
        default_factory=OrderedDict
    )
    one_by_one: set[str] = field(default_factory=set)
    workers: set[int] = field(default_factory=set)  # Prefect events workers flushed before

    def deliver(self, batch: list[_Item]) -> None:
        """Send ``batch`` in order: runs of events for one server in one request each."""
        run: list[_Item] = []
        url: str | None = None
        for ctx, pending in batch:
            target = ctx.run(_batch_url)
            if target in self.one_by_one:
                target = None
            if run and target != url:
                self._send(url, run)
                run = []
            url = target
            run.append((ctx, pending))
        if run:
            self._send(url, run)

    def _send(self, url: str | None, items: list[_Item]) -> None:
        if url is None:
            self._flush_before_worker(items[0][0])
            for ctx, pending in items:
                try:
                    ctx.run(pending.emit_one)
                except Exception:  # too large for Prefect: the others still go
                    log.warning("could not emit Prefect event %s", pending.event, exc_info=True)
            return
        from prefect.exceptions import PrefectHTTPStatusError

        try:
            self.loop.run_until_complete(self._post(url, items))
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code not in (404, 405):
                raise
            log.warning("%s has no route for a batch of events: sending them one by one", url)
            self.one_by_one.add(url)
            self._send(None, items)

    def _flush_before_worker(self, ctx: contextvars.Context) -> None:
        """Before the first event handed to a Prefect events worker, make sure the exit
        flush runs before that worker is drained: exit hooks run last-registered first, and
        the worker registers its drain when it is made, so the flush is registered (again)
        after it."""
        from prefect.events.worker import should_emit_events

        if not ctx.run(should_emit_events):
            return
        worker = ctx.run(EventsWorker.instance)
        if id(worker) not in self.workers:
            self.workers.add(id(worker))
            _register_exit_flush()

    async def _post(self, url: str, items: list[_Item]) -> None:
        client = await self._client(url, items[0][0])
        body = []
        for ctx, p in items:
            try:
                event = await self._event(url, client, ctx, p)
            except EventTooLarge:  # the server would refuse the whole batch
                log.warning("could not emit Prefect event %s", p.event, exc_info=True)
                continue
            body.append(event.model_dump(mode="json"))
        if body:
            await client.request("POST", "/events", json=body)

    async def _client(self, url: str, ctx: contextvars.Context) -> PrefectClient:
        client = self.clients.get(url)
        if client is None:
            from prefect.client.orchestration import get_client

            client = ctx.run(get_client)
            await client.__aenter__()
            self.clients[url] = client
        return client

    async def _event(
        self, url: str, client: PrefectClient, ctx: contextvars.Context, p: PendingEvent
    ) -> Event:
        from prefect.events.schemas.events import Event
        from prefect.settings import get_current_settings

        related = list(p.related)
        flow_run_id, task_run_id = ctx.run(_run_ids)
        if flow_run_id is not None or task_run_id is not None:
            key = (url, flow_run_id, task_run_id)
            run_related = self.related.get(key)
            if run_related is None:
                run_related = await self._run_related(client, ctx)
                if run_related:  # an empty list (the lookups failed) is tried again
                    self.related[key] = run_related
                    while len(self.related) > _RELATED_RUNS:
                        self.related.popitem(last=False)
            # as Prefect's events worker: only as many as the Event schema allows
            maximum = ctx.run(get_current_settings).server.events.maximum_related_resources
            related += run_related[: max(maximum - len(related), 0)]
        event = Event(**{**p.as_kwargs(), "related": related})
        # as emit_event: the server refuses an event above its size limit
        limit = ctx.run(get_current_settings).server.events.maximum_size_bytes
        if event.size_bytes > limit:
            raise EventTooLarge(event.size_bytes, limit)
        return event

    async def _run_related(
        self, client: PrefectClient, ctx: contextvars.Context
    ) -> list[dict[str, str]]:
        from prefect.events.related import related_resources_from_run_context

        task = self.loop.create_task(related_resources_from_run_context(client), context=ctx)
        try:
            return [dict(r.root) for r in await task]
        except Exception:  # the event still goes, without its run (as a relayed one)
            log.debug("could not read the run's related resources", exc_info=True)
            return []


class _Outbox:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start empty, with no events thread (also what a ``fork()``-ed child does: the
        parent's thread does not run there)."""
        self.queue: queue.Queue[_Item] = queue.Queue(MAX_QUEUED)
        self.dropped = 0  # events not queued because MAX_QUEUED were waiting
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.hurry = threading.Event()  # set by flush_events(): send at once, no lingering

    def put(self, pending: PendingEvent) -> None:
        if getattr(threading, "_SHUTTING_DOWN", False):  # the exit flush has run
            log.warning(
                "Prefect event %s not sent: the interpreter is exiting "
                "(relay_events delivers it from the ledger)",
                pending.event,
            )
            return
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    _register_exit_flush()
                    self.thread = threading.Thread(
                        target=self._run, name="baton-events", daemon=True
                    )
                    self.thread.start()
        try:
            self.queue.put_nowait((contextvars.copy_context(), pending))
        except queue.Full:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning(
                    "%d Prefect events not sent: %d are waiting for Prefect "
                    "(relay_events delivers them from the ledger)",
                    self.dropped,
                    MAX_QUEUED,
                )

    def _next_batch(self) -> list[_Item]:
        batch = [self.queue.get()]
        until = time.monotonic() + LINGER_SECONDS
        while len(batch) < MAX_BATCH:
            left = 0.0 if self.hurry.is_set() else until - time.monotonic()
            try:
                batch.append(self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        delivery = _Delivery()
        while True:
            batch = self._next_batch()
            try:
                delivery.deliver(batch)
            except Exception as exc:
                log.warning(
                    "could not emit %d Prefect events (relay_events delivers them from the "
                    "ledger): %s: %s",
                    len(batch),
                    type(exc).__name__,
                    exc,
                )
                log.debug("why the Prefect events were not sent", exc_info=True)
            finally:
                for _ in batch:
                    self.queue.task_done()
            del batch

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        self.hurry.set()
        try:
            while self.queue.unfinished_tasks:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
            return True
        finally:
            self.hurry.clear()


def _register_exit_flush() -> None:
    """Flush at exit (from ``threading``'s exit hooks, which run last-registered first:
    registered again after each Prefect events worker the events thread hands events to,
    so that the flush runs before Prefect drains that worker)."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it since 3.9
        import atexit

        register = atexit.register
    try:
        register(_exit_flush)
    except RuntimeError:  # the interpreter is already shutting down
        log.debug("too late to flush Prefect events at exit", exc_info=True)


def _exit_flush() -> None:
    if not flush_events(FLUSH_SECONDS):
        log.warning(
            "%d Prefect events not sent within %g s at exit (relay_events delivers them "
            "from the ledger)",
            _outbox.queue.unfinished_tasks,
            FLUSH_SECONDS,
        )


_outbox = _Outbox()
os.register_at_fork(after_in_child=_outbox.reset)


def later(pending: PendingEvent) -> None:
    """Queue ``pending`` for the events thread, with a copy of the caller's context (its
    run becomes the event's related resources): sent in the order queued, within about
    :data:`LINGER_SECONDS`. A batch that cannot be sent is logged as a warning.

    With Prefect's events client override set (Prefect's test fixtures, a process pool's
    forwarding client) it is handed to Prefect's events worker at once instead, on the
    caller's thread, as Prefect's own events are: a test that drains that worker sees it."""
    if getattr(EventsWorker, "_client_override", None) is not None:
        try:
            pending.emit_one()
        except Exception:
            log.warning("could not emit Prefect event %s", pending.event, exc_info=True)
        return
    _outbox.put(pending)


def flush_events(timeout: float = FLUSH_SECONDS) -> bool:
    """Send every Prefect event this process queued so far (``@leased``, ``lease``,
    ``handoff_to``, ``accept_handoff``) without waiting for the batch to fill, and wait
    until each was handed to Prefect: sent to the server, or to Prefect's events worker on
    the ``emit_event`` route (then ``EventsWorker.instance().drain()`` waits for that
    worker, as with Prefect's own events).

    Events are sent within about 0.1 s anyway; call this in tests that assert on events
    right after a run, and before a process ends on its own terms (``os._exit``, a kill).

    Args:
        timeout: the longest to wait (``float`` seconds).

    Returns:
        ``True`` when every queued event was handed on, ``False`` when ``timeout`` passed
        first (the rest stay queued).
    """
    return _outbox.flush(timeout)
