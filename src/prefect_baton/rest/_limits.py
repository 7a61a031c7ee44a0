"""Connection limits of the HTTP server that its supervisor process needs too (standard
library only, so that :func:`prefect_baton.rest.__main__.supervise` can configure uvicorn
without loading :mod:`prefect_baton.rest._protocol` and the app behind it)."""

from __future__ import annotations

__all__ = ["ACCEPT_BATCH", "MAX_HEAD_BYTES"]

#: Largest incomplete request head (request line and headers) kept, in bytes (h11's
#: default): a client that has sent more without ending its head is answered ``400``.
MAX_HEAD_BYTES = 16 * 1024
#: Connections accepted per wake-up of the listening socket, and its listen queue (uvicorn's
#: ``backlog``). asyncio accepts a whole batch before the connection cap of
#: :mod:`prefect_baton.rest._protocol` can close any connection, so the cap leaves room for
#: two batches.
ACCEPT_BATCH = 100
