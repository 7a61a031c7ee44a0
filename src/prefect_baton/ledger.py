"""Public functions for the ledger's schema: what ``baton db upgrade|current`` call.

The ledger migrates itself on first use; these make it an explicit deployment step.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import make_url

from prefect_baton._stores.ledger.engine import (
    current_revision,
    head_revision,
    make_engines,
    upgrade_from_to,
)

__all__ = ["LedgerRevision", "ledger_revision", "upgrade_ledger"]


@dataclass(frozen=True)
class LedgerRevision:
    """Where a ledger's schema stands.

    Attributes:
        ledger_url: the URL with any password hidden (``str``).
        previous_revision: the revision before an upgrade (``None`` for an empty database;
            equal to ``revision`` for a read).
        revision: the revision now (``str | None``).
        head: the newest revision this package ships (``str``).
    """

    ledger_url: str
    previous_revision: str | None
    revision: str | None
    head: str

    @property
    def up_to_date(self) -> bool:
        """Whether the ledger is at the newest shipped revision."""
        return self.revision == self.head


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def upgrade_ledger(ledger_url: str, revision: str = "head") -> LedgerRevision:
    """Apply the shipped Alembic migrations to ``ledger_url`` up to ``revision``.

    Safe when many processes do it at once (SQLite's write lock or a PostgreSQL advisory
    lock serialises them).

    Raises:
        ValidationError: a malformed or unsupported URL; ``revision`` not shipped, or older
            than the ledger's (an upgrade never downgrades).
        UnavailableError: unreachable.
    """
    engines = make_engines(ledger_url)
    try:
        before, after = upgrade_from_to(engines, revision)
        return LedgerRevision(_safe(engines.url), before, after, head_revision())
    finally:
        engines.dispose()


def ledger_revision(ledger_url: str) -> LedgerRevision:
    """Read the revision of ``ledger_url`` without changing it.

    Raises:
        ValidationError: a malformed or unsupported URL. UnavailableError: unreachable.
    """
    engines = make_engines(ledger_url)
    try:
        rev = current_revision(engines)
        return LedgerRevision(_safe(engines.url), rev, rev, head_revision())
    finally:
        engines.dispose()
