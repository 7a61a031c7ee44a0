"""The REST API of prefect-baton (FastAPI) and its bearer keys.

Install with the ``rest`` extra (``fastapi``, ``uvicorn``, ``httpx``). See
:mod:`prefect_baton.rest.app` for routes, envelopes and statuses, and
:mod:`prefect_baton.rest.keys` for keys and scopes.
"""

from __future__ import annotations

from prefect_baton.rest._http import MAX_BODY_BYTES, STATUS_BY_CODE
from prefect_baton.rest.app import create_app
from prefect_baton.rest.keys import ALL_SCOPES, ApiKey, create_key, list_keys, revoke_key

__all__ = [
    "ALL_SCOPES",
    "MAX_BODY_BYTES",
    "STATUS_BY_CODE",
    "ApiKey",
    "create_app",
    "create_key",
    "list_keys",
    "revoke_key",
]
