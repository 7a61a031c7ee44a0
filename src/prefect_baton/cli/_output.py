"""Rendering of CLI results: JSON receipts for machines, Rich tables for humans, and the
fixed exit code of every error code.

A JSON receipt is one object on stdout::

    {"ok": true, "action": "lease.acquire", "status": "ok", "lease": {...}}
    {"ok": false, "action": "lease.acquire", "error": {"code": "CONFLICT", "message": "...",
     "expires_at": "..."}}

``status`` is ``ok``, ``replayed`` (the result came back from a stored idempotency receipt)
or ``no_change`` (a release that had already happened). In table mode the error is one line
on stderr instead.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from prefect_baton._exit import (
    EXIT_CODES,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    error_line,
    exit_code_for,
    one_line,
    visible,
)
from prefect_baton.models import Page, Receipt

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "OutputFormat",
    "Page",
    "RowView",
    "dump",
    "emit_error",
    "emit_ok",
    "emit_page",
    "exit_code_for",
    "exit_codes_help",
    "format_from_argv",
    "one_line",
    "status_of",
    "visible",
]


#: How a row of a list (its JSON data) reads in a table (``emit_ok``'s ``shown``).
RowView = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class OutputFormat(enum.StrEnum):
    """``--format``: ``table`` (Rich, for humans) or ``json`` (a receipt, for machines)."""

    table = "table"
    json = "json"


def format_from_argv(args: Sequence[str]) -> OutputFormat:
    """The output format named by ``--format`` among ``args`` (a ``baton`` command line; the
    last one wins), else ``BATON_FORMAT``, else ``table``: how to report an error that came
    before the options were parsed (``baton`` itself and ``baton demo``)."""
    fmt = os.environ.get("BATON_FORMAT", "table")
    for i, a in enumerate(args):
        if a == "--format" and i + 1 < len(args):
            fmt = args[i + 1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
    return OutputFormat.json if fmt.lower() == "json" else OutputFormat.table


def exit_codes_help() -> str:
    """The exit code table as text, for ``baton --help``."""
    rows = [f"{n:>3}  {code}" for code, n in EXIT_CODES.items()]
    rows.insert(2, "  2  usage error (missing option, bad value)")
    rows.append("  1  any other failure (audit violations, internal error)")
    return "Exit codes:\n" + "\n".join(rows)


def dump(obj: Any) -> Any:
    """JSON-ready form of a model, a list of models, or plain data."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list | tuple):
        return [dump(o) for o in obj]
    if isinstance(obj, dict):
        return {str(k): dump(v) for k, v in obj.items()}
    return obj


def status_of(obj: Any) -> str:
    """The receipt's top-level ``status`` for a returned model: ``replayed``, ``no_change``,
    ``expired`` for a release :class:`~prefect_baton.models.Receipt` of a lease that had
    run out before it was released (the holder's protection had lapsed: a script checking
    ``.status`` must not read it as a clean release), else ``ok``."""
    if getattr(obj, "replayed", False):
        return "replayed"
    if getattr(obj, "status", None) == "no_change":
        return "no_change"
    if isinstance(obj, Receipt) and obj.status == "expired":
        return "expired"
    return "ok"


def _console(*, err: bool = False) -> Console:
    # Made per call so a swapped sys.stdout (tests, redirection) is honoured; wide when
    # piped so ids are not folded.
    file = sys.stderr if err else sys.stdout
    probe = Console(file=file)
    width = None if probe.is_terminal else 200
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


def _cell(value: Any) -> Text:
    """The one rendering of a value in table output: ``-`` for ``None``, yes/no, a list
    joined by commas, a nested value as JSON, else its text; always a plain :class:`Text`
    (never parsed as Rich markup) with control characters made :func:`visible`, so a
    value another principal wrote cannot restyle, move or clear the reader's terminal."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, list | tuple):
        if all(not isinstance(v, dict | list) for v in value):
            text = ", ".join(str(v) for v in value) or "-"
        else:
            text = json.dumps(value, sort_keys=True)
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True)
    else:
        text = str(value)
    return Text(visible(text))


def _render_object(title: str, data: Mapping[str, Any], records: Collection[str] = ()) -> None:
    """A one-object table: a row per field of ``data``; each field of a nested record
    named in ``records`` (the lease of a release receipt) on a row of its own, named by its
    path (``lease.epoch``), instead of the whole record as JSON in one cell. Free-form JSON
    (a checkpoint's state, a handoff's parameters) stays JSON."""
    table = Table(title=Text(title), show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if key in records and isinstance(value, Mapping):
            for name, v in value.items():
                table.add_row(_cell(f"{key}.{name}"), _cell(v))
        else:
            table.add_row(_cell(key), _cell(value))
    _console().print(table)


def _records(value: Any) -> list[str]:
    """The fields of model ``value`` that hold a model themselves (a record such as the
    lease of a receipt), not free-form JSON."""
    if not isinstance(value, BaseModel):
        return []
    return [name for name, v in value if isinstance(v, BaseModel)]


def _render_rows(
    title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], empty: str | None
) -> None:
    if not rows:
        _console().print(Text(visible(f"{title}: {empty or 'none'}")))
        return
    table = Table(title=Text(f"{title} ({len(rows)})"), title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(col)) for col in columns))
    _console().print(table)


def emit_ok(
    fmt: OutputFormat,
    action: str,
    key: str,
    value: Any,
    *,
    status: str | None = None,
    columns: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    shown: RowView | None = None,
    empty: str | None = None,
) -> None:
    """Print a successful result.

    Args:
        fmt: the output format.
        action: ``group.command`` (e.g. ``lease.acquire``).
        key: the receipt key of the result (``lease``, ``handoffs``, ``info``, ...).
        value: a model, a list of models, or plain JSON data.
        status: ``ok``/``replayed``/``no_change``; default from the value.
        columns: for a list, the columns of the table.
        extra: more top-level receipt fields (JSON) or rows shown under the table.
        shown: how each row of a list (its JSON data), or the one object, reads in the
            table; the JSON receipt is the data as it is.
        empty: for an empty list, what the table format prints after ``action: `` instead
            of a table (``str``, e.g. ``no leases in org 'acme'``; default ``none``); the
            JSON receipt is the empty list.
    """
    data = dump(value)
    if status is None:
        status = "ok" if isinstance(value, list) else status_of(value)
    if fmt is OutputFormat.json:
        receipt: dict[str, Any] = {"ok": True, "action": action, "status": status, key: data}
        receipt.update(dump(dict(extra or {})))
        sys.stdout.write(json.dumps(receipt, sort_keys=False) + "\n")
        return
    title = action if status == "ok" else f"{action}: {status}"
    if isinstance(data, list):
        rows = [shown(row) for row in data] if shown is not None else data
        _render_rows(title, rows, columns or (list(data[0]) if data else []), empty)
    else:
        _render_object(title, shown(data) if shown is not None else data, _records(value))
    for name, v in (extra or {}).items():
        _console().print(Text(visible(f"{name}: {v}")))


def emit_page(
    fmt: OutputFormat,
    action: str,
    key: str,
    page: Page[Any],
    *,
    columns: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    shown: RowView | None = None,
    empty: str | None = None,
) -> None:
    """Print one page of a list: in JSON, the receipt of :func:`emit_ok` with a top-level
    ``next_cursor`` (``str`` or ``null``); as a table, the table on stdout and, when a next
    page exists, one line on stderr naming the ``--cursor`` that fetches it (stdout stays
    the table alone).

    Args:
        fmt: the output format.
        action: ``group.command`` (e.g. ``lease.list``).
        key: the receipt key of the rows (``leases``, ``handoffs``, ``outcomes``,
            ``keys``).
        page: the rows (models, or rows as mappings) and the next page's cursor (a
            :class:`~prefect_baton.models.Page` as the client's listing returns it:
            a cursor only when a row follows the page).
        columns: the columns of the table (default: the first row's fields).
        extra: further top-level fields of the JSON receipt (a mapping; e.g. the
            ``next_after`` of ``events.tail``), before ``next_cursor``; a table shows none.
        shown: how each row reads in the table (see :func:`emit_ok`).
        empty: what the table format says of an empty page (see :func:`emit_ok`).
    """
    rows = list(page)
    if fmt is OutputFormat.json:
        fields = {**(extra or {}), "next_cursor": page.next_cursor}
        emit_ok(fmt, action, key, rows, columns=columns, extra=fields)
        return
    emit_ok(fmt, action, key, rows, columns=columns, shown=shown, empty=empty)
    if page.next_cursor is not None:
        sys.stdout.flush()
        sys.stderr.write(
            f"baton {action.replace('.', ' ')}: more rows; next page: --cursor {page.next_cursor}\n"
        )
        sys.stderr.flush()


def emit_error(
    fmt: OutputFormat,
    action: str,
    error: Mapping[str, Any],
    *,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Print an error (``{"code", "message", ...}``) and return its exit status.

    JSON mode: the receipt (plus ``extra`` top-level fields) goes to stdout. Table mode:
    one line on stderr.
    """
    err = dump(dict(error))
    code = str(err.get("code", "ERROR"))
    exit_code = exit_code_for(code)
    if fmt is OutputFormat.json:
        receipt = {"ok": False, "action": action, "error": err}
        receipt.update(dump(dict(extra or {})))
        sys.stdout.write(json.dumps(receipt) + "\n")
        sys.stdout.flush()
    else:
        who = "baton" if action == "baton" else f"baton {action.replace('.', ' ')}"
        sys.stderr.write(error_line(who, err))
        sys.stderr.flush()
    return exit_code
