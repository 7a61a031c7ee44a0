"""Prefect 3 integration: ``@leased`` tasks and flows, ``with lease(...)`` blocks, handoffs
between deployments, Prefect events for every ledger transition, a board artifact and a
Block.

Importing this module needs Prefect (``pip install 'prefect-baton[prefect]'``); the core
``prefect_baton`` package never imports Prefect. Prefect loads this module through the
``prefect.collections`` entry point, which registers :class:`BatonBlock`.
"""

from __future__ import annotations

from prefect_baton.prefect._accept import AcceptedHandoff, accept_handoff
from prefect_baton.prefect._block import BatonBlock
from prefect_baton.prefect._board import board_rows, publish_board, timelines_markdown
from prefect_baton.prefect._context import RunIdentity, current_baton, current_lease, run_identity
from prefect_baton.prefect._decorators import leased
from prefect_baton.prefect._events import can_emit, relay_events
from prefect_baton.prefect._handoff import (
    HandoffRejected,
    SentHandoff,
    ahandoff_to,
    handoff_to,
    start_recipient,
)
from prefect_baton.prefect._lease import LeaseBlock, lease
from prefect_baton.prefect._outbox import flush_events
from prefect_baton.prefect._serve import prefect_api, serving, wait_for_run

__all__ = [
    "AcceptedHandoff",
    "BatonBlock",
    "HandoffRejected",
    "LeaseBlock",
    "RunIdentity",
    "SentHandoff",
    "accept_handoff",
    "ahandoff_to",
    "board_rows",
    "can_emit",
    "current_baton",
    "current_lease",
    "flush_events",
    "handoff_to",
    "lease",
    "leased",
    "prefect_api",
    "publish_board",
    "relay_events",
    "run_identity",
    "serving",
    "start_recipient",
    "timelines_markdown",
    "wait_for_run",
]
