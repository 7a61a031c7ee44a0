"""Command-line arguments and options that several ``baton`` commands declare alike.

Each is a :data:`typing.Annotated` alias, so one declaration (name, metavar, help text)
serves every command that takes it and the help texts cannot drift apart.
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from prefect_baton._rules.validation import LIFETIME_RANGE

__all__ = [
    "POLL_INTERVAL_MAX_SECONDS",
    "Cursor",
    "Fence",
    "IdempotencyKey",
    "SubjectId",
    "lifetime",
    "poll_interval",
    "row_limit",
]

#: The longest ``--interval`` of a command that polls until stopped (seconds: one hour).
POLL_INTERVAL_MAX_SECONDS = 3600.0

#: ``SUBJECT_ID``: the subject a checkpoint, handoff or outcome is about.
SubjectId = Annotated[
    str, typer.Argument(metavar="SUBJECT_ID", help="Subject id (text, 1-256 characters).")
]

#: ``--idempotency-key`` of a record write (checkpoint save, handoff create, outcome
#: record): a retry with the same key replays the stored result.
IdempotencyKey = Annotated[
    str | None,
    typer.Option("--idempotency-key", help="Idempotency key (text); a retry replays."),
]

#: ``--fence``: the lease id a checkpoint or outcome write is fenced with.
Fence = Annotated[
    str | None,
    typer.Option(
        "--fence",
        help="Lease id (text) to fence the write with: rejected (exit 10, STALE_FENCE) "
        "once that lease generation is no longer current.",
    ),
]

#: ``--cursor`` of a paged listing command (``lease list``, ``handoff inbox``, ``outcome
#: list``, ``keys list``, ``events tail``).
Cursor = Annotated[
    str | None,
    typer.Option(
        "--cursor",
        help="Start after the page this cursor ends (opaque text, 'c1.'...): the "
        "'next_cursor' of the previous page's JSON receipt, or the --cursor that the table "
        "format's hint on stderr names. The last page has no next cursor. Give "
        "the same filters again. A malformed cursor, or one of another list, is "
        "VALIDATION_ERROR (exit 2).",
    ),
]


def row_limit(maximum: int) -> typer.models.OptionInfo:
    """The ``--limit`` option of a listing command.

    Args:
        maximum: the largest row count (``int``) the listing accepts; it is stated in the
            help text.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[int, ...]``.
    """
    option: typer.models.OptionInfo = typer.Option(
        "--limit", help=f"At most this many rows (integer, 1 to {maximum})."
    )
    return option


def lifetime(name: str, after: str) -> typer.models.OptionInfo:
    """An optional lifetime in whole seconds, 1 to
    :data:`~prefect_baton._rules.validation.CHECKPOINT_TTL_MAX_SECONDS` (366 days): the
    ``--ttl-seconds`` of a checkpoint save, the ``--expires-in-seconds`` of a handoff.

    Args:
        name: the option's name (``str``, e.g. ``--ttl-seconds``).
        after: what happens once that time has passed (``str``), ending the help text
            ``Seconds (integer, 1 to 31622400) after which <after>.``

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[int | None, ...]``.
    """
    option: typer.models.OptionInfo = typer.Option(
        name, help=f"Seconds (integer, {LIFETIME_RANGE}) after which {after}."
    )
    return option


def poll_interval(minimum: float, what: str) -> typer.models.OptionInfo:
    """The ``--interval`` option of a command that polls until stopped (``events tail
    --follow``, ``reconcile --follow``): a finite number of seconds from ``minimum`` to
    :data:`POLL_INTERVAL_MAX_SECONDS`. Anything else (``nan``, ``inf``, ``1e12``, a negative
    or too small number) is a usage error, ``VALIDATION_ERROR`` (exit 2), before anything
    runs.

    Args:
        minimum: the shortest interval (``float``, seconds), stated in the help text.
        what: the help text's start (``str``), e.g. ``With --follow: the pause between
            polls when idle``; the range follows it.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[float, ...]``.
    """

    def check(value: float) -> float:
        if not (math.isfinite(value) and minimum <= value <= POLL_INTERVAL_MAX_SECONDS):
            raise typer.BadParameter(
                f"must be a number of seconds from {minimum:g} to "
                f"{POLL_INTERVAL_MAX_SECONDS:g}, got {value:g}"
            )
        return value

    option: typer.models.OptionInfo = typer.Option(
        "--interval",
        callback=check,
        help=f"{what} (seconds, a number from {minimum:g} to {POLL_INTERVAL_MAX_SECONDS:g}).",
    )
    return option
