"""prefect-baton: leases with fencing tokens, checkpoints, handoffs and outcomes for Prefect
flows and plain agent code, on a SQL ledger (SQLite by default, PostgreSQL at scale)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect_baton._client.aio import (
        AsyncBaton,
        AsyncCheckpointAPI,
        AsyncEventAPI,
        AsyncHandoffAPI,
        AsyncLeaseAPI,
        AsyncOutcomeAPI,
    )
    from prefect_baton._client.keeper import LeaseKeeper
    from prefect_baton._client.sync import (
        Baton,
        CheckpointAPI,
        EventAPI,
        HandoffAPI,
        LeaseAPI,
        OutcomeAPI,
    )
    from prefect_baton._settings import BatonSettings
    from prefect_baton.errors import (
        BatonError,
        ConflictError,
        ForbiddenError,
        IdempotencyInFlightError,
        IdempotencyMismatchError,
        InternalError,
        LeaseLostError,
        NotFoundError,
        StaleFenceError,
        UnauthenticatedError,
        UnavailableError,
        ValidationError,
        VersionConflictError,
    )
    from prefect_baton.models import (
        Checkpoint,
        Event,
        Evidence,
        Handoff,
        Lease,
        LeaseInfo,
        Outcome,
        Page,
        Receipt,
    )
else:
    from prefect_baton._lazy import exports, listing

    # The names below are imported on first access (PEP 562), so that importing the
    # package (or a light submodule such as ``prefect_baton.rest.__main__``) loads no
    # database, Redis or web framework code: see :mod:`prefect_baton._lazy`.
    __getattr__ = exports(
        __name__,
        {
            "AsyncBaton": "prefect_baton._client.aio",
            "AsyncCheckpointAPI": "prefect_baton._client.aio",
            "AsyncEventAPI": "prefect_baton._client.aio",
            "AsyncHandoffAPI": "prefect_baton._client.aio",
            "AsyncLeaseAPI": "prefect_baton._client.aio",
            "AsyncOutcomeAPI": "prefect_baton._client.aio",
            "LeaseKeeper": "prefect_baton._client.keeper",
            "Baton": "prefect_baton._client.sync",
            "CheckpointAPI": "prefect_baton._client.sync",
            "EventAPI": "prefect_baton._client.sync",
            "HandoffAPI": "prefect_baton._client.sync",
            "LeaseAPI": "prefect_baton._client.sync",
            "OutcomeAPI": "prefect_baton._client.sync",
            "BatonSettings": "prefect_baton._settings",
            "BatonError": "prefect_baton.errors",
            "ConflictError": "prefect_baton.errors",
            "ForbiddenError": "prefect_baton.errors",
            "IdempotencyInFlightError": "prefect_baton.errors",
            "IdempotencyMismatchError": "prefect_baton.errors",
            "InternalError": "prefect_baton.errors",
            "LeaseLostError": "prefect_baton.errors",
            "NotFoundError": "prefect_baton.errors",
            "StaleFenceError": "prefect_baton.errors",
            "UnauthenticatedError": "prefect_baton.errors",
            "UnavailableError": "prefect_baton.errors",
            "ValidationError": "prefect_baton.errors",
            "VersionConflictError": "prefect_baton.errors",
            "Checkpoint": "prefect_baton.models",
            "Event": "prefect_baton.models",
            "Evidence": "prefect_baton.models",
            "Handoff": "prefect_baton.models",
            "Lease": "prefect_baton.models",
            "LeaseInfo": "prefect_baton.models",
            "Outcome": "prefect_baton.models",
            "Page": "prefect_baton.models",
            "Receipt": "prefect_baton.models",
        },
    )
    __dir__ = listing(__name__)

__version__ = "0.1.0"

__all__ = [
    "AsyncBaton",
    "AsyncCheckpointAPI",
    "AsyncEventAPI",
    "AsyncHandoffAPI",
    "AsyncLeaseAPI",
    "AsyncOutcomeAPI",
    "Baton",
    "BatonError",
    "BatonSettings",
    "Checkpoint",
    "CheckpointAPI",
    "ConflictError",
    "Event",
    "EventAPI",
    "Evidence",
    "ForbiddenError",
    "Handoff",
    "HandoffAPI",
    "IdempotencyInFlightError",
    "IdempotencyMismatchError",
    "InternalError",
    "Lease",
    "LeaseAPI",
    "LeaseInfo",
    "LeaseKeeper",
    "LeaseLostError",
    "NotFoundError",
    "Outcome",
    "OutcomeAPI",
    "Page",
    "Receipt",
    "StaleFenceError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
    "VersionConflictError",
    "__version__",
]
