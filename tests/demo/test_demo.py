"""The main job, ``baton demo``, end to end with real processes, crashes and pauses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_baton import Baton
from prefect_baton.audit import audit_ledger
from prefect_baton.cli import app
from prefect_baton.cli._output import EXIT_CODES
from prefect_baton.demo import analysis

from ..conftest import REDIS_URL, require_redis


def _json_pkg() -> Path:
    return analysis.default_inputs()[0]


def _run(tmp_path: Path, *extra: str, timeout: float = 600) -> tuple[int, dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_baton.demo", "--format", "json", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    data = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, data, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["sqlite", "postgresql"])
def test_demo_survives_crash_and_pause(
    tmp_path: Path, arm: str, request: pytest.FixtureRequest
) -> None:
    """A crashed and a paused researcher leave no file undone or done twice, and the paused
    one's late write is rejected by the fence."""
    extra = ["--input", str(_json_pkg()), "--workers", "3", "--crash", "1", "--pause", "1"]
    if arm == "postgresql":
        extra += ["--ledger-url", request.getfixturevalue("pg_url")]
    code, data, err = _run(tmp_path, *extra)
    keys = ("duplicate_completions", "undone", "verdict", "audit_violations", "missed_faults")
    assert code == 0, (err, {k: data.get(k) for k in keys})
    files = len(analysis.list_files([_json_pkg()]))
    assert data["files"] == files
    assert data["completed"] == files
    assert data["duplicate_completions"] == 0
    assert data["crashes"] == 1
    assert data["pauses"] == 1
    assert data["takeovers"] >= 2
    assert data["stale_writes_rejected"] >= 1
    assert data["verdict"] == "accepted"
    # the writer accepts each file's analysis handoff once the report is compiled, then
    # the operator and the reviewer accept theirs: no handoff is left pending
    assert data["handoffs_accepted"] == files + 2
    store_url = str(data["ledger"])
    b = Baton(ledger_url=store_url, org=str(data["org"]), principal="auditor", role="admin")
    assert audit_ledger(b.store, b.org).ok
    assert b.handoffs.list(party="*", status="pending") == []
    report = json.loads(Path(str(data["report"])).read_text())
    assert report["totals"]["files"] == files
    b.close()
    # the demo ends with the timelines of its busiest resources: the taken-over files (one
    # with the paused researcher's rejected late write) and the report's delivery
    page = Path(str(data["timeline"])).read_text()
    for kind in ("taken_over", "fence_rejected", "handoff_accepted", "outcome"):
        assert f'data-kind="{kind}"' in page, kind


@pytest.mark.slow
def test_faults_are_injected_when_healthy_researchers_outnumber_the_files(
    tmp_path: Path,
) -> None:
    """With four healthy researchers and two files, the crashing and the pausing
    researcher still each start a file and inject their fault (they start first; started
    together, the healthy ones often took both files before either faulty one began, and
    the demo exited 1 having shown neither)."""
    import shutil

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("decoder.py", "encoder.py"):
        shutil.copy(_json_pkg() / name, inputs / name)
    run = tmp_path / "run"
    run.mkdir()
    extra = ["--input", str(inputs), "--workers", "6", "--crash", "1", "--pause", "1"]
    code, data, err = _run(run, *extra)
    summary = {k: data.get(k) for k in ("crashes", "pauses", "completed", "missed_faults")}
    assert code == 0, (err, summary)
    assert summary == {"crashes": 1, "pauses": 1, "completed": 2, "missed_faults": []}
    assert data["duplicate_completions"] == 0
    assert data["verdict"] == "accepted"


@pytest.mark.slow
def test_demo_on_the_redis_authority(tmp_path: Path) -> None:
    """With --redis the leases live on Redis; the crash and pause are still survived and the
    ledger, brought up to date from the journal, passes the audit."""
    require_redis()
    extra = ["--input", str(_json_pkg()), "--workers", "3", "--crash", "1", "--pause", "1"]
    code, data, err = _run(tmp_path, *extra, "--redis", REDIS_URL)
    assert code == 0, (err, data)
    assert data["completed"] == data["files"]
    assert data["duplicate_completions"] == 0
    assert (data["crashes"], data["pauses"]) == (1, 1)
    assert data["takeovers"] >= 2
    assert data["stale_writes_rejected"] >= 1
    assert data["audit_violations"] == []
    page = Path(str(data["timeline"])).read_text()
    assert 'data-kind="fence_rejected"' in page
    assert 'data-kind="taken_over"' in page


@pytest.mark.slow
def test_demo_on_prefect(tmp_path: Path) -> None:
    """--engine prefect runs the four roles as Prefect flows handing off by deployment, on
    Prefect's embedded server, with the same checks."""
    code, data, err = _run(tmp_path, "--engine", "prefect", "--input", str(_json_pkg()))
    assert code == 0, (err, data)
    assert data["completed"] == data["files"] == len(analysis.list_files([_json_pkg()]))
    assert data["duplicate_completions"] == 0
    assert data["verdict"] == "accepted"
    # as the processes engine (the files plus the operator's and the reviewer's), plus the
    # researcher flow's handoff of the research to the writer's deployment (README)
    assert data["handoffs_accepted"] == data["files"] + 3


def test_demo_rejects_bad_arguments(tmp_path: Path) -> None:
    """Bad demo options (unknown, malformed or not fitting together) exit 2 with a
    VALIDATION_ERROR receipt, like every baton command, and start nothing."""
    for args in (
        ["--bogus"],
        ["--workers", "x"],
        ["--workers", "0"],
        ["--workers", "2", "--crash", "2"],
        ["--ttl", "5"],
        ["--input", str(tmp_path / "missing")],
        ["--engine", "prefect", "--crash", "1"],
        ["--work-ms", "-5"],
    ):
        code, data, err = _run(tmp_path, *args)
        assert code == EXIT_CODES["VALIDATION_ERROR"], args
        assert data["ok"] is False, args
        assert data["action"] == "demo"
        error = data["error"]
        assert isinstance(error, dict)
        assert error["code"] == "VALIDATION_ERROR", args
        assert "Traceback" not in err
    assert not (tmp_path / ".baton").exists()


def test_baton_demo_reports_bad_arguments_as_validation_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baton demo` prints bad options in the CLI's error form: one
    `baton demo: VALIDATION_ERROR: ...` line on stderr and exit status 2."""
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "missing"
    for args, message in (
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--input", str(missing)], f"--input {missing} is not a directory"),
        (["--timeout", "0"], "--timeout must be at least 1 (got 0)"),
        (["--lines-per-chunk", "0"], "--lines-per-chunk must be at least 1 (got 0)"),
        (["--work-ms", "-5"], "--work-ms must not be negative (got -5)"),
    ):
        result = CliRunner().invoke(app, ["demo", *args], env=_no_baton_env())
        assert result.exit_code == EXIT_CODES["VALIDATION_ERROR"], result.output
        assert result.stderr == f"baton demo: VALIDATION_ERROR: {message}\n"
    assert not (tmp_path / ".baton").exists()


def test_baton_demo_refuses_org_principal_and_role_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baton demo --org x` (and --principal, --role) is VALIDATION_ERROR saying the demo
    runs in an org of its own, not argparse's bare "unrecognized arguments"."""
    monkeypatch.chdir(tmp_path)
    for flag in ("--org", "--principal", "--role"):
        result = CliRunner().invoke(app, ["demo", flag, "x"], env=_no_baton_env())
        assert result.exit_code == EXIT_CODES["VALIDATION_ERROR"], result.output
        assert result.stderr.startswith(f"baton demo: VALIDATION_ERROR: {flag}: ")
        assert "new org of its own" in result.stderr
    assert not (tmp_path / ".baton").exists()


def test_baton_demo_refuses_a_global_org_principal_or_role_before_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baton --org x demo` (and --principal, --role before `demo`) exits 2 with the same
    VALIDATION_ERROR as after `demo`, instead of running in the demo's own org as if the
    option had been read; BATON_ORG in the environment is not refused."""
    monkeypatch.chdir(tmp_path)
    for flag, value in (("--org", "x"), ("--principal", "x"), ("--role", "owner")):
        result = CliRunner().invoke(app, [flag, value, "demo"], env=_no_baton_env())
        assert result.exit_code == EXIT_CODES["VALIDATION_ERROR"], result.output
        assert result.stderr.startswith(f"baton demo: VALIDATION_ERROR: {flag}: ")
        assert "new org of its own" in result.stderr
    assert not (tmp_path / ".baton").exists()
    env = {**_no_baton_env(), "BATON_ORG": "x"}
    result = CliRunner().invoke(app, ["demo", "--workers", "0"], env=env)
    assert "--workers must be at least 1" in result.stderr, result.output


def test_every_demo_option_has_help_naming_its_engine() -> None:
    """`baton demo --help` explains every option, and the options the Prefect engine does
    not use say they are for --engine processes only."""
    from prefect_baton.demo.options import parser

    actions = {a.option_strings[0]: a for a in parser()._actions}
    assert all(a.help for a in actions.values())
    for flag in ("--crash", "--pause", "--ttl", "--lines-per-chunk", "--work-ms", "--timeout"):
        assert "--engine processes only" in str(actions[flag].help), flag


def test_baton_demo_takes_the_global_redis_url(tmp_path: Path) -> None:
    """`baton --redis-url URL demo` and `baton demo --redis-url URL` (alias --redis) reach the
    demo: an unreachable URL gives UNAVAILABLE before any worker starts."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    for argv in (["--redis-url", url, "demo"], ["demo", "--redis-url", url]):
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_baton.cli", *argv, "--input", str(_json_pkg())],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == EXIT_CODES["UNAVAILABLE"], proc.stderr
        assert "baton demo: UNAVAILABLE: Redis unavailable" in proc.stderr


def test_a_role_past_timeout_is_unavailable_with_the_cli_error_form(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A role that does not finish within --timeout is reported like every baton error:
    `baton demo: UNAVAILABLE: ...` (or a JSON receipt) and exit status 11, naming the
    timeout and the remedy."""
    import prefect_baton.demo as demo

    def late(_args: object) -> None:
        raise TimeoutError("researchers did not finish in time")

    monkeypatch.setattr(demo, "run_demo", late)
    assert demo.main(["--timeout", "5"]) == EXIT_CODES["UNAVAILABLE"]
    assert capsys.readouterr().err == (
        "baton demo: UNAVAILABLE: researchers did not finish in time (after --timeout 5 s); "
        "give a larger --timeout\n"
    )
    assert demo.main(["--timeout", "5", "--format", "json"]) == EXIT_CODES["UNAVAILABLE"]
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "UNAVAILABLE"
    assert "--timeout 5 s" in error["message"]


def _no_baton_env() -> dict[str, str | None]:
    """Every ``BATON_*`` variable of this environment unset (for ``CliRunner``)."""
    return {k: None for k in os.environ if k.startswith("BATON_")}


def _closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_redis_fails_fast_with_unavailable(tmp_path: Path) -> None:
    """A Redis URL nothing listens on fails within seconds with UNAVAILABLE (exit 11) naming
    the cause, instead of waiting for --timeout and reporting an internal error."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    for fmt in ("json", "table"):
        code, data, err = _run(
            tmp_path, "--input", str(_json_pkg()), "--redis", url, "--format", fmt, timeout=120
        )
        assert code == EXIT_CODES["UNAVAILABLE"], err
        assert "INTERNAL_ERROR" not in err
        if fmt == "json":
            error = data["error"]
            assert isinstance(error, dict)
            assert error["code"] == "UNAVAILABLE"
            assert "Redis unavailable" in error["message"]
        else:
            assert "baton demo: UNAVAILABLE: Redis unavailable" in err


def test_summary_prints_paths_unwrapped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger URL and the report path are printed whole on their own lines under the
    summary table, even when wider than the terminal, so they can be copied."""
    from prefect_baton.demo import DemoResult, _print_table

    monkeypatch.setenv("COLUMNS", "60")
    deep = "/tmp/" + "/".join(f"directory-{i}" for i in range(8))
    result = DemoResult(
        files=3, completed=3, ledger=f"sqlite:///{deep}/ledger.db", report=f"{deep}/report.json"
    )
    _print_table(result)
    lines = capsys.readouterr().out.splitlines()
    assert f"ledger: sqlite:///{deep}/ledger.db" in lines
    assert f"report: {deep}/report.json" in lines
    assert sum(deep in line for line in lines) == 2


def test_tampered_input_is_rejected_by_reviewer(tmp_path: Path) -> None:
    """If a file changes after its analysis, the reviewer's recomputed sha256 differs and the
    verdict is not accepted (the demo exits non-zero)."""
    from prefect_baton.demo import roles

    src = tmp_path / "pkg"
    src.mkdir()
    for i in range(3):
        (src / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    files = analysis.list_files([src])
    url = f"sqlite:///{tmp_path / 'l.db'}"
    r = Baton(ledger_url=url, org="t", principal="researcher")
    stats = roles.researcher(r, files, worker="w1", work_seconds=0)
    assert stats.completed == 3
    roles.writer(r.as_principal("writer"), files)
    roles.operator(r.as_principal("operator"), tmp_path / "out", timeout_seconds=5)
    (src / "m1.py").write_text("def changed():\n    pass\n")
    verdict = roles.reviewer(r.as_principal("reviewer"), files, timeout_seconds=5)
    assert verdict["verdict"] == "rejected"
    assert any("m1.py" in p for p in verdict["problems"])
    assert r.outcomes.list("review")[-1].status == "failed"
    r.close()


def test_a_requested_fault_that_did_not_happen_fails_the_demo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--crash 1 --pause 1`` whose researchers found no file left to start injected
    nothing: the run proved less than asked, so it is not ``ok`` (exit 1) and says which
    fault is missing and what to change."""
    import argparse

    from prefect_baton.demo import DemoResult, _missed_faults, _print_table

    args = argparse.Namespace(crash=1, pause=1)
    result = DemoResult(files=1, completed=1, verdict="accepted", crashes=1, pauses=0)
    result.missed_faults = _missed_faults(args, result)
    assert len(result.missed_faults) == 1
    assert result.missed_faults[0].startswith("--pause 1: 0 researcher(s) paused")
    assert "--input" in result.missed_faults[0]
    assert not result.ok
    _print_table(result)
    assert "fault not injected: --pause 1" in capsys.readouterr().err
    assert result.summary()["missed_faults"] == result.missed_faults
    both = DemoResult(files=1, completed=1, verdict="accepted", crashes=1, pauses=1)
    assert _missed_faults(args, both) == []
    assert both.ok
    prefect = DemoResult(engine="prefect", files=1, completed=1, verdict="accepted")
    assert prefect.summary()["missed_faults"] is None
    assert prefect.ok
