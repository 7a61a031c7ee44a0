"""``baton db upgrade|current`` (Alembic migrations of the ledger) and ``baton audit``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from .._ledger.engine import Engines, current_revision, head_revision, make_engines, upgrade
from ..audit import audit_ledger
from ..errors import UnavailableError
from ._output import EXIT_FAILURE, emit_error, emit_ok
from ._state import CliState, guard

app = typer.Typer(
    name="db",
    help="Ledger database migrations (Alembic).",
    no_args_is_help=True,
)


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


@contextmanager
def _engines(st: CliState) -> Iterator[Engines]:
    engines = make_engines(st.resolved_ledger_url())
    try:
        yield engines
    except OperationalError as exc:
        raise UnavailableError(f"ledger database unavailable: {exc.orig}") from None
    finally:
        engines.dispose()


@app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    revision: Annotated[
        str, typer.Option("--revision", help="Target migration revision (text).")
    ] = "head",
) -> None:
    """Apply the shipped migrations to the ledger (safe to run from many processes).

    Other commands also migrate on first use; this makes it an explicit deployment step.
    """
    with guard(ctx, "db.upgrade") as st, _engines(st) as engines:
        before = current_revision(engines)
        after = upgrade(engines, revision)
        info = {
            "ledger_url": _safe_url(engines.url),
            "previous_revision": before,
            "revision": after,
            "head": head_revision(),
        }
        emit_ok(
            st.format, "db.upgrade", "info", info, status="ok" if before != after else "no_change"
        )


@app.command("current")
def db_current(ctx: typer.Context) -> None:
    """Show the ledger's migration revision and the newest one this package ships."""
    with guard(ctx, "db.current") as st, _engines(st) as engines:
        rev = current_revision(engines)
        head = head_revision()
        info = {
            "ledger_url": _safe_url(engines.url),
            "revision": rev,
            "head": head,
            "up_to_date": rev == head,
        }
        emit_ok(st.format, "db.current", "info", info)


def audit(ctx: typer.Context) -> None:
    """Check the ledger's lease history against the lease invariants.

    No two effective holdings of a resource overlap in time, epochs strictly rise, versions
    rise by one, at most one active generation, every acquire receipt points at an existing
    transition. Prints the violations and exits 1 if there are any. Audits the org of
    --org (or BATON_ORG).
    """
    with guard(ctx, "audit") as st:
        target = st.resolved_org()
        report = audit_ledger(st.client().store, target)
        data: dict[str, Any] = dataclasses.asdict(report)
        if report.ok:
            emit_ok(st.format, "audit", "audit", data)
            return
        if st.json:
            emit_error(
                st.format,
                "audit",
                {
                    "code": "AUDIT_VIOLATIONS",
                    "message": f"{len(report.violations)} invariant violation(s) in org {target}",
                },
                extra={"audit": data},
            )
        else:
            summary = {k: v for k, v in data.items() if k != "violations"}
            emit_ok(st.format, "audit", "audit", summary)
            for line in report.violations:
                sys.stdout.write(f"VIOLATION {line}\n")
            sys.stderr.write(
                f"baton audit: {len(report.violations)} invariant violation(s) in org {target}\n"
            )
        raise typer.Exit(EXIT_FAILURE)
