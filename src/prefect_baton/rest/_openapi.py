"""The OpenAPI document of the REST API: the success envelope of every ``/v1`` operation
(``data`` with the real model's schema, see :mod:`._responses`), the error envelope for the
statuses the app really returns, and FastAPI's default ``422`` (replaced by ``400``)
removed."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ._responses import success_schemas

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
            },
        }
    },
}

_STATUSES = {
    "400": "VALIDATION_ERROR: bad values, malformed JSON, wrong types, unknown fields",
    "401": "UNAUTHENTICATED: no, unknown or revoked bearer key",
    "403": "FORBIDDEN: the role or the key's scopes do not allow it",
    "404": "NOT_FOUND: unknown, not in the needed state, or another org's",
    "409": "CONFLICT, VERSION_CONFLICT, IDEMPOTENCY_MISMATCH, IDEMPOTENCY_IN_FLIGHT, "
    "LEASE_LOST or STALE_FENCE",
    "413": "PAYLOAD_TOO_LARGE: body over 2 MiB",
    "503": "UNAVAILABLE: the ledger or lease authority cannot be reached",
}


def _declare_success(responses: dict[str, Any], envelope: dict[str, Any] | None) -> None:
    """Put ``envelope`` as the JSON schema of the operation's 2xx response(s)."""
    if envelope is None:
        return
    for status, response in responses.items():
        if status.startswith("2"):
            response["content"] = {"application/json": {"schema": envelope}}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (``FastAPI``) return the corrected document (built once)."""

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
        for path, item in doc.get("paths", {}).items():
            for method, op in item.items():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                if path.startswith("/v1/"):
                    op["security"] = [{"bearer": []}]
                    _declare_success(responses, envelopes.get((method.upper(), path)))
                    for status, text in _STATUSES.items():
                        responses.setdefault(
                            status,
                            {"description": text, "content": {"application/json": {"schema": ref}}},
                        )
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
