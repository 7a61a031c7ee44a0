"""The REST API of prefect-baton (FastAPI) and its bearer keys.

Install with the ``rest`` extra (``fastapi``, ``uvicorn``, ``httpx``). See
:mod:`prefect_baton.rest.app` for routes, envelopes and statuses, and
:mod:`prefect_baton.rest.keys` for keys and scopes. The names below are imported on first
access (:mod:`prefect_baton._lazy`), so the server's supervisor process
(:func:`prefect_baton.rest.__main__.supervise`) loads none of FastAPI or the stores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect_baton.rest._http import MAX_BODY_BYTES, STATUS_BY_CODE
    from prefect_baton.rest.app import create_app
    from prefect_baton.rest.keys import ALL_SCOPES, ApiKey, create_key, list_keys, revoke_key
else:
    from prefect_baton._lazy import exports, listing

    __getattr__ = exports(
        __name__,
        {
            "MAX_BODY_BYTES": "prefect_baton.rest._http",
            "STATUS_BY_CODE": "prefect_baton.rest._http",
            "create_app": "prefect_baton.rest.app",
            "ALL_SCOPES": "prefect_baton.rest.keys",
            "ApiKey": "prefect_baton.rest.keys",
            "create_key": "prefect_baton.rest.keys",
            "list_keys": "prefect_baton.rest.keys",
            "revoke_key": "prefect_baton.rest.keys",
        },
    )
    __dir__ = listing(__name__)

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
