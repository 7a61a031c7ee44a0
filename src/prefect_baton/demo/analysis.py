"""Real work for the demo: find the input files and analyse one in resumable chunks."""

from __future__ import annotations

import ast
import hashlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PACKAGES = ("json", "email", "http")


def default_inputs() -> list[Path]:
    """The directories of the running Python's ``json``, ``email`` and ``http`` packages."""
    out = []
    for name in DEFAULT_PACKAGES:
        mod = importlib.import_module(name)
        out.append(Path(next(iter(mod.__path__))))
    return out


def list_files(inputs: list[Path]) -> dict[str, Path]:
    """Map a stable resource id (``<input dir name>/<relative path>``) to each ``.py`` file
    under ``inputs``, sorted by id."""
    files: dict[str, Path] = {}
    for root in inputs:
        root = root.resolve()
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files[f"{root.name}/{path.relative_to(root).as_posix()}"] = path
    return dict(sorted(files.items()))


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of the file's bytes."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Chunk:
    """One slice of a file's lines: ``index`` (0-based), ``lines`` and its digest."""

    index: int
    total: int
    line_count: int
    digest: str


def chunks(path: Path, lines_per_chunk: int) -> Iterator[Chunk]:
    """Split the file into chunks of ``lines_per_chunk`` lines (at least one chunk)."""
    text = path.read_bytes().splitlines(keepends=True)
    total = max(1, (len(text) + lines_per_chunk - 1) // lines_per_chunk)
    for i in range(total):
        part = b"".join(text[i * lines_per_chunk : (i + 1) * lines_per_chunk])
        yield Chunk(
            index=i,
            total=total,
            line_count=len(text[i * lines_per_chunk : (i + 1) * lines_per_chunk]),
            digest=hashlib.sha256(part).hexdigest(),
        )


def finish(path: Path, chunk_digests: list[str], lines: int) -> dict[str, Any]:
    """The final analysis: whole-file sha256, line count, top-level definitions (``ast``)."""
    source = path.read_bytes()
    defs: list[str] = []
    try:
        tree = ast.parse(source, filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defs.append(node.name)
    except SyntaxError:
        pass
    return {
        "sha256": sha256_file(path),
        "lines": lines,
        "bytes": len(source),
        "chunk_digests": chunk_digests,
        "definitions": defs,
    }
