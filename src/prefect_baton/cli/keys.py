"""``baton keys create|list|revoke``: the bearer keys of the REST API.

A key is shown once, by ``create``; the ledger keeps only its SHA-256. ``list`` never
shows a secret or a hash.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prefect_baton._settings import BatonSettings
from prefect_baton.cli._options import Cursor, row_limit
from prefect_baton.cli._output import Page, emit_ok, emit_page
from prefect_baton.cli._state import CliState, guard, nothing_found, usage_error
from prefect_baton.models import from_ms, wire_time

if TYPE_CHECKING:  # the REST package (FastAPI) is imported only when a command runs
    from prefect_baton.rest.keys import ApiKey

__all__ = ["KEY_COLUMNS", "app", "key_row"]

app = typer.Typer(
    name="keys",
    help="Bearer keys of the REST API: create (the secret is shown once), list, revoke.",
    no_args_is_help=True,
)

#: Columns of ``baton keys list`` (never the secret or its hash).
KEY_COLUMNS = ("key_id", "org", "principal", "role", "scopes", "created_at", "revoked_at")

WARNING = "store this key now: it is not shown again (the ledger keeps only its hash)"


def key_row(key: ApiKey) -> dict[str, Any]:
    """``key`` (:class:`~prefect_baton.rest.keys.ApiKey`) as a row: ids, role, scopes
    (``list[str]``), ``created_at`` and ``revoked_at`` (text in wire time,
    :func:`~prefect_baton.models.wire_time`: UTC, milliseconds, ``Z``; or ``None``)."""
    created = from_ms(key.created_at_ms)
    revoked = from_ms(key.revoked_at_ms)
    return {
        "key_id": key.key_id,
        "org": key.org,
        "principal": key.principal,
        "role": key.role,
        "scopes": list(key.scopes),
        "created_at": wire_time(created) if created else None,
        "revoked_at": wire_time(revoked) if revoked else None,
    }


def _identity(st: CliState) -> tuple[str, str, str]:
    if not st.org:
        usage_error(st, "keys.create", "--org (or BATON_ORG) is required")
    if not st.principal:
        usage_error(st, "keys.create", "--principal (or BATON_PRINCIPAL) is required")
    return st.org, st.principal, st.role or "agent"


@app.command("create")
def create(
    ctx: typer.Context,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="Scope the key grants (repeatable): <area>:read or <area>:write, area one "
            "of leases, handoffs, checkpoints, outcomes, events. \\[default: all ten]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create a bearer key for --org, --principal and --role (agent, owner or admin).

    Prints the secret (bk_...) once, with a warning on stderr that it is not shown again;
    the JSON receipt carries it as "secret". Exit status 2 (VALIDATION_ERROR) for a
    missing or bad org, principal, role or scope; nothing is stored then.
    """
    from prefect_baton.rest.keys import create_key

    with guard(ctx, "keys.create") as st:
        org, principal, role = _identity(st)
        secret, key = create_key(
            st.local_ledger_url(), org=org, principal=principal, role=role, scopes=scope
        )
        emit_ok(st.format, "keys.create", "key", key_row(key), extra={"secret": secret})
        sys.stderr.write(f"baton keys create: {WARNING}\n")
        sys.stderr.flush()


@app.command("list")
def list_(
    ctx: typer.Context,
    active_only: Annotated[
        bool, typer.Option("--active-only", help="Leave out revoked keys.")
    ] = False,
    limit: Annotated[int, row_limit(10_000)] = 1000,
    cursor: Cursor = None,
) -> None:
    """List keys (of --org when given, else of every org), oldest first (by creation time,
    then key id), revoked ones too unless --active-only. Never shows a secret or a hash.
    Exit 2 (VALIDATION_ERROR) for a bad org, limit or cursor; exit 5 (NOT_FOUND) for a
    SQLite ledger file that does not exist (nothing is created).

    One page of at most --limit rows. When more rows follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    from prefect_baton.rest.keys import list_keys

    with guard(ctx, "keys.list", reads_only=True) as st:
        keys = list_keys(
            st.local_ledger_url(),
            org=st.org,
            include_revoked=not active_only,
            limit=limit,
            cursor=cursor,
        )
        page = Page([key_row(k) for k in keys], keys.next_cursor)
        empty = nothing_found(ctx, "keys", st.org)
        emit_page(st.format, "keys.list", "keys", page, columns=KEY_COLUMNS, empty=empty)


#: How long a running ``baton serve`` keeps accepting a key revoked by another process:
#: the default of ``BATON_KEY_CACHE_SECONDS`` (seconds), the server's key cache.
_KEY_CACHE_DEFAULT = BatonSettings.model_fields["key_cache_seconds"].default


@app.command(
    "revoke",
    help=(
        "Revoke a key: a running baton serve refuses it (401) at the latest "
        f"BATON_KEY_CACHE_SECONDS (default {_KEY_CACHE_DEFAULT:g} s, its key cache) after "
        "the revocation; until then it still accepts the key. Revoking again keeps the "
        "first time. Exit status 5 (NOT_FOUND) for an unknown id."
    ),
)
def revoke(
    ctx: typer.Context,
    key_id: Annotated[
        str, typer.Argument(metavar="KEY_ID", help="Key id (text, 'key_...') from create or list.")
    ],
) -> None:
    """Revoke the key ``key_id`` (``str``) in the ledger; a running ``baton serve`` refuses
    it (401) at most ``BATON_KEY_CACHE_SECONDS`` later (its key cache). Exit status 5
    (NOT_FOUND) for an unknown id."""
    from prefect_baton.rest.keys import revoke_key

    with guard(ctx, "keys.revoke") as st:
        key = revoke_key(st.local_ledger_url(), key_id=key_id)
        emit_ok(st.format, "keys.revoke", "key", key_row(key))
