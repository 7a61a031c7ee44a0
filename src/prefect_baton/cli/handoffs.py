"""``baton handoff ...``: create, inbox, list, resolve, show."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from prefect_baton._client.leases import proof_by_id
from prefect_baton._client.records import handoff_listing
from prefect_baton.cli._options import (
    Cursor,
    IdempotencyKey,
    SubjectId,
    lease_ttl,
    lifetime,
    principal_filter,
    proof_key,
    row_limit,
)
from prefect_baton.cli._output import Page
from prefect_baton.cli._state import command, state
from prefect_baton.errors import ValidationError
from prefect_baton.models import Handoff

app = typer.Typer(
    name="handoff",
    help="Hand a subject (with its checkpoint and lease) to another principal.",
    no_args_is_help=True,
)

HANDOFF_COLUMNS = (
    "handoff_id",
    "from_principal",
    "to_principal",
    "subject_id",
    "status",
    "checkpoint_id",
    "lease_id",
    "created_at",
    "expires_at",
)


class Resolution(enum.StrEnum):
    accepted = "accepted"
    rejected = "rejected"


HandoffId = Annotated[
    str, typer.Argument(metavar="HANDOFF_ID", help="Handoff id (text, 'hoff_...').")
]


@command(app, "handoff.create", "handoff")
def create(
    ctx: typer.Context,
    to_principal: Annotated[
        str,
        typer.Argument(
            metavar="TO_PRINCIPAL", help="Recipient principal (text); need not have acted yet."
        ),
    ],
    subject_id: SubjectId,
    checkpoint_id: Annotated[
        str | None,
        typer.Option("--checkpoint-id", help="Checkpoint id (text) the recipient may read."),
    ] = None,
    context_id: Annotated[
        str | None, typer.Option("--context-id", help="Context reference (text).")
    ] = None,
    message: Annotated[
        str | None, typer.Option("--message", help="Note for the recipient (text).")
    ] = None,
    lease_id: Annotated[
        str | None,
        typer.Option(
            "--lease-id",
            help="Lease id (text) you hold, transferred to the recipient on acceptance.",
        ),
    ] = None,
    execution_key: Annotated[str | None, proof_key("the --lease-id lease")] = None,
    expires_in_seconds: Annotated[
        int | None, lifetime("--expires-in-seconds", "it reads as 'expired'")
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> Handoff:
    """Create a pending handoff of SUBJECT_ID to TO_PRINCIPAL."""
    b = state(ctx).client()
    return b.handoffs.create(
        to_principal,
        subject_id,
        checkpoint_id=checkpoint_id,
        context_id=context_id,
        message=message,
        lease=proof_by_id(b.leases, lease_id, execution_key) if lease_id else None,
        idempotency_key=idempotency_key,
        expires_in_seconds=expires_in_seconds,
    )


class StatusFilter(enum.StrEnum):
    pending = "pending"
    accepted = "accepted"
    rejected = "rejected"
    expired = "expired"
    any = "any"


def _handoffs(
    ctx: typer.Context,
    who: str | None,
    status: StatusFilter | None,
    limit: int,
    cursor: str | None,
) -> Page[Handoff]:
    """Your inbox (``who`` ``None``), else the handoffs principal ``who`` (``'*'``:
    anyone) sent or received, of ``status`` (default ``pending``).

    Raises:
        ValidationError: ``status`` without ``who`` (as on every surface:
            :func:`prefect_baton._client.records.handoff_listing`).
    """
    return handoff_listing(
        state(ctx).client().handoffs,
        who,
        None if status is None else status.value,
        limit=limit,
        cursor=cursor,
    )


@command(app, "handoff.inbox", "handoffs", columns=HANDOFF_COLUMNS, reads_only=True)
def inbox(
    ctx: typer.Context,
    limit: Annotated[int, row_limit(10_000)] = 100,
    party: Annotated[
        str | None,
        principal_filter(
            "--party",
            "Instead of your inbox: the handoffs this principal (text) sent or received; "
            "'*' for everyone's.",
        ),
    ] = None,
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Everyone's handoffs of the organization (same as --party '*', which may "
            "be given with it; --party naming a principal may not).",
        ),
    ] = False,
    status: Annotated[
        StatusFilter | None,
        typer.Option(
            "--status",
            help="With --party or --all: only handoffs of this status (default pending).",
        ),
    ] = None,
    cursor: Cursor = None,
) -> Page[Handoff]:
    """List pending handoffs addressed to you (with --party or --all: a principal's or
    everyone's, sent or received), oldest first (by creation time, then handoff id). Exit 6
    (FORBIDDEN) when an agent asks for another's or everyone's; exit 2 (VALIDATION_ERROR)
    for a bad limit or cursor, --all with --party naming a principal (--all with --party
    '*' asks for the same list and is accepted), or --status without either.

    One page of at most --limit rows. When more rows follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    if all_ and party is not None and party != "*":
        raise ValidationError("give --party or --all, not both")
    return _handoffs(ctx, "*" if all_ else party, status, limit, cursor)


@command(app, "handoff.list", "handoffs", columns=HANDOFF_COLUMNS, reads_only=True)
def list_(
    ctx: typer.Context,
    limit: Annotated[int, row_limit(10_000)] = 100,
    party: Annotated[
        str,
        principal_filter(
            "--party", "Only the handoffs this principal (text) sent or received ('*': everyone's)."
        ),
    ] = "*",
    status: Annotated[
        StatusFilter,
        typer.Option("--status", help="Only handoffs of this status ('any': all)."),
    ] = StatusFilter.any,
    cursor: Cursor = None,
) -> Page[Handoff]:
    """List the organization's handoffs of any status, sent or received by anyone, oldest
    first (by creation time, then handoff id): the same as 'baton handoff inbox --all
    --status any' (with --party P: 'handoff inbox --party P --status any'). Exit 6
    (FORBIDDEN) for an agent (everyone's, or another principal's, needs --role owner or
    admin; an agent may give --party with its own name); exit 2 (VALIDATION_ERROR) for a
    bad limit or cursor.

    One page of at most --limit rows. When more rows follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    return _handoffs(ctx, party, status, limit, cursor)


@command(app, "handoff.resolve", "handoff")
def resolve(
    ctx: typer.Context,
    handoff_id: HandoffId,
    status: Annotated[
        Resolution,
        typer.Argument(metavar="STATUS", help="'accepted' or 'rejected'.", case_sensitive=False),
    ],
    note: Annotated[str | None, typer.Option("--note", help="Note (text) kept with it.")] = None,
    execution_key: Annotated[
        str | None,
        typer.Option(
            "--execution-key",
            help="Your execution key (text) for a carried lease (default 'handoff:<id>').",
        ),
    ] = None,
    ttl_seconds: Annotated[
        int | None, lease_ttl("Duration of a carried lease", "the sender's TTL")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="Idempotency key (text); a retry replays instead of exiting 5 (NOT_FOUND).",
        ),
    ] = None,
) -> Handoff:
    """Accept or reject a pending handoff addressed to you.

    Accepting one that carries a lease transfers the lease to you. A second resolve exits
    5 (NOT_FOUND); resolving a handoff addressed to someone else exits 2
    (VALIDATION_ERROR: only the target principal can resolve a handoff).
    """
    return (
        state(ctx)
        .client()
        .handoffs.resolve(
            handoff_id,
            status.value,
            note,
            execution_key=execution_key,
            ttl_seconds=ttl_seconds,
            idempotency_key=idempotency_key,
        )
    )


@command(app, "handoff.show", "handoff", reads_only=True)
def show(ctx: typer.Context, handoff_id: HandoffId) -> Handoff:
    """Show a handoff you sent or received."""
    return state(ctx).client().handoffs.get(handoff_id)
