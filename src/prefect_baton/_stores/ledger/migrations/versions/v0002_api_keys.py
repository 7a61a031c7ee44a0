"""bearer keys of the REST API (baton_api_keys)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "baton_api_keys",
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=256), nullable=False),
        sa.Column("principal", sa.String(length=256), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("key_id"),
        sa.UniqueConstraint("key_hash"),
    )
    with op.batch_alter_table("baton_api_keys", schema=None) as batch_op:
        batch_op.create_index("ix_api_key_org", ["org_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("baton_api_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_api_key_org")
    op.drop_table("baton_api_keys")
