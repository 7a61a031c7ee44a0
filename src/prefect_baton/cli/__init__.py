"""The ``baton`` command line: every operation of prefect-baton, with Rich tables for
humans and JSON receipts (``--format json``) for machines.

Sub-commands are registered in :data:`SUB_APPS` and :data:`COMMANDS`; adding one (e.g.
``baton reconcile``) is one line there.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from prefect_baton import __version__
from prefect_baton.cli import (
    checkpoints,
    db,
    demo,
    events,
    handoffs,
    keys,
    leases,
    outcomes,
    reconcile,
    serve,
    timeline,
    ui,
)
from prefect_baton.cli._options import whole_numbers
from prefect_baton.cli._output import (
    EXIT_CODES,
    EXIT_FAILURE,
    EXIT_USAGE,
    OutputFormat,
    emit_error,
    exit_codes_help,
    format_from_argv,
    one_line,
)
from prefect_baton.cli._state import CliState
from prefect_baton.cli.mcp import mcp as mcp_command
from prefect_baton.errors import BatonError, as_baton_error

__all__ = ["COMMANDS", "EXIT_CODES", "SUB_APPS", "app", "hoist_global_options", "main"]


def _click_exceptions() -> Any:
    # Typer >= 0.2x vendors Click as ``typer._click``; older releases depend on Click.
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - older Typer
        return importlib.import_module("click.exceptions")


_CLICK = _click_exceptions()
_NO_ARGS_IS_HELP: Any = getattr(_CLICK, "NoArgsIsHelpError", None)


def _action_of(command_path: str) -> str:
    parts = command_path.split()[1:]
    return ".".join(parts) or "baton"


#: Global options that take a value; they may also follow the command (seed 004 style:
#: ``baton lease inspect deploy svc --format json``) and are moved in front of it.
GLOBAL_VALUE_OPTIONS = frozenset(
    {"--org", "--principal", "--role", "--ledger-url", "--redis-url", "--format"}
)


def hoist_global_options(argv: list[str]) -> list[str]:
    """Move global options given after the command in front of it (later ones win).

    Commands that forward their arguments (``demo``) are left alone, and so is anything
    after ``--``.

    Raises:
        click.UsageError: a global option that takes a value ends the command line
            (``baton lease inspect t r --org``), as click says of one before the command.
    """
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        i += 2 if argv[i] in GLOBAL_VALUE_OPTIONS else 1
    if i >= len(argv) or argv[i] in _pass_through_commands():
        return argv
    hoisted: list[str] = []
    kept: list[str] = []
    rest = argv[i + 1 :]
    j = 0
    while j < len(rest):
        tok = rest[j]
        if tok == "--":
            kept += rest[j:]
            break
        if tok in GLOBAL_VALUE_OPTIONS:
            if j + 1 == len(rest):
                raise _CLICK.UsageError(f"Option '{tok}' requires an argument.")
            hoisted += rest[j : j + 2]
            j += 2
            continue
        if "=" in tok and tok.split("=", 1)[0] in GLOBAL_VALUE_OPTIONS:
            hoisted.append(tok)
        else:
            kept.append(tok)
        j += 1
    return [*argv[:i], *hoisted, argv[i], *kept]


def _pass_through_commands() -> set[str]:
    return {
        name
        for name, _fn, settings in COMMANDS
        if settings and settings.get("ignore_unknown_options")
    }


class BatonGroup(TyperGroup):
    """The root command: turns every failure into an error receipt and a fixed exit
    status (never a traceback), in the Typer runner and on the real command line alike."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv = hoist_global_options(argv)
        except _CLICK.UsageError as exc:
            code = self._usage_error(exc, argv)
        else:
            code = self._run(argv, prog_name or "baton", complete_var, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, argv: list[str], prog_name: str, complete_var: str | None, **extra: Any) -> int:
        try:
            rv = super().main(
                args=argv,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except _CLICK.ClickException as exc:
            if _NO_ARGS_IS_HELP is not None and isinstance(exc, _NO_ARGS_IS_HELP):
                exc.show()
                return EXIT_USAGE
            return self._usage_error(exc, argv)
        except typer.Abort:
            sys.stderr.write("baton: aborted\n")
            return EXIT_FAILURE
        except BatonError as exc:
            return emit_error(format_from_argv(argv), "baton", exc.to_dict())
        except BrokenPipeError:
            return _stdout_gone()
        except SystemExit as exc:  # Typer exits (1) on EPIPE even when not standalone
            if exc.code is None or isinstance(exc.code, int):
                return int(exc.code or 0)
            return EXIT_FAILURE
        except Exception as exc:
            if os.environ.get("BATON_CLI_TRACEBACK") == "1":
                raise
            return emit_error(format_from_argv(argv), "baton", as_baton_error(exc).to_dict())

    def _usage_error(self, exc: Any, argv: list[str]) -> int:
        ctx = getattr(exc, "ctx", None)
        obj = ctx.find_root().obj if ctx is not None else None
        fmt = obj.format if isinstance(obj, CliState) else format_from_argv(argv)
        # Click's option parser raises some errors (an option missing its value) without
        # a context: the command is then named from argv.
        path = ctx.command_path if ctx is not None else self._command_path(argv)
        action = _action_of(path)
        _drop_pydantic_prefix(exc)
        _suggest_options(exc)
        message = one_line(exc.format_message())
        if fmt is OutputFormat.table and path != "baton":
            message += f" (see '{path} --help')"
        emit_error(fmt, action, {"code": "VALIDATION_ERROR", "message": message})
        code = getattr(exc, "exit_code", EXIT_USAGE)
        return code if isinstance(code, int) else EXIT_USAGE

    def _command_path(self, argv: list[str]) -> str:
        """``baton`` and the (sub)command names ``argv`` gives after the global options
        (``"baton lease renew"``); ``"baton"`` when it names none."""
        path = ["baton"]
        i = 0
        while i < len(argv) and argv[i].startswith("-"):
            i += 2 if argv[i] in GLOBAL_VALUE_OPTIONS else 1
        commands: Any = self.commands
        while i < len(argv) and isinstance(commands, dict) and argv[i] in commands:
            path.append(argv[i])
            commands = getattr(commands[argv[i]], "commands", None)  # a group's, else None
            i += 1
        return " ".join(path)


#: The start pydantic gives the message of a ``ValueError`` raised while Typer converts a
#: value (``'yaml' is not one of 'table', 'json'.``).
_PYDANTIC_VALUE_ERROR = "Value error, "


def _drop_pydantic_prefix(exc: Any) -> None:
    """Remove pydantic's ``Value error, `` from the start of a usage error's message (the
    part after Click's ``Invalid value for '--name': ``), in place."""
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message.startswith(_PYDANTIC_VALUE_ERROR):
        exc.message = message[len(_PYDANTIC_VALUE_ERROR) :]


def closest_options(name: str, options: Sequence[str]) -> list[str]:
    """The ``options`` (long names, ``--ttl-seconds``) a mistyped option ``name`` may have
    meant: those it begins (``--ttl`` for ``--ttl-seconds``, at least two letters after
    ``--``), and those close to it in spelling (:func:`difflib.get_close_matches`, as Click
    suggests them), sorted."""
    prefix = [o for o in options if len(name) > 3 and o != name and o.startswith(name)]
    return sorted({*prefix, *difflib.get_close_matches(name, options)})


def _suggest_options(exc: Any) -> None:
    """Make an unknown option's error (Click's ``NoSuchOption``) suggest the closest
    visible options of its command (:func:`closest_options`), in place. Click suggests only
    by spelling, over every name the parser knows (hidden ones included), so ``--ttl``
    got nothing although ``--ttl-seconds`` starts with it."""
    ctx = getattr(exc, "ctx", None)
    if not isinstance(exc, _CLICK.NoSuchOption) or ctx is None:
        return
    names = [
        opt
        for param in ctx.command.get_params(ctx)
        if not getattr(param, "hidden", False)
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    ]
    exc.possibilities = closest_options(exc.option_name, names)


def _stdout_gone() -> int:
    """stdout was closed by the reader (``| head``): stop quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_FAILURE


app = typer.Typer(
    name="baton",
    cls=BatonGroup,
    help="Leases with fencing tokens, checkpoints, handoffs and outcomes on a shared ledger.\n\n"
    "Global options default to the BATON_* environment (BATON_ORG, BATON_PRINCIPAL, "
    "BATON_ROLE, BATON_LEDGER_URL, BATON_REDIS_URL, BATON_FORMAT) and may also follow the "
    "command: baton lease inspect deploy svc --format json. baton demo is the exception: "
    "it runs in a new org of its own, so after demo only --format, --ledger-url and "
    "--redis-url are taken (see baton demo --help).\n\n"
    "With BATON_API_URL and BATON_API_KEY (a bearer key from baton keys create) and no "
    "--ledger-url or --redis-url flag, commands run through that REST API (baton serve) as "
    "the key's principal, as Baton() does in Python, even when BATON_LEDGER_URL or "
    "BATON_REDIS_URL is set too; baton keys, db, audit, serve, ui, reconcile and mcp "
    "--transport http act on a ledger and need --ledger-url or BATON_LEDGER_URL then.",
    epilog=exit_codes_help(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

#: ``(name, Typer app)`` of every command group; add one line to add a group.
SUB_APPS: list[tuple[str, typer.Typer]] = [
    ("lease", leases.app),
    ("handoff", handoffs.app),
    ("checkpoint", checkpoints.app),
    ("outcome", outcomes.app),
    ("events", events.app),
    ("db", db.app),
    ("keys", keys.app),
]

#: ``(name, function, context_settings)`` of every top-level command.
COMMANDS: list[tuple[str, Callable[..., None], dict[str, Any] | None]] = [
    ("audit", db.audit, None),
    ("demo", demo.demo, demo.DEMO_CONTEXT),
    ("timeline", timeline.timeline, None),
    ("reconcile", reconcile.reconcile, None),
    ("serve", serve.serve, None),
    ("ui", ui.ui, None),
    ("mcp", mcp_command, None),
]


def reflow(doc: str | None) -> str | None:
    """A docstring as command help: the lines of each paragraph joined into one, so Rich
    wraps them to the terminal (in ``rich`` markup mode every line break of a docstring is
    kept, which left source-width lines broken again at 80 columns). Lines starting a list
    item (``-``, ``*``) stay on their own line."""
    if not doc:
        return doc
    paragraphs = []
    for block in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in block.splitlines():
            text = line.strip()
            if lines and not text.startswith(("- ", "* ")):
                lines[-1] += " " + text
            else:
                lines.append(text)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


for _name, _sub in SUB_APPS:
    for _info in _sub.registered_commands:
        if _info.callback is not None:
            whole_numbers(_info.callback)
            if _info.help is None:
                _info.help = reflow(_info.callback.__doc__)
    app.add_typer(_sub, name=_name)
for _name, _fn, _settings in COMMANDS:
    whole_numbers(_fn)
    app.command(_name, context_settings=_settings, help=reflow(_fn.__doc__))(_fn)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"baton (prefect-baton) {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    org: Annotated[
        str | None,
        typer.Option("--org", envvar="BATON_ORG", help="Organization (text). \\[default: default]"),
    ] = None,
    principal: Annotated[
        str | None,
        typer.Option(
            "--principal",
            envvar="BATON_PRINCIPAL",
            help="Acting principal (text). \\[default: user@host]",
        ),
    ] = None,
    role: Annotated[
        str | None,
        typer.Option(
            "--role", envvar="BATON_ROLE", help="Role: agent, owner or admin. \\[default: agent]"
        ),
    ] = None,
    ledger_url: Annotated[
        str | None,
        typer.Option(
            "--ledger-url",
            envvar="BATON_LEDGER_URL",
            help="Ledger URL: sqlite:///path or postgresql://... "
            "\\[default: sqlite:///./.baton/ledger.db]",
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            envvar="BATON_REDIS_URL",
            help="Redis URL: hold leases on the Redis fast path (redis://host:port/db); "
            "without it the ledger holds them.",
        ),
    ] = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            envvar="BATON_FORMAT",
            case_sensitive=False,
            help="Output: 'table' for humans or 'json' receipts for machines.",
        ),
    ] = OutputFormat.table,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Leases with fencing tokens, checkpoints, handoffs and outcomes on a shared ledger."""
    st = CliState(
        org=org,
        principal=principal,
        role=role,
        # Only the flags choose the store; BATON_LEDGER_URL and BATON_REDIS_URL reach the
        # client through its settings, as they reach Baton() in Python: so that one
        # environment with BATON_API_URL picks the same store on both (the REST API).
        ledger_url=_flag(ctx, "ledger_url", ledger_url),
        redis_url=_flag(ctx, "redis_url", redis_url),
        format=fmt,
    )
    ctx.obj = st
    ctx.call_on_close(st.close)


def _flag(ctx: typer.Context, name: str, value: str | None) -> str | None:
    """``value`` of the root option ``name`` when it was given on the command line, else
    ``None`` (its environment variable, if any, is read by the client's settings)."""
    source = ctx.get_parameter_source(name)  # Typer's own click: compare by name
    return value if source is not None and source.name == "COMMANDLINE" else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``baton`` with ``argv`` (default ``sys.argv[1:]``) and return its exit status."""
    command = typer.main.get_command(app)
    code = command.main(args=argv, prog_name="baton", standalone_mode=False)
    return int(code) if isinstance(code, int) else 0
