"""The committed CLI reference, ``docs/cli.md``, is what the Typer app generates now.

``docs/_hooks/cli_reference.py`` produces the page (``make cli-docs`` writes it; the MkDocs
hook refuses to build from a stale copy).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

from prefect_baton.cli import app

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "_hooks" / "cli_reference.py"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command_paths(command: Any, path: tuple[str, ...]) -> Iterator[str]:
    if not getattr(command, "hidden", False):
        yield " ".join(path)
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _command_paths(sub, (*path, name))


def test_cli_page_is_the_generated_reference(hook: ModuleType) -> None:
    """docs/cli.md is byte for byte what the current Typer app generates."""
    message = hook.stale()
    assert message is None, message


def test_cli_page_documents_every_command() -> None:
    """Every visible command and group of the app has a section with its usage line."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    paths = list(_command_paths(typer.main.get_command(app), ("baton",)))
    assert len(paths) > 30
    for path in paths:
        assert f"`{path}`\n" in text, f"no section for {path}"
        assert f"\n$ {path} [OPTIONS]" in text, f"no usage line for {path}"


def test_stale_page_names_the_make_target_and_fails_the_site_build(
    hook: ModuleType, tmp_path: Path
) -> None:
    """A page with one help string changed is reported with a diff and `make cli-docs`, and
    the MkDocs hook raises instead of building from it."""
    from mkdocs.exceptions import PluginError

    page = tmp_path / "cli.md"
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    old = "Organization (text)."
    assert old in committed
    page.write_text(committed.replace(old, "Organisation (text).", 1), encoding="utf-8")
    message = hook.stale(page)
    assert message is not None
    assert "make cli-docs" in message
    assert "-* `--org <str>`: Organisation (text)." in message
    assert "+* `--org <str>`: Organization (text)." in message
    with pytest.raises(PluginError, match="make cli-docs"):
        hook.on_pre_build({"docs_dir": str(tmp_path)})


def test_demo_section_shows_the_demo_parsers_options() -> None:
    """`baton demo` parses its own options (argparse), so its section carries that parser's
    help: every option of it, not only Typer's --help."""
    from prefect_baton.demo.options import parser

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("### `baton demo`\n", 1)[1].split("\n### ", 1)[0]
    assert "```text\nusage: baton demo [-h]" in section
    for action in parser()._actions:
        for flag in action.option_strings:
            assert flag in section, f"{flag} missing from the baton demo section"


def test_help_text_is_unescaped_except_what_markdown_would_read_as_html(
    hook: ModuleType,
) -> None:
    """Typer's HTML escapes are undone on the page ('key's', 'x>=1'), but a `<` that would
    open a tag or a `&` that would start an entity stays escaped, and code spans are kept."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "&#x27;" not in text
    assert "&gt;" not in text
    assert "as the key's principal" in text
    assert hook._unescape("a&#x27;s x&gt;=1 1&lt;=x &lt;id&gt; &amp;amp; `&lt;b&gt;`") == (
        "a's x>=1 1<=x &lt;id> &amp;amp; `&lt;b&gt;`"
    )
