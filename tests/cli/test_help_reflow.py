"""Command help is reflowed from the docstrings: a paragraph is one run of text that Rich
wraps to the terminal, not source-width lines broken again at 80 columns."""

from __future__ import annotations

import itertools

import pytest
from typer.testing import CliRunner

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
