"""The documentation site runs as written.

Every fenced ``python`` block of ``docs/*.md`` runs (the blocks of one page in order, as one
script, in a fresh temporary directory) unless the line before it is ``<!-- not-run -->``.
Every ``sh`` / ``console`` block whose first command calls ``baton`` (``baton ...``, or
``NAME=$(baton ...)`` keeping its output) runs (again one script per page, with
``set -euo pipefail``) against a temporary SQLite ledger; a block that calls ``baton`` further
down but not first must be marked ``<!-- not-run -->``.
``mkdocs build --strict`` must succeed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
NOT_RUN = "<!-- not-run -->"
PYTHON = {"python", "py"}
SHELL = {"sh", "console"}
#: Languages of blocks that are shown but never run (diagrams, config, output).
INERT = {"text", "mermaid", "yaml", "toml", "json"}
BIN = Path(sys.executable).parent

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)(?P<rest>.*)$")
#: A command that runs ``baton``: ``baton ...`` or ``NAME=$(baton ...)``.
_RUNS_BATON = re.compile(r"^(?:[A-Za-z_]\w*=\$\()?baton ")
_CALLS_BATON = re.compile(r"(?<![\w-])baton ")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    lang: str
    code: str
    not_run: bool

    @property
    def commands(self) -> list[str]:
        """Shell commands: every line of an ``sh`` block; ``$ `` lines of a ``console`` one."""
        lines = self.code.splitlines()
        if self.lang == "console":
            return [ln[2:] for ln in lines if ln.startswith("$ ")]
        return lines

    @property
    def runs_baton(self) -> bool:
        """An ``sh``/``console`` block whose first command is ``baton ...`` or
        ``NAME=$(baton ...)``."""
        first = next((c for c in self.commands if c.strip()), "")
        return self.lang in SHELL and _RUNS_BATON.match(first) is not None


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (indented ones too, e.g. inside admonitions)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        end = i + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            end += 1
        assert end < len(lines), f"{page.name}:{i + 1}: unclosed code fence"
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
        out.append(
            Block(
                page=page.name,
                line=i + 1,
                lang=m["lang"].lower(),
                code=textwrap.dedent("\n".join(body)) + "\n",
                not_run=prev == NOT_RUN,
            )
        )
        i = end + 1
    return out


def _pages_with(kind: str) -> list[Path]:
    pages = []
    for page in PAGES:
        blocks = blocks_of(page)
        if kind == "python" and any(b.lang in PYTHON and not b.not_run for b in blocks):
            pages.append(page)
        if kind == "baton" and any(b.runs_baton and not b.not_run for b in blocks):
            pages.append(page)
    return pages


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)
    env["PREFECT_HOME"] = str(tmp_path / ".prefect")
    return env


def test_docs_exist() -> None:
    """The site has its pages and each page's blocks parse."""
    names = {p.name for p in PAGES}
    expected = {"index.md", "quickstart.md", "concepts.md", "prefect.md", "operations.md"}
    expected |= {"semantics.md", "errors.md", "cli.md", "api.md"}
    assert expected <= names
    for page in PAGES:
        blocks_of(page)


def test_every_block_has_a_known_language() -> None:
    """Every fenced block is python, sh/console (run when it calls baton) or an inert kind."""
    for page in PAGES:
        for b in blocks_of(page):
            assert b.lang in PYTHON | SHELL | INERT, (
                f"{b.page}:{b.line}: fenced block with language {b.lang!r}; use one of "
                f"{sorted(PYTHON | SHELL | INERT)}"
            )


def test_every_shell_block_that_calls_baton_runs() -> None:
    """A sh/console block with a ``baton`` command anywhere runs with its page or is marked
    not-run: a walkthrough block that starts with another command is never skipped silently."""
    for page in PAGES:
        for b in blocks_of(page):
            if b.lang in SHELL and not b.not_run and any(map(_CALLS_BATON.search, b.commands)):
                assert b.runs_baton, (
                    f"{b.page}:{b.line}: this block calls baton but its first command does not "
                    f"(start it with `baton ...` or `NAME=$(baton ...)`, or mark it {NOT_RUN})"
                )


@pytest.mark.parametrize("page", _pages_with("python"), ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's python blocks, in order as one script, exit 0 in a fresh directory."""
    parts = []
    for b in blocks_of(page):
        if b.lang in PYTHON and not b.not_run:
            parts.append(f"# ---- {b.page}:{b.line}\n{b.code}")
    script = tmp_path / f"{page.stem}_blocks.py"
    script.write_text("\n".join(parts), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=work,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{page.name} blocks failed:\n{proc.stdout}\n{proc.stderr}"


def _run_twice(code: str, tmp_path: Path) -> list[str]:
    """Run ``code`` as a script twice in one fresh directory; each run's stdout (both must
    exit 0)."""
    script = tmp_path / "twice.py"
    script.write_text(code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    outputs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=_clean_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    return outputs


def test_concepts_blocks_run_twice_in_one_directory(tmp_path: Path) -> None:
    """concepts.md's blocks, one script, run again in the same directory: nothing the first
    run keeps (an idempotency key's receipt) trips the second."""
    code = "\n".join(
        b.code for b in blocks_of(DOCS / "concepts.md") if b.lang in PYTHON and not b.not_run
    )
    _run_twice(code, tmp_path)


def test_fencing_first_sample_runs_twice(tmp_path: Path) -> None:
    """fencing.md's first sample is self-contained: run twice in one directory, it gives
    the same result (nothing it writes persists to trip the second run)."""
    first = next(b for b in blocks_of(DOCS / "fencing.md") if b.lang in PYTHON)
    outputs = _run_twice(first.code, tmp_path)
    assert outputs[0] == outputs[1]
    assert "('checkout', '2.0')" in outputs[1]


@pytest.mark.parametrize("page", _pages_with("baton"), ids=lambda p: p.name)
def test_baton_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's baton shell blocks, in order as one bash script, exit 0 on a temp ledger."""
    parts = ["set -euo pipefail"]
    for b in blocks_of(page):
        if b.runs_baton and not b.not_run:
            parts.append(f"# ---- {b.page}:{b.line}\n" + "\n".join(b.commands))
    script = tmp_path / f"{page.stem}_blocks.sh"
    script.write_text("\n".join(parts) + "\n", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = _clean_env(tmp_path)
    env["BATON_LEDGER_URL"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{page.name} shell blocks failed:\n{proc.stdout}\n{proc.stderr}"


def test_quickstart_starts_with_the_readme_commands() -> None:
    """The quickstart's first shell block is exactly the README's two set-up commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    readme_cmds = re.findall(r"^(make \w+)", setup, flags=re.M)
    first_sh = next(b for b in blocks_of(DOCS / "quickstart.md") if b.lang in SHELL)
    cmds = [c.split("#", 1)[0].strip() for c in first_sh.commands if c.strip()]
    assert cmds == readme_cmds == ["make demo", "make test"]


def test_semantics_table_covers_every_lease_operation() -> None:
    """Every public LeaseAPI method has a row in the semantics table."""
    from prefect_baton import LeaseAPI

    text = (DOCS / "semantics.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)", text, flags=re.M)}
    methods = {n for n in vars(LeaseAPI) if not n.startswith("_") and callable(vars(LeaseAPI)[n])}
    assert methods <= rows, f"missing rows: {sorted(methods - rows)}"


def test_error_page_lists_every_code_and_exit_status() -> None:
    """The error page gives every error code, those of the REST API's envelope included,
    and the exit status the CLI uses for it; the REST page gives each envelope code's
    HTTP status."""
    from prefect_baton.cli._output import EXIT_CODES
    from prefect_baton.errors import ERROR_CODES
    from prefect_baton.rest import STATUS_BY_CODE

    text = (DOCS / "errors.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+?) \|", text, flags=re.M))
    assert set(ERROR_CODES) | set(STATUS_BY_CODE) <= set(table)
    for code, status in EXIT_CODES.items():
        if code != "OK":
            assert table.get(code) == str(status), code
    rest = (DOCS / "rest.md").read_text(encoding="utf-8")
    by_status = dict(re.findall(r"^\| (\d{3}) \| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \|", rest, flags=re.M))
    for code, http_status in STATUS_BY_CODE.items():
        assert f"`{code}`" in by_status.get(str(http_status), ""), code


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds and renders the CLI and API references."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("baton lease acquire", "baton handoff resolve", "baton checkpoint save"):
        assert command in cli
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("LeaseAPI", "CheckpointAPI", "LeaseKeeper", "StaleFenceError", "accept_handoff"):
        assert name in api


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_prefect_setup_warns_that_the_default_ledger_follows_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Prefect guide's set-up says the default ledger is under each worker's working
    directory (so workers started elsewhere never exclude each other) and what to set."""
    from prefect_baton._settings import default_ledger_url

    monkeypatch.chdir(tmp_path)
    assert default_ledger_url() == f"sqlite:///{tmp_path / '.baton' / 'ledger.db'}"
    setup = " ".join(_section("prefect.md", "Configuration in Prefect").split())
    assert "`./.baton/ledger.db` under **its working directory**" in setup
    assert "never see each other's leases" in setup
    for advice in ("`BATON_LEDGER_URL`", "`ledger_url`", "PostgreSQL"):
        assert advice in setup, advice


@pytest.mark.parametrize(
    ("page", "promise"),
    [
        ("concepts.md", "not even after the recipient released it."),
        ("prefect.md", "even after the recipient released the resource,"),
    ],
)
def test_the_handed_off_key_promise_states_its_time_bound(page: str, promise: str) -> None:
    """Where a page promises that a handed-off execution key is refused even after the
    recipient released the resource, it bounds that by the receipt retention (past it the key
    acquires again: tests/unit/test_receipt_retention.py) and says what to set."""
    text = " ".join((DOCS / page).read_text(encoding="utf-8").split())
    assert promise in text
    after = text.split(promise, 1)[1][:700]
    assert "`BATON_RECEIPT_RETENTION_SECONDS`" in after
    assert "operations.md#receipt-retention" in after
    assert "acquires the resource again" in after
