"""The SQL side of keyset paging (:mod:`prefect_baton._rules.paging`): the condition that
keeps the rows after a page's last key, in a list ordered oldest first or newest first."""

from __future__ import annotations

import operator
from typing import Any

from sqlalchemy import and_, or_

__all__ = ["after_key"]


def after_key(at: Any, id_: Any, key: tuple[int, str], *, descending: bool = False) -> Any:
    """The condition (a SQLAlchemy expression) that a row comes after ``key`` (``(ms,
    id)``, the last key of the previous page) in a list ordered by the columns ``at`` (epoch
    milliseconds; a checkpoint's history: its version) and then ``id_``, both ascending
    (``descending``: both descending, as the lease list, newest first)."""
    ms, last = key
    beyond = operator.lt if descending else operator.gt
    return or_(beyond(at, ms), and_(at == ms, beyond(id_, last)))
