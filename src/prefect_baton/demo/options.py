"""The options of ``baton demo``: its argument parser (:func:`parser`) and the checks of
the values together (:func:`parse`), whose problems raise
:class:`~prefect_baton.errors.ValidationError` like every other command's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from prefect_baton._rules.validation import TTL_MIN_SECONDS, TTL_RANGE, validate_ttl
from prefect_baton.errors import ValidationError

__all__ = ["parse", "parser"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors (unknown option, bad value) raise
    :class:`~prefect_baton.errors.ValidationError` instead of exiting with argparse's usage
    message, so ``baton demo`` reports them like every other command."""

    def error(self, message: str) -> NoReturn:
        raise ValidationError(message)


#: Options that only ``--engine processes`` uses (the Prefect flows run without faults,
#: with their own chunking and a 600 s limit per role).
_PROCESSES_ONLY = "--engine processes only"


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="baton demo",
        description=(
            "Run the four-role scenario (researchers, writer, operator, reviewer) on real "
            "files: as separate OS processes with real crashes and pauses (--engine "
            "processes, the default), or as Prefect flows and deployments (--engine prefect). "
            "Every run uses a new org of its own (demo-...), so the global --org, "
            "--principal and --role do not apply: given before or after `demo`, they exit "
            "2 with VALIDATION_ERROR. --format, --ledger-url and --redis-url may come "
            "before or after `demo`."
        ),
    )
    p.add_argument(
        "--workers",
        type=int,
        default=4,
        metavar="N",
        help="researcher processes (--engine prefect: concurrent researcher tasks); "
        "integer >= 1, default 4",
    )
    p.add_argument(
        "--input",
        action="append",
        type=Path,
        metavar="DIR",
        help="directory of .py files to analyse (repeatable; default: the json, email and "
        "http packages of this Python)",
    )
    p.add_argument(
        "--crash",
        type=int,
        default=0,
        metavar="N",
        help=f"researchers that SIGKILL themselves mid-file (integer >= 0, default 0; "
        f"{_PROCESSES_ONLY})",
    )
    p.add_argument(
        "--pause",
        type=int,
        default=0,
        metavar="N",
        help=f"researchers SIGSTOPped past their lease's TTL (integer >= 0, default 0; "
        f"{_PROCESSES_ONLY}); --crash + --pause must leave one healthy researcher",
    )
    p.add_argument(
        "--ttl",
        type=int,
        default=TTL_MIN_SECONDS,
        metavar="SECONDS",
        help=f"file lease TTL in seconds ({TTL_RANGE}; default: {TTL_MIN_SECONDS}; "
        f"{_PROCESSES_ONLY})",
    )
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="output: table (a summary table, default) or json (one JSON document); "
        "errors as `baton demo: CODE: message` on stderr or a JSON receipt",
    )
    p.add_argument(
        "--ledger-url",
        metavar="URL",
        help="ledger URL, sqlite:///path or postgresql://... (default: a new SQLite file "
        "in the run directory)",
    )
    p.add_argument(
        "--lines-per-chunk",
        type=int,
        default=60,
        metavar="N",
        help=f"source lines per checkpoint (integer >= 1, default 60; {_PROCESSES_ONLY})",
    )
    p.add_argument(
        "--work-ms",
        type=int,
        default=20,
        metavar="MS",
        help=f"simulated work per chunk in milliseconds (integer >= 0, default 20; "
        f"{_PROCESSES_ONLY})",
    )
    p.add_argument(
        "--timeout",
        type=int,
        default=600,
        metavar="SECONDS",
        help=f"give up (UNAVAILABLE, exit 11) when a role has not finished after this "
        f"many seconds (integer >= 1, default 600; {_PROCESSES_ONLY}: the Prefect flows "
        f"wait 600 s per role)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where the ledger, logs, report and timeline go (default: a new "
        "./.baton/demo/<time>-<id>)",
    )
    p.add_argument(
        "--redis-url",
        "--redis",
        dest="redis_url",
        metavar="URL",
        help="Redis URL: hold the leases on the Redis fast path (default: the ledger holds "
        "them); --redis is an alias",
    )
    p.add_argument(
        "--engine",
        choices=("processes", "prefect"),
        default="processes",
        help="processes: each role an OS process (default); prefect: the four roles as Prefect "
        "flows and deployments, on PREFECT_API_URL or Prefect's embedded server",
    )
    return p


#: Global ``baton`` options that the demo does not take (it makes its org and principals).
_NOT_FOR_DEMO = frozenset({"--org", "--principal", "--role"})


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check ``baton demo`` arguments.

    Raises:
        ValidationError: an unknown option, a bad value, or options that do not fit
            together (all problems in one message, ``; ``-separated).
    """
    given = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in _NOT_FOR_DEMO]
    if given:
        raise ValidationError(
            f"{', '.join(dict.fromkeys(given))}: baton demo runs in a new org of its own "
            "(demo-...) with its own principals, so --org, --principal and --role do not apply"
        )
    args = parser().parse_args(argv)
    problems = []
    if args.workers < 1:
        problems.append("--workers must be at least 1")
    if args.crash < 0 or args.pause < 0:
        problems.append("--crash and --pause must not be negative")
    if args.crash + args.pause > args.workers - 1:
        problems.append("--crash + --pause must leave at least one healthy researcher")
    if args.engine == "prefect" and (args.crash or args.pause):
        problems.append("--crash and --pause apply to --engine processes only")
    if args.work_ms < 0:
        problems.append(f"--work-ms must not be negative (got {args.work_ms})")
    for option, value in (("--lines-per-chunk", args.lines_per_chunk), ("--timeout", args.timeout)):
        if value < 1:
            problems.append(f"{option} must be at least 1 (got {value:g})")
    try:
        validate_ttl(args.ttl, "--ttl")
    except ValidationError:
        problems.append(f"--ttl must be from {TTL_RANGE} seconds")
    for d in args.input or []:
        if not d.is_dir():
            problems.append(f"--input {d} is not a directory")
    if problems:
        raise ValidationError("; ".join(problems))
    return args
