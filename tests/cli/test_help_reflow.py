"""Command help is reflowed from the docstrings: a paragraph is one run of text that Rich
wraps to the terminal, not source-width lines broken again at 80 columns."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from prefect_baton._rules.validation import TTL_RANGE
from prefect_baton.cli import app, reflow


def test_reflow_joins_paragraph_lines_and_keeps_paragraphs_and_list_items() -> None:
    doc = """First line.

    A paragraph written
    over three
    source lines.

    Items:
    - one
    - two
    """
    assert reflow(doc) == (
        "First line.\n\nA paragraph written over three source lines.\n\nItems:\n- one\n- two"
    )
    assert reflow(None) is None


@pytest.mark.parametrize("command", ["mcp", "reconcile", "serve"])
def test_long_help_paragraphs_fill_the_width(command: str) -> None:
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}).output
    lines = [line.rstrip() for line in out.splitlines()]
    body = lines[: next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))]
    # A paragraph wrapped by Rich leaves no short line followed by a continuation that
    # would have fitted on it: every line but a paragraph's last is so full that the next
    # line's first word would have taken it to 80 columns (Rich fills them to 79 here).
    for line, following in itertools.pairwise(body):
        if line.strip() and following.strip() and "Usage:" not in line:
            assert len(line) + 1 + len(following.split()[0]) >= 80, (line, following)


def test_mcp_help_names_the_key_command() -> None:
    out = CliRunner().invoke(app, ["mcp", "--help"], env={"COLUMNS": "200"}).output
    assert "baton keys create" in out
    assert "create_key" not in out


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree under ``command`` (a Typer command or group) with its
    argv path (lazily loaded groups included)."""
    yield path, command
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                yield from _commands(sub, (*path, name))


def test_bracketed_option_help_is_shown() -> None:
    """Text in square brackets in an option's help (``[default: user@host]``) reaches
    ``--help``: escaped, so that Rich does not take it for markup and drop it."""
    checked = 0
    for path, command in _commands(typer.main.get_command(app)):
        wanted = [
            part
            for p in command.params
            for part in re.findall(
                r"\[[^\]]*\]", (getattr(p, "help", None) or "").replace("\\[", "[")
            )
        ]
        if not wanted:
            continue
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        shown = " ".join(out.replace("│", " ").split())
        for part in wanted:
            assert " ".join(part.split()) in shown, (path, part)
            checked += 1
    assert checked >= 5, "the global options' defaults and keys create's are among them"


def test_lease_ttl_seconds_is_declared_alike_on_every_lease_command() -> None:
    """``--ttl-seconds`` of a lease (lease acquire, renew, transfer; the carried lease of
    handoff resolve) is declared once (``cli._options.lease_ttl``): every one reads
    ``<what> in seconds (integer, 10 to 86400[; default: ...]).``, required exactly where
    it has no default; checkpoint save's is a checkpoint lifetime instead."""
    found: dict[tuple[str, ...], Any] = {}
    for path, command in _commands(typer.main.get_command(app)):
        for p in command.params:
            if "--ttl-seconds" in getattr(p, "opts", ()):
                found[path] = p
    lease_paths = {
        ("lease", "acquire"),
        ("lease", "renew"),
        ("lease", "transfer"),
        ("handoff", "resolve"),
    }
    assert set(found) == lease_paths | {("checkpoint", "save")}
    shape = re.compile(
        rf"[A-Z][^,;()]* in seconds \(integer, {re.escape(TTL_RANGE)}(; default: [^()]+)?\)\."
    )
    for path in lease_paths:
        text = found[path].help
        match = shape.fullmatch(text)
        assert match is not None, (path, text)
        assert found[path].required is (match.group(1) is None), path
