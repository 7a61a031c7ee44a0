"""``baton demo``: the seed scenario's four roles as separate OS processes on real input.

Researchers (``--workers``) lease and analyse every ``.py`` file of the input directories
(default: the running Python's ``json``, ``email`` and ``http`` packages); ``--crash N`` of
them SIGKILL themselves mid-file and ``--pause N`` are SIGSTOPped past their TTL and resumed
after another researcher took the file over, so their late writes must be rejected by the
fence. Then a writer compiles a report and hands it off to an operator, who delivers it and
hands off to a reviewer, who recomputes every file's sha256 against the evidence.

The summary is read back from the ledger. The command exits 1 if any file was completed twice
or left undone, the verdict is not ``accepted``, the ledger audit finds a violation, or a crash
or pause asked for was not injected (too little input for the faulty researchers to reach it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from prefect_baton import Baton, BatonError, ValidationError
from prefect_baton._rules.events import FENCE_REJECTED
from prefect_baton.audit import audit_ledger
from prefect_baton.cli._output import OutputFormat, emit_error, format_from_argv
from prefect_baton.demo import analysis
from prefect_baton.demo.options import parse
from prefect_baton.demo.timelines import write_demo_timelines
from prefect_baton.errors import UnavailableError, error_for_code

__all__ = ["DemoResult", "main", "run_demo"]


def _measure(label: str, default: Any = 0, engines: tuple[str, ...] = ()) -> Any:
    """A :class:`DemoResult` field shown in the summary table as ``label``; with
    ``engines``, it applies to those ``--engine`` values only (``n/a`` in the table, ``null``
    in JSON, for another)."""
    return field(default=default, metadata={"label": label, "show": str, "engines": engines})


def _path(label: str) -> Any:
    """A :class:`DemoResult` path printed as ``label: path`` on its own line under the
    summary table (never wrapped, so it can be copied)."""
    return field(default="", metadata={"path": label})


@dataclass
class DemoResult:
    """The demo's summary, read back from the ledger (counts are ``int``); the fields in the
    order of the summary table, with its labels; ``ledger`` (URL) and ``report`` (path) are
    printed under the table, one a line, and so is ``timeline`` (the HTML page of the
    busiest resources' lease timelines). ``crashes`` and ``pauses`` apply to ``engine``
    ``processes`` only: with ``prefect`` (no faults are injected) the table shows ``n/a``
    and the JSON summary ``null`` (:meth:`summary`)."""

    engine: str = _measure("engine", "processes")
    files: int = _measure("files")
    completed: int = _measure("completed")
    duplicate_completions: int = _measure("duplicate completions")
    undone: int = _measure("left undone")
    crashes: int = _measure("crashed researchers (SIGKILL)", engines=("processes",))
    pauses: int = _measure("paused researchers (SIGSTOP/SIGCONT)", engines=("processes",))
    takeovers: int = _measure("takeovers after expiry")
    resumed_from_checkpoint: int = _measure("resumed from checkpoint")
    stale_writes_rejected: int = _measure("stale writes rejected")
    handoffs_accepted: int = _measure("handoffs accepted")
    verdict: str = _measure("verdict", "none")
    audit_violations: list[str] = field(
        default_factory=list, metadata={"label": "audit violations", "show": len}
    )
    missed_faults: list[str] = field(
        default_factory=list,
        metadata={
            "label": "requested faults not injected",
            "show": len,
            "engines": ("processes",),
        },
    )
    elapsed_seconds: float = _measure("elapsed (s)", 0.0)
    ledger: str = _path("ledger")
    org: str = ""
    report: str = _path("report")
    timeline: str = _path("timeline")

    @property
    def ok(self) -> bool:
        """Every file done exactly once, verdict accepted, audit clean, and every crash and
        pause asked for (``--crash``, ``--pause``) injected."""
        return (
            self.duplicate_completions == 0
            and self.undone == 0
            and self.verdict == "accepted"
            and not self.audit_violations
            and not self.missed_faults
        )

    def summary(self) -> dict[str, Any]:
        """The result as JSON data: every field, ``None`` for a measure that does not apply
        to :attr:`engine`."""
        data = asdict(self)
        for f in fields(self):
            if f.metadata.get("engines") and self.engine not in f.metadata["engines"]:
                data[f.name] = None
        return data


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class _Workers:
    """The demo's worker processes by name (``researcher-1``, ``writer``, ...), each's role,
    and the one JSON line each printed on stdout (its result, or ``{"error": {...}}``)."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.roles: dict[str, str] = {}
        self._out: dict[str, dict[str, Any]] = {}

    def output(self, name: str) -> dict[str, Any]:
        """The last JSON line ``name`` printed (``{}`` if none); read once it has exited."""
        p = self.procs[name]
        if name not in self._out and p.poll() is not None:
            lines = (p.stdout.read() if p.stdout else "").strip().splitlines()
            try:
                self._out[name] = json.loads(lines[-1]) if lines else {}
            except ValueError:
                self._out[name] = {}
        return self._out.get(name, {})

    def error(self, name: str) -> BatonError:
        """The error worker ``name`` exited with (from its JSON line, else its exit status)."""
        err = self.output(name).get("error")
        if isinstance(err, dict) and "code" in err:
            return error_for_code(str(err["code"]), f"{name}: {err.get('message', '')}")
        return BatonError(f"{name} exited with status {self.procs[name].returncode}")

    def check_failed_roles(self) -> None:
        """Raise the first worker's error when every worker of a role has exited and none
        succeeded (a researcher told to crash, SIGKILLed, is not counted as a failure).

        Raises:
            BatonError: the first failed worker's error (code and message), e.g.
                ``UNAVAILABLE`` when the workers could not reach Redis.
        """
        for role in dict.fromkeys(self.roles.values()):
            names = [n for n, r in self.roles.items() if r == role]
            codes = [self.procs[n].poll() for n in names]
            if any(c is None or c == 0 for c in codes):
                continue
            failed = [n for n, c in zip(names, codes, strict=True) if c != -signal.SIGKILL]
            if failed:
                raise self.error(failed[0])

    def wait(self, name: str, deadline: float) -> None:
        """Wait for ``name`` until ``deadline`` (``time.monotonic()`` seconds).

        Raises:
            TimeoutError: it did not finish in time (naming it).
        """
        try:
            self.procs[name].wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{name} did not finish in time") from None


class _Progress:
    """A Rich progress bar on a terminal, plain lines otherwise (on stderr for JSON)."""

    def __init__(self, total: int, fmt: str) -> None:
        self.total = total
        self.tty = sys.stdout.isatty() and fmt == "table"
        self.last = -1
        self._bar: Any = None
        if self.tty:
            from rich.progress import Progress

            self._bar = Progress(transient=True)
            self._bar.start()
            self._task = self._bar.add_task("files analysed", total=total)
        self.out: IO[str] = sys.stderr if fmt == "json" else sys.stdout

    def update(self, done: int, note: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
        elif done != self.last or note:
            print(f"[demo] {done}/{self.total} files analysed {note}".rstrip(), file=self.out)
        self.last = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_demo(args: argparse.Namespace) -> DemoResult:
    """Run the scenario described by parsed ``baton demo`` arguments."""
    t0 = time.monotonic()
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir: Path = (
        args.run_dir or Path.cwd() / ".baton" / "demo" / f"{stamp}-{uuid.uuid4().hex[:6]}"
    ).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger_url = args.ledger_url or f"sqlite:///{run_dir / 'ledger.db'}"
    org = f"demo-{uuid.uuid4().hex[:10]}"
    files = analysis.list_files(args.input or analysis.default_inputs())
    result = DemoResult(engine=args.engine, files=len(files), ledger=ledger_url, org=org)
    b = Baton(ledger_url=ledger_url, org=org, principal="orchestrator", redis_url=args.redis_url)
    try:  # are the ledger and the lease authority (Redis) reachable? Fail before any worker
        b.leases.inspect("file", next(iter(files), "probe"))
    except BaseException:
        b.close()
        raise
    if args.engine == "prefect":
        _run_on_prefect(args, b, run_dir)
        return _finish(args, b, files, run_dir, result, t0)
    base = {
        "ledger_url": ledger_url,
        "redis_url": args.redis_url,
        "org": org,
        "files": {k: str(v) for k, v in files.items()},
        "ttl": args.ttl,
        "lines_per_chunk": args.lines_per_chunk,
        "work_seconds": args.work_ms / 1000.0,
        "run_dir": str(run_dir),
        "timeout": float(args.timeout),
    }
    logs: list[IO[str]] = []
    workers = _Workers()

    def spawn(cfg: dict[str, Any]) -> subprocess.Popen[str]:
        log = open(run_dir / f"{cfg['worker']}.log", "w")  # noqa: SIM115
        logs.append(log)
        p = subprocess.Popen(
            [sys.executable, "-m", "prefect_baton.demo.worker", json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        workers.procs[cfg["worker"]] = p
        workers.roles[cfg["worker"]] = cfg["role"]
        return p

    researchers: dict[str, subprocess.Popen[str]] = {}
    faulty: dict[str, str] = {}
    healthy: list[dict[str, Any]] = []
    stride = max(1, len(files) // max(1, args.workers))
    for i in range(args.workers):
        fault = "crash" if i < args.crash else "pause" if i < args.crash + args.pause else None
        name = f"researcher-{i + 1}"
        cfg = {
            **base,
            "role": "researcher",
            "principal": "researcher",
            "worker": name,
            "offset": i * stride,
            "fault": fault,
        }
        if fault is None:
            healthy.append(cfg)
        else:
            researchers[name] = spawn(cfg)
            faulty[name] = fault
    spawn({**base, "role": "operator", "principal": "operator", "worker": "operator"})
    spawn({**base, "role": "reviewer", "principal": "reviewer", "worker": "reviewer"})
    deadline = time.monotonic() + args.timeout
    progress = _Progress(len(files), args.format)
    handled: dict[str, float] = {}
    try:
        _wait_for_faults(run_dir, researchers, faulty, deadline)
        for cfg in healthy:
            researchers[cfg["worker"]] = spawn(cfg)
        while any(p.poll() is None for p in researchers.values()):
            workers.check_failed_roles()
            if time.monotonic() > deadline:
                raise TimeoutError("researchers did not finish in time")
            for marker in run_dir.glob("pause-*.json"):
                name = marker.stem.removeprefix("pause-")
                info = json.loads(marker.read_text())
                if name in handled or not _stopped(info["pid"]):
                    continue
                first_seen = handled.setdefault(f"seen:{name}", time.monotonic())
                taken = b.leases.inspect("file", info["resource_id"]).epoch > info["epoch"]
                if taken or time.monotonic() - first_seen > 6 * args.ttl:
                    os.kill(info["pid"], signal.SIGCONT)
                    handled[name] = time.monotonic()
                    result.pauses += 1
                    progress.update(progress.last, f"(resumed paused {name})")
            done = len(
                {o.subject_id for o in b.outcomes.list(limit=100_000) if o.status == "succeeded"}
                & set(files)
            )
            progress.update(done)
            time.sleep(0.3)
        progress.update(
            len(
                {o.subject_id for o in b.outcomes.list(limit=100_000) if o.status == "succeeded"}
                & set(files)
            )
        )
        workers.check_failed_roles()
        spawn({**base, "role": "writer", "principal": "writer", "worker": "writer"})
        for name in ("writer", "operator", "reviewer"):
            workers.wait(name, deadline)
            workers.check_failed_roles()
    finally:
        progress.close()
        for p in workers.procs.values():
            if p.poll() is None:
                if _stopped(p.pid):
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    for name, p in researchers.items():
        if p.returncode == -signal.SIGKILL:
            result.crashes += 1
            continue
        stats = workers.output(name)
        result.resumed_from_checkpoint += int(stats.get("resumed", 0))
    result.missed_faults = _missed_faults(args, result)
    return _finish(args, b, files, run_dir, result, t0)


def _wait_for_faults(
    run_dir: Path,
    procs: dict[str, subprocess.Popen[str]],
    faulty: dict[str, str],
    until: float,
) -> None:
    """Wait until each researcher told to crash or pause (``faulty``: name -> ``"crash"``
    or ``"pause"``) has done so, or ended otherwise, or monotonic time ``until`` came: the
    healthy researchers start after, so that they cannot take every file before a faulty
    one starts its first (a faulty researcher that started late on a busy machine found
    none left, and the demo showed less than it was asked to)."""
    waiting = dict(faulty)
    while waiting and time.monotonic() < until:
        for name, fault in list(waiting.items()):
            paused = fault == "pause" and (run_dir / f"pause-{name}.json").exists()
            if paused or procs[name].poll() is not None:
                del waiting[name]
        time.sleep(0.05)


def _missed_faults(args: argparse.Namespace, result: DemoResult) -> list[str]:
    """What ``--crash`` and ``--pause`` asked for and did not happen, one sentence each: a
    researcher injects its fault after the first checkpoint of the first file it starts, so
    one that finds every file done or held by others never does, and the run would show
    less than it was asked to (the demo then exits 1)."""
    missed = []
    for flag, asked, done, what in (
        ("--crash", args.crash, result.crashes, "crashed"),
        ("--pause", args.pause, result.pauses, "paused"),
    ):
        if done < asked:
            missed.append(
                f"{flag} {asked}: {done} researcher(s) {what}; a researcher injects its "
                "fault in the first file it starts, and found none left: give more input "
                "files (--input) or fewer --workers"
            )
    return missed


def _run_on_prefect(args: argparse.Namespace, b: Baton, run_dir: Path) -> None:
    """The same scenario as four Prefect flows handing off by deployment
    (:func:`prefect_baton.demo.scenario.run_scenario`), on this run's ledger and org."""
    env = {"BATON_LEDGER_URL": b.store.url, "BATON_ORG": b.org}
    if args.redis_url:
        env["BATON_REDIS_URL"] = args.redis_url
    env.setdefault(
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
    )
    env.setdefault("PREFECT_LOGGING_LEVEL", os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"))
    env.setdefault(
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
        os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"),
    )
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from prefect_baton.demo.scenario import run_scenario

        inputs = [str(p) for p in args.input] if args.input else None
        run_scenario(inputs, workers=args.workers, out_dir=str(run_dir))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _finish(
    args: argparse.Namespace,
    b: Baton,
    files: dict[str, Path],
    run_dir: Path,
    result: DemoResult,
    t0: float,
) -> DemoResult:
    """Fill ``result`` from the ledger once the scenario ran (either way), write the
    timelines, close ``b`` and return ``result``."""
    _summarise(b, files, result, args.redis_url)
    result.report = str(run_dir / "report.json")
    result.timeline = str(write_demo_timelines(b.as_principal(b.principal, "owner"), run_dir))
    result.elapsed_seconds = round(time.monotonic() - t0, 2)
    b.close()
    return result


def _summarise(b: Baton, files: dict[str, Path], result: DemoResult, redis_url: str | None) -> None:
    if redis_url:  # bring the ledger up to date with the Redis journal before reading it
        from prefect_baton.reconcile import run_reconciler

        run_reconciler(redis_url, b.store.url, orgs=[b.org], store=b.store)
    succeeded = Counter(
        o.subject_id for o in b.outcomes.list(limit=100_000) if o.status == "succeeded"
    )
    result.completed = sum(1 for f in files if succeeded[f] >= 1)
    result.duplicate_completions = sum(max(0, succeeded[f] - 1) for f in files)
    result.undone = sum(1 for f in files if succeeded[f] == 0)
    _rows, transitions = b.store.lease_history(b.org)
    result.takeovers = sum(
        1 for t in transitions if t.action == "takeover" and t.resource_type == "file"
    )
    seq = 0
    while True:
        page = b.events.list(after_seq=seq, limit=1000)
        if not page:
            break
        result.handoffs_accepted += sum(1 for e in page if e.kind == "handoff.accepted")
        result.stale_writes_rejected += sum(1 for e in page if e.kind == FENCE_REJECTED)
        seq = page[-1].seq
    review = b.outcomes.list("review")
    if review:
        result.verdict = "accepted" if review[-1].status == "succeeded" else "rejected"
    result.audit_violations = audit_ledger(b.store, b.org).violations


def _print_table(r: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="prefect-baton demo", show_header=True)
    t.add_column("measure")
    t.add_column("value", justify="right", overflow="fold")
    data = r.summary()
    for f in fields(r):
        if "label" in f.metadata:
            value = data[f.name]
            t.add_row(
                f.metadata["label"], "n/a" if value is None else str(f.metadata["show"](value))
            )
    Console().print(t)
    for f in fields(r):
        if "path" in f.metadata:
            print(f"{f.metadata['path']}: {getattr(r, f.name)}")
    for v in r.audit_violations:
        print(f"audit: {v}", file=sys.stderr)
    for m in r.missed_faults:
        print(f"fault not injected: {m}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``baton demo`` and ``python -m prefect_baton.demo``.

    Args:
        argv: the demo's arguments (``list[str]``; default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 all good, 1 a check failed, else the exit status of the
        error's code (``2`` ``VALIDATION_ERROR`` for bad arguments, ``11`` ``UNAVAILABLE``
        when the ledger or Redis cannot be reached or a role did not finish within
        ``--timeout`` seconds, ...). Errors are printed like every ``baton`` command's:
        ``baton demo: CODE: message`` on stderr, or a JSON receipt with ``--format json``.
        ``--help`` exits (``SystemExit(0)``) after printing the usage.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(argv)
    except ValidationError as exc:
        return emit_error(format_from_argv(argv), "demo", exc.to_dict())
    try:
        result = run_demo(args)
    except TimeoutError as exc:
        late = UnavailableError(
            f"{exc} (after --timeout {args.timeout} s); give a larger --timeout"
        )
        return emit_error(OutputFormat(args.format), "demo", late.to_dict())
    except BatonError as exc:
        return emit_error(OutputFormat(args.format), "demo", exc.to_dict())
    if args.format == "json":
        print(json.dumps({"ok": result.ok, **result.summary()}, indent=2))
    else:
        _print_table(result)
    return 0 if result.ok else 1
