"""The CLI reference page, ``docs/cli.md``, generated from the Typer app.

The page is committed whole, so it reads the same on GitHub as on the site. ``render()`` is
the one function that produces it: ``python docs/_hooks/cli_reference.py`` (``make
cli-docs``) writes it to ``docs/cli.md``. As an MkDocs hook this module fails the build when
the committed page differs from what the installed ``baton`` command generates, and
``tests/docs/test_cli_reference.py`` fails on the same check.

The text comes from ``python -m typer prefect_baton.cli utils docs --name baton``, run with
the interpreter that runs this module, at a fixed width, without colours and without the
caller's ``BATON_*`` environment, so the same app always gives the same bytes. Typer writes
help text HTML-escaped (``&#x27;`` for ``'``); the page carries it unescaped, except a ``<``
that would open an HTML tag and a ``&`` that would start an entity. ``baton demo`` parses
its own options (argparse, ``prefect_baton.demo.options.parser``), so its section shows that
parser's help, made the same way.
"""

from __future__ import annotations

import difflib
import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[1] / "cli.md"
REMEDY = "run `make cli-docs` and commit docs/cli.md"
HEADER = (
    "# CLI reference\n\n"
    "Every `baton` command, generated from the Typer app (`prefect_baton.cli`) by\n"
    "`make cli-docs`. Do not edit this page by hand: a test and the site build fail when it\n"
    "differs from what the app generates.\n\n"
)
_EXIT_ROW = re.compile(r"^\s+\d+\s+\S")
_ENV = {"COLUMNS": "100", "LINES": "50", "TERM": "dumb", "NO_COLOR": "1"}
_COLOUR = {"FORCE_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE"}
#: Text that Markdown would read as HTML once unescaped: a tag's ``<`` or an entity's ``&``.
_HTML_START = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?\w+;)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_DEMO_SECTION = "### `baton demo`\n"
_DEMO_HELP = "from prefect_baton.demo.options import parser; print(parser().format_help(), end='')"


def _run(what: str, args: list[str]) -> str:
    """The standard output of ``python <args>`` run at the fixed width, without colours
    and without ``BATON_*`` variables (str).

    Raises:
        RuntimeError: the command failed or printed nothing (``what`` names it).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_") and k not in _COLOUR}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, env={**env, **_ENV}
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _typer_docs() -> str:
    """The raw Markdown of ``typer ... utils docs`` (str).

    Raises:
        RuntimeError: the command failed or printed nothing.
    """
    args = ["-m", "typer", "prefect_baton.cli", "utils", "docs", "--name", "baton"]
    return _run("typer utils docs", args)


def _unescape(line: str) -> str:
    """``line`` of Markdown text with Typer's HTML escapes undone (str): a ``<`` that would
    open a tag (``<id>``) and a ``&`` that would start an entity stay escaped, and code spans
    are left as they are."""
    parts: list[str] = []
    start = 0
    for span in _CODE_SPAN.finditer(line):
        parts.append(_unescape_text(line[start : span.start()]))
        parts.append(span.group())
        start = span.end()
    parts.append(_unescape_text(line[start:]))
    return "".join(parts)


def _unescape_text(text: str) -> str:
    return _HTML_START.sub(lambda m: html.escape(m.group()), html.unescape(text))


def _with_demo_options(markdown: str) -> str:
    """``markdown`` with the option list of the ``baton demo`` section (Typer sees only
    ``--help``) replaced by the demo parser's help, as ``baton demo --help`` prints it (str).

    Raises:
        RuntimeError: the section or its option list is missing, or the help failed.
    """
    start = markdown.find(_DEMO_SECTION)
    end = markdown.find("\n### ", start + 1)
    head = "\n**Options**:\n\n"
    at = markdown.find(head, start, end)
    if start < 0 or end < 0 or at < 0:
        raise RuntimeError("docs/cli.md: no option list in the `baton demo` section")
    first = at + len(head)
    last = first
    while markdown.startswith("* ", last):
        last = markdown.index("\n", last) + 1
    demo_help = _run("the help of baton demo", ["-c", _DEMO_HELP]).rstrip()
    lines = [line.rstrip() for line in demo_help.splitlines()]
    options = "\n".join(["```text", *lines, "```", ""])
    intro = "\n**Options** (the demo's own parser; `baton demo --help` prints the same):\n\n"
    return markdown[:at] + intro + options + markdown[last:]


def generate() -> str:
    """The Markdown of every ``baton`` command, headings one level below the page title.

    Usage lines are ``text`` blocks (a synopsis such as ``baton [OPTIONS] COMMAND`` is not a
    command the docs tests should run); the root command's exit-code table stays
    preformatted, and so does the help of ``baton demo``'s own options. Help text is
    unescaped (:func:`_unescape`).

    Raises:
        RuntimeError: the Typer app could not be documented.
    """
    out: list[str] = []
    lines = _typer_docs().splitlines()
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if line.startswith("```"):
            if not in_fence and line == "```console":
                line = "```text"
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            line = "#" + _unescape(line)
        elif not in_fence and line.strip() == "Exit codes:":
            rows = [line]
            while i + 1 < len(lines) and _EXIT_ROW.match(lines[i + 1]):
                i += 1
                rows.append(lines[i].rstrip())
            out += ["```text", *(html.unescape(row) for row in rows), "```"]
            i += 1
            continue
        elif not in_fence:
            line = _unescape(line)
        out.append(line)
        i += 1
    while out and not out[-1]:
        out.pop()
    return _with_demo_options("\n".join(out) + "\n")


def render() -> str:
    """The whole text of ``docs/cli.md`` (str).

    Raises:
        RuntimeError: the Typer app could not be documented.
    """
    return HEADER + generate()


def stale(page: Path = PAGE) -> str | None:
    """Why ``page`` is not the current reference (str, with the start of a diff and what to
    run), or None when it is.

    Raises:
        RuntimeError: the Typer app could not be documented.
    """
    expected = render()
    actual = page.read_text(encoding="utf-8") if page.exists() else ""
    if actual == expected:
        return None
    diff = difflib.unified_diff(
        actual.splitlines(), expected.splitlines(), "committed", "generated", lineterm="", n=1
    )
    head = "\n".join(list(diff)[:30])
    return f"{page} is not the reference the Typer app generates; {REMEDY}.\n{head}"


def on_pre_build(config: Any) -> None:
    """MkDocs hook: fail the build when the committed CLI page is out of date.

    Raises:
        mkdocs.exceptions.PluginError: the page differs from the generated reference.
    """
    from mkdocs.exceptions import PluginError

    message = stale(Path(config["docs_dir"]) / "cli.md")
    if message is not None:
        raise PluginError(message)


def main() -> None:
    """Write the generated reference to ``docs/cli.md``."""
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
