"""``baton demo``: the four-role scenario on real files (``prefect_baton.demo``).

The options are parsed by ``prefect_baton.demo.main(argv)``; this command forwards them
unchanged and exits with its return code.
"""

from __future__ import annotations

import importlib

import typer

from prefect_baton.cli._output import EXIT_FAILURE, emit_error
from prefect_baton.cli._state import state

DEMO_CONTEXT = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": [],  # `baton demo --help` is answered by the demo itself
}

# Global options given explicitly before `demo` that are passed on to the demo:
# (parameter, the demo's option, its aliases). The demo takes the first three; it
# refuses --org, --principal and --role (exit 2) wherever they are given, as it runs in
# a new org of its own, so `baton --org x demo` is not silently run in another org.
_FORWARDED_GLOBALS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ledger_url", "--ledger-url", ()),
    ("redis_url", "--redis-url", ("--redis",)),
    ("fmt", "--format", ()),
    ("org", "--org", ()),
    ("principal", "--principal", ()),
    ("role", "--role", ()),
)


def _forwarded_globals(ctx: typer.Context, args: list[str]) -> list[str]:
    root = ctx.find_root()
    extra: list[str] = []
    for param, flag, aliases in _FORWARDED_GLOBALS:
        source = root.get_parameter_source(param)
        if source is None or source.name != "COMMANDLINE":
            continue
        if any(a == f or a.startswith(f + "=") for a in args for f in (flag, *aliases)):
            continue
        value = root.params.get(param)
        if value is not None:
            extra += [flag, str(getattr(value, "value", value))]
    return extra


def demo(ctx: typer.Context) -> None:
    """Run the four-role scenario (researchers, writer, operator, reviewer) on real files.

    Separate OS processes share one ledger, with real crashes and pauses (or, with
    --engine prefect, Prefect flows and deployments); prints a summary.

    Options, forwarded unchanged to the demo: --engine processes|prefect, --workers N
    (researchers), --input DIR (repeatable), --crash N (researchers SIGKILLed mid-file),
    --pause N (researchers SIGSTOPped past their TTL) and --ttl SECONDS (file lease TTL,
    integer seconds), these three with --engine processes only, --format table|json,
    --ledger-url URL, --redis-url URL (alias --redis); `baton demo --help` lists them all.
    A global --ledger-url, --redis-url or --format given before `demo` is passed on too;
    --org, --principal and --role do not apply (every run has a new org of its own) and
    exit 2 with VALIDATION_ERROR, before `demo` or after it (BATON_ORG, BATON_PRINCIPAL
    and BATON_ROLE are not used). Bad options exit 2 with VALIDATION_ERROR; an unreachable
    ledger or Redis exits 11 with UNAVAILABLE before any worker starts, and so does a role
    that does not finish within --timeout seconds. Exits 1 if a file is completed twice or
    left undone, the verdict is not accepted, or a --crash or --pause asked for was not
    injected (its researcher found no file left to start).
    """
    args = list(ctx.args)
    argv = _forwarded_globals(ctx, args) + args
    try:
        module = importlib.import_module("prefect_baton.demo")
    except ImportError as exc:
        st = state(ctx)
        raise typer.Exit(
            emit_error(
                st.format,
                "demo",
                {"code": "DEMO_UNAVAILABLE", "message": f"baton demo is not available: {exc}"},
            )
        ) from None
    try:
        code = module.main(argv)
    except SystemExit as exc:  # argparse exits on --help and on bad arguments
        code = exc.code
    raise typer.Exit(_exit_status(code))


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    return EXIT_FAILURE
