"""Prefect retries around a handoff or a lapsed lease: a retry in another process decides
from the store (never acquires a resource whose lease the run handed off), and a flow retry
that ends without running its body after a failed attempt neither re-raises nor logs that
attempt's exception."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest
from prefect import flow, task
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import CancelledRun
from prefect.flow_engine import run_flow

from prefect_baton import Baton
from prefect_baton.prefect import _plan, current_lease, handoff_to, lease, leased
from prefect_baton.prefect._logs import _ENGINE_EXIT, settle_failed_attempt

MakeBaton = Callable[..., Baton]

#: the ledger arms (SQLite, PostgreSQL) and the Redis arms of the root conftest's ``baton``
ARMS = pytest.mark.parametrize(
    "ledger_url", ["sqlite", "postgresql", "fakeredis", "redis"], indirect=True
)


def _run_count() -> int:
    task_ctx = TaskRunContext.get()
    if task_ctx is not None:
        return int(task_ctx.task_run.run_count)
    flow_ctx = FlowRunContext.get()
    assert flow_ctx is not None
    assert flow_ctx.flow_run is not None
    return int(flow_ctx.flow_run.run_count)


@pytest.fixture
def other_process(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``other_process(fn, from_run=2)``: ``fn`` whose calls from attempt ``from_run`` of
    its run on run as another process would: without this process's memory of the run's
    earlier attempts and with an attempt token of its own (what a worker re-running the
    flow run has)."""

    def wrap(fn: Callable[..., Any], from_run: int = 2) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _run_count() >= from_run:
                for memory in (_plan._held_attempts, _plan._handed_to, _plan._failed):
                    memory.clear()
                monkeypatch.setattr(_plan, "_process_attempt", "process-elsewhere")
            return fn(*args, **kwargs)

        return wrapper

    return wrap


def _generations(admin: Baton, resource_type: str, resource_id: str) -> list[tuple[int, str]]:
    """``(epoch, status)`` of every generation of the resource, oldest first."""
    rows = admin.leases.list(resource_type=resource_type, owner="*", include_ended=True)
    return sorted((g.epoch, g.status) for g in rows if g.resource_id == resource_id)


def _engine_exits(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == _ENGINE_EXIT]


def _hand_off_then_fail(b: Baton, reviewer: Baton, report: str, runs: list[int]) -> None:
    """The body: hand the lease to ``reviewer``, who accepts and finishes, then fail."""
    held = current_lease()
    assert held is not None
    runs.append(held.epoch)
    sent = handoff_to("reviewer", report, checkpoint={"sections_done": 2}, lease=held, baton=b)
    accepted = reviewer.handoffs.resolve(sent.handoff_id, "accepted")
    assert accepted.lease is not None
    reviewer.leases.release(accepted.lease)
    raise RuntimeError("crash after handing off")


# ------------------------------------------------------------ a retry in another process


@ARMS
@pytest.mark.parametrize("surface", ["flow", "task", "block"])
def test_retry_in_another_process_after_a_handoff_ends_handed_off(
    baton: Baton, other_process: Callable[..., Any], surface: str
) -> None:
    """The retry of a run whose previous attempt handed its lease off and failed, run by
    another process (no memory of that attempt, another attempt token), does not acquire
    the resource again nor run the body: the store refuses the run's execution key
    ``transferred`` and the run ends ``Completed(name="HandedOff")`` (``@leased`` flows and
    tasks, ``with lease(...)``); no generation follows the recipient's."""
    writer, reviewer = baton.as_principal("writer"), baton.as_principal("reviewer")
    runs: list[int] = []
    task_states: list[Any] = []
    body = functools.partial(_hand_off_then_fail, writer, reviewer)
    options: dict[str, Any] = {"ttl_seconds": 30, "baton": writer}

    if surface == "flow":

        @flow(name="baton-test-rerun", retries=1, retry_delay_seconds=0)
        @other_process
        @leased("report", "{report}", **options)
        def run(report: str) -> Any:
            body(report, runs)

    elif surface == "task":

        @task(retries=1, retry_delay_seconds=0)
        @other_process
        @leased("report", "{report}", **options)
        def write(report: str) -> None:
            body(report, runs)

        @flow(name="baton-test-rerun")
        def run(report: str) -> Any:
            task_states.append(write(report, return_state=True))

    else:

        @other_process
        def write(report: str) -> Any:
            block = lease("report", report, **options)
            with block as held:
                if held is None:
                    return block.skip_state
                body(report, runs)
            return None

        @flow(name="baton-test-rerun", retries=1, retry_delay_seconds=0)
        def run(report: str) -> Any:
            return write(report)

    state: Any = run("q7", return_state=True)
    if surface == "task":
        (state,) = task_states
    assert len(runs) == 1  # the retry did not run the body
    assert (state.type.value, state.name) == ("COMPLETED", "HandedOff")
    for part in ("report/q7", "transferred", "does not acquire it again"):
        assert part in state.message
    admin = baton.as_principal("admin", role="owner")
    generations = _generations(admin, "report", "q7")
    assert [status for _, status in generations] == ["transferred", "released"]
    assert generations[0][0] == runs[0]


@pytest.mark.parametrize("then", ["held", "handed_off"])
def test_retry_in_another_process_after_a_lapsed_lease_never_holds_a_second_one(
    other_process: Callable[..., Any], then: str
) -> None:
    """A retry whose previous lease lapsed acquires anew under the run's key as a new
    attempt; the next retry, run by another process, finds that lease: while the earlier
    attempt still holds it, a conflict (``on_conflict="skip"`` skips: no second lease), and
    once it was handed off, ``HandedOff``."""
    from prefect_baton.testing import ManualClock, memory_baton

    clock = ManualClock()
    runs: list[tuple[int, int]] = []
    with memory_baton(org="test", principal="admin", role="owner", clock=clock) as admin:
        reviewer = admin.as_principal("reviewer")

        @flow(name="baton-test-lapsed-elsewhere", retries=2, retry_delay_seconds=0)
        def run(report: str) -> Any:
            return other_process(write, from_run=3)(report)

        @leased("report", "{report}", ttl_seconds=10, on_conflict="skip", baton=admin.as_principal)
        def write(report: str) -> None:
            held = current_lease()
            assert held is not None
            runs.append((_run_count(), held.epoch))
            if len(runs) == 1:
                clock.advance(11)  # the first attempt's lease lapses before its retry
            elif then == "handed_off":
                sent = handoff_to("reviewer", report, lease=held)
                reviewer.handoffs.resolve(sent.handoff_id, "accepted")
            raise RuntimeError("transient failure")

        state: Any = run("q8", return_state=True)
        assert runs == [(1, 1), (2, 2)]  # the third attempt did not run the body
        generations = _generations(admin, "report", "q8")
        if then == "held":
            assert (state.type.value, state.name) == ("COMPLETED", "Skipped")
            assert "report/q8" in state.message
            assert "held by another attempt of this execution" in state.message
            assert generations == [(1, "taken_over"), (2, "active")]
        else:
            assert (state.type.value, state.name) == ("COMPLETED", "HandedOff")
            assert generations == [(1, "taken_over"), (2, "transferred"), (3, "active")]


def test_a_retry_after_a_lapsed_lease_warns_with_advice_a_prefect_user_can_follow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry whose previous lease expired in between warns that it acquires anew, and
    says what keeps the lease across retries (a TTL longer than the retry delay), not the
    store's "use a new execution key": inside Prefect that key is the run id, which the
    user does not choose."""
    from prefect_baton.testing import ManualClock, memory_baton

    clock = ManualClock()
    runs: list[int] = []
    with memory_baton(org="test", principal="admin", role="owner", clock=clock) as admin:

        @flow(name="baton-test-lapsed-warning", retries=1, retry_delay_seconds=0)
        def run(report: str) -> None:
            write(report)

        @leased("report", "{report}", ttl_seconds=10, baton=admin.as_principal)
        def write(report: str) -> None:
            runs.append(_run_count())
            if len(runs) == 1:
                clock.advance(11)  # the first attempt's lease lapses before its retry
                raise RuntimeError("transient failure")

        with caplog.at_level(logging.WARNING):
            state: Any = run("q9", return_state=True)
    assert state.is_completed(), state
    assert runs == [1, 2]
    [warning] = [r.getMessage() for r in caplog.records if "previous attempt" in r.getMessage()]
    assert warning == (
        "report/q9: the lease of the previous attempt is no longer held (expired); acquiring "
        "anew as a new attempt of this run (it expired before this retry: choose ttl_seconds "
        "(now 10) longer than the retry delay to keep the lease across retries)"
    )
    assert "execution key" not in warning


# ------------------------------------------------- the failed attempt is no outcome of a retry


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_flow_retry_ending_handed_off_returns_and_logs_no_engine_error(
    make_baton: MakeBaton, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """A flow run whose first attempt handed off and failed, retried in the same process,
    ends ``HandedOff``; run as Prefect runs a deployment's flow run, it returns the final
    state's result (``None``) instead of re-raising the first attempt's exception, and logs
    no "Engine execution exited with unexpected exception" (sync and async flows)."""
    writer, reviewer = make_baton("writer"), make_baton("reviewer")
    runs: list[int] = []
    flow_runs: list[str] = []

    def body(report: str) -> None:
        ctx = FlowRunContext.get()
        assert ctx is not None
        assert ctx.flow_run is not None
        flow_runs.append(str(ctx.flow_run.id))
        _hand_off_then_fail(writer, reviewer, report, runs)

    async def abody(report: str) -> None:
        body(report)

    held = leased("report", "{report}", ttl_seconds=30, baton=writer)
    retried = flow(name="baton-test-handed-off-exit", retries=1, retry_delay_seconds=0)
    run: Any = retried(held(body if kind == "sync" else abody))

    def finish(out: Any) -> Any:
        return asyncio.run(out) if kind == "async" else out

    engine_logger = logging.getLogger("prefect.flow_runs")
    assert finish(run_flow(run, parameters={"report": "q9"}, error_logger=engine_logger)) is None
    assert runs == [1]
    assert _engine_exits(caplog) == []
    assert _final_state(flow_runs[0]).name == "HandedOff"
    assert finish(run("q10")) is None  # called as a function: no exception either


def _final_state(flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


@pytest.mark.parametrize("on_conflict", ["skip", "cancel"])
def test_flow_retry_skipped_after_a_failed_attempt_does_not_raise_it(
    caplog: pytest.LogCaptureFixture, on_conflict: str
) -> None:
    """A flow retry that finds its lapsed resource taken ends ``Skipped`` (or ``Cancelled``)
    without re-raising the failed attempt's exception: run as a deployment's flow run, a
    skipped run returns ``None`` and a cancelled one raises its ``CancelledRun``, with no
    engine error logged either way."""
    from prefect_baton.testing import ManualClock, memory_baton

    clock = ManualClock()
    runs: list[int] = []
    with memory_baton(org="test", principal="admin", role="owner", clock=clock) as admin:

        @flow(name="baton-test-skipped-retry", retries=1, retry_delay_seconds=0)
        @leased(
            "report", "{report}", ttl_seconds=10, on_conflict=on_conflict, baton=admin.as_principal
        )
        def run(report: str) -> None:
            runs.append(1)
            clock.advance(11)  # the lease lapses and someone else takes the resource
            admin.as_principal("someone").leases.acquire("report", report, ttl_seconds=60)
            raise RuntimeError("transient failure")

        engine_logger = logging.getLogger("prefect.flow_runs")
        if on_conflict == "skip":
            assert run_flow(run, parameters={"report": "q11"}, error_logger=engine_logger) is None
        else:
            with pytest.raises(CancelledRun, match="report/q11"):
                run_flow(run, parameters={"report": "q11"}, error_logger=engine_logger)
        assert runs == [1]
        assert _engine_exits(caplog) == []


@pytest.mark.filterwarnings("ignore:Logger 'prefect.flow_runs' attempted to send logs")
def test_a_failed_attempt_settled_without_its_engine_loses_only_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where Prefect's engine cannot be found, the failed attempt's exception (a built-in
    one too) is still marked expected: the engine-exit record of it is dropped, any other
    record keeps its message without the traceback."""
    failure = RuntimeError("crash after handing off")
    settle_failed_attempt("no-such-flow-run", failure)
    flow_logger = logging.getLogger("prefect.flow_runs")
    info = (RuntimeError, failure, None)
    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"):
        flow_logger.error(_ENGINE_EXIT, exc_info=info)
        flow_logger.error("Encountered exception during execution", exc_info=info)
        other = ValueError("not settled")
        flow_logger.error(_ENGINE_EXIT, exc_info=(ValueError, other, None))
    records = [r for r in caplog.records if r.name == "prefect.flow_runs"]
    assert [(r.getMessage(), r.exc_info is None) for r in records] == [
        ("Encountered exception during execution", True),
        (_ENGINE_EXIT, False),
    ]
