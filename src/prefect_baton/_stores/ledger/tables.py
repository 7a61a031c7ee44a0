"""All ledger tables (SQLModel). Times are epoch milliseconds from the database clock.

The Alembic migrations in ``migrations/versions`` create exactly these tables; a test
compares the two so they cannot drift.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, String, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

metadata = SQLModel.metadata


def _ms(nullable: bool = False) -> Column:  # type: ignore[type-arg]
    return Column(BigInteger, nullable=nullable)


def _serial() -> Column:  # type: ignore[type-arg]
    """An autoincrement primary key column (BIGINT; INTEGER on SQLite, for its rowid)."""
    return Column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )


class Organization(SQLModel, table=True):
    """An isolation boundary; registered on first use."""

    __tablename__ = "baton_organizations"
    org_id: str = Field(primary_key=True, max_length=256)
    created_at_ms: int = Field(sa_column=_ms())


class Principal(SQLModel, table=True):
    """An agent identity inside an org with its role; registered on first use."""

    __tablename__ = "baton_principals"
    org_id: str = Field(primary_key=True, max_length=256)
    name: str = Field(primary_key=True, max_length=256)
    role: str = Field(max_length=16)
    created_at_ms: int = Field(sa_column=_ms())


class GenerationRow(SQLModel, table=True):
    """One lease generation. The newest row (highest epoch) of a resource is its head."""

    __tablename__ = "baton_leases"
    __table_args__ = (
        UniqueConstraint("org_id", "resource_type", "resource_id", "epoch", name="uq_lease_epoch"),
        Index(
            "uq_lease_active",
            "org_id",
            "resource_type",
            "resource_id",
            unique=True,
            sqlite_where=text("status = 'active'"),
            postgresql_where=text("status = 'active'"),
        ),
        Index(
            "ix_lease_active_scoped",
            "org_id",
            "status",
            sqlite_where=text("status = 'active' AND has_scopes = 1"),
            postgresql_where=text("status = 'active' AND has_scopes = 1"),
        ),
        Index("ix_lease_owner", "org_id", "owner", "status"),
    )
    lease_id: str = Field(primary_key=True, max_length=64)
    org_id: str = Field(max_length=256)
    resource_type: str = Field(max_length=256)
    resource_id: str = Field(max_length=256)
    owner: str = Field(max_length=256)
    execution_key: str | None = Field(default=None, max_length=256)
    purpose: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    scopes: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    has_scopes: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    version: int = Field(sa_column=_ms())
    epoch: int = Field(sa_column=_ms())
    status: str = Field(max_length=16)
    acquired_at_ms: int = Field(sa_column=_ms())
    expires_at_ms: int = Field(sa_column=_ms())
    ttl_ms: int = Field(sa_column=_ms())
    ended_at_ms: int | None = Field(default=None, sa_column=_ms(True))
    ended_by: str | None = Field(default=None, max_length=256)


class LeaseTransition(SQLModel, table=True):
    """Append-only history of lease transitions; the audit and the reconciler read it.

    Unique on ``(lease_id, version, action)`` so a reconciler can apply a Redis journal
    entry twice without effect.
    """

    __tablename__ = "baton_lease_transitions"
    __table_args__ = (
        UniqueConstraint("lease_id", "version", "action", name="uq_transition"),
        Index("ix_transition_resource", "org_id", "resource_type", "resource_id", "seq"),
    )
    seq: int | None = Field(default=None, sa_column=_serial())
    org_id: str = Field(max_length=256)
    resource_type: str = Field(max_length=256)
    resource_id: str = Field(max_length=256)
    lease_id: str = Field(max_length=64)
    action: str = Field(max_length=32)
    version: int = Field(sa_column=_ms())
    epoch: int = Field(sa_column=_ms())
    owner: str = Field(max_length=256)
    execution_key: str | None = Field(default=None, max_length=256)
    status: str = Field(max_length=16)
    at_ms: int = Field(sa_column=_ms())
    expires_at_ms: int = Field(sa_column=_ms())
    actor: str = Field(max_length=256)


class CheckpointRow(SQLModel, table=True):
    """The current checkpoint of ``(org, subject, principal, kind)``."""

    __tablename__ = "baton_checkpoints"
    __table_args__ = (
        UniqueConstraint("org_id", "subject_id", "principal", "kind", name="uq_checkpoint"),
    )
    checkpoint_id: str = Field(primary_key=True, max_length=64)
    org_id: str = Field(max_length=256)
    subject_id: str = Field(max_length=256)
    principal: str = Field(max_length=256)
    kind: str = Field(max_length=256)
    version: int = Field(sa_column=_ms())
    state: str = Field(sa_column=Column(Text, nullable=False))
    state_hash: str = Field(max_length=80)
    created_at_ms: int = Field(sa_column=_ms())
    updated_at_ms: int = Field(sa_column=_ms())
    expires_at_ms: int | None = Field(default=None, sa_column=_ms(True))


class CheckpointVersion(SQLModel, table=True):
    """Every version a checkpoint has had (history)."""

    __tablename__ = "baton_checkpoint_history"
    checkpoint_id: str = Field(primary_key=True, max_length=64)
    version: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    state: str = Field(sa_column=Column(Text, nullable=False))
    state_hash: str = Field(max_length=80)
    saved_at_ms: int = Field(sa_column=_ms())
    fence_lease_id: str | None = Field(default=None, max_length=64)
    fence_epoch: int | None = Field(default=None, sa_column=_ms(True))


class HandoffRow(SQLModel, table=True):
    """A handoff from one principal to another."""

    __tablename__ = "baton_handoffs"
    __table_args__ = (
        Index("ix_handoff_inbox", "org_id", "to_principal", "status"),
        # the pending handoff carrying a lease (an acquire refused by that lease looks here)
        Index("ix_handoff_lease", "lease_id"),
        # the org's handoffs by status, oldest first (the org-wide listing of owner/admin)
        Index("ix_handoff_org_status", "org_id", "status", "created_at_ms", "handoff_id"),
    )
    handoff_id: str = Field(primary_key=True, max_length=64)
    org_id: str = Field(max_length=256)
    from_principal: str = Field(max_length=256)
    to_principal: str = Field(max_length=256)
    subject_id: str = Field(max_length=256)
    checkpoint_id: str | None = Field(default=None, max_length=64)
    context_id: str | None = Field(default=None, max_length=256)
    message: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    lease_id: str | None = Field(default=None, max_length=64)
    status: str = Field(max_length=16)
    created_at_ms: int = Field(sa_column=_ms())
    expires_at_ms: int | None = Field(default=None, sa_column=_ms(True))
    resolved_at_ms: int | None = Field(default=None, sa_column=_ms(True))
    note: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    accepted_lease_id: str | None = Field(default=None, max_length=64)
    parameters_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class OutcomeRow(SQLModel, table=True):
    """Completion or failure of a subject with its evidence (JSON list)."""

    __tablename__ = "baton_outcomes"
    __table_args__ = (Index("ix_outcome_subject", "org_id", "subject_id"),)
    outcome_id: str = Field(primary_key=True, max_length=64)
    org_id: str = Field(max_length=256)
    subject_id: str = Field(max_length=256)
    principal: str = Field(max_length=256)
    status: str = Field(max_length=16)
    evidence: str = Field(sa_column=Column(Text, nullable=False))
    lease_id: str | None = Field(default=None, max_length=64)
    handoff_id: str | None = Field(default=None, max_length=64)
    checkpoint_id: str | None = Field(default=None, max_length=64)
    fence_epoch: int | None = Field(default=None, sa_column=_ms(True))
    recorded_at_ms: int = Field(sa_column=_ms())


class ReceiptRow(SQLModel, table=True):
    """An idempotency receipt: the stored result of one mutation.

    Identity ``(org, principal, operation, idem_key, scope_key)``; ``request_digest`` binds
    the request; ``response`` is the JSON result returned on an exact retry.
    """

    __tablename__ = "baton_receipts"
    __table_args__ = (
        UniqueConstraint(
            "org_id", "principal", "operation", "idem_key", "scope_key", name="uq_receipt"
        ),
        Index("ix_receipt_expiry", "expires_at_ms"),
    )
    id: int | None = Field(default=None, sa_column=_serial())
    org_id: str = Field(max_length=256)
    principal: str = Field(max_length=256)
    operation: str = Field(max_length=32)
    idem_key: str = Field(max_length=256)
    scope_key: str = Field(default="", max_length=600)
    request_digest: str = Field(max_length=64)
    response: str = Field(sa_column=Column(Text, nullable=False))
    created_at_ms: int = Field(sa_column=_ms())
    expires_at_ms: int = Field(sa_column=_ms())


class EventRow(SQLModel, table=True):
    """The outbox: one event per committed transition, in the same transaction."""

    __tablename__ = "baton_events"
    __table_args__ = (
        Index("ix_event_org_seq", "org_id", "seq"),
        # the events of one lease (of one resource's leases: the resource filter)
        Index("ix_event_lease", "org_id", "lease_id", "seq"),
        # the events of one subject
        Index("ix_event_subject", "org_id", "subject", "seq"),
    )
    seq: int | None = Field(default=None, sa_column=_serial())
    event_id: str = Field(max_length=64, unique=True)
    org_id: str = Field(max_length=256)
    kind: str = Field(max_length=64)
    principal: str = Field(max_length=256)
    subject: str = Field(max_length=600)
    payload: str = Field(sa_column=Column(Text, nullable=False))
    occurred_at_ms: int = Field(sa_column=_ms())
    #: The payload's ``lease_id`` (a ``lease.*`` event's generation, the fence of a
    #: ``fence.rejected``, the lease a ``handoff.*`` carried), else ``None``: the lease, and
    #: through it the resource, the event concerns.
    lease_id: str | None = Field(default=None, max_length=64)


class ApiKeyRow(SQLModel, table=True):
    """A REST/MCP bearer key: only the SHA-256 of the secret is stored, mapped to an org,
    principal, role and scopes (JSON list); a revoked key has ``revoked_at_ms``."""

    __tablename__ = "baton_api_keys"
    __table_args__ = (Index("ix_api_key_org", "org_id"),)
    key_id: str = Field(primary_key=True, max_length=64)
    key_hash: str = Field(max_length=64, unique=True)
    org_id: str = Field(max_length=256)
    principal: str = Field(max_length=256)
    role: str = Field(max_length=16)
    scopes: str = Field(sa_column=Column(Text, nullable=False))
    created_at_ms: int = Field(sa_column=_ms())
    revoked_at_ms: int | None = Field(default=None, sa_column=_ms(True))


__all__ = [
    "ApiKeyRow",
    "CheckpointRow",
    "CheckpointVersion",
    "EventRow",
    "GenerationRow",
    "HandoffRow",
    "LeaseTransition",
    "Organization",
    "OutcomeRow",
    "Principal",
    "ReceiptRow",
    "metadata",
]
_ = String
