"""Helpers for the CLI tests: run ``baton`` through Typer's runner or as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prefect_baton.cli import app

# Variables the runner clears so the developer's environment cannot change a test.
CLEAN_ENV: dict[str, str | None] = dict.fromkeys(
    (
        "BATON_ORG",
        "BATON_PRINCIPAL",
        "BATON_ROLE",
        "BATON_LEDGER_URL",
        "BATON_REDIS_URL",
        "BATON_FORMAT",
        "BATON_CLI_TRACEBACK",
        "BATON_API_URL",
        "BATON_API_KEY",
    )
)
BATON_SCRIPT = Path(sys.executable).with_name("baton")


@dataclass
class Run:
    """Result of one ``baton`` invocation."""

    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """stdout parsed as one JSON document."""
        return json.loads(self.stdout)

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


class Cli:
    """Runs ``baton`` with the global options of one ledger and org filled in."""

    def __init__(self, ledger_url: str, org: str) -> None:
        self.ledger_url = ledger_url
        self.org = org
        self.runner = CliRunner()

    def argv(self, args: tuple[str, ...], principal: str, role: str, fmt: str) -> list[str]:
        return [
            "--ledger-url",
            self.ledger_url,
            "--org",
            self.org,
            "--principal",
            principal,
            "--role",
            role,
            "--format",
            fmt,
            *args,
        ]

    def __call__(
        self,
        *args: str,
        principal: str = "alice",
        role: str = "agent",
        fmt: str = "json",
        input: str | None = None,
    ) -> Run:
        """Run in-process through :class:`typer.testing.CliRunner`."""
        result = self.runner.invoke(
            app, self.argv(args, principal, role, fmt), input=input, env=CLEAN_ENV
        )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Run(result.exit_code, result.stdout, result.stderr)

    def ok(self, *args: str, **kwargs: Any) -> Any:
        """Run a JSON command that must succeed; return its receipt."""
        run = self(*args, **kwargs)
        assert run.code == 0, run.text
        receipt = run.json
        assert receipt["ok"] is True
        return receipt

    def proc(
        self,
        *args: str,
        principal: str = "alice",
        role: str = "agent",
        fmt: str = "json",
        input: str | None = None,
    ) -> Run:
        """Run as a real process: ``python -m prefect_baton.cli``."""
        return run_process(
            [sys.executable, "-m", "prefect_baton.cli", *self.argv(args, principal, role, fmt)],
            input=input,
        )


def process_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_process(argv: list[str], *, input: str | None = None) -> Run:
    done = subprocess.run(
        argv, input=input, capture_output=True, text=True, env=process_env(), timeout=300
    )
    return Run(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def cli_org() -> str:
    """A fresh organization id per test."""
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> str:
    """A SQLite ledger file under the test's temporary directory, as an empty file (no
    tables yet: the first command migrates it; a command that only reads refuses a file
    that does not exist, tests/cli/test_app.py)."""
    path = tmp_path / "ledger.db"
    path.touch()
    return f"sqlite:///{path}"


@pytest.fixture
def cli(sqlite_ledger: str, cli_org: str) -> Cli:
    """``baton`` on a fresh SQLite ledger and org."""
    return Cli(sqlite_ledger, cli_org)


@pytest.fixture
def pg_cli(pg_url: str, org: str) -> Cli:
    """``baton`` on the PostgreSQL ledger, in a fresh org."""
    return Cli(pg_url, org)
