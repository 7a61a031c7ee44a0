"""``baton outcome ...``: record and list outcomes with their evidence."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from prefect_baton.cli._options import Cursor, Fence, IdempotencyKey, SubjectId, row_limit
from prefect_baton.cli._output import Page
from prefect_baton.cli._state import command, fence_lease, parse_evidence, state
from prefect_baton.models import Outcome

app = typer.Typer(
    name="outcome",
    help="Record the completion or failure of a subject, linked to its evidence.",
    no_args_is_help=True,
)

OUTCOME_COLUMNS = (
    "outcome_id",
    "subject_id",
    "status",
    "principal",
    "evidence",
    "lease_id",
    "fence_epoch",
    "recorded_at",
)


def _link(record: str) -> typer.models.OptionInfo:
    """The ``--<record>-id`` option that links an outcome to a lease, handoff or checkpoint
    (``record``, ``str``) by its id."""
    option: typer.models.OptionInfo = typer.Option(
        f"--{record}-id", help=f"Link to this {record} id (text)."
    )
    return option


class OutcomeStatus(enum.StrEnum):
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


@command(app, "outcome.record", "outcome")
def record(
    ctx: typer.Context,
    subject_id: SubjectId,
    status: Annotated[
        OutcomeStatus,
        typer.Argument(
            metavar="STATUS", help="'succeeded', 'failed' or 'cancelled'.", case_sensitive=False
        ),
    ],
    evidence: Annotated[
        list[str] | None,
        typer.Option(
            "--evidence",
            help="Evidence item 'kind=file,uri=...,digest=sha256:...,note=...', or a JSON "
            "object or list of objects; repeat for several. 'succeeded' needs at least one.",
        ),
    ] = None,
    fence: Fence = None,
    lease_id: Annotated[str | None, _link("lease")] = None,
    handoff_id: Annotated[str | None, _link("handoff")] = None,
    checkpoint_id: Annotated[str | None, _link("checkpoint")] = None,
    idempotency_key: IdempotencyKey = None,
) -> Outcome:
    """Record STATUS for SUBJECT_ID with its evidence."""
    items = parse_evidence(evidence or [])
    b = state(ctx).client()
    return b.outcomes.record(
        subject_id,
        status.value,
        evidence=items,
        fence=fence_lease(b, fence),
        lease_id=lease_id,
        handoff_id=handoff_id,
        checkpoint_id=checkpoint_id,
        idempotency_key=idempotency_key,
    )


@command(app, "outcome.list", "outcomes", columns=OUTCOME_COLUMNS, reads_only=True)
def list_(
    ctx: typer.Context,
    subject_id: Annotated[
        str | None,
        typer.Argument(
            metavar="SUBJECT_ID", help="Only this subject (text); default: all of the org."
        ),
    ] = None,
    limit: Annotated[int, row_limit(100_000)] = 1000,
    cursor: Cursor = None,
) -> Page[Outcome]:
    """List outcomes of the org (of one subject when given), oldest first (by record time,
    then outcome id). Exit 2 (VALIDATION_ERROR) for a bad subject id, limit or cursor.

    One page of at most --limit rows. When more rows follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    return state(ctx).client().outcomes.list(subject_id, limit=limit, cursor=cursor)
