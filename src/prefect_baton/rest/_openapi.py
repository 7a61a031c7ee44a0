"""The OpenAPI document of the REST API: the success envelope of every ``/v1`` operation
(``data`` with the real model's schema, see :mod:`._responses`), the error envelope for the
statuses the app really returns, FastAPI's default ``422`` (replaced by ``400``) removed,
the bounds of path and query parameters stated, and ``Idempotency-Key`` documented only on
the routes that honour it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute

from prefect_baton._rules.paging import MAX_PAGE
from prefect_baton._rules.validation import MAX_ID_LENGTH
from prefect_baton.rest._responses import success_schemas
from prefect_baton.rest._schemas import NO_CONTROL

__all__ = ["install_openapi"]

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "expires_at": {"type": "string"},
                "current_version": {"type": "integer"},
                "expected_version": {"type": "integer"},
                "status": {"type": "string"},
            },
        },
        "meta": {
            "type": "object",
            "required": ["request_id"],
            "properties": {"request_id": {"type": "string"}},
        },
    },
}

_STATUSES = {
    "400": "VALIDATION_ERROR: bad values, malformed JSON, wrong types, unknown fields",
    "401": "UNAUTHENTICATED: no, unknown or revoked bearer key",
    "403": "FORBIDDEN: the role or the key's scopes do not allow it, or Redis decides "
    "the org's leases and this server has no Redis URL",
    "404": "NOT_FOUND: unknown, not in the needed state, or another org's",
    "409": "CONFLICT, VERSION_CONFLICT, IDEMPOTENCY_MISMATCH, IDEMPOTENCY_IN_FLIGHT, "
    "LEASE_LOST or STALE_FENCE",
    "413": "PAYLOAD_TOO_LARGE: body over {limit:,} bytes: the larger of 2 MiB and 3 times "
    "the checkpoint state cap (state_max_bytes, GET /v1/me) + 64 KiB, so that a state within "
    "the cap fits even when sent with ASCII escapes; or a JSON body holding more objects and "
    "arrays than half the larger of the state cap and 1 MiB, plus 32,768 (557,056 by default)",
    "415": "VALIDATION_ERROR: a Content-Encoding other than identity (the body is read "
    "only as sent, unencoded)",
    "503": "UNAVAILABLE: the ledger or lease authority cannot be reached",
}


#: Largest ``limit`` per operation (the Python API's bounds,
#: :data:`~prefect_baton._rules.paging.MAX_PAGE`); 10,000 where not listed.
LIMIT_MAX: dict[tuple[str, str], int] = {
    ("GET", "/v1/events"): MAX_PAGE["events"],
    ("GET", "/v1/outcomes"): MAX_PAGE["outcomes"],
    ("GET", "/v1/checkpoints/history"): MAX_PAGE["checkpoints"],
}
_ID_PARAM: dict[str, Any] = {"minLength": 1, "maxLength": MAX_ID_LENGTH, "pattern": NO_CONTROL}


def _constrain_parameters(op_key: tuple[str, str], params: list[dict[str, Any]]) -> None:
    """State the Python API's bounds on path and query parameters: every string one is an
    id (1..256 characters, no control characters), as is ``Idempotency-Key``; ``limit`` is
    1..max, ``after`` 0..2**63-1."""
    for param in params:
        if param.get("in") not in ("path", "query") and param.get("name") != "Idempotency-Key":
            continue
        schema = param.get("schema", {})
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") == "string":
                branch.update(_ID_PARAM)
            elif branch.get("type") == "integer" and param.get("name") == "limit":
                branch.update(minimum=1, maximum=LIMIT_MAX.get(op_key, 10_000))
            elif branch.get("type") == "integer" and param.get("name") == "after":
                branch.update(minimum=0, maximum=2**63 - 1)


def _no_receipt_operations(app: FastAPI) -> set[tuple[str, str]]:
    """``(METHOD, path)`` of the routes that refuse ``Idempotency-Key`` (no receipt)."""
    out: set[tuple[str, str]] = set()
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        names = {getattr(d.call, "__name__", "") for d in route.dependant.dependencies}
        if "_no_idempotency_key" in names:
            out |= {(m, route.path) for m in route.methods or ()}
    return out


def _declare_success(responses: dict[str, Any], envelope: dict[str, Any] | None) -> None:
    """Put ``envelope`` as the JSON schema of the operation's 2xx response(s)."""
    if envelope is None:
        return
    for status, response in responses.items():
        if status.startswith("2"):
            response["content"] = {"application/json": {"schema": envelope}}


#: Where the document and its pages are served.
OPENAPI_PATH, DOCS_PATH, REDOC_PATH = "/openapi.json", "/docs", "/redoc"


def install_openapi(app: FastAPI, max_body_bytes: int) -> None:
    """Make ``app.openapi()`` (``FastAPI``) return the corrected document (built once);
    its ``413`` states ``max_body_bytes`` (``int``, the app's body limit in bytes). Serve it
    at :data:`OPENAPI_PATH`, with Swagger UI at :data:`DOCS_PATH` and ReDoc at
    :data:`REDOC_PATH`, as routes of the app's own route class (build the app with
    ``openapi_url=None, docs_url=None, redoc_url=None``), so they follow every route's
    rules: an unknown query parameter or a body is ``400``, ``HEAD`` is ``GET`` without
    the body.
    """

    @app.get(OPENAPI_PATH, include_in_schema=False)
    def openapi_document() -> JSONResponse:
        """The OpenAPI document."""
        return JSONResponse(app.openapi())

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        """Swagger UI over the document."""
        return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title=f"{app.title} - Swagger UI")

    @app.get(REDOC_PATH, include_in_schema=False)
    def redoc() -> HTMLResponse:
        """ReDoc over the document."""
        return get_redoc_html(openapi_url=OPENAPI_PATH, title=f"{app.title} - ReDoc")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["ErrorEnvelope"] = _ERROR_SCHEMA
        ref = {"$ref": "#/components/schemas/ErrorEnvelope"}
        envelopes, components = success_schemas()
        for name, schema in components.items():
            schemas.setdefault(name, schema)
        doc.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"}
        }
        no_receipt = _no_receipt_operations(app)
        for path, item in doc.get("paths", {}).items():
            for method, op in item.items():
                key = (method.upper(), path)
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                if key in no_receipt:  # the header is refused there (400), not a parameter
                    op["parameters"] = [
                        p for p in op.get("parameters", []) if p.get("name") != "Idempotency-Key"
                    ]
                _constrain_parameters(key, op.get("parameters", []))
                if path.startswith("/v1/"):
                    op["security"] = [{"bearer": []}]
                    _declare_success(responses, envelopes.get(key))
                    for status, text in _STATUSES.items():
                        responses.setdefault(
                            status,
                            {
                                "description": text.format(limit=max_body_bytes),
                                "content": {"application/json": {"schema": ref}},
                            },
                        )
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
