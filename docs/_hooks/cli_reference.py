"""MkDocs hook: fills the CLI reference page from the Typer app at build time.

It runs ``python -m typer prefect_baton.cli utils docs --name baton`` with the interpreter
that runs MkDocs, so the page always matches the installed ``baton`` command. A failure to
generate fails the build instead of leaving the page empty.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

MARKER = "<!-- baton-cli-reference -->"
_EXIT_ROW = re.compile(r"^\s+\d+\s+\S")


def generate() -> str:
    """The Markdown of every ``baton`` command, headings one level below the page title."""
    proc = subprocess.run(
        [sys.executable, "-m", "typer", "prefect_baton.cli", "utils", "docs", "--name", "baton"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"typer utils docs failed ({proc.returncode}): {proc.stderr.strip()}")
    out: list[str] = []
    lines = proc.stdout.splitlines()
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            line = "#" + line
        elif not in_fence and line.strip() == "Exit codes:":
            # The root command's epilog: keep its table as preformatted text.
            rows = [line]
            while i + 1 < len(lines) and _EXIT_ROW.match(lines[i + 1]):
                i += 1
                rows.append(lines[i])
            out += ["```text", *rows, "```"]
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker on the CLI page with the generated reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, generate())
