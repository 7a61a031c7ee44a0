"""index of an org's handoffs by status and creation (baton_handoffs)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

The org-wide handoff listing of ``owner``/``admin`` (``GET /v1/handoffs?party=*``, pending
by default) reads an org's handoffs of one status, oldest first, in keyset pages.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_handoff_org_status",
        "baton_handoffs",
        ["org_id", "status", "created_at_ms", "handoff_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_handoff_org_status", table_name="baton_handoffs")
