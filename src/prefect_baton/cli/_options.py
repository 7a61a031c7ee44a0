"""Command-line arguments and options that several ``baton`` commands declare alike.

Each is a :data:`typing.Annotated` alias, so one declaration (name, metavar, help text)
serves every command that takes it and the help texts cannot drift apart.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic_core import PydanticCustomError
from typer.models import ParameterInfo

from prefect_baton._rules.validation import LIFETIME_RANGE, TTL_RANGE

__all__ = [
    "POLL_INTERVAL_MAX_SECONDS",
    "Cursor",
    "Fence",
    "IdempotencyKey",
    "SubjectId",
    "compare_and_swap",
    "lease_ttl",
    "lifetime",
    "poll_interval",
    "principal_filter",
    "proof_key",
    "row_limit",
    "whole_numbers",
]

#: The longest ``--interval`` of a command that polls until stopped (seconds: one hour).
POLL_INTERVAL_MAX_SECONDS = 3600.0

#: ``SUBJECT_ID``: the subject a checkpoint, handoff or outcome is about.
SubjectId = Annotated[
    str, typer.Argument(metavar="SUBJECT_ID", help="Subject id (text, 1-256 characters).")
]

#: ``--idempotency-key`` of a write (lease renew, transfer, release and force-release;
#: checkpoint save and delete, handoff create, outcome record): a retry with the same key
#: replays the stored result.
IdempotencyKey = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        help="Retry key (text, 1-256 characters): rerunning the same command with the same "
        "key replays the stored result ('replayed') instead of acting twice; the key with "
        "another request exits 7 (IDEMPOTENCY_MISMATCH).",
    ),
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

#: ``--cursor`` of a paged listing command (``lease list``, ``handoff inbox`` and ``list``,
#: ``outcome list``, ``keys list``, ``events tail`` and ``list``).
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


def compare_and_swap(what: str, zero: str | None = None) -> typer.models.OptionInfo:
    """The ``--expected-version`` option of a write: compare-and-swap on a version (lease
    acquire, renew, transfer and release; checkpoint save).

    Args:
        what: what the version is of (``str``, e.g. ``lease``), as the help text names it.
        zero: what ``0`` asks for (``str``, e.g. ``never leased``), or ``None`` where the
            version cannot be 0.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[int | None, ...]``.
    """
    integer = "integer" if zero is None else f"integer; 0: {zero}"
    option: typer.models.OptionInfo = typer.Option(
        "--expected-version",
        help=f"Compare-and-swap: fail with VERSION_CONFLICT (exit 4) unless the {what} "
        f"version ({integer}) is this one.",
    )
    return option


def proof_key(lease: str) -> typer.models.OptionInfo:
    """The ``--execution-key`` option that goes with a lease id as the proof of holding the
    lease (lease renew, transfer and release; handoff create with ``--lease-id``).

    Args:
        lease: the lease it is presented with (``str``, e.g. ``the --lease-id lease``), as
            the help text names it.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[str | None, ...]``.
    """
    option: typer.models.OptionInfo = typer.Option(
        "--execution-key",
        help=f"Execution key (text) of {lease}, as given as --execution-key at acquire "
        "(handoff:<handoff id> for a lease taken over by accepting a handoff); omit only for "
        "a lease acquired without one.",
    )
    return option


def principal_filter(name: str, what: str) -> typer.models.OptionInfo:
    """The option of a listing that reads another principal's records, or everyone's with
    ``'*'`` (``--owner`` of lease list, ``--party`` of handoff inbox and list): only
    ``--role owner`` or ``admin`` may name anyone but the caller (else FORBIDDEN, exit 6),
    as the help text ends.

    Args:
        name: the option's name (``str``, e.g. ``--owner``).
        what: the help text's start (``str``): what the option selects, and what ``'*'``
            means; the access rule follows it.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[str | None, ...]``
        (``Annotated[str, ...]`` with a default).
    """
    option: typer.models.OptionInfo = typer.Option(
        name, help=f"{what} Others than yourself need --role owner or admin."
    )
    return option


def lease_ttl(what: str, default: str | None = None) -> typer.models.OptionInfo:
    """The ``--ttl-seconds`` option of a lease: its duration in whole seconds,
    :data:`~prefect_baton._rules.validation.TTL_RANGE` (lease acquire, renew and transfer;
    the lease a handoff carries, on handoff resolve).

    Args:
        what: what the duration is of (``str``, e.g. ``Lease duration``), beginning the
            help text ``<what> in seconds (integer, 10 to 86400).``
        default: what applies when the option is not given (``str``, e.g. ``the lease's
            TTL``), or ``None`` where the option is required.

    Returns:
        The :class:`typer.models.OptionInfo` to put in an ``Annotated[int, ...]``
        (``int | None`` with a ``default``).
    """
    tail = "" if default is None else f"; default: {default}"
    option: typer.models.OptionInfo = typer.Option(
        "--ttl-seconds",
        help=f"{what} in seconds (integer, {TTL_RANGE}{tail}).",
        show_default=False,
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


#: An integer as the command line spells it: optional sign, decimal digits (``_`` between
#: digits, as Python writes them), nothing else.
_INTEGER = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")


def _integer_parser(info: ParameterInfo) -> Callable[[Any], int]:
    """The parser of an integer argument or option: the text must be an integer
    (``60``, not ``60.0``, ``6e1`` or ``60.5``), within ``info.min`` .. ``info.max`` when
    the declaration gives them (a parser replaces Typer's own range check)."""
    low, high = info.min, info.max

    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _refused(f"must be an integer, got {value!r}")
        if isinstance(value, str) and not _INTEGER.fullmatch(value.strip()):
            raise _refused(f"must be an integer, got {value!r}")
        number = int(value)
        if (low is not None and number < low) or (high is not None and number > high):
            bounds = f"from {low:g}" if low is not None else ""
            if high is not None:
                bounds = f"{bounds} to {high:g}" if bounds else f"at most {high:g}"
            else:
                bounds = f"at least {low:g}"
            raise _refused(f"must be an integer {bounds}, got {number}")
        return number

    return parse


def _refused(message: str) -> PydanticCustomError:
    """The error a parser raises: Typer shows its message after ``Invalid value for
    '--name': `` (a ``ValueError`` would read ``Value error, ...``)."""
    return PydanticCustomError("int_parsing", message)


def _is_integer(annotation: Any) -> bool:
    """``int`` or ``int | None``."""
    if annotation is int:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation)) == {int, type(None)}
    return False


def whole_numbers(command: Callable[..., Any]) -> None:
    """Make every integer argument and option of ``command`` (a Typer command or callback,
    annotated ``int`` or ``int | None``) accept only integers: Typer converts through a lax
    pydantic ``TypeAdapter`` that takes ``60.0`` for 60. Anything else is a usage error,
    ``VALIDATION_ERROR`` (exit 2), before the command runs. Applied to every command where
    the ``baton`` app is assembled (:mod:`prefect_baton.cli`), so no integer option is left
    out; an option with a parser of its own keeps it.

    Raises:
        TypeError: an integer parameter declared without ``typer.Argument`` or
            ``typer.Option`` (no declaration to give the parser to).
    """
    hints = typing.get_type_hints(command, include_extras=True)
    # the evaluated annotations replace their text (``from __future__ import annotations``):
    # Typer would evaluate the text again, into new declarations without the parser
    annotations = inspect.unwrap(command).__annotations__
    for name, param in inspect.signature(command).parameters.items():
        hint = hints.get(name)
        infos: list[Any] = []
        if typing.get_origin(hint) is Annotated:
            base, *infos = typing.get_args(hint)
        else:
            base = hint
        if not _is_integer(base):
            continue
        if isinstance(param.default, ParameterInfo):
            infos.append(param.default)
        declared = [i for i in infos if isinstance(i, ParameterInfo)]
        if not declared:
            raise TypeError(
                f"integer parameter {name!r} of {command.__qualname__} has no typer.Argument "
                "or typer.Option to take the integer parser"
            )
        for info in declared:
            if info.parser is None:
                info.parser = _integer_parser(info)
        annotations[name] = hint
