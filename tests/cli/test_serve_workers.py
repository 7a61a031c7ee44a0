"""``baton serve --workers N``: several worker processes answer on one port, each with the
same rules (a lease held through one is refused through the other), and SIGTERM stops
them all; the default number of workers follows the ledger and authority."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import prefect_baton.rest._worker as rest_worker
from prefect_baton._exit import exit_code_for
from prefect_baton.errors import UnavailableError, ValidationError
from prefect_baton.rest.__main__ import MAX_WORKERS, default_workers

from .conftest import BATON_SCRIPT, Cli, process_env
from .test_serve_keys import LEASE, _free_port, _wait_until_listening


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_two_workers_serve_one_port_and_stop_together(cli: Cli) -> None:
    """With --workers 2, pairs over many connections all succeed, a held lease is a
    CONFLICT for another principal whichever worker answers, the metrics port (no key)
    and ``/metrics`` (a key of the org) sum what both workers counted, and SIGTERM ends
    the server and its workers."""
    port, mport = _free_port(), _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2", "--metrics-port", str(mport)]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    bob = cli.ok("keys", "create", "--scope", "leases:write", principal="bob")["secret"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=process_env()
    )
    try:
        _wait_until_listening(proc, port)
        url = f"http://127.0.0.1:{port}"
        for i in range(8):  # new connections: the kernel spreads them over the workers
            with httpx.Client(base_url=url, timeout=60) as c:
                h = {"Authorization": f"Bearer {alice}"}
                body = {**LEASE, "resource_id": f"r{i}"}
                r = c.post("/v1/leases", json=body, headers=h)
                assert r.status_code == 201, r.text
                for _ in range(2):
                    with httpx.Client(base_url=url, timeout=60) as other:
                        h2 = {"Authorization": f"Bearer {bob}"}
                        refused = other.post("/v1/leases", json=body, headers=h2)
                        assert refused.status_code == 409, refused.text
                        assert refused.json()["error"]["code"] == "CONFLICT"
                r = c.delete(f"/v1/leases/{r.json()['data']['lease_id']}", headers=h)
                assert r.status_code == 200, r.text
        _assert_metrics_summed(cli.org, url, mport, alice)
        workers = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
        assert len(workers) == 2
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def test_without_a_metrics_port_a_lean_supervisor_runs_the_workers(cli: Cli) -> None:
    """With --workers 2 and no --metrics-port, the process that checked the ledger replaces
    itself (same process id) with a supervisor that has none of the stores or web libraries
    loaded (no pydantic_core, SQLite or FastAPI code mapped), its workers answer, leases
    held through one are refused through the other, and SIGTERM ends them all (exit 0,
    the metrics directory it made removed)."""
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2"]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    bob = cli.ok("keys", "create", "--scope", "leases:write", principal="bob")["secret"]
    env = process_env()
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _wait_until_listening(proc, port)
        assert "supervise()" in _cmdline(proc.pid)
        with open(f"/proc/{proc.pid}/maps") as f:
            mapped = f.read()
        for heavy in ("pydantic_core", "_sqlite3", "sqlalchemy", "hiredis"):
            assert heavy not in mapped, heavy
        workers = [p for p in _children(proc.pid) if "spawn_main" in _cmdline(p)]
        assert len(workers) == 2
        with open(f"/proc/{workers[0]}/environ", "rb") as f:  # set before they started
            environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        metrics_dir = environ[b"PROMETHEUS_MULTIPROC_DIR"].decode()
        assert os.path.isdir(metrics_dir)
        url = f"http://127.0.0.1:{port}"
        for i in range(4):
            with httpx.Client(base_url=url, timeout=60) as c:
                body = {**LEASE, "resource_id": f"lean{i}"}
                r = c.post("/v1/leases", json=body, headers={"Authorization": f"Bearer {alice}"})
                assert r.status_code == 201, r.text
            with httpx.Client(base_url=url, timeout=60) as other:
                refused = other.post(
                    "/v1/leases", json=body, headers={"Authorization": f"Bearer {bob}"}
                )
                assert refused.status_code == 409, refused.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "Uvicorn running on" in out
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    assert not os.path.exists(metrics_dir)


def test_lean_supervisor_ignores_modules_in_the_working_directory(cli: Cli, tmp_path: Path) -> None:
    """Started from a directory holding a ``tempfile.py`` and a ``uvicorn.py`` (as a user's
    project might), the supervisor and its workers import the real modules, not these
    (``python -c`` alone would put the directory first on ``sys.path``), and answer."""
    for name in ("tempfile", "uvicorn", "socket"):
        (tmp_path / f"{name}.py").write_text('raise SystemExit("imported from the cwd")\n')
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    argv += ["--workers", "2"]
    alice = cli.ok("keys", "create", "--scope", "leases:write", principal="alice")["secret"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=process_env(),
        cwd=tmp_path,
    )
    try:
        _wait_until_listening(proc, port)  # bound before the supervisor starts: ask too
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/leases",
            json={**LEASE, "resource_id": "cwd"},
            headers={"Authorization": f"Bearer {alice}"},
            timeout=60,
        )
        assert r.status_code == 201, r.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "imported from the cwd" not in out


def _assert_metrics_summed(org: str, url: str, mport: int, key: str) -> None:
    """The 8 grants, 16 conflicts and 8 releases of the test above, whichever worker
    answered them, on the loopback metrics port and on the API's ``/metrics``."""
    labels = f'organization="{org}",resource_type="deploy"'
    lines = [
        f'baton_acquires_total{{{labels},result="granted"}} 8.0',
        f'baton_acquires_total{{{labels},result="conflict"}} 16.0',
        f'baton_releases_total{{{labels},status="released"}} 8.0',
    ]
    open_port = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=60)
    assert open_port.status_code == 200
    api = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert api.status_code == 200
    for line in lines:
        assert line in open_port.text
        assert line in api.text
    assert httpx.get(f"{url}/metrics", timeout=60).status_code == 401


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("ledger_url", "redis_url", "expected"),
    [
        ("sqlite:///x.db", None, 1),
        ("sqlite:///x.db", "redis://127.0.0.1:6379/0", "cpus"),
        ("postgresql://u@h/db", None, "cpus"),
    ],
)
def test_default_workers_follow_the_ledger_and_authority(
    monkeypatch: pytest.MonkeyPatch, ledger_url: str, redis_url: str | None, expected: object
) -> None:
    """One worker on a SQLite ledger alone (one writer at a time); one per CPU, at most
    4, with Redis as the authority or on PostgreSQL."""
    monkeypatch.delenv("BATON_REDIS_URL", raising=False)
    cpus = min(4, len(os.sched_getaffinity(0)))
    assert default_workers(ledger_url, redis_url) == (cpus if expected == "cpus" else expected)


@pytest.mark.parametrize("workers", ["0", str(MAX_WORKERS + 1), "1000"])
def test_serve_workers_out_of_range_is_validation_error(cli: Cli, workers: str) -> None:
    """--workers 0, or over MAX_WORKERS (64, as the help says), exits 2 before anything
    is served."""
    run = cli("serve", "--port", str(_free_port()), "--workers", workers)
    assert run.code == 2, run.text
    assert run.json["error"]["code"] == "VALIDATION_ERROR"
    assert f"from 1 to {MAX_WORKERS}" in run.json["error"]["message"]
    assert f"--workers outside 1-{MAX_WORKERS}," in " ".join(cli("serve", "--help").text.split())


@pytest.mark.parametrize("workers", ["0", str(MAX_WORKERS + 1)])
def test_module_entry_point_reports_a_bad_option_in_one_line(workers: str) -> None:
    """``python -m prefect_baton.rest --workers 0`` (or 65) prints one line with the error
    code on stderr, no traceback, and exits with the status ``baton serve`` gives it."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_baton.rest",
            "--port",
            str(_free_port()),
            "--workers",
            workers,
        ],
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=120,
    )
    assert run.returncode == exit_code_for("VALIDATION_ERROR") == 2, run.stderr
    assert run.stderr.splitlines() == [
        "python -m prefect_baton.rest: VALIDATION_ERROR: workers must be from 1 to "
        f"{MAX_WORKERS}, got {workers} (--workers)"
    ]


def test_module_entry_point_reports_an_unreachable_ledger_in_one_line(tmp_path: Path) -> None:
    """A ledger that cannot be opened is ``UNAVAILABLE`` (exit 11, as ``baton serve``), one
    line on stderr."""
    (tmp_path / "ledger.db").mkdir()  # a directory where the SQLite file should be
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_baton.rest",
            "--port",
            str(_free_port()),
            "--ledger-url",
            url,
        ],
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=120,
    )
    assert run.returncode == exit_code_for("UNAVAILABLE") == 11, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("python -m prefect_baton.rest: UNAVAILABLE: ")


def _until(ok: Callable[[], bool], what: str, seconds: float = 180.0) -> None:
    """Poll ``ok`` until it holds; fail with ``what`` after a generous ``seconds``."""
    pause = threading.Event()
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, what
        pause.wait(0.1)


def _workers(pid: int) -> list[int]:
    try:
        return [p for p in _children(pid) if "spawn_main" in _cmdline(p)]
    except OSError:
        return []


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            return True
    except OSError:
        return False


def _start_two_workers(cli: Cli, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    argv = [str(BATON_SCRIPT), "serve", "--port", str(port), "--ledger-url", cli.ledger_url]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--workers", "2"], stdout=out, stderr=subprocess.STDOUT, env=process_env()
        )
    return proc, port


def _stop(proc: subprocess.Popen[bytes], pids: list[int]) -> None:
    """Clean up after a failed test: kill what is left, by process id."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_workers_end_when_the_supervisor_is_killed(cli: Cli, tmp_path: Path) -> None:
    """SIGKILL of the server process (the lean supervisor, which cannot stop anything
    then) still ends its workers, each told by the kernel: the port stops accepting
    connections and no worker process is left."""
    proc, port = _start_two_workers(cli, tmp_path / "serve.log")
    workers: list[int] = []
    try:
        _until(lambda: _answers(port), "no worker answered")
        _until(lambda: len(_workers(proc.pid)) == 2, "two workers did not start")
        workers = _workers(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _until(lambda: all(_gone(pid) for pid in workers), "a worker outlived its supervisor")
        _until(lambda: not _accepts(port), "the port still accepts connections")
    finally:
        _stop(proc, workers)


def test_without_prctl_a_thread_ends_the_worker_with_its_parent() -> None:
    """Where the kernel cannot signal a parent's death, a thread of the worker notices its
    parent is gone and ends it with SIGTERM."""
    worker = (
        "import sys, time; import prefect_baton.rest._worker as m; "
        "m._set_parent_death_signal = lambda signum: False; "
        "m._end_with_parent(int(sys.argv[1])); print('ready', flush=True); time.sleep(600)"
    )
    parent = (
        "import os, subprocess, sys; "
        f"w = subprocess.Popen([sys.executable, '-c', {worker!r}, str(os.getpid())], "
        "stdout=subprocess.PIPE, text=True); w.stdout.readline(); print(w.pid, flush=True)"
    )
    run = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=120, check=True
    )
    pid = int(run.stdout)
    try:
        _until(lambda: _gone(pid), "the worker outlived its parent")
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_that_cannot_start_waits_and_tries_again(cli: Cli, tmp_path: Path) -> None:
    """A worker started while the ledger cannot be opened logs one line per attempt (no
    traceback) and tries again in the same process, pausing longer each time, instead of
    being restarted in a loop; once the ledger is back it serves."""
    log = tmp_path / "serve.log"
    proc, port = _start_two_workers(cli, log)
    workers: list[int] = []
    ledger = Path(cli.ledger_url.removeprefix("sqlite:///"))
    try:
        _until(lambda: _answers(port), "no worker answered")
        _until(lambda: len(_workers(proc.pid)) == 2, "two workers did not start")
        workers = _workers(proc.pid)
        # both started (one answering is not enough: the other would then fail to start
        # too); only the lines logged from here on are the replacement's
        _until(
            lambda: all(f"Started server process [{p}]" in log.read_text() for p in workers),
            "both workers did not start",
        )
        seen = len(log.read_text().splitlines())
        ledger.rename(ledger.with_suffix(".away"))
        ledger.mkdir()  # the ledger cannot be opened now
        os.kill(workers[0], signal.SIGKILL)  # its replacement starts without a ledger

        def failures() -> list[str]:
            later = log.read_text().splitlines()[seen:]
            return [ln for ln in later if "cannot start" in ln]

        _until(lambda: len(failures()) >= 3, "the new worker did not report its failures")
        new = [pid for pid in _workers(proc.pid) if pid not in workers]
        assert len(new) == 1
        workers += new
        lines = failures()
        assert all(f"worker [{new[0]}] cannot start: UNAVAILABLE: " in ln for ln in lines)
        assert [ln.rsplit("again in ", 1)[1] for ln in lines[:3]] == ["1 s", "2 s", "4 s"]
        text = log.read_text()
        assert "Traceback" not in text
        assert text.count("died") == 1  # the killed one: the new worker was never replaced
        ledger.rmdir()
        ledger.with_suffix(".away").rename(ledger)
        _until(
            lambda: f"Started server process [{new[0]}]" in log.read_text(),
            "the worker did not start once the ledger was back",
        )
        assert _answers(port)
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    finally:
        _stop(proc, workers)


def test_build_with_retries_pauses_longer_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the app cannot reach its ledger (UNAVAILABLE): 1, 2, 4, ... seconds between
    attempts, at most WORKER_RETRY_MAX_SECONDS, one line each without traceback. Any other
    failure is not retried: a BatonError is one line, another error has its traceback, and
    the worker stops (uvicorn then stops its supervisor, as without retries)."""
    pauses: list[float] = []
    monkeypatch.setattr(rest_worker, "_pause", lambda seconds: pauses.append(seconds) or False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("prefect_baton.rest")
    logger.addHandler(handler)
    errors: list[Exception] = [UnavailableError("ledger\ngone")] * 8

    def build() -> str:
        if errors:
            raise errors.pop(0)
        return "app"

    def failing(exc: Exception) -> Callable[[], str]:
        def build() -> str:
            raise exc

        return build

    try:
        assert rest_worker._build_with_retries(build) == "app"
        assert pauses == [1, 2, 4, 8, 16, 30, 30, 30]
        assert rest_worker.WORKER_RETRY_MAX_SECONDS == 30
        assert "UNAVAILABLE: ledger gone; trying again in 1 s" in records[0].getMessage()
        assert not any(r.exc_info for r in records)
        records.clear()
        with pytest.raises(ValidationError):
            rest_worker._build_with_retries(failing(ValidationError("bad setting")))
        assert [r.getMessage().endswith("VALIDATION_ERROR: bad setting") for r in records] == [True]
        assert not records[0].exc_info
        records.clear()
        with pytest.raises(RuntimeError):
            rest_worker._build_with_retries(failing(RuntimeError("boom")))
        assert "Traceback" in logging.Formatter().format(records[0])
    finally:
        logger.removeHandler(handler)
    assert len(pauses) == 8  # neither was retried


def test_pause_ends_on_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM during a pause ends it at once (True) and the previous handler is back."""
    before = signal.getsignal(signal.SIGTERM)
    sleep = time.sleep
    calls: list[float] = []

    def first_sleep_gets_sigterm(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", first_sleep_gets_sigterm)
    assert rest_worker._pause(600) is True
    assert len(calls) == 1
    assert signal.getsignal(signal.SIGTERM) is before
