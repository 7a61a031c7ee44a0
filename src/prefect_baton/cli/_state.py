"""Per-invocation state of the ``baton`` command (global options, the lazily built client)
and the helpers every command shares: error guarding, the receipt of a command's result,
lease proofs, JSON input."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar, cast

import typer

from prefect_baton._client.leases import fence_by_id
from prefect_baton._client.sync import Baton
from prefect_baton._settings import BatonSettings, load_settings
from prefect_baton.cli._output import (
    EXIT_USAGE,
    OutputFormat,
    Page,
    RowView,
    emit_error,
    emit_ok,
    emit_page,
)
from prefect_baton.errors import BatonError, ValidationError
from prefect_baton.models import Lease
from prefect_baton.rest._json_body import DuplicateKey, unique_keys

__all__ = [
    "CliState",
    "command",
    "fail",
    "fence_lease",
    "guard",
    "nothing_found",
    "parse_evidence",
    "read_json_object",
    "warn_if_org_unused",
    "warn_unused_org",
]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class CliState:
    """Global options of one ``baton`` invocation; unset ones come from ``BATON_*``."""

    org: str | None = None
    principal: str | None = None
    role: str | None = None
    ledger_url: str | None = None
    redis_url: str | None = None  # the Redis fast path for leases (None: BATON_REDIS_URL)
    format: OutputFormat = OutputFormat.table
    action: str | None = None  # the running command's receipt action (set by guard)
    #: the running command only reads the ledger (``reads_only`` of :func:`guard`): on a
    #: SQLite ledger file that does not exist it is NOT_FOUND, instead of creating an empty
    #: ledger and answering from it (a mistyped path would read as "not held")
    reads_only: bool = False
    _settings: BatonSettings | None = field(default=None, repr=False)
    _client: Baton | None = field(default=None, repr=False)

    @property
    def json(self) -> bool:
        return self.format is OutputFormat.json

    def settings(self) -> BatonSettings:
        """The ``BATON_*`` settings. Raises :class:`ValidationError` on a bad variable."""
        if self._settings is None:
            self._settings = load_settings()
        return self._settings

    def resolved_ledger_url(self) -> str:
        """``--ledger-url``, else ``BATON_LEDGER_URL``, else ``./.baton/ledger.db``."""
        return self.ledger_url or self.settings().ledger_url

    def local_ledger_url(self) -> str:
        """The ledger of a command that acts on the ledger itself, never through the REST
        API (``baton keys``, ``baton db``, ``baton audit``, ``baton serve``, ``baton ui``,
        ``baton reconcile``, ``baton mcp --transport http``): :meth:`resolved_ledger_url`.

        Raises:
            ValidationError: ``BATON_API_URL`` is set and no ledger URL was given
                (``--ledger-url`` or ``BATON_LEDGER_URL``): every other command would run
                through the API, so the default ``./.baton/ledger.db`` is never what was
                meant (and would be created and migrated here).
            NotFoundError: a command that only reads (:attr:`reads_only`) on a SQLite
                ledger file that does not exist (nothing is created).
        """
        settings = self.settings()
        from_env = "ledger_url" in settings.model_fields_set  # BATON_LEDGER_URL
        if self.ledger_url is None and not from_env and settings.api_url is not None:
            raise ValidationError(
                "this command acts on the ledger directly, not through the REST API of "
                "BATON_API_URL: pass --ledger-url (or BATON_LEDGER_URL), or unset BATON_API_URL"
            )
        url = self.resolved_ledger_url()
        if self.reads_only:
            _require_ledger_file(url)
        return url

    def resolved_org(self) -> str:
        return self.org or self.settings().org

    def client(self) -> Baton:
        """The client, built on first use (this opens the ledger and applies migrations).

        Raises:
            NotFoundError: a command that only reads (:attr:`reads_only`) on a SQLite
                ledger file that does not exist (nothing is created; a client through the
                REST API reads no file).
        """
        if self._client is None:
            through_api = self.ledger_url is None and self.settings().api_url is not None
            if self.reads_only and not through_api:
                _require_ledger_file(self.resolved_ledger_url())
            self._client = Baton(
                ledger_url=self.ledger_url,
                org=self.org,
                principal=self.principal,
                role=self.role,
                settings=self.settings(),
                redis_url=self.redis_url,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _require_ledger_file(url: str) -> None:
    """:func:`~prefect_baton._stores.ledger.engine.require_ledger_file` of a command's
    ledger URL.

    Raises:
        NotFoundError: ``url`` is a SQLite URL whose file does not exist.
    """
    from prefect_baton._stores.ledger.engine import require_ledger_file  # SQLAlchemy: only here

    require_ledger_file(url, configured_by="--ledger-url (or BATON_LEDGER_URL)")


def state(ctx: typer.Context) -> CliState:
    """The :class:`CliState` the root callback stored on the context."""
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):  # a sub-app invoked on its own (tests, docs)
        obj = CliState()
        ctx.find_root().obj = obj
        ctx.find_root().call_on_close(obj.close)
    return obj


@contextmanager
def guard(
    ctx: typer.Context, action: str, *, reads_only: bool = False, org_reads: bool = False
) -> Iterator[CliState]:
    """Run a command body; a :class:`BatonError` becomes an error receipt and its exit
    status (``typer.Exit``), never a traceback.

    Args:
        ctx: the command's context.
        action: the receipt's ``action`` (``str``).
        reads_only: the command only reads the ledger (``bool``): on a SQLite ledger file
            that does not exist it is NOT_FOUND (:attr:`CliState.reads_only`) instead of
            creating the file. The first guard of an invocation decides.
        org_reads: the command reads one organization's records (``bool``): after it
            succeeds, :func:`warn_if_org_unused`.
    """
    st = state(ctx)
    if st.action is None:
        st.action = action
        st.reads_only = reads_only
    try:
        check_no_option_as_value(ctx)
        yield st
    except BatonError as exc:
        raise typer.Exit(emit_error(st.format, action, exc.to_dict())) from None
    if org_reads:
        warn_if_org_unused(st)


def check_no_option_as_value(ctx: typer.Context) -> None:
    """Refuse an option whose value is the name of an option of the command line (the
    command's own, ``--help`` or a global one): ``--execution-key --purpose x`` gives
    ``--execution-key`` the value ``--purpose``, which is never meant, and the lease would
    be recorded under that key.

    Raises:
        ValidationError: naming the option and the value it swallowed.
    """
    names = set(ctx.help_option_names)
    contexts = [c for c in (ctx, ctx.find_root()) if c.command is not None]
    for c in contexts:
        for param in c.command.params:
            names.update(param.opts)
            names.update(param.secondary_opts)
    for c in contexts:
        for param in c.command.params:
            if param.param_type_name != "option" or param.name is None:
                continue
            value = c.params.get(param.name)
            for v in value if isinstance(value, list | tuple) else [value]:
                if isinstance(v, str) and v in names:
                    raise ValidationError(
                        f"{param.opts[0]} took {v!r} as its value: {v} is an option, so "
                        f"{param.opts[0]} was given no value of its own"
                    )


def warn_if_org_unused(st: CliState) -> None:
    """Warn on stderr when nothing was ever recorded in the client's organization (its
    event stream is empty): a mistyped ``--org`` or ``BATON_ORG`` otherwise reads as a clean
    answer (``held no``, an empty list, an audit of 0 resources). Silent when the events
    cannot be read (another role's view, the ledger unreachable) or no client was made."""
    b = st._client
    if b is None:
        return
    try:
        if b.events.list(limit=1):
            return
    except BatonError:
        return
    warn_unused_org(b.org)


def warn_unused_org(org: str) -> None:
    """Write the warning of :func:`warn_if_org_unused` for ``org`` (``str``) to stderr."""
    sys.stderr.write(
        f"warning: nothing was ever recorded in org {org!r} on this ledger "
        "(a mistyped --org or BATON_ORG?)\n"
    )


def command(
    app: typer.Typer,
    action: str,
    key: str,
    *,
    columns: Sequence[str] | None = None,
    reads_only: bool = False,
    shown: Callable[[], RowView] | None = None,
    noun: str | None = None,
) -> Callable[[Callable[P, T]], Callable[P, None]]:
    """Decorator: register a command whose body returns its result, and print that result
    as the receipt of ``action`` (the shared tail of the commands that call the API once).

    The body is an ordinary Typer command (its parameters are the command's arguments and
    options, its docstring the help text) taking the context as ``ctx``; it runs under
    :func:`guard`, so a :class:`BatonError` it raises becomes the error receipt and its exit
    status, and what it returns is printed by :func:`~prefect_baton.cli._output.emit_ok`
    (a :class:`~prefect_baton.cli._output.Page`, one page of a paged list, by
    :func:`~prefect_baton.cli._output.emit_page`: with its ``next_cursor``).

    Args:
        app: the command group (``typer.Typer``) the command is registered in.
        action: ``group.command`` (``str``, e.g. ``lease.renew``): the receipt's
            ``action``, of the result and of an error alike; the command's name is the part
            after the first dot.
        key: the receipt key of the result (``str``: ``lease``, ``checkpoint``, ...).
        columns: for a list result (or a page), the columns of the table.
        reads_only: the command only reads the ledger (``bool``, :func:`guard`): NOT_FOUND
            on a SQLite ledger file that does not exist.
        shown: makes (once the result is in) how each row of a list result, or the one
            object, reads in the table (see :func:`~prefect_baton.cli._output.emit_ok`);
            JSON is unchanged.
        noun: what the rows of a list result are, in the table format's line for an
            empty list (``str``, default ``key``; :func:`nothing_found`).

    Returns:
        The decorator; it returns the registered command, which prints and returns ``None``.

    Raises:
        typer.Exit: from the registered command, with the error's exit status after the
            error receipt, when the body raises a :class:`BatonError`.
    """

    def register(body: Callable[P, T]) -> Callable[P, None]:
        @functools.wraps(body)
        def run(*args: P.args, **kwargs: P.kwargs) -> None:
            # Typer passes every parameter by name, the context as the body's ``ctx``.
            ctx = cast(typer.Context, kwargs["ctx"])
            with guard(ctx, action, reads_only=reads_only, org_reads=reads_only) as st:
                result = body(*args, **kwargs)
                view = shown() if shown is not None else None
                empty = None
                if isinstance(result, list) and not result and not st.json:  # table only
                    b = st.client()
                    empty = nothing_found(ctx, noun or key, b.org, b.principal)
                if isinstance(result, Page):
                    emit_page(
                        st.format, action, key, result, columns=columns, shown=view, empty=empty
                    )
                else:
                    emit_ok(
                        st.format, action, key, result, columns=columns, shown=view, empty=empty
                    )

        app.command(action.partition(".")[2])(run)
        return run

    return register


#: Parameters of a list command that do not narrow what it looks for.
_NOT_FILTERS = frozenset({"limit", "interval"})


def nothing_found(
    ctx: typer.Context, noun: str, org: str | None, principal: str | None = None
) -> str:
    """What the table format says of an empty list, naming where it looked, so that a
    mistyped ``--org`` or filter shows: ``no leases in org 'acme' as principal 'alice'
    (--resource-type 'deploy', --all)``.

    Args:
        ctx: the list command's context; its arguments and options given on the command
            line or by the environment (all but ``--limit``) are named as the filters.
        noun: what the rows are (``str``, e.g. ``leases``).
        org: the organization queried (``str``), or ``None`` for every org.
        principal: the acting principal (``str``) when what is listed depends on it.
    """
    where = f"in org {org!r}" if org is not None else "in any org"
    who = f" as principal {principal!r}" if principal is not None else ""
    given: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        source = ctx.get_parameter_source(name)  # Typer's own click: compare by name
        if name in _NOT_FILTERS or source is None or source.name.startswith("DEFAULT"):
            continue
        value = ctx.params.get(name)
        label = param.opts[0] if param.param_type_name == "option" else _metavar(param)
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            v = getattr(v, "value", v)  # an enum choice
            if isinstance(v, bool):
                given += [label] if v else []
            else:
                given.append(f"{label} {str(v)!r}")
    filters = f" ({', '.join(given)})" if given else ""
    return f"no {noun} {where}{who}{filters}"


def _metavar(param: Any) -> str:
    """How the help names argument ``param`` (``SUBJECT_ID``)."""
    metavar = getattr(param, "metavar", None)
    return metavar if isinstance(metavar, str) else str(param.name).upper()


def fail(st: CliState, action: str, code: str, message: str) -> NoReturn:
    """Report an error with ``code`` and exit with its status."""
    raise typer.Exit(emit_error(st.format, action, {"code": code, "message": message}))


def usage_error(st: CliState, action: str, message: str) -> NoReturn:
    """Report bad command-line input (``VALIDATION_ERROR``, exit 2)."""
    emit_error(st.format, action, {"code": "VALIDATION_ERROR", "message": message})
    raise typer.Exit(EXIT_USAGE)


def fence_lease(b: Baton, fence: str | None) -> Lease | None:
    """The lease a write is fenced with: the caller's lease ``fence`` (the ``--fence`` lease
    id, ``str``), or ``None`` without ``--fence``
    (:func:`~prefect_baton._client.leases.fence_by_id`, as the MCP tools build theirs).

    Raises:
        StaleFenceError: unknown, another org's or another principal's lease (the write is
            refused as the Python API refuses it).
    """
    return fence_by_id(b.leases, fence) if fence else None


def _read_bounded(source: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``source`` (a file path, or ``-`` for stdin): enough
    to tell a text within ``limit`` from one over it without reading the rest."""
    if source == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text-only stdin (an embedding that replaced sys.stdin)
            return sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
        data: bytes = stream.read(limit + 1)
        return data
    with Path(source).expanduser().open("rb") as f:
        return f.read(limit + 1)


def _read_text(source: str, what: str, limit: int, why: str) -> str:
    origin = "on stdin" if source == "-" else f"file {source!r}"
    try:
        data = _read_bounded(source, limit)
    except FileNotFoundError:
        raise ValidationError(
            f"{what} {source!r} is neither JSON text nor an existing file"
        ) from None
    except OSError as exc:
        raise ValidationError(f"cannot read {what} {origin}: {exc}") from None
    if len(data) > limit:
        raise ValidationError(f"{what} {origin} is over {limit} bytes{why}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"cannot read {what} {origin}: {exc}") from None


def _load_json(text: str, what: str) -> Any:
    """``text`` read as JSON, with the REST API's rule on repeated keys (an object naming a
    key twice is refused, not read as its last value: :func:`unique_keys`)."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise ValidationError(f"{what} is not valid JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValidationError(f"{what} is nested too deeply") from None
    except ValueError as exc:  # an integer over Python's int-str conversion limit
        raise ValidationError(f"{what} is not usable JSON: {exc}") from None


def _json_not_a_path(source: str) -> bool:
    """Whether ``source`` names no existing file and reads as JSON (a string, number,
    ``true``, ``false`` or ``null``): then it is refused as not an object, not as a missing
    file."""
    try:
        if Path(source).expanduser().exists():
            return False
        json.loads(source)
    except (OSError, ValueError, RecursionError):
        return False
    return True


def read_json_object(source: str, what: str, max_bytes: int, *, why: str = "") -> dict[str, Any]:
    """A JSON object from inline JSON text, a file path, or ``-`` (stdin).

    Text whose first non-blank character is ``{`` or ``[`` is taken as inline JSON. A file
    or stdin is read up to ``max_bytes`` + 1 bytes only, so an endless or huge input
    (``/dev/zero``, a stream) is refused without being read whole.

    Args:
        source: the inline JSON, the path, or ``-`` (``str``).
        what: the argument's name in messages (``str``, e.g. ``"state"``).
        max_bytes: the most bytes (``int``) of a file or of stdin that are read.
        why: appended to the message of an input over ``max_bytes`` (``str``, e.g. the
            limit's reason: ``"; ..."``).

    Raises:
        ValidationError: unreadable file, more than ``max_bytes`` bytes, not UTF-8,
            malformed JSON, or not a JSON object.
    """
    stripped = source.lstrip()
    if stripped[:1] in ("{", "[") or (source != "-" and _json_not_a_path(source)):
        text = source  # JSON text (another value than an object is refused below)
    else:
        text = _read_text(source, what, max_bytes, why)
    value = _load_json(text, what)
    if not isinstance(value, dict):
        raise ValidationError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


_EVIDENCE_KEYS = ("kind", "uri", "digest", "note")
_EVIDENCE_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_-]*=)")


def parse_evidence(values: list[str]) -> list[dict[str, Any]]:
    """Evidence items from ``--evidence`` values.

    Each value is ``kind=file,uri=...,digest=...,note=...`` (a comma splits before any
    ``name=``, so a misspelt key such as ``digets=`` is refused instead of being read as
    part of the value before it; a comma followed by anything else stays in the value, so
    URIs may contain commas), a JSON object, or a JSON list of objects (for a value that
    itself holds ``,name=``).

    Raises:
        ValidationError: malformed item or unknown key.
    """
    items: list[dict[str, Any]] = []
    for raw in values:
        stripped = raw.strip()
        if stripped[:1] in ("[", "{"):
            value = _load_json(stripped, "--evidence")
            batch = value if isinstance(value, list) else [value]
            for obj in batch:
                if not isinstance(obj, dict):
                    raise ValidationError("--evidence JSON must be an object or a list of objects")
                items.append(obj)
            continue
        item: dict[str, Any] = {}
        for part in _EVIDENCE_SPLIT.split(stripped):
            key, sep, val = part.partition("=")
            key = key.strip()
            if not sep or key not in _EVIDENCE_KEYS:
                raise ValidationError(
                    f"--evidence {raw!r}: expected key=value pairs with keys "
                    f"{', '.join(_EVIDENCE_KEYS)}"
                    + (f", got {key!r}" if sep else "")
                    + " (for a value holding ',name=', give the item as a JSON object)"
                )
            item[key] = val
        items.append(item)
    return items
