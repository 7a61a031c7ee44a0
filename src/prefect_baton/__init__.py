"""prefect-baton: leases with fencing tokens, checkpoints, handoffs and outcomes for Prefect
flows and plain agent code, on a SQL ledger (SQLite by default, PostgreSQL at scale)."""

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
    Receipt,
)

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
    "Receipt",
    "StaleFenceError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
    "VersionConflictError",
    "__version__",
]
