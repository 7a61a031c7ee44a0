"""flows/ (reconcile, dispatch_handoffs, report_expired, the four-role scenario), the
leased-task example, the board artifact and the Block."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefect_baton import Baton, ValidationError
from prefect_baton.prefect import BatonBlock, board_rows, serving, wait_for_run

from .conftest import REPO, load_script

MakeBaton = Callable[..., Baton]


def test_reconcile_is_a_noop_without_redis(
    baton_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without BATON_REDIS_URL the reconcile flow completes with a clear message."""
    monkeypatch.delenv("BATON_REDIS_URL", raising=False)
    out = load_script("flows/reconcile.py").reconcile()
    assert out["status"] == "skipped"
    assert "BATON_REDIS_URL is unset" in out["reason"]


def test_report_expired_finds_a_crashed_holders_lease(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """A lease whose holder stopped renewing is reported once its TTL has passed."""
    b = make_baton("crashed-worker")
    lease = b.leases.acquire("file", "a.py", ttl_seconds=10, idempotency_key="k")
    live = b.leases.acquire("file", "b.py", ttl_seconds=600, idempotency_key="k2")
    time.sleep(10.5)  # let the TTL pass (there is no clock to inject across processes)
    out = load_script("flows/report_expired.py").report_expired()
    ids = [row["lease_id"] for row in out["expired"]]
    assert lease.lease_id in ids
    assert live.lease_id not in ids
    assert [e.kind for e in b.events.list(limit=1000)].count("lease.expired") == 1
    again = load_script("flows/report_expired.py").report_expired()
    assert again["expired"] == []


def test_dispatch_starts_the_recipients_deployment(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """A pending handoff to a deployment's principal starts that deployment once, with the
    parameters stored with the handoff; a second dispatch reports the run already started."""
    example = load_script("examples/prefect_automation.py")
    dispatch = load_script("flows/dispatch_handoffs.py").dispatch_handoffs
    to = "baton-example-inbox/inbox"
    sender = make_baton("sender")
    h = sender.handoffs.create(to, "ticket-7", parameters={"principal": to})
    with serving(example.inbox.to_deployment(name="inbox")):
        first = dispatch()
        again = dispatch()
        assert [s["handoff_id"] for s in first["started"]] == [h.handoff_id]
        assert again["started"] == []
        # the run is reported as already started, unless it has accepted the handoff in
        # between (then nothing is pending: a loaded machine can get there first)
        if sender.handoffs.get(h.handoff_id).status == "pending" or again["running"]:
            (running,) = again["running"]
            assert running["flow_run_id"] == first["started"][0]["flow_run_id"]
        run = wait_for_run(first["started"][0]["flow_run_id"], timeout_seconds=120)
        assert run.parameters == {"handoff_id": h.handoff_id, "principal": to}
        assert run.state is not None
        assert run.state.is_completed()
    assert sender.handoffs.get(h.handoff_id).status == "accepted"


def test_dispatch_reports_a_recipient_run_that_ended_leaving_its_handoff_pending(
    baton_env: dict[str, str],
    make_baton: MakeBaton,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recipient run that ended (Crashed, or even Completed) while its handoff is still
    pending is listed under ``ended``, not ``running``, with a warning naming the handoff,
    the run, its state and what to do; a run not ended yet stays under ``running``, and one
    that ended after resolving its handoff is not listed. The runs are real Prefect runs
    created with the handoff id as idempotency key, as ``start_recipient`` does, and put
    in their state with ``set_flow_run_state`` (a crash is hard to arrange on purpose)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Crashed

    @flow(name="baton-test-stuck")
    def stuck(handoff_id: str) -> str:
        return handoff_id

    deployment_id = stuck.to_deployment(name="db").apply()
    to = "baton-test-stuck/db"
    sender = make_baton("sender")
    held = sender.leases.acquire("report", "s1", ttl_seconds=600)
    crashed = sender.handoffs.create(to, "s1", lease=held)
    completed = sender.handoffs.create(to, "s2")
    waiting = sender.handoffs.create(to, "s3")
    resolved = sender.handoffs.create(to, "s4")
    runs = {}
    with get_client(sync_client=True) as client:
        for h, state in [
            (crashed, Crashed()),
            (completed, Completed()),
            (waiting, None),
            (resolved, Completed()),
        ]:
            run = client.create_flow_run_from_deployment(
                deployment_id,
                parameters={"handoff_id": h.handoff_id},
                idempotency_key=h.handoff_id,
            )
            if state is not None:
                client.set_flow_run_state(run.id, state, force=True)
            runs[h.handoff_id] = str(run.id)
    module = load_script("flows/dispatch_handoffs.py")
    real_existing_run = module.existing_run

    def resolved_meanwhile(handoff_id: str) -> object:  # accepted after the listing
        if handoff_id == resolved.handoff_id:
            make_baton(to).handoffs.resolve(handoff_id, "accepted")
        return real_existing_run(handoff_id)

    monkeypatch.setattr(module, "existing_run", resolved_meanwhile)
    with caplog.at_level(logging.WARNING):
        out = module.dispatch_handoffs([to])
    assert out["started"] == []
    assert out["skipped"] == []
    assert out["running"] == [
        {
            "handoff_id": waiting.handoff_id,
            "flow_run_id": runs[waiting.handoff_id],
            "state": "Scheduled",
        }
    ]
    assert out["ended"] == [
        {"handoff_id": h.handoff_id, "flow_run_id": runs[h.handoff_id], "state": state}
        for h, state in [(crashed, "Crashed"), (completed, "Completed")]
    ]
    warnings = [r.getMessage() for r in caplog.records if "is stuck" in r.getMessage()]
    assert len(warnings) == 2
    assert warnings[0] == (
        f"handoff {crashed.handoff_id} of 's1' is stuck: its recipient run "
        f"{runs[crashed.handoff_id]} ended (state Crashed) and left it pending, its lease "
        f"held by nobody until the TTL. Reject it to free its lease (baton --principal "
        f"'{to}' handoff resolve {crashed.handoff_id} rejected), or start the recipient "
        f"again (prefect deployment run {to} --params "
        f'\'{{"handoff_id": "{crashed.handoff_id}"}}\')'
    )
    assert f"handoff {completed.handoff_id} of 's2' is stuck" in warnings[1]
    assert "(state Completed)" in warnings[1]


def test_dispatch_packs_stored_parameters_into_a_recipients_kwargs(
    baton_env: dict[str, str],
    make_baton: MakeBaton,
    prefect_api: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handoff whose stored parameters name what the recipient flow only takes through
    ``**kwargs`` is dispatched with them packed into that parameter, so Prefect's engine
    can call the flow (``parameters_to_args_kwargs``, as the run does); when the run
    ended leaving the handoff pending, the warning's ``prefect deployment run`` command
    starts a run Prefect can call the flow with too."""
    import shlex

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Crashed
    from prefect.utilities.callables import parameters_to_args_kwargs

    @flow(name="baton-test-dispatch-kwargs")
    def r_kw(handoff_id: str, **kwargs: Any) -> dict[str, Any]:
        return {"handoff_id": handoff_id, **kwargs}

    r_kw.to_deployment(name="db").apply()
    to = "baton-test-dispatch-kwargs/db"
    h = make_baton("sender").handoffs.create(to, "k1", parameters={"report": "r", "extra": 1})
    dispatch = load_script("flows/dispatch_handoffs.py").dispatch_handoffs
    (started,) = dispatch([to])["started"]
    expected = {"handoff_id": h.handoff_id, "report": "r", "extra": 1}
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(started["flow_run_id"])
        assert run.parameters == {
            "handoff_id": h.handoff_id,
            "kwargs": {"report": "r", "extra": 1},
        }
        args, kwargs = parameters_to_args_kwargs(r_kw.fn, run.parameters)
        assert r_kw.fn(*args, **kwargs) == expected
        client.set_flow_run_state(run.id, Crashed(), force=True)
    with caplog.at_level(logging.WARNING):
        assert [e["handoff_id"] for e in dispatch([to])["ended"]] == [h.handoff_id]
    (warning,) = [r.getMessage() for r in caplog.records if "is stuck" in r.getMessage()]
    command = shlex.split(warning.split("start the recipient again (", 1)[1].rstrip(")"))
    assert command[:4] == ["prefect", "deployment", "run", to]
    prefect_cli = str(Path(sys.executable).with_name("prefect"))
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    out = subprocess.run(
        [prefect_cli, *command[1:]], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[run.deployment_id]))
        )
    (again,) = [r for r in runs if r.id != run.id]
    assert again.parameters == run.parameters
    args, kwargs = parameters_to_args_kwargs(r_kw.fn, again.parameters)
    assert r_kw.fn(*args, **kwargs) == expected


def test_pending_handoffs_finds_every_recipient_on_a_long_ledger(make_baton: MakeBaton) -> None:
    """Every pending handoff is found, past many other events and over several pages; a
    resolved one is not; listing everyone's needs the owner role."""
    from prefect_baton import ForbiddenError

    pending_handoffs = load_script("flows/dispatch_handoffs.py").pending_handoffs
    sender = make_baton("sender")
    lease = sender.leases.acquire("file", "busy", ttl_seconds=600, idempotency_key="k")
    for _ in range(120):  # events that are no handoff.created
        lease = sender.leases.renew(lease)
    early = [sender.handoffs.create("a/b", f"s{i}") for i in range(25)]
    late = sender.handoffs.create("late/recipient", "zz")
    done = sender.handoffs.create("done/recipient", "d")
    make_baton("done/recipient").handoffs.resolve(done.handoff_id, "rejected")
    found = pending_handoffs(make_baton("dispatcher", role="owner"), page_size=10)
    assert sorted(found) == ["a/b", "late/recipient"]
    # oldest first: by creation time (ms), then handoff id (several may share a millisecond)
    oldest_first = sorted(early, key=lambda h: (h.created_at, h.handoff_id))
    assert [h.handoff_id for h in found["a/b"]] == [h.handoff_id for h in oldest_first]
    assert [h.handoff_id for h in found["late/recipient"]] == [late.handoff_id]
    with pytest.raises(ForbiddenError):
        pending_handoffs(make_baton("dispatcher"))


def test_dispatch_reports_an_unknown_deployment_readably(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """A pending handoff to a principal that names no existing deployment is skipped with
    the reason ``handoff_to`` gives for the same mistake."""
    dispatch = load_script("flows/dispatch_handoffs.py").dispatch_handoffs
    h = make_baton("sender").handoffs.create("someone/else", "t1")
    out = dispatch()
    assert out["started"] == []
    assert out["skipped"] == [
        {"handoff_id": h.handoff_id, "reason": "NotFoundError: deployment 'someone/else' not found"}
    ]


def test_four_role_scenario_hands_off_by_deployment(
    baton_env: dict[str, str], tmp_path: Path
) -> None:
    """Researcher -> writer -> operator -> reviewer run as four deployments; verdict accepted."""
    import json as stdlib_json

    scenario = load_script("flows/scenario.py")
    inputs = [str(Path(stdlib_json.__file__).parent)]
    out = scenario.main(inputs=inputs, workers=2, out_dir=str(tmp_path / "out"))
    assert set(out) == {"researcher", "writer", "operator", "reviewer", "final_states"}
    # the runner stopping after the chain must not turn finished runs Cancelled
    assert out["final_states"] == dict.fromkeys(
        ("researcher", "writer", "operator", "reviewer"), "Completed"
    )
    files = sum(w["completed"] for w in out["researcher"]["workers"])
    assert files == len(list(Path(inputs[0]).rglob("*.py")))
    assert out["reviewer"]["verdict"] == "accepted", out["reviewer"]["problems"]


def test_leased_task_example_runs_as_a_script(baton_env: dict[str, str], prefect_api: str) -> None:
    """``python examples/prefect_leased_task.py``: the retry replays the same lease."""
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    proc = subprocess.run(
        [sys.executable, "examples/prefect_leased_task.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    first, second = out["attempts"]
    assert (first["run_count"], second["run_count"]) == (1, 2)
    assert (first["lease_id"], first["epoch"]) == (second["lease_id"], second["epoch"])
    assert second["replayed"] is True


def test_lease_block_example(baton_env: dict[str, str]) -> None:
    """examples/prefect_lease_block.py: the retry replays the block's lease; a run while
    another principal holds the table ends Skipped with the reason."""
    out = load_script("examples/prefect_lease_block.py").main()
    done, skipped = out["done"], out["skipped"]
    assert done["state"] == "Completed"
    assert done["result"]["owner"] == "baton-example-lease-block"
    assert (done["result"]["epoch"], done["result"]["replayed"]) == (1, True)
    assert skipped["state"] == "Skipped"
    assert "Resource is leased by another principal" in skipped["message"]


def test_board_rows_list_leases_and_inbox(make_baton: MakeBaton) -> None:
    """The board lists the principal's leases and the handoffs waiting for it."""
    b = make_baton("flow-x")
    b.leases.acquire("deploy", "svc", ttl_seconds=30, idempotency_key="k")
    make_baton("flow-y").handoffs.create("flow-x", "subject-1", message="over to you")
    kinds = sorted(row["kind"] for row in board_rows(b))
    assert kinds == ["handoff (pending)", "lease"]


def test_block_builds_a_client_and_keeps_urls_secret(ledger_db: str, org: str) -> None:
    """BatonBlock holds URLs as secrets and builds a Baton for a principal."""
    block = BatonBlock(ledger_url=ledger_db, org=org, redis_url="redis://:pw@localhost:6379/0")
    assert "pw" not in repr(block)
    b = block.baton(principal="from-block")
    assert (b.org, b.principal) == (org, "from-block")
    from prefect.plugins import load_prefect_collections

    assert "prefect_baton" in load_prefect_collections()


def test_block_without_redis_url_ignores_the_workers_redis(
    ledger_db: str, org: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block names its ledger and Redis together: without ``redis_url`` it runs on the
    ledger alone, even where the worker sets ``BATON_REDIS_URL`` (the Redis of another
    ledger's clients); a block with one uses its own."""
    monkeypatch.setenv("BATON_REDIS_URL", "redis://127.0.0.1:6379/15")
    alone = BatonBlock(ledger_url=ledger_db, org=org)
    assert alone.settings().redis_url is None
    paired = BatonBlock(ledger_url=ledger_db, org=org, redis_url="redis://127.0.0.1:6379/14")
    url = paired.settings().redis_url
    assert url is not None
    assert url.get_secret_value() == "redis://127.0.0.1:6379/14"


def test_relay_flow_mirrors_ledger_events(baton_env: dict[str, str], make_baton: MakeBaton) -> None:
    """The relay flow emits the org's ledger events once and then has nothing left."""
    make_baton("cli-user").handoffs.create("someone", "ticket-9")
    relay = load_script("flows/relay_events.py").relay
    first = relay()
    assert first["emitted"] >= 1
    assert relay()["emitted"] == 0


def test_resume_expired_skips_finished_or_moved_on_work(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """The resume pattern checks the resource's current epoch and the subject's outcomes:
    a late or repeated lease.expired starts nothing once the work moved on or is done."""
    module = load_script("flows/resume_expired.py")
    verdict = module.resume_verdict
    b = make_baton("worker")
    gone = b.leases.acquire("file", "r.py", ttl_seconds=30)
    b.leases.release(gone)
    assert verdict(b, "file", "r.py", gone.epoch) is None
    assert "taken over" in verdict(b, "file", "r.py", gone.epoch, reason="taken_over")
    with pytest.raises(ValidationError, match="'lapsed' or 'taken_over'"):
        verdict(b, "file", "r.py", gone.epoch, reason="bogus")  # not read as taken over
    assert module.resume_expired("file", "r.py", gone.epoch, gone.lease_id) == {
        "status": "resumable"
    }
    again = b.leases.acquire("file", "r.py", ttl_seconds=30)
    assert "held again" in verdict(b, "file", "r.py", gone.epoch)
    b.outcomes.record("file/r.py", "succeeded", evidence=[{"kind": "f", "uri": "u"}], fence=again)
    b.leases.release(again)
    assert "epoch" in verdict(b, "file", "r.py", gone.epoch)
    assert "succeeded" in verdict(b, "file", "r.py", again.epoch)
    out = module.resume_expired("file", "r.py", again.epoch, again.lease_id)
    assert out["status"] == "skipped"


def test_resume_expired_command_line_runs_once_serves_or_says_how(
    baton_env: dict[str, str],
    make_baton: MakeBaton,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python flows/resume_expired.py`` takes the event's four fields (a usage message,
    exit 2, without them), and ``--serve`` serves deployment ``resume-expired`` with
    ``--deployment`` as its default parameter, like the other flows' ``--serve``."""
    module = load_script("flows/resume_expired.py")
    with pytest.raises(SystemExit) as bare:
        module.main([])
    assert bare.value.code == 2
    assert "RESOURCE_TYPE RESOURCE_ID EPOCH LEASE_ID, or --serve" in capsys.readouterr().err
    b = make_baton("worker")
    gone = b.leases.acquire("file", "cli.py", ttl_seconds=30)
    b.leases.release(gone)
    once = module.main(["file", "cli.py", str(gone.epoch), gone.lease_id])
    assert once == {"status": "resumable"}
    served: list[dict[str, object]] = []
    monkeypatch.setattr(module.resume_expired, "serve", lambda **kw: served.append(kw))
    assert module.main(["--serve", "--deployment", "work/work"]) is None
    assert served == [
        {"name": "resume-expired", "interval": None, "parameters": {"deployment": "work/work"}}
    ]


def test_deployments_refusing_the_parameters_are_named(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """A resume or recipient deployment whose flow requires other parameters (Prefect
    answers 409 ``'table' is a required property``): ``resume_expired`` raises and
    ``dispatch_handoffs`` reports a ValidationError naming the deployment, the parameters
    given and the missing one, instead of Prefect's raw ``PrefectHTTPStatusError``."""
    from prefect import flow

    from prefect_baton import ValidationError

    @flow(name="baton-test-migrate")
    def migrate(table: str) -> str:
        return table

    migrate.to_deployment(name="db").apply()
    name = "baton-test-migrate/db"
    b = make_baton("worker")
    gone = b.leases.acquire("file", "m.py", ttl_seconds=30)
    b.leases.release(gone)
    resume = load_script("flows/resume_expired.py").resume_expired
    with pytest.raises(ValidationError) as info:
        resume("file", "m.py", gone.epoch, gone.lease_id, deployment=name)
    message = info.value.message
    assert f"deployment {name!r} refused the parameters" in message
    assert "(expired_lease_id, resource_id, resource_type, subject_id)" in message
    assert "'table' is a required property" in message
    h = make_baton("sender").handoffs.create(name, "t2")
    [skipped] = load_script("flows/dispatch_handoffs.py").dispatch_handoffs()["skipped"]
    assert skipped["handoff_id"] == h.handoff_id
    assert skipped["reason"].startswith(f"ValidationError: deployment {name!r} refused")
    assert "(handoff_id)" in skipped["reason"]
    assert "'table' is a required property" in skipped["reason"]


def test_flow_command_line_reports_an_error_as_one_line_and_its_exit_code(
    baton_env: dict[str, str], make_baton: MakeBaton, prefect_api: str
) -> None:
    """``python flows/resume_expired.py ... --deployment nope/nope``: the NotFoundError is one
    line ``<flow>: NOT_FOUND: message`` on stderr and exit 5 (``EXIT_CODES``), a deployment
    refusing the parameters ``VALIDATION_ERROR`` and exit 2; neither the run's logs nor the
    command print a traceback."""
    from prefect import flow

    @flow(name="baton-test-needs-table")
    def needs_table(table: str) -> str:
        return table

    needs_table.to_deployment(name="db").apply()
    b = make_baton("worker")
    gone = b.leases.acquire("file", "cli-err.py", ttl_seconds=30)
    b.leases.release(gone)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(REPO / "src")}
    script = [sys.executable, str(REPO / "flows/resume_expired.py")]
    event = ["file", "cli-err.py", str(gone.epoch), gone.lease_id]
    for deployment, code, status in [
        ("nope/nope", "NOT_FOUND", 5),
        ("baton-test-needs-table/db", "VALIDATION_ERROR", 2),
    ]:
        run = subprocess.run(
            [*script, *event, "--deployment", deployment],
            env=env | {"PREFECT_LOGGING_LEVEL": "INFO"},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert run.returncode == status, run.stderr
        assert "Traceback" not in run.stdout + run.stderr
        said = f"baton-resume-expired: {code}: deployment {deployment!r}"
        assert [line for line in run.stderr.splitlines() if line.startswith(said)], run.stderr
        assert "Finished in state Failed" in run.stdout + run.stderr


def test_flow_command_line_without_a_prefect_api_is_unavailable(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """``python flows/report_expired.py`` with ``PREFECT_API_URL`` naming a port where no
    server listens: one line ``<flow>: UNAVAILABLE: ...`` naming the API, exit 11
    (``EXIT_CODES``), no traceback (Prefect raises ``RuntimeError`` from the connection
    error when the run starts)."""
    make_baton("worker").close()  # the ledger exists
    with socket.socket() as s:  # a free loopback port, closed again: nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **baton_env, "PREFECT_API_URL": api, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        [sys.executable, str(REPO / "flows/report_expired.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 11, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    said = f"baton-report-expired: UNAVAILABLE: the Prefect API at {api} is unavailable"
    assert [line for line in run.stderr.splitlines() if line.startswith(said)], run.stderr


def test_reading_flows_refuse_a_missing_sqlite_ledger(
    baton_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flows that only read, on a SQLite ``BATON_LEDGER_URL`` whose file does not exist:
    NOT_FOUND naming the path, as ``baton``'s read commands say, and no file is created
    (a mistyped path must not read as "nothing expired")."""
    from prefect_baton import NotFoundError

    missing = tmp_path / "x.db"
    monkeypatch.setenv("BATON_LEDGER_URL", f"sqlite:///{missing}")
    runs: list[Callable[[], Any]] = [
        load_script("flows/report_expired.py").report_expired,
        load_script("flows/dispatch_handoffs.py").dispatch_handoffs,
        load_script("flows/relay_events.py").relay,
        lambda: load_script("flows/resume_expired.py").resume_expired("file", "a", 1, "l"),
    ]
    for run in runs:
        with pytest.raises(NotFoundError, match=f"no ledger at {missing}: check BATON_LEDGER_URL"):
            run()
    assert not missing.exists()
