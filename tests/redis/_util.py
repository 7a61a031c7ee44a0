"""Helpers of the Redis authority tests."""

from __future__ import annotations

from prefect_baton import Baton
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.queries import EventQuery


def kinds_of(store: LedgerStore, b: Baton) -> list[str]:
    """The kinds of the org's events in the ledger, read without draining first."""
    return [e.kind for e in store.events_list(b.caller, EventQuery(limit=1000))]
