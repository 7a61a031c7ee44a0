"""index of the lease a handoff carries (baton_handoffs.lease_id)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

An acquire refused by a lease looks up the pending handoff carrying that lease, to end it
when it has expired (``_rules.handoffs.decide_handoff_expiry``).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_handoff_lease", "baton_handoffs", ["lease_id"])


def downgrade() -> None:
    op.drop_index("ix_handoff_lease", table_name="baton_handoffs")
