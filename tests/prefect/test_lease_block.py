"""``with lease(...)`` / ``async with lease(...)``, skipped and refused runs, the run logger,
the chosen principal and ``baton="baton/<block>"``."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prefect import flow, task
from prefect.context import TaskRunContext
from prefect.states import State

from prefect_baton import Baton, ConflictError, LeaseLostError, NotFoundError, ValidationError
from prefect_baton.prefect import (
    BatonBlock,
    accept_handoff,
    current_lease,
    handoff_to,
    lease,
    leased,
)

MakeBaton = Callable[..., Baton]


class _Records(logging.Handler):
    """Collects the records of Prefect's run loggers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)


@pytest.fixture
def run_logs() -> Iterator[_Records]:
    """Records sent to ``prefect.task_runs`` and ``prefect.flow_runs`` during the test."""
    handler = _Records()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(n) for n in ("prefect.task_runs", "prefect.flow_runs")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_block_in_a_task_uses_the_run_identity(make_baton: MakeBaton) -> None:
    """Inside a task the block acts as the flow, keyed by the task run id, and is current."""

    @task
    def deploy() -> tuple[str, str | None, str, bool]:
        ctx = TaskRunContext.get()
        assert ctx is not None
        with lease("deploy", "checkout", ttl_seconds=20, baton=make_baton) as held:
            assert held is not None
            assert current_lease() is held
            return held.owner, held.execution_key, str(ctx.task_run.id), held.lease.replayed

    @flow(name="baton-test-block")
    def run() -> tuple[str, str | None, str, bool]:
        return deploy()

    owner, key, task_run_id, replayed = run()
    assert (owner, key, replayed) == ("baton-test-block", task_run_id, False)
    assert current_lease() is None
    assert make_baton("x").leases.inspect("deploy", "checkout").held is False


def test_block_retry_replays_its_own_acquire(make_baton: MakeBaton) -> None:
    """A failed block keeps its lease for the Prefect retry, which replays it."""
    seen: list[tuple[str, int, bool]] = []

    @task(retries=1, retry_delay_seconds=0)
    def deploy() -> int:
        with lease("deploy", "billing", ttl_seconds=20, baton=make_baton) as held:
            assert held is not None
            seen.append((held.lease_id, held.epoch, held.lease.replayed))
            if len(seen) == 1:
                raise RuntimeError("transient")
            return held.epoch

    @flow(name="baton-test-block-retry")
    def run() -> int:
        return deploy()

    assert run() == 1
    (id1, e1, r1), (id2, e2, r2) = seen
    assert (id1, e1, r1) == (id2, e2, not r2)
    assert make_baton("x").leases.inspect("deploy", "billing").held is False


def test_blocks_one_after_the_other_in_one_run_each_hold_the_resource(
    make_baton: MakeBaton, run_logs: _Records
) -> None:
    """Two (three) blocks on one resource, one after the other in one run: each acquires it
    anew under the run's key (a new generation, a higher epoch), none fails with the
    store's advice of a new execution key, and the run's log says why at info level."""

    @flow(name="baton-test-block-twice")
    def run() -> list[tuple[str, int, str | None]]:
        seen = []
        for _ in range(3):
            with lease("deploy", "twice", ttl_seconds=20, baton=make_baton) as held:
                assert held is not None
                seen.append((held.lease_id, held.epoch, held.execution_key))
        return seen

    seen = run()
    assert len({lease_id for lease_id, _, _ in seen}) == 3
    assert [epoch for _, epoch, _ in seen] == [1, 2, 3]
    assert len({key for _, _, key in seen}) == 1
    assert make_baton("x").leases.inspect("deploy", "twice").held is False
    said = [r for r in run_logs.records if "an earlier block of this run" in r.getMessage()]
    assert said, "the second block says why it acquires anew"
    assert {r.levelno for r in said} == {logging.INFO}
    assert all("deploy/twice" in r.getMessage() for r in said)


def test_a_block_after_a_block_that_handed_the_resource_off_is_refused(
    make_baton: MakeBaton,
) -> None:
    """A later block of the run on a resource an earlier block handed off is refused on
    entering with LEASE_LOST naming the resource and the handoff, and leaves the lease to
    the handoff: the recipient still accepts it (before, the later block replayed the
    pending handoff's lease and released it at its exit, so the handoff read expired)."""

    @flow(name="baton-test-block-after-handoff")
    def run() -> tuple[str, str]:
        with lease("deploy", "handed", ttl_seconds=20, baton=make_baton) as held:
            assert held is not None
            sent = handoff_to("bob", "s1", lease=held, baton=make_baton)
        with pytest.raises(LeaseLostError) as refused:
            lease("deploy", "handed", ttl_seconds=20, baton=make_baton).__enter__()
        return sent.handoff_id, refused.value.message

    handoff_id, message = run()
    assert message.startswith("deploy/handed: an earlier lease block of this run handed")
    assert f"handoff {handoff_id} to bob" in message
    with accept_handoff(handoff_id, principal="bob", baton=make_baton) as accepted:
        assert accepted.status == "accepted"
        assert accepted.lease is not None


def test_a_block_nested_in_a_block_on_the_same_resource_is_refused(
    make_baton: MakeBaton,
) -> None:
    """A block nested in a block on the same resource in one run is refused on entering,
    naming the resource; the enclosing block keeps its lease (the nested one would have
    replayed it and released it at its exit)."""

    @flow(name="baton-test-block-nested")
    def run() -> tuple[str, bool, bool]:
        with lease("deploy", "nested", ttl_seconds=20, baton=make_baton) as outer:
            assert outer is not None
            inner = lease("deploy", "nested", ttl_seconds=20, baton=make_baton)
            with pytest.raises(ValidationError) as refused:
                inner.__enter__()
            held = make_baton("x").leases.inspect("deploy", "nested").held
            return refused.value.message, held, outer.lost
        raise AssertionError("unreachable")

    message, held, lost = run()
    assert "deploy/nested is already held by another lease block of this run" in message
    assert (held, lost) == (True, False)
    assert make_baton("x").leases.inspect("deploy", "nested").held is False


def test_async_block_in_an_async_task(make_baton: MakeBaton) -> None:
    """``async with lease(...)`` holds across awaits in an async task and is released."""

    @task
    async def build() -> tuple[int, bool]:
        async with lease("report", "q3", ttl_seconds=20, baton=make_baton) as held:
            await asyncio.sleep(0.05)
            assert held is not None
            return held.epoch, current_lease() is held

    @flow(name="baton-test-async-block")
    async def run() -> tuple[int, bool]:
        return await build()

    assert asyncio.run(run()) == (1, True)
    assert make_baton("x").leases.inspect("report", "q3").held is False


def test_block_outside_prefect(make_baton: MakeBaton) -> None:
    """Outside a run: a block per execution, conflicts name the resource, skip enters
    with ``None`` and a reason, the body's exception passes through unchanged."""
    b = make_baton("agent-a")
    with lease("file", "a.txt", ttl_seconds=10, baton=b) as held:
        assert held is not None
        assert held.epoch == 1
        other = lease("file", "a.txt", ttl_seconds=10, baton=make_baton("agent-b"))
        with (
            pytest.raises(ConflictError, match=r"file/a\.txt: Resource is leased .* until "),
            other,
        ):
            pass
        block = lease(
            "file", "a.txt", ttl_seconds=10, on_conflict="skip", baton=b.as_principal("c")
        )
        with block as skipped:
            assert skipped is None
        assert block.skipped
        assert "file/a.txt" in (block.skip_message or "")
        assert block.skip_state is None
    with pytest.raises(KeyError, match="boom"), lease("file", "a.txt", ttl_seconds=10, baton=b):
        raise KeyError("boom")
    assert b.leases.inspect("file", "a.txt").held is False

    async def in_async() -> int:
        async with lease("file", "b.txt", ttl_seconds=10, baton=b) as held:
            assert held is not None
            return held.epoch

    assert asyncio.run(in_async()) == 1


def test_block_options_are_checked_at_once() -> None:
    """Bad options and a bad ``baton=`` string are refused when the block is made."""
    with pytest.raises(ValidationError, match="ttl_seconds"):
        lease("file", "x", ttl_seconds=1)
    with pytest.raises(ValidationError, match="baton/<block name>"):
        lease("file", "x", ttl_seconds=10, baton="prod")
    with pytest.raises(ValidationError, match="baton/<block name>"):
        leased("file", "x", ttl_seconds=10, baton="baton/")


def _holder(make_baton: MakeBaton, gate: threading.Event) -> threading.Thread:
    """A run of another flow holding ``db/orders`` until ``gate`` is set."""

    @flow(name="baton-test-holder")
    @leased("db", "orders", ttl_seconds=30, baton=make_baton)
    def hold() -> None:
        gate.wait(60)

    t = threading.Thread(target=lambda: hold(return_state=True), daemon=True)
    t.start()
    reader = make_baton("x")
    for _ in range(600):
        if reader.leases.inspect("db", "orders").held:
            break
        threading.Event().wait(0.05)
    return t


@pytest.mark.parametrize("mode", ["skip", "cancel"])
def test_skipped_task_ends_skipped_or_cancelled(make_baton: MakeBaton, mode: Any) -> None:
    """A skipped task ends ``Completed(name="Skipped")`` (or ``Cancelled``) with the reason;
    the caller receives that state; a skipped ``with lease`` block returns it too."""
    gate = threading.Event()
    t = _holder(make_baton, gate)
    try:

        @task
        @leased("db", "orders", ttl_seconds=30, on_conflict=mode, baton=make_baton)
        def decorated() -> str:
            return "ran"

        @task
        def with_block() -> Any:
            block = lease("db", "orders", ttl_seconds=30, on_conflict=mode, baton=make_baton)
            with block as held:
                if held is None:
                    return block.skip_state
                return "ran"

        @flow(name="baton-test-skipped")
        def run() -> list[Any]:
            return [decorated(return_state=True), with_block(return_state=True), decorated()]

        first, second, received = run()
    finally:
        gate.set()
        t.join(60)
    for state in (first, second):
        if mode == "skip":
            assert state.is_completed()
            assert state.name == "Skipped"
        else:
            assert state.is_cancelled()
        assert "db/orders" in (state.message or "")
        assert f"on_conflict={mode!r}" in (state.message or "")
    assert isinstance(received, State)
    assert received.type == first.type


def test_refused_run_names_the_resource_without_a_traceback(
    make_baton: MakeBaton, run_logs: _Records
) -> None:
    """``on_conflict="raise"``: the state message names the resource and the expiry, the
    caller still gets ConflictError, and no traceback is logged for it."""
    gate = threading.Event()
    t = _holder(make_baton, gate)
    try:

        @task
        @leased("db", "orders", ttl_seconds=30, baton=make_baton)
        def refused() -> None:
            return None

        @flow(name="baton-test-refused")
        def run() -> None:
            refused()

        state = run(return_state=True)
    finally:
        gate.set()
        t.join(60)
    assert state.is_failed()
    with pytest.raises(ConflictError, match=r"db/orders: Resource is leased .* until \d{4}-"):
        state.result()
    assert "db/orders" in (state.message or "")
    conflict_records = [r for r in run_logs.records if "db/orders" in r.getMessage()]
    assert conflict_records  # Prefect logged the failure, naming the resource
    assert all(r.exc_info is None for r in conflict_records)
    assert "Traceback" not in run_logs.text()


@pytest.mark.parametrize("mode", ["cancel", "raise"])
def test_refused_deployment_run_logs_no_engine_traceback(
    make_baton: MakeBaton, run_logs: _Records, mode: Any
) -> None:
    """A refused ``@leased`` flow run through Prefect's engine as a deployment run is (the
    engine re-raises the final state's exception to its run logger) ends ``Cancelled``
    (``"cancel"``) or ``Failed`` (``"raise"``), logs no traceback and no "Engine execution
    exited with unexpected exception" line; the final state line names the resource."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import CancelledRun
    from prefect.flow_engine import flow_run_logger, run_flow

    gate = threading.Event()
    t = _holder(make_baton, gate)
    try:

        @flow(name=f"baton-test-refused-{mode}")
        @leased("db", "orders", ttl_seconds=30, on_conflict=mode, baton=make_baton)
        def refused() -> str:
            return "ran"

        with get_client(sync_client=True) as client:
            flow_run = client.create_flow_run(refused)
        expected_error = CancelledRun if mode == "cancel" else ConflictError
        with pytest.raises(expected_error, match="db/orders"):
            run_flow(refused, flow_run=flow_run, error_logger=flow_run_logger(flow_run))
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
    finally:
        gate.set()
        t.join(60)
    assert state is not None
    assert state.is_cancelled() if mode == "cancel" else state.is_failed()
    assert "db/orders" in (state.message or "")
    msgs = [r.getMessage() for r in run_logs.records]
    assert any("Finished in state" in m and "db/orders" in m for m in msgs), msgs
    assert not any("Engine execution exited" in m for m in msgs), msgs
    assert "Traceback" not in run_logs.text()


def test_waiting_is_logged_to_the_run(make_baton: MakeBaton, run_logs: _Records) -> None:
    """``on_conflict="wait"`` says in the run's logs what it waits for, and gives up
    naming the resource."""
    gate = threading.Event()
    t = _holder(make_baton, gate)
    try:

        @flow(name="baton-test-waiter")
        @leased(
            "db",
            "orders",
            ttl_seconds=30,
            on_conflict="wait",
            wait_timeout_seconds=0.5,
            baton=make_baton,
        )
        def waiter() -> None:
            return None

        state = waiter(return_state=True)
    finally:
        gate.set()
        t.join(60)
    assert state.is_failed()
    msgs = [r.getMessage() for r in run_logs.records if r.name == "prefect.flow_runs"]
    assert any("db/orders" in m and "Waiting" in m for m in msgs), msgs


def test_chosen_principal(
    make_baton: MakeBaton, baton_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``principal=`` wins over ``BATON_PREFECT_PRINCIPAL``, which wins over the run's name."""

    @flow(name="baton-test-principal")
    def run() -> list[str]:
        owners = []
        with lease("doc", "a", ttl_seconds=20) as held:
            assert held is not None
            owners.append(held.owner)
        with lease("doc", "b", ttl_seconds=20, principal="writer") as held:
            assert held is not None
            owners.append(held.owner)
        return owners

    assert run() == ["baton-test-principal", "writer"]
    monkeypatch.setenv("BATON_PREFECT_PRINCIPAL", "team-writer")
    assert run() == ["team-writer", "writer"]


def test_handoff_principals(make_baton: MakeBaton) -> None:
    """``from_principal=`` sends as that principal, ``principal=`` accepts as it."""
    sent = handoff_to("bob", "doc-1", from_principal="alice", baton=make_baton)
    assert sent.handoff.from_principal == "alice"
    with accept_handoff(sent.handoff_id, principal="bob", baton=make_baton) as h:
        assert h.status == "accepted"
    assert sent.handoff.to_principal == "bob"
    other = handoff_to("bob", "doc-2", from_principal="alice", baton=make_baton)
    refused = accept_handoff(other.handoff_id, principal="carol", baton=make_baton)
    with pytest.raises(NotFoundError), refused:
        pass


def test_an_accept_handoff_block_is_entered_once(make_baton: MakeBaton) -> None:
    """Entering an ``accept_handoff(...)`` block again, inside it or after it, is refused
    with the same RuntimeError as ``lease(...)``, before anything is read or resolved; the
    lease the first entry took over stays held by the recipient until that block ends."""
    b = make_baton("alice")
    held = b.leases.acquire("doc", "once", ttl_seconds=60)
    sent = handoff_to("bob", "doc-once", lease=held, from_principal="alice", baton=make_baton)
    block = accept_handoff(sent.handoff_id, principal="bob", baton=make_baton)
    once = r"accept_handoff\(\.\.\.\) block can be entered once"
    with block as h:
        assert h.lease is not None
        with pytest.raises(RuntimeError, match=once), block:
            pass
        assert b.leases.inspect("doc", "once").held
        assert h.lease.lease_id == b.as_principal("bob").leases.list()[0].lease_id
    with pytest.raises(RuntimeError, match=once), block:
        pass


def test_block_reference_loads_once(
    ledger_db: str, org: str, make_baton: MakeBaton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``baton="baton/<name>"`` loads the block once per process and acts as its principal."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    BatonBlock(ledger_url=ledger_db, org=org, principal="block-writer").save(name)
    loads: list[str] = []
    real_load = BatonBlock.load

    def counting_load(*args: Any, **kwargs: Any) -> Any:
        loads.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(BatonBlock, "load", counting_load)

    @task
    @leased("doc", "{n}", ttl_seconds=20, baton=f"baton/{name}")
    def write(n: int) -> str:
        held = current_lease()
        assert held is not None
        return held.owner

    @flow(name="baton-test-block-ref")
    def run() -> list[str]:
        return [write(1), write(2), write(3)]

    assert run() == ["block-writer"] * 3
    assert loads == [name]
    assert make_baton("x").leases.inspect("doc", "1").epoch == 1


def test_loss_is_logged_to_the_run(make_baton: MakeBaton, run_logs: _Records) -> None:
    """A lease lost during the block (noticed on the heartbeat thread) is in the run's logs."""
    box: dict[str, Any] = {}

    @task
    def long_job() -> None:
        with lease("job", "lost", ttl_seconds=10, baton=make_baton) as held:
            assert held is not None
            box["lease_id"] = held.lease_id
            for _ in range(600):
                if held.lost:
                    break
                threading.Event().wait(0.05)

    @flow(name="baton-test-loss-logged")
    def run() -> Any:
        return long_job(return_state=True)

    t = threading.Thread(
        target=lambda: box.setdefault("state", run(return_state=True)), daemon=True
    )
    t.start()
    for _ in range(600):
        if "lease_id" in box:
            break
        threading.Event().wait(0.05)
    make_baton("root", "admin").leases.force_release(box["lease_id"])
    t.join(60)
    assert box["state"].is_failed()
    said = f"job/lost: lease {box['lease_id']} was lost (LEASE_LOST"
    lost = [r for r in run_logs.records if r.getMessage().startswith(said)]
    assert [(r.name, r.levelname) for r in lost] == [("prefect.task_runs", "WARNING")]


def test_block_reference_to_a_missing_block_is_not_found() -> None:
    """``baton="baton/<name>"`` naming no saved block is NOT_FOUND naming the block, in a run
    and outside one (``PREFECT_API_URL`` set), not Prefect's ``ValueError``."""
    name = f"does-not-exist-{uuid.uuid4().hex[:8]}"

    @task
    @leased("doc", "{n}", ttl_seconds=20, baton=f"baton/{name}")
    def write(n: int) -> None:
        raise AssertionError("the body must not run")

    @flow(name="baton-test-missing-block")
    def run() -> None:
        write(1)

    with pytest.raises(NotFoundError, match=f"no Baton block named '{name}'") as caught:
        run()
    assert caught.value.code == "NOT_FOUND"
    with (
        pytest.raises(NotFoundError, match=f"baton/{name}"),
        lease("doc", "1", ttl_seconds=20, baton=f"baton/{name}"),
    ):
        pass


def test_block_reference_without_a_prefect_api_is_refused() -> None:
    """Outside a run and without ``PREFECT_API_URL`` a block reference is a clear
    VALIDATION_ERROR: no temporary Prefect server is started to look for the block."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_baton.prefect import _block

    loads: list[str] = []

    def no_load(*args: Any, **kwargs: Any) -> Any:
        loads.append(args[0])
        raise AssertionError("no load without an API")

    name = f"never-{uuid.uuid4().hex[:8]}"
    with (
        temporary_settings(restore_defaults={PREFECT_API_URL}),
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(_block.BatonBlock, "load", no_load)
        assert not PREFECT_API_URL.value()
        with (
            pytest.raises(ValidationError, match="PREFECT_API_URL is unset"),
            lease("doc", "1", ttl_seconds=20, baton=f"baton/{name}"),
        ):
            pass
    assert loads == []
