"""Fencing at your own resource: refuse a write made under a lease a newer holder has
since written under.

A lease keeps out participants that ask for it; a process that paused (a GC pause, a
suspended VM, a slow network) can still believe it holds an expired lease and write. The
lease's epoch is a fencing token that rises with every new holder, so the place where the
write lands can refuse a token lower than one it has already seen (Kleppmann, "How to do
distributed locking"). These guards do that check where your write lands:

* your SQL database (SQLite 3.35+, PostgreSQL): :func:`guard` in the write's transaction,
  with the ``baton_fences`` table (:func:`ensure_fence_table`, :data:`fence_table`);
* an HTTP service: the client sends :func:`headers` (``Baton-Fencing-Token``), a FastAPI
  service checks them with :mod:`prefect_baton.fencing.web`, any other with
  :func:`token_from_headers` and :func:`guard`;
* an object store with conditional writes (generation / ETag preconditions):
  :func:`conditional_put`.

Every guard applies one rule, :func:`prefect_baton._rules.core.check_fencing_token`: the
same token passes any number of times, a lower one raises
:class:`~prefect_baton.errors.StaleFenceError` (code ``STALE_FENCE``), and bad input raises
:class:`~prefect_baton.errors.ValidationError`. See the "Fencing your own writes" page of
the documentation.

Importing this module loads SQLAlchemy only (no Redis, Prefect or FastAPI).
"""

from __future__ import annotations

from prefect_baton.errors import StaleFenceError
from prefect_baton.fencing._objects import (
    METADATA_KEY,
    PreconditionFailed,
    StoredObject,
    conditional_put,
    object_metadata,
    token_from_metadata,
)
from prefect_baton.fencing._sql import (
    DEFAULT_NAMESPACE,
    FENCE_TABLE_NAME,
    ensure_fence_table,
    fence_metadata,
    fence_table,
    guard,
    highest_token,
)
from prefect_baton.fencing._token import (
    RESOURCE_HEADER,
    TOKEN_HEADER,
    Fenceable,
    FencingToken,
    headers,
    token_from_headers,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "FENCE_TABLE_NAME",
    "METADATA_KEY",
    "RESOURCE_HEADER",
    "TOKEN_HEADER",
    "Fenceable",
    "FencingToken",
    "PreconditionFailed",
    "StaleFenceError",
    "StoredObject",
    "conditional_put",
    "ensure_fence_table",
    "fence_metadata",
    "fence_table",
    "guard",
    "headers",
    "highest_token",
    "object_metadata",
    "token_from_headers",
    "token_from_metadata",
]
