"""``baton checkpoint ...``: save, get, history and delete of resumable progress."""

from __future__ import annotations

from typing import Annotated

import typer

from prefect_baton._rules.paging import MAX_PAGE
from prefect_baton._rules.validation import request_body_limit
from prefect_baton.cli._options import (
    Cursor,
    Fence,
    IdempotencyKey,
    SubjectId,
    compare_and_swap,
    lifetime,
    row_limit,
)
from prefect_baton.cli._state import command, fence_lease, read_json_object, state
from prefect_baton.errors import NotFoundError, ValidationError
from prefect_baton.models import Checkpoint, Page

app = typer.Typer(
    name="checkpoint",
    help="Save and read checkpoints: resumable progress per (subject, principal, kind).",
    no_args_is_help=True,
)

HISTORY_COLUMNS = ("version", "state_hash", "updated_at", "checkpoint_id", "principal")

Kind = Annotated[
    str, typer.Argument(metavar="KIND", help="Checkpoint kind (text, 1-256 characters).")
]
Principal = Annotated[
    str | None,
    typer.Option("--owner", help="Whose checkpoint to read (principal, text; default: yours)."),
]


@command(app, "checkpoint.save", "checkpoint")
def save(
    ctx: typer.Context,
    subject_id: SubjectId,
    kind: Kind,
    state_source: Annotated[
        str,
        typer.Argument(
            metavar="STATE",
            help="The state, a JSON object: inline JSON text, a file path, or '-' for stdin. "
            "At most BATON_STATE_MAX_BYTES (default 1 MiB) of canonical JSON; a file or stdin "
            "longer than the REST body limit (3 times that + 64 KiB, at least 2 MiB) is "
            "refused without being read whole (exit 2).",
            show_default=False,
        ),
    ],
    expected_version: Annotated[
        int | None, compare_and_swap("checkpoint", "it must not exist yet")
    ] = None,
    fence: Fence = None,
    idempotency_key: IdempotencyKey = None,
    ttl_seconds: Annotated[
        int | None, lifetime("--ttl-seconds", "the checkpoint is not returned")
    ] = None,
) -> Checkpoint:
    """Write your checkpoint of SUBJECT_ID KIND from STATE; version +1 per write."""
    b = state(ctx).client()
    cap = b.checkpoints.state_max_bytes
    state_obj = read_json_object(
        state_source,
        "state",
        request_body_limit(cap),  # JSON text of a state within the cap fits, as over REST
        why=f"; a state is at most {cap} bytes of JSON (BATON_STATE_MAX_BYTES)",
    )
    return b.checkpoints.save(
        subject_id,
        kind,
        state_obj,
        expected_version=expected_version,
        fence=fence_lease(b, fence),
        idempotency_key=idempotency_key,
        ttl_seconds=ttl_seconds,
    )


@command(app, "checkpoint.get", "checkpoint", reads_only=True)
def get(
    ctx: typer.Context,
    subject_id: Annotated[
        str | None,
        typer.Argument(
            metavar="SUBJECT_ID", help="Subject id (text); omit with --id.", show_default=False
        ),
    ] = None,
    kind: Annotated[
        str | None, typer.Argument(metavar="KIND", help="Checkpoint kind (text); omit with --id.")
    ] = None,
    principal: Principal = None,
    checkpoint_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="Read by checkpoint id (text) instead, e.g. one attached to a handoff "
            "addressed to you.",
        ),
    ] = None,
) -> Checkpoint:
    """Show the current checkpoint of SUBJECT_ID KIND (or --id). Exits 5 if there is none."""
    b = state(ctx).client()
    if checkpoint_id is not None:
        if subject_id is not None or kind is not None:
            raise ValidationError("give either SUBJECT_ID KIND or --id, not both")
        return b.checkpoints.get_by_id(checkpoint_id)
    if subject_id is None or kind is None:
        raise ValidationError("missing SUBJECT_ID and KIND (or --id)")
    found = b.checkpoints.get(subject_id, kind, principal)
    if found is None:
        raise NotFoundError(f"no checkpoint of {subject_id}/{kind}")
    return found


@command(app, "checkpoint.history", "checkpoints", columns=HISTORY_COLUMNS, reads_only=True)
def history(
    ctx: typer.Context,
    subject_id: SubjectId,
    kind: Kind,
    principal: Principal = None,
    limit: Annotated[int, row_limit(MAX_PAGE["checkpoints"])] = 100,
    cursor: Cursor = None,
) -> Page[Checkpoint]:
    """List the versions of a checkpoint, oldest first.

    One page of at most --limit versions. When more follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    return (
        state(ctx)
        .client()
        .checkpoints.history(subject_id, kind, principal, limit=limit, cursor=cursor)
    )


@command(app, "checkpoint.delete", "checkpoint")
def delete(
    ctx: typer.Context,
    checkpoint_id: Annotated[
        str, typer.Argument(metavar="CHECKPOINT_ID", help="The checkpoint id (text).")
    ],
    idempotency_key: IdempotencyKey = None,
) -> Checkpoint:
    """Delete your checkpoint CHECKPOINT_ID: it then reads as absent (history kept). Exits 5
    if unknown or already deleted, 6 if not yours, 3 while a pending handoff carries it."""
    return state(ctx).client().checkpoints.delete(checkpoint_id, idempotency_key=idempotency_key)
