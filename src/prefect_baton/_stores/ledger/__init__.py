"""The SQL ledger: SQLModel tables, Alembic migrations and the store that applies decisions."""
