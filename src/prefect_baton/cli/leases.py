"""``baton lease ...``: acquire, inspect, show, renew, transfer, release, force-release, list,
report-expired.

The command line is stateless between invocations, so lease operations after acquire take
the proof by flags: ``--lease-id`` and ``--execution-key`` (the one given at acquire), plus
an optional ``--expected-version`` compare-and-swap. On renew, transfer, release and
force-release, ``--idempotency-key`` is a retry key (not the execution key): a retry of the
same command with the same key replays the stored result (``replayed``). Acquire still
takes its execution key as ``--idempotency-key`` too (hidden, deprecated: it warns).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

import typer

from prefect_baton._client.leases import proof_by_id
from prefect_baton._rules.core import lapsed
from prefect_baton.cli._options import (
    Cursor,
    IdempotencyKey,
    compare_and_swap,
    lease_ttl,
    principal_filter,
    proof_key,
    row_limit,
)
from prefect_baton.cli._output import Page, RowView, emit_ok
from prefect_baton.cli._state import command, guard, state
from prefect_baton.errors import ValidationError
from prefect_baton.models import Lease, LeaseInfo, Receipt

app = typer.Typer(
    name="lease",
    help="Acquire, renew, transfer and release expiring leases on resources.",
    no_args_is_help=True,
)

LEASE_COLUMNS = (
    "lease_id",
    "resource_type",
    "resource_id",
    "owner",
    "execution_key",
    "version",
    "epoch",
    "status",
    "expires_at",
)


def _expired_in_table(now_ms: int) -> RowView:
    """A lease row as the table shows it: status ``expired`` for a lease still ``active``
    on its record whose expiry is not after ``now_ms`` (epoch milliseconds; nobody has
    ended the generation yet); the JSON receipt keeps ``active`` and ``expires_at``."""

    def view(row: Mapping[str, Any]) -> Mapping[str, Any]:
        expires = row.get("expires_at")
        if not isinstance(expires, str):
            return row
        expires_ms = round(datetime.fromisoformat(expires).timestamp() * 1000)
        if lapsed(str(row.get("status")), expires_ms, now_ms):
            return {**row, "status": "expired"}
        return row

    return view


def _expired_now() -> RowView:
    """:func:`_expired_in_table` on this machine's clock (``lease list``, ``lease
    show``)."""
    return _expired_in_table(time.time_ns() // 1_000_000)


def _all_expired() -> RowView:
    """:func:`_expired_in_table` for rows the authority found past their expiry
    (``lease report-expired``): every ``active`` one reads ``expired``."""
    return _expired_in_table(2**63)


ResourceType = Annotated[
    str,
    typer.Argument(
        metavar="RESOURCE_TYPE", help="Resource type (text, 1-256 characters), e.g. 'deploy'."
    ),
]
ResourceId = Annotated[
    str,
    typer.Argument(
        metavar="RESOURCE_ID", help="Resource id (text, 1-256 characters), e.g. 'checkout-service'."
    ),
]
LeaseId = Annotated[
    str, typer.Option("--lease-id", help="Lease id (text, 'lease_...') returned by acquire.")
]
#: ``LEASE_ID`` of the commands that name a lease by id alone (show, force-release).
LeaseIdArgument = Annotated[
    str, typer.Argument(metavar="LEASE_ID", help="Lease id (text, 'lease_...').")
]
ExecutionKey = Annotated[str | None, proof_key("the lease")]
ExpectedVersion = Annotated[int | None, compare_and_swap("lease")]


@command(app, "lease.acquire", "lease")
def acquire(
    ctx: typer.Context,
    resource_type: ResourceType,
    resource_id: ResourceId,
    ttl_seconds: Annotated[int, lease_ttl("Lease duration")],
    execution_key: Annotated[
        str | None,
        typer.Option(
            "--execution-key",
            help="Execution key (text, 1-256 characters; renew, transfer, release and "
            "handoff create take it back as --execution-key): a retry with the same key and "
            "request replays the receipt (status 'replayed'); another key conflicts while the "
            "lease is held.",
        ),
    ] = None,
    old_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            hidden=True,
            help="Deprecated name of --execution-key on acquire (warns on stderr).",
        ),
    ] = None,
    attempt: Annotated[
        str | None,
        typer.Option(
            "--attempt",
            help="Token of this attempt of the execution (text, 1-256 characters; needs "
            "--execution-key), e.g. a process id: while the lease is held, another process "
            "presenting the same --execution-key with another --attempt (or none) exits 8 "
            "(IDEMPOTENCY_IN_FLIGHT) instead of getting the same lease; the same --attempt "
            "retrying replays. Without it every presenter of the key is one attempt.",
        ),
    ] = None,
    expected_version: Annotated[int | None, compare_and_swap("resource", "never leased")] = None,
    purpose: Annotated[
        str | None, typer.Option("--purpose", help="Free text kept with the lease.")
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="Write-scope glob (text, e.g. 'src/**'); repeat for several. Overlapping "
            "scopes of another principal's effective lease conflict.",
        ),
    ] = None,
) -> Lease:
    """Acquire (or take over after expiry) the lease on RESOURCE_TYPE RESOURCE_ID.

    Exits 3 (CONFLICT) when another holder has it, 4 on a stale --expected-version, 8
    (IDEMPOTENCY_IN_FLIGHT) when another --attempt of the same --execution-key holds it, 2
    (VALIDATION_ERROR) when --execution-key and its deprecated name --idempotency-key
    disagree or --attempt comes without --execution-key.
    """
    key = _execution_key(execution_key, old_key)
    if attempt is not None and key is None:
        raise ValidationError(
            "--attempt names an attempt of the execution given by --execution-key: "
            "give --execution-key as well"
        )
    return (
        state(ctx)
        .client()
        .leases.acquire(
            resource_type,
            resource_id,
            ttl_seconds=ttl_seconds,
            purpose=purpose,
            scopes=scope or (),
            expected_version=expected_version,
            idempotency_key=key,
            attempt=attempt,
        )
    )


def _execution_key(key: str | None, old_key: str | None) -> str | None:
    """The execution key of ``lease acquire``: ``--execution-key``, or its deprecated name
    ``--idempotency-key`` (with a warning on stderr).

    Raises:
        ValidationError: both are given, with different values.
    """
    if old_key is None:
        return key
    if key is not None and key != old_key:
        raise ValidationError(
            "--idempotency-key is the deprecated name of --execution-key on acquire: give one"
        )
    typer.echo(
        "baton lease acquire: --idempotency-key is deprecated here; use --execution-key "
        "(the same execution key)",
        err=True,
    )
    return old_key


@command(app, "lease.inspect", "info", reads_only=True)
def inspect(ctx: typer.Context, resource_type: ResourceType, resource_id: ResourceId) -> LeaseInfo:
    """Show whether a resource is held, until when, and its version and epoch.

    Only the holder sees its lease details; others never see holder, purpose or scopes.
    """
    return state(ctx).client().leases.inspect(resource_type, resource_id)


@command(app, "lease.show", "lease", reads_only=True, shown=_expired_now)
def show(
    ctx: typer.Context,
    lease_id: LeaseIdArgument,
) -> Lease:
    """Show one lease generation by id: holder, execution key, version, epoch, status, expiry.

    Yours only, any of the org's with --role owner or admin; exits 5 (NOT_FOUND) for an
    unknown lease, another org's or (as an agent) another principal's. A lease past its
    expiry that nobody has ended yet shows status 'expired' in the table (by this
    machine's clock); the JSON receipt keeps the record's 'active' and its 'expires_at'.
    """
    return state(ctx).client().leases.get(lease_id)


@command(app, "lease.renew", "lease")
def renew(
    ctx: typer.Context,
    lease_id: LeaseId,
    execution_key: ExecutionKey = None,
    ttl_seconds: Annotated[
        int | None, lease_ttl("New duration from now", "the lease's TTL")
    ] = None,
    expected_version: ExpectedVersion = None,
    idempotency_key: IdempotencyKey = None,
) -> Lease:
    """Extend a lease you hold: version +1, new expiry; id, epoch and scopes unchanged.

    Exits 9 (LEASE_LOST) when the lease ended, expired or belongs to another execution.
    """
    b = state(ctx).client()
    return b.leases.renew(
        proof_by_id(b.leases, lease_id, execution_key),
        ttl_seconds=ttl_seconds,
        expected_version=expected_version,
        idempotency_key=idempotency_key,
    )


@command(app, "lease.transfer", "lease")
def transfer(
    ctx: typer.Context,
    lease_id: LeaseId,
    to_principal: Annotated[
        str,
        typer.Option(
            "--to-principal", "--new-owner", help="Principal (text) that receives the lease."
        ),
    ],
    new_execution_key: Annotated[
        str,
        typer.Option(
            "--new-execution-key",
            "--new-idempotency-key",
            help="The receiver's execution key (text); must differ from the current one.",
        ),
    ],
    ttl_seconds: Annotated[int, lease_ttl("Duration of the receiver's lease")],
    execution_key: ExecutionKey = None,
    expected_version: ExpectedVersion = None,
    idempotency_key: IdempotencyKey = None,
) -> Lease:
    """Hand a lease you hold to another principal: new lease id, version +1, epoch +1."""
    b = state(ctx).client()
    return b.leases.transfer(
        proof_by_id(b.leases, lease_id, execution_key),
        to_principal=to_principal,
        new_execution_key=new_execution_key,
        ttl_seconds=ttl_seconds,
        expected_version=expected_version,
        idempotency_key=idempotency_key,
    )


@app.command("release")
def release(
    ctx: typer.Context,
    lease_id: LeaseId,
    execution_key: ExecutionKey = None,
    expected_version: ExpectedVersion = None,
    idempotency_key: IdempotencyKey = None,
) -> None:
    """Release a lease you hold, by proof. Safe to retry: a second release is 'no_change'.

    The receipt's status is 'released', or 'expired' when the lease had already run out
    (your protection lapsed; the JSON receipt's top-level status is then 'expired' too, and
    the table's title 'lease.release: expired'). Exits 9 (LEASE_LOST) if someone else took
    it since, or when --execution-key is missing or differs from the lease's (the message
    says so).
    """
    with guard(ctx, "lease.release") as st:
        b = st.client()
        receipt = b.leases.release(
            proof_by_id(b.leases, lease_id, execution_key),
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )
        emit_ok(st.format, "lease.release", "receipt", receipt)
        if receipt.status == "expired" and not st.json:
            typer.echo("warning: the lease had already expired before this release", err=True)


@command(app, "lease.force-release", "receipt")
def force_release(
    ctx: typer.Context,
    lease_id: LeaseIdArgument,
    idempotency_key: IdempotencyKey = None,
) -> Receipt:
    """Release anyone's lease of the org. Needs --role owner or admin (else exit 6)."""
    return state(ctx).client().leases.force_release(lease_id, idempotency_key=idempotency_key)


@command(app, "lease.list", "leases", columns=LEASE_COLUMNS, reads_only=True, shown=_expired_now)
def list_(
    ctx: typer.Context,
    resource_type: Annotated[
        str | None, typer.Option("--resource-type", help="Only leases of this type (text).")
    ] = None,
    owner: Annotated[
        str | None, principal_filter("--owner", "Whose leases (text; '*' for everyone).")
    ] = None,
    include_ended: Annotated[
        bool, typer.Option("--all", help="Also list ended (released, expired, ...) leases.")
    ] = False,
    limit: Annotated[int, row_limit(10_000)] = 100,
    cursor: Cursor = None,
) -> Page[Lease]:
    """List your effective leases, newest first (by acquire time, then lease id).

    With --all, a lease past its expiry that nobody has ended yet shows status 'expired'
    in the table (by this machine's clock); the JSON receipt keeps the record's 'active'
    and its 'expires_at'.

    One page of at most --limit rows. When more rows follow, the JSON receipt's
    'next_cursor' (null otherwise) is the --cursor of the next page; the table format names
    it on stderr.
    """
    return (
        state(ctx)
        .client()
        .leases.list(
            resource_type=resource_type,
            owner=owner,
            include_ended=include_ended,
            limit=limit,
            cursor=cursor,
        )
    )


@command(
    app,
    "lease.report-expired",
    "leases",
    columns=LEASE_COLUMNS,
    shown=_all_expired,
    noun="newly expired leases",
)
def report_expired(
    ctx: typer.Context,
    limit: Annotated[int, row_limit(10_000)] = 1000,
) -> list[Lease]:
    """Record lease.expired for the org's leases found past their TTL that nobody acted on.

    Each such lease (a crashed holder's, typically) gets one lease.expired event (reason
    'lapsed'); the leases newly reported are printed, oldest expiry first, at most --limit.
    The org's pending handoffs that expired unaccepted are ended too, releasing the lease
    each carries. Nothing needs this for correctness (expiry is judged when someone next
    acts): run it now and then for the events, e.g. from cron or the report-expired flow in
    flows/. Running it twice reports nothing new. Without --redis-url in an org whose leases
    Redis decides, exits 6 (FORBIDDEN). The table shows their status as 'expired'; the
    JSON receipt keeps the record's 'active' (the generation has not been ended).
    """
    return state(ctx).client().leases.report_expired(limit=limit)
