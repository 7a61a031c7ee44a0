"""``@leased`` on Prefect tasks and flows: retries, conflicts, async, heartbeat, loss."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from prefect import flow, task
from prefect.context import FlowRunContext, TaskRunContext

from prefect_baton import (
    Baton,
    ConflictError,
    IdempotencyInFlightError,
    LeaseLostError,
    ValidationError,
)
from prefect_baton.prefect import _plan, current_lease, leased

from ..conftest import metric_value

MakeBaton = Callable[..., Baton]


def _wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_retry_replays_its_own_acquire(make_baton: MakeBaton) -> None:
    """A Prefect retry of the same task run replays its acquire: same lease, same epoch."""
    seen: list[tuple[int, str, int, bool, str | None]] = []

    @task(retries=1, retry_delay_seconds=0)
    @leased("deploy", "{service}", ttl_seconds=30, baton=make_baton)
    def deploy(service: str) -> int:
        ctx = TaskRunContext.get()
        held = current_lease()
        assert ctx is not None
        assert held is not None
        seen.append(
            (
                ctx.task_run.run_count,
                held.lease_id,
                held.epoch,
                held.lease.replayed,
                ctx.task_run.id,
            )
        )
        if len(seen) == 1:
            raise RuntimeError("transient failure")
        return held.epoch

    @flow(name="baton-test-retry")
    def run() -> int:
        return deploy("checkout")

    assert run() == 1
    (c1, id1, e1, r1, tr1), (c2, id2, e2, r2, tr2) = seen
    assert (c1, c2) == (1, 2)
    assert (id1, e1) == (id2, e2)
    assert (r1, r2) == (False, True)
    assert tr1 == tr2
    assert make_baton("x").leases.inspect("deploy", "checkout").held is False


def test_another_process_picking_the_run_up_is_refused(make_baton: MakeBaton) -> None:
    """Another process that picks the same task run up is another attempt of its execution:
    refused IDEMPOTENCY_IN_FLIGHT while this one holds the lease; this process's own
    acquire under the run's key replays."""
    seen: list[tuple[bool, bool]] = []

    @task
    @leased("deploy", "payments", ttl_seconds=30, baton=make_baton)
    def deploy() -> None:
        ctx = TaskRunContext.get()
        held = current_lease()
        assert ctx is not None
        assert held is not None
        b = make_baton(held.owner)
        kw: dict[str, Any] = {"ttl_seconds": 30, "idempotency_key": str(ctx.task_run.id)}
        with pytest.raises(IdempotencyInFlightError):
            b.leases.acquire("deploy", "payments", attempt="process-elsewhere", **kw)
        again = b.leases.acquire("deploy", "payments", attempt=_plan._process_attempt, **kw)
        seen.append((again.replayed, again.lease_id == held.lease_id))

    @flow(name="baton-test-second-process")
    def run() -> None:
        deploy()

    run()
    assert seen == [(True, True)]


def test_final_failure_releases(make_baton: MakeBaton) -> None:
    """When the retries are exhausted the lease is released, not stranded until its TTL."""

    @task(retries=1, retry_delay_seconds=0)
    @leased("deploy", "billing", ttl_seconds=30, baton=make_baton)
    def always_fails() -> None:
        raise RuntimeError("permanent")

    @flow(name="baton-test-final-failure")
    def run() -> bool:
        return always_fails(return_state=True).is_failed()

    assert run() is True
    assert make_baton("x").leases.inspect("deploy", "billing").held is False


def _contender(
    make_baton: MakeBaton, on_conflict: Any, gate: threading.Event | None, **kw: Any
) -> Any:
    @flow(name="baton-test-contender")  # one flow name: one principal, two runs
    @leased("db", "orders", ttl_seconds=30, on_conflict=on_conflict, baton=make_baton, **kw)
    def contender() -> int:
        held = current_lease()
        assert held is not None
        if gate is not None:
            gate.wait(60)
        return held.epoch

    return contender


@pytest.mark.parametrize("mode", ["raise", "skip", "wait"])
def test_two_concurrent_flow_runs_one_conflicts(
    make_baton: MakeBaton, mode: str, metrics_recording: None
) -> None:
    """Two runs of one flow on one resource: the second raises, skips or waits as configured
    (a wait counted on ``baton_acquire_wait_seconds`` from its first attempt)."""
    gate = threading.Event()
    attempts: list[int] = []

    def counting(principal: str) -> Baton:
        b = make_baton(principal)
        inner = b.lease

        def lease(*a: Any, **kw: Any) -> Any:
            attempts.append(1)
            return inner(*a, **kw)

        b.lease = lease  # type: ignore[method-assign]
        return b

    holder = _contender(make_baton, "raise", gate)
    t1, out1 = _in_thread(lambda: holder(return_state=True))
    _wait_until(lambda: make_baton("x").leases.inspect("db", "orders").held)
    second = _contender(counting, mode, None)
    if mode == "wait":
        t2, out2 = _in_thread(lambda: second(return_state=True))
        _wait_until(lambda: len(attempts) >= 2)  # it conflicted and is retrying
        gate.set()
        t1.join(60)
        t2.join(60)
        assert out1[0].is_completed()
        assert out2[0].is_completed()
        assert out2[0].result() == out1[0].result() + 1  # acquired after the holder released
        labels = {"organization": make_baton("x").org, "resource_type": "db"}
        assert metric_value("baton_acquire_wait_seconds_count", **labels) == 2
        # the waiter slept at least once before its retry (0.125 s or more, with jitter)
        assert metric_value("baton_acquire_wait_seconds_sum", **labels) > 0.1
        return
    state = second(return_state=True)
    gate.set()
    t1.join(60)
    assert out1[0].is_completed()
    if mode == "raise":
        assert state.is_failed()
        with pytest.raises(ConflictError, match="leased by another"):
            state.result()
    else:
        assert state.is_completed()
        assert state.name == "Skipped"
        assert "db/orders" in (state.message or "")
        assert "on_conflict='skip'" in (state.message or "")
        assert state.result() is None  # the body did not run


def test_wait_times_out(make_baton: MakeBaton) -> None:
    """``on_conflict="wait"`` gives up with ConflictError after ``wait_timeout_seconds``."""
    gate = threading.Event()
    holder = _contender(make_baton, "raise", gate)
    t1, _ = _in_thread(lambda: holder(return_state=True))
    _wait_until(lambda: make_baton("x").leases.inspect("db", "orders").held)
    waiter = _contender(make_baton, "wait", None, wait_timeout_seconds=0.5)
    state = waiter(return_state=True)
    gate.set()
    t1.join(60)
    with pytest.raises(ConflictError, match="after waiting"):
        state.result()


def test_async_task(make_baton: MakeBaton) -> None:
    """An async task stays async and holds its lease across awaits."""

    @task
    @leased("report", "{name}", ttl_seconds=20, baton=make_baton)
    async def build(name: str) -> tuple[str, int]:
        await asyncio.sleep(0.05)
        held = current_lease()
        assert held is not None
        return held.resource_id, held.epoch

    assert asyncio.iscoroutinefunction(build.fn)

    @flow(name="baton-test-async")
    async def run() -> tuple[str, int]:
        return await build("q3")

    assert asyncio.run(run()) == ("q3", 1)
    assert make_baton("x").leases.inspect("report", "q3").held is False


@pytest.mark.slow
def test_heartbeat_keeps_lease_past_three_ttls(make_baton: MakeBaton) -> None:
    """A 31 s body under a 10 s TTL keeps its lease: never lost, epoch unchanged."""
    seen: dict[str, Any] = {}

    @task
    @leased("job", "long", ttl_seconds=10, baton=make_baton)
    def long_job() -> None:
        held = current_lease()
        assert held is not None
        seen["keeper"], seen["start"] = held, (held.lease_id, held.epoch)
        time.sleep(31)
        seen["end"] = (held.lease_id, held.epoch, held.lost)

    @flow(name="baton-test-heartbeat")
    def run() -> None:
        long_job()

    run()
    keeper = seen["keeper"]
    assert seen["end"] == (*seen["start"], False)
    assert keeper.renewals >= 3
    assert keeper.receipt_status == "released"  # not "expired": it never lapsed


def test_stolen_lease_fails_the_task(make_baton: MakeBaton) -> None:
    """An admin force-releases the lease mid-run: the task fails with LeaseLostError."""
    box: dict[str, Any] = {}

    @task
    @leased("deploy", "payments", ttl_seconds=10, baton=make_baton)
    def deploy() -> str:
        held = current_lease()
        assert held is not None
        box["lease_id"] = held.lease_id
        _wait_until(lambda: held.lost, timeout=30)  # the heartbeat notices within TTL/3
        return "finished anyway"

    @flow(name="baton-test-stolen")
    def run() -> Any:
        return deploy(return_state=True)

    t, out = _in_thread(lambda: run(return_state=True))
    _wait_until(lambda: "lease_id" in box)
    make_baton("root", "admin").leases.force_release(box["lease_id"])
    t.join(60)
    task_state = out[0].result(raise_on_failure=False)
    assert task_state.is_failed()
    with pytest.raises(LeaseLostError, match="was lost: LEASE_LOST"):
        task_state.result()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancel_on_loss_interrupts_the_body(make_baton: MakeBaton, kind: str) -> None:
    """With ``cancel_on_loss=True`` a lost lease interrupts a busy body (sync and async)."""
    box: dict[str, Any] = {}
    opts: dict[str, Any] = {"ttl_seconds": 10, "cancel_on_loss": True, "baton": make_baton}

    if kind == "sync":

        @leased("job", "busy-sync", **opts)
        def body() -> None:
            box["lease_id"] = current_lease().lease_id  # type: ignore[union-attr]
            while True:
                time.sleep(0.05)

        call: Callable[[], Any] = body
    else:

        @leased("job", "busy-async", **opts)
        async def abody() -> None:
            box["lease_id"] = current_lease().lease_id  # type: ignore[union-attr]
            while True:
                await asyncio.sleep(0.05)

        def call() -> Any:
            return asyncio.run(abody())

    def guarded() -> Any:
        try:
            call()
        except LeaseLostError as exc:
            return exc
        return None

    t, out = _in_thread(guarded)
    _wait_until(lambda: "lease_id" in box)
    make_baton("root", "admin").leases.force_release(box["lease_id"])
    t.join(30)
    assert not t.is_alive()
    assert isinstance(out[0], LeaseLostError)
    assert "interrupted" in str(out[0])


def test_flow_level_lease_uses_flow_run_id(make_baton: MakeBaton) -> None:
    """On a flow the principal is the flow name and the execution key the flow run id."""

    @flow(name="baton-test-flow-lease")
    @leased("pipeline", "nightly", ttl_seconds=20, baton=make_baton)
    def nightly() -> tuple[str, str | None, str]:
        held = current_lease()
        ctx = FlowRunContext.get()
        assert held is not None
        assert ctx is not None
        assert ctx.flow_run is not None
        return held.owner, held.execution_key, str(ctx.flow_run.id)

    owner, key, run_id = nightly()
    assert owner == "baton-test-flow-lease"
    assert key == run_id


def test_above_task_keeps_options_and_distinct_keys(make_baton: MakeBaton) -> None:
    """Placed above ``@task`` it keeps retries, tags and hooks, and task keys stay distinct."""
    hook_calls: list[str] = []

    @task(retries=3, tags={"critical"}, on_completion=[lambda t, r, s: hook_calls.append("ok")])
    def first(x: int) -> int:
        held = current_lease()
        assert held is not None
        return held.epoch + x

    @task
    def second(x: int) -> int:
        return x

    wrapped = leased("calc", "{x}", ttl_seconds=10, baton=make_baton)(first)
    other = leased("calc", "{x}", ttl_seconds=10, baton=make_baton)(second)
    assert wrapped.retries == 3
    assert wrapped.tags == {"critical"}
    assert wrapped.task_key != other.task_key
    assert wrapped.task_key.startswith("first-")

    @flow(name="baton-test-above")
    def run() -> int:
        return wrapped(5)

    assert run() == 6
    assert hook_calls == ["ok"]


def test_distinct_task_keys_below_task() -> None:
    """Two functions wrapped below ``@task`` get distinct task keys (pinned Prefect hook)."""

    @task
    @leased("k", "a", ttl_seconds=10)
    def alpha() -> int:
        return 1

    @task
    @leased("k", "b", ttl_seconds=10)
    def beta() -> int:
        return 2

    assert alpha.task_key.startswith("alpha-")
    assert beta.task_key.startswith("beta-")
    assert alpha.task_key.split("-")[-1] != beta.task_key.split("-")[-1]


def test_bad_template_names_the_function() -> None:
    """A template naming a missing parameter is rejected when applied, naming the function."""

    def deploy(service: str) -> None:
        return None

    with pytest.raises(ValidationError, match=r"deploy.*\{svc\}.*svc"):
        leased("deploy", "{svc}", ttl_seconds=10)(deploy)
    with pytest.raises(ValidationError, match="ttl_seconds"):
        leased("deploy", "x", ttl_seconds=5)
    with pytest.raises(ValidationError, match="wait_timeout_seconds"):
        leased("deploy", "x", ttl_seconds=10, wait_timeout_seconds=3)


def test_resource_type_is_a_template_too(make_baton: MakeBaton) -> None:
    """``@leased("{resource_type}", "{resource_id}")`` leases the resource the task's
    parameters name (a type literally named ``{resource_type}`` would let a second run in
    while the first holds the resource), and a holder of that resource refuses it."""
    seen: list[tuple[str, str]] = []

    @task
    @leased("{resource_type}", "{resource_id}", ttl_seconds=30, baton=make_baton)
    def work(resource_type: str, resource_id: str) -> None:
        held = current_lease()
        assert held is not None
        seen.append((held.resource_type, held.resource_id))
        assert make_baton("x").leases.inspect(resource_type, resource_id).held

    @flow(name="baton-test-type-template")
    def run(resource_type: str, resource_id: str) -> None:
        work(resource_type, resource_id)

    run("deploy", "checkout")
    assert seen == [("deploy", "checkout")]
    assert make_baton("x").leases.inspect("{resource_type}", "checkout").epoch == 0
    taken = pytest.raises(ConflictError, match="deploy/billing: Resource is leased")
    with make_baton("other").lease("deploy", "billing", ttl_seconds=30), taken:
        run("deploy", "billing")


def test_resource_type_template_is_checked_when_applied() -> None:
    """A resource type template naming a missing parameter is refused when applied, as for
    ``resource_id``; ``lease(...)`` fills no templates, so a braced type is refused there."""
    from prefect_baton.prefect import lease

    def deploy(kind: str, service: str) -> None:
        return None

    with pytest.raises(ValidationError, match=r"deploy: resource_type template '\{knd\}'"):
        leased("{knd}", "{service}", ttl_seconds=10)(deploy)
    assert callable(leased("{kind}", "{service}", ttl_seconds=10)(deploy))
    with pytest.raises(ValidationError, match=r"lease\(\): resource_type '\{kind\}'"):
        lease("{kind}", "checkout", ttl_seconds=10)


def test_plain_function_outside_a_run(make_baton: MakeBaton) -> None:
    """Outside Prefect it leases per call, and ``skip`` returns None without running."""
    b = make_baton("agent-a")

    @leased("file", "{path}", ttl_seconds=10, baton=b, on_conflict="skip")
    def edit(path: str) -> int:
        held = current_lease()
        assert held is not None
        return held.epoch

    assert edit("a.txt") == 1
    other = make_baton("agent-b")
    with other.lease("file", "a.txt", ttl_seconds=10):
        assert edit("a.txt") is None
    assert current_lease() is None


def test_a_none_template_field_is_refused_naming_the_parameter(make_baton: MakeBaton) -> None:
    """A template field whose value is None is VALIDATION_ERROR naming the template and the
    parameter, and nothing is leased (it used to lease ``deploy/None``); the same for an
    attribute of a parameter and for a scope template."""
    b = make_baton("agent-a")
    ran: list[str] = []

    @leased("deploy", "{service}", ttl_seconds=10, baton=b)
    def deploy(service: str | None) -> None:
        ran.append(str(service))

    none_field = r"resource_id template '\{service\}': \{service\} is None; pass a value"
    with pytest.raises(ValidationError, match=none_field):
        deploy(service=None)
    with pytest.raises(ValidationError, match=none_field):
        deploy(None)

    class Target:
        name: str | None = None

    @leased("{kind}", "{target.name}", ttl_seconds=10, baton=b, scopes=["src/{area}/**"])
    def build(kind: str, target: Target, area: str | None = None) -> None:
        ran.append(kind)

    with pytest.raises(
        ValidationError, match=r"\{target\.name\} is None \(of parameter 'target'\)"
    ):
        build("image", Target())
    named = Target()
    named.name = "web"
    with pytest.raises(ValidationError, match=r"scopes template 'src/\{area\}/\*\*': \{area\} is"):
        build("image", named)
    assert ran == []
    assert b.leases.inspect("deploy", "None").epoch == 0
    assert b.leases.inspect("image", "None").epoch == 0
    deploy("checkout")
    build("image", named, area="ui")
    assert ran == ["checkout", "image"]


def test_above_flow_keeps_options(make_baton: MakeBaton) -> None:
    """Placed above ``@flow`` it keeps the flow's options and keys on the flow run id."""

    @flow(name="baton-test-above-flow", retries=2)
    def pipeline() -> str | None:
        held = current_lease()
        assert held is not None
        return held.execution_key

    wrapped = leased("pipeline", "weekly", ttl_seconds=10, baton=make_baton)(pipeline)
    assert wrapped.retries == 2
    assert wrapped.name == "baton-test-above-flow"
    state = wrapped(return_state=True)
    assert state.result() == str(state.state_details.flow_run_id)


def test_lease_block_takes_every_option_of_leased() -> None:
    """``with lease(...)`` accepts the same keyword options as ``@leased`` and checks them the
    same way (a renew deadline at or above the TTL is refused when the block is made)."""
    import inspect

    from prefect_baton.prefect import lease

    assert list(inspect.signature(lease).parameters) == list(inspect.signature(leased).parameters)
    block = lease("file", "a.txt", ttl_seconds=30, renew_deadline_seconds=12, max_hold_seconds=90)
    assert block is not None
    for bad in ({"renew_deadline_seconds": 30}, {"max_hold_seconds": 0}):
        with pytest.raises(ValidationError) as info:
            lease("file", "a.txt", ttl_seconds=30, **bad)  # type: ignore[arg-type]
        assert info.value.code == "VALIDATION_ERROR"


def test_retry_after_the_lease_expired_acquires_anew() -> None:
    """A retry whose previous attempt's lease lapsed (expired between attempts) still
    acquires anew, at a new epoch, and runs the body."""
    from prefect_baton.testing import ManualClock, memory_baton

    clock = ManualClock()
    runs: list[int] = []
    with memory_baton(org="test", principal="admin", role="owner", clock=clock) as b:

        @flow(name="baton-test-lapsed", retries=1, retry_delay_seconds=0)
        @leased("report", "{report}", ttl_seconds=10, baton=b.as_principal)
        def writer(report: str) -> int:
            held = current_lease()
            assert held is not None
            runs.append(held.epoch)
            if len(runs) == 1:
                clock.advance(11)  # the retry comes after the TTL
                raise RuntimeError("transient failure")
            return held.epoch

        state: Any = writer("q4", return_state=True)
        assert state.is_completed()
        assert state.name == "Completed"
        assert runs == [1, 2]
        rows = b.leases.list(resource_type="report", owner="*", include_ended=True)
        # the expired generation ends "taken_over" when the new one replaces it
        assert sorted((g.epoch, g.status) for g in rows) == [(1, "taken_over"), (2, "released")]
