"""the lease an event concerns, and indexes of an org's events by lease and by subject
(baton_events)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``lease_id``: the payload's ``lease_id`` (a ``lease.*`` event's generation, the fence of a
``fence.rejected``, the lease a ``handoff.*`` carried; ``NULL`` for the other kinds), filled
in from the payload of the events written before it. The event listing filtered by resource
(``b.events.list(resource_type=..., resource_id=...)``) reads the events of the resource's
leases through ``ix_event_lease``; filtered by subject, through ``ix_event_subject``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The kinds whose payload names a lease.
_WITH_LEASE = "kind LIKE 'lease.%' OR kind LIKE 'handoff.%' OR kind = 'fence.rejected'"


def upgrade() -> None:
    with op.batch_alter_table("baton_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_id", sa.String(length=64), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        lease_id = "CAST(payload AS json) ->> 'lease_id'"
    else:
        lease_id = "json_extract(payload, '$.lease_id')"
    op.execute(f"UPDATE baton_events SET lease_id = {lease_id} WHERE {_WITH_LEASE}")
    with op.batch_alter_table("baton_events", schema=None) as batch_op:
        batch_op.create_index("ix_event_lease", ["org_id", "lease_id", "seq"], unique=False)
        batch_op.create_index("ix_event_subject", ["org_id", "subject", "seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("baton_events", schema=None) as batch_op:
        batch_op.drop_index("ix_event_subject")
        batch_op.drop_index("ix_event_lease")
        batch_op.drop_column("lease_id")
