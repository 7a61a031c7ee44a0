"""parameters of a handoff's recipient run (baton_handoffs.parameters_json)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

A nullable JSON text column: rows written before it read as a handoff without parameters.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("baton_handoffs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parameters_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("baton_handoffs", schema=None) as batch_op:
        batch_op.drop_column("parameters_json")
