"""In-run Prefect events go to the server in batches (one ``POST /api/events`` per batch),
with their run's related resources; other routes still get them one by one, and none is
lost when the process exits right after its run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task

from prefect_baton import Baton
from prefect_baton.prefect import _outbox, flush_events, leased
from prefect_baton.prefect._events import prefect_event_id

from .conftest import REPO

MakeBaton = Callable[..., Baton]


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh events queue and thread for the test (what it learns about the server, such
    as a missing batch route, stays with it)."""
    monkeypatch.setattr(_outbox, "_outbox", _outbox._Outbox())
    yield
    assert flush_events(30)


@pytest.fixture
def event_posts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``POST /events`` request Prefect's client sends."""
    from prefect.client.orchestration import PrefectClient

    sizes: list[int] = []
    real = PrefectClient.request

    async def counting(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if (method, path) == ("POST", "/events"):
            sizes.append(len(kwargs["json"]))
        return await real(self, method, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PrefectClient, "request", counting)
    return sizes


def _expected_ids(b: Baton) -> dict[str, str]:
    """Prefect event id -> ledger kind of every lease event ``b``'s org recorded."""
    return {
        str(prefect_event_id(b.org, e.kind, e.payload, e.event_id)): e.kind
        for e in b.events.list(limit=500)
        if e.kind in ("lease.acquired", "lease.released")
    }


def _server_events(ids: list[str], timeout: float = 60) -> list[Any]:
    """The events with these ids on the Prefect server, polled until all arrived (the
    server persists events in batches) or ``timeout`` seconds passed."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventIDFilter

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            flt = EventFilter(id=EventIDFilter(id=[uuid.UUID(i) for i in ids]))
            page = client.read_events(filter=flt, limit=len(ids) + 10)
            if len(page.events) >= len(ids) or time.monotonic() > deadline:
                return list(page.events)
            time.sleep(0.5)


def test_in_run_events_are_sent_in_batches_with_their_runs(
    make_baton: MakeBaton, outbox: None, event_posts: list[int]
) -> None:
    """Ten ``@leased`` task runs queue twenty events; they reach the server in fewer
    requests than events, each with its task run, flow run and flow as related resources,
    the two events of one lease naming the same task run."""

    @task
    @leased("deploy", "batch-{i}", ttl_seconds=30, baton=make_baton)
    def work(i: int) -> int:
        return i

    @flow(name="baton-test-event-batches")
    def run() -> None:
        for i in range(10):
            work(i)

    run()
    assert flush_events(30)
    b = make_baton("baton-test-event-batches")
    expected = _expected_ids(b)
    assert len(expected) == 20
    got = _server_events(list(expected))
    assert sorted(str(e.id) for e in got) == sorted(expected)
    assert 1 <= len(event_posts) < 20
    assert sum(event_posts) >= 20
    task_run_of: dict[str, set[str]] = {}
    for e in got:
        assert e.event == "prefect-baton." + expected[str(e.id)]
        roles = {r.role: r.id for r in e.related}
        assert {"task-run", "flow-run", "flow", "principal"} <= set(roles), roles
        assert roles["principal"] == "prefect-baton.principal.baton-test-event-batches"
        task_run_of.setdefault(e.resource["prefect-baton.lease-id"], set()).add(roles["task-run"])
    assert len(task_run_of) == 10
    assert all(len(runs) == 1 for runs in task_run_of.values())
    assert len(set().union(*task_run_of.values())) == 10


def test_a_server_without_the_batch_route_gets_them_one_by_one(
    make_baton: MakeBaton,
    outbox: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When ``POST /events`` answers 404 the events thread says so once and sends the
    run's events through Prefect's events worker instead: they still arrive."""
    import httpx
    from prefect.client.orchestration import PrefectClient
    from prefect.exceptions import PrefectHTTPStatusError

    real = PrefectClient.request
    refused: list[int] = []

    async def no_route(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if (method, path) == ("POST", "/events"):
            refused.append(len(kwargs["json"]))
            request = httpx.Request("POST", "http://127.0.0.1/api/events")
            response = httpx.Response(404, request=request)
            raise PrefectHTTPStatusError.from_httpx_error(
                httpx.HTTPStatusError("404", request=request, response=response)
            )
        return await real(self, method, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PrefectClient, "request", no_route)

    @task
    @leased("deploy", "no-batch-{i}", ttl_seconds=30, baton=make_baton)
    def work(i: int) -> int:
        return i

    @flow(name="baton-test-no-batch-route")
    def run() -> None:
        for i in range(3):
            work(i)

    with caplog.at_level(logging.WARNING, logger="prefect_baton.prefect.events"):
        run()
        assert flush_events(30)
    expected = _expected_ids(make_baton("baton-test-no-batch-route"))
    assert len(expected) == 6
    got = _server_events(list(expected))
    assert sorted(str(e.id) for e in got) == sorted(expected)
    assert all("task-run" in {r.role for r in e.related} for e in got)
    assert len(refused) == 1  # asked once; then one by one
    warnings = [r.getMessage() for r in caplog.records if "no route" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_an_events_client_override_receives_them_at_once(
    make_baton: MakeBaton, outbox: None
) -> None:
    """With Prefect's events client override (``AssertingEventsClient``, as Prefect's own
    test fixtures set it) the events go to that client as Prefect's own do, on the
    caller's thread: a drain right after the run (or a ``lease`` block outside any run)
    sees them, with the task run of an in-run one."""
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    from prefect_baton.prefect import lease

    @task
    @leased("deploy", "override", ttl_seconds=30, baton=make_baton)
    def work() -> None:
        return None

    @flow(name="baton-test-events-override")
    def run() -> None:
        work()

    EventsWorker.set_client_override(AssertingEventsClient)
    try:
        worker = EventsWorker.instance()
        run()
        with lease("deploy", "override-outside", ttl_seconds=30, baton=make_baton("outside")):
            pass
        worker.drain()
        client = worker._client
        assert isinstance(client, AssertingEventsClient)
        ours = [e for e in client.events if e.event.startswith("prefect-baton.lease.")]
    finally:
        EventsWorker.set_client_override(None)
    assert [(e.event, e.resource["prefect-baton.resource-id"]) for e in ours] == [
        ("prefect-baton.lease.acquired", "override"),
        ("prefect-baton.lease.released", "override"),
        ("prefect-baton.lease.acquired", "override-outside"),
        ("prefect-baton.lease.released", "override-outside"),
    ]
    assert all("task-run" in {r.role for r in e.related} for e in ours[:2])


def _run_script(tmp_path: Path, body: str, api_url: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PREFECT_API_URL"] = api_url
    env["PREFECT_LOGGING_LEVEL"] = "WARNING"
    return subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_events_queued_just_before_exit_are_sent(tmp_path: Path, prefect_api: str) -> None:
    """A process that exits right after its run (within the batching delay) still sends
    its queued events: the exit flush sends them at once."""
    proc = _run_script(
        tmp_path,
        f"""
import json
from prefect import flow, task
from prefect_baton import Baton
from prefect_baton.prefect import leased
from prefect_baton.prefect._events import prefect_event_id

b = Baton(ledger_url="sqlite:///{tmp_path / "l.db"}", org="exit-org", principal="exits")

@task
@leased("deploy", "exit-{{i}}", ttl_seconds=30, baton=b)
def work(i):
    return i

@flow(name="baton-test-exit-flush")
def run():
    for i in range(3):
        work(i)

run()
print(json.dumps([
    str(prefect_event_id(b.org, e.kind, e.payload, e.event_id))
    for e in b.events.list(limit=50)
    if e.kind in ("lease.acquired", "lease.released")
]))
""",
        prefect_api,
    )
    assert proc.returncode == 0, proc.stderr
    ids = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(ids) == 6
    got = _server_events(ids)
    assert sorted(str(e.id) for e in got) == sorted(ids)


def test_an_event_too_large_is_left_out_of_its_batch_alone(
    make_baton: MakeBaton, outbox: None, caplog: pytest.LogCaptureFixture
) -> None:
    """An event above Prefect's size limit is logged and left out; the server would refuse
    the whole batch for it, so the lease events queued around it still arrive."""
    from datetime import UTC, datetime

    from prefect_baton.prefect._outbox import PendingEvent, later

    too_large = PendingEvent(
        "prefect-baton.test.too-large",
        {"prefect.resource.id": "prefect-baton.test.too-large"},
        [],
        {"blob": "x" * 2_000_000},
        uuid.uuid4(),
        datetime.now(UTC),
    )

    @task
    @leased("deploy", "beside-too-large", ttl_seconds=30, baton=make_baton)
    def work() -> None:
        later(too_large)

    @flow(name="baton-test-too-large")
    def run() -> None:
        work()

    with caplog.at_level(logging.WARNING, logger="prefect_baton.prefect.events"):
        run()
        assert flush_events(30)
    expected = _expected_ids(make_baton("baton-test-too-large"))
    assert len(expected) == 2
    got = _server_events(list(expected))
    assert sorted(str(e.id) for e in got) == sorted(expected)
    assert _server_events([str(too_large.id)], timeout=2) == []
    assert any("prefect-baton.test.too-large" in r.getMessage() for r in caplog.records)


def test_events_left_unsent_at_exit_are_reported(tmp_path: Path) -> None:
    """When the exit flush gives up (the server does not answer), the process says how
    many events it did not send, and that ``relay_events`` delivers them; an event queued
    after the exit flush ran (a lease taken in an ``atexit`` handler) is reported too."""
    proc = _run_script(
        tmp_path,
        f"""
import atexit
from prefect_baton import Baton
from prefect_baton.prefect import _outbox, lease

_outbox.FLUSH_SECONDS = 1.0
b = Baton(ledger_url="sqlite:///{tmp_path / "l.db"}", org="exit-org", principal="exits")
with lease("deploy", "unsent", ttl_seconds=30, baton=b):
    pass

def late():
    with lease("deploy", "late", ttl_seconds=30, baton=b):
        pass

atexit.register(late)
""",
        f"http://127.0.0.1:{_closed_port()}/api",
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 Prefect events not sent within 1 s at exit (relay_events" in proc.stderr
    assert (
        "Prefect event prefect-baton.lease.acquired not sent: the interpreter is exiting"
        in proc.stderr
    )


def test_events_beyond_the_queue_bound_are_dropped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While Prefect does not take events, at most ``MAX_QUEUED`` wait; later ones are
    dropped and counted in a warning, and the waiting ones are still sent afterwards."""
    import threading
    from datetime import UTC, datetime

    from prefect_baton.prefect._outbox import PendingEvent, later

    monkeypatch.setattr(_outbox, "MAX_QUEUED", 3)
    monkeypatch.setattr(_outbox, "_outbox", _outbox._Outbox())
    gate, stuck_now = threading.Event(), threading.Event()
    sent: list[str] = []

    def stuck(self: Any, batch: list[Any]) -> None:
        stuck_now.set()
        gate.wait(30)
        sent.extend(p.event for _, p in batch)

    monkeypatch.setattr(_outbox._Delivery, "deliver", stuck)

    def pending(i: int) -> PendingEvent:
        return PendingEvent(
            f"prefect-baton.test.{i}",
            {"prefect.resource.id": "prefect-baton.test"},
            [],
            {},
            uuid.uuid4(),
            datetime.now(UTC),
        )

    with caplog.at_level(logging.WARNING, logger="prefect_baton.prefect.events"):
        later(pending(0))
        assert stuck_now.wait(10)  # the thread took event 0 and is stuck sending it
        for i in range(1, 10):
            later(pending(i))
    gate.set()
    assert flush_events(30)
    assert sent == [f"prefect-baton.test.{i}" for i in range(4)]
    warnings = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert warnings == [
        "1 Prefect events not sent: 3 are waiting for Prefect (relay_events delivers them "
        "from the ledger)"
    ]
    assert _outbox._outbox.dropped == 6


def test_events_still_go_when_the_runs_resources_cannot_be_read(
    make_baton: MakeBaton, outbox: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When Prefect's lookups of the run's related resources fail, the run's events are
    sent without them (with the acting principal), not dropped."""
    import prefect.events.related

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lookup failed")

    monkeypatch.setattr(prefect.events.related, "related_resources_from_run_context", failing)

    @task
    @leased("deploy", "no-related", ttl_seconds=30, baton=make_baton)
    def work() -> None:
        return None

    @flow(name="baton-test-no-related")
    def run() -> None:
        work()

    run()
    assert flush_events(30)
    expected = _expected_ids(make_baton("baton-test-no-related"))
    got = _server_events(list(expected))
    assert sorted(str(e.id) for e in got) == sorted(expected)
    assert all({r.role for r in e.related} == {"principal"} for e in got)
