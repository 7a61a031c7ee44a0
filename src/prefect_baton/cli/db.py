"""``baton db upgrade|current`` (Alembic migrations of the ledger) and ``baton audit``."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Any

import typer

from prefect_baton.audit import audit_ledger
from prefect_baton.cli._output import EXIT_FAILURE, emit_error, emit_ok, visible
from prefect_baton.cli._state import guard, warn_unused_org
from prefect_baton.ledger import ledger_revision, upgrade_ledger

app = typer.Typer(
    name="db",
    help="Ledger database migrations (Alembic).",
    no_args_is_help=True,
)


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
    with guard(ctx, "db.upgrade") as st:
        r = upgrade_ledger(st.local_ledger_url(), revision)
        info = {
            "ledger_url": r.ledger_url,
            "previous_revision": r.previous_revision,
            "revision": r.revision,
            "head": r.head,
        }
        status = "ok" if r.previous_revision != r.revision else "no_change"
        emit_ok(st.format, "db.upgrade", "info", info, status=status)


@app.command("current")
def db_current(ctx: typer.Context) -> None:
    """Show the ledger's migration revision and the newest one this package ships.

    Exit 5 (NOT_FOUND) for a SQLite ledger file that does not exist: nothing is created
    (db upgrade creates and migrates it).
    """
    with guard(ctx, "db.current", reads_only=True) as st:
        r = ledger_revision(st.local_ledger_url())
        info = {
            "ledger_url": r.ledger_url,
            "revision": r.revision,
            "head": r.head,
            "up_to_date": r.up_to_date,
        }
        emit_ok(st.format, "db.current", "info", info)


def audit(ctx: typer.Context) -> None:
    """Check the ledger's lease history against the lease invariants.

    No two effective generations of a resource overlap in time, epochs strictly rise, versions
    rise by one, at most one active generation, every acquire receipt points at an existing
    transition. Prints the violations and exits 1 if there are any. Audits the org of
    --org (or BATON_ORG). Reads the ledger directly, never through the REST API: with
    BATON_API_URL set it needs --ledger-url or BATON_LEDGER_URL (else exits 2,
    VALIDATION_ERROR); a SQLite ledger file that does not exist is 5 (NOT_FOUND).
    """
    with guard(ctx, "audit", reads_only=True) as st:
        from prefect_baton._rules.validation import validate_id
        from prefect_baton._stores.ledger.store import LedgerStore

        target = validate_id("org", st.resolved_org())
        ledger = LedgerStore.from_settings(st.settings(), st.local_ledger_url())
        try:
            report = audit_ledger(ledger, target)
        finally:
            ledger.close()
        data: dict[str, Any] = dataclasses.asdict(report)
        if not (report.resources or report.generations or report.transitions):
            warn_unused_org(target)
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
                sys.stdout.write(f"VIOLATION {visible(line)}\n")
            sys.stderr.write(
                f"baton audit: {len(report.violations)} invariant violation(s) in org "
                f"{visible(target)}\n"
            )
        raise typer.Exit(EXIT_FAILURE)
