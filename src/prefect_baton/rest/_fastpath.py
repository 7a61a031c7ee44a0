"""A shorter way through FastAPI for the hottest routes (``POST /v1/leases``, ``DELETE
/v1/leases/{lease_id}``): :func:`install` gives a route a request handler that reads the
route's parameters itself, validates each with the very field FastAPI would validate it
with (the body as :class:`~prefect_baton.rest._http.BatonMiddleware` parsed it, else
read by :func:`~prefect_baton.rest._json_body.read_json_body`, the JSON rule of the whole API:
a body it refuses is ``400 VALIDATION_ERROR`` here too), and runs the
endpoint on a worker thread as FastAPI does; anything else out of the
ordinary (a validation error, a body that is not ``Content-Type: application/json``, a
missing required value, dependency overrides, FastAPI's telemetry switched on) is handed
to FastAPI's own handler of the route, which answers it as before. Responses, errors and
the OpenAPI document are FastAPI's; only the work per request is less (FastAPI's
dependency solving costs about 350 Python calls per acquire+release pair).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute, request_response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from prefect_baton.rest._http import JSON_BODY_STATE
from prefect_baton.rest._json_body import read_json_body

try:
    from fastapi.telemetry import get_telemetry_data
except ImportError:  # pragma: no cover - FastAPI before its telemetry

    def get_telemetry_data() -> Any:  # type: ignore[misc]
        """No telemetry in this FastAPI."""
        return None


__all__ = ["install"]

_Handler = Callable[[Request], Awaitable[Response]]


class _Fallback(Exception):
    """The request needs FastAPI's own handling (a value missing or invalid)."""


def _check_supported(route: APIRoute) -> None:
    """Refuse a route whose parameters :func:`install` does not read itself.

    Raises:
        TypeError: the route has query, cookie or form parameters, a ``Response``,
            ``BackgroundTasks``, ``SecurityScopes`` or ``HTTPConnection`` parameter, a
            response model, route-level dependencies, embedded body fields, a header
            without an explicit alias, an async endpoint, or a dependency that is not an
            ``async`` function of the request alone.
    """
    d = route.dependant
    problems = []
    if d.query_params or d.cookie_params or d.websocket_param_name:
        problems.append("query, cookie or websocket parameters")
    if (
        d.background_tasks_param_name
        or d.response_param_name
        or d.security_scopes_param_name
        or d.http_connection_param_name
    ):
        problems.append("a BackgroundTasks, Response, SecurityScopes or HTTPConnection parameter")
    if route.response_field is not None:
        problems.append("a response model (the endpoint must return a Response)")
    if route.dependencies or route._embed_body_fields or len(d.body_params) > 1:
        problems.append("route dependencies or several body fields")
    if any(not h.field_info.alias for h in d.header_params):
        problems.append("a header parameter without an alias")
    params = [*d.path_params, *d.header_params]
    if any(
        isinstance(p.field_info.annotation, type) and issubclass(p.field_info.annotation, BaseModel)
        for p in params
    ):
        problems.append("path or header parameters in a model")
    if route.body_field is not None and type(route.body_field.field_info).__name__ != "Body":
        problems.append("a form body")
    for sub in d.dependencies:
        only_request = sub.request_param_name and not (
            sub.dependencies
            or sub.path_params
            or sub.query_params
            or sub.header_params
            or sub.cookie_params
            or sub.body_params
        )
        if not only_request or sub.name is None or not _is_async(sub.call):
            problems.append(f"dependency {sub.name!r} takes more than the request")
    if _is_async(d.call):
        problems.append("an async endpoint")
    if problems:
        raise TypeError(f"no fast path for {route.path}: {', '.join(problems)}")


def _is_async(call: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(call)


def _field_value(field: Any, value: Any, loc: tuple[str, ...]) -> Any:
    """``value`` validated by ``field`` as FastAPI validates a request parameter: a missing
    one is its default (a deep copy, validated if the field says so) unless required.

    Raises:
        _Fallback: required and missing, or invalid.
    """
    if value is None:
        if field.field_info.is_required():
            raise _Fallback
        value = copy.deepcopy(field.default)
        if not field.field_info.validate_default:
            return value
    validated, errors = field.validate(value, {}, loc=loc)
    if errors:
        raise _Fallback
    return validated


def install(route: APIRoute) -> None:
    """Serve ``route`` (a FastAPI :class:`~fastapi.routing.APIRoute`) through the fast path
    described in the module docstring; FastAPI's handler stays its fallback.

    Raises:
        TypeError: the route has parameters the fast path does not read
            (:func:`_check_supported`).
    """
    _check_supported(route)
    slow: _Handler = route.get_route_handler()
    d = route.dependant
    endpoint: Callable[..., Any] = route.endpoint
    body_field = route.body_field
    path_fields = [(f.name, f) for f in d.path_params]
    header_fields = [(f.name, str(f.field_info.alias).lower(), f) for f in d.header_params]
    deps: list[tuple[str, Callable[..., Awaitable[Any]], str]] = [
        (str(sub.name), sub.call, str(sub.request_param_name))
        for sub in d.dependencies
        if sub.call is not None
    ]
    request_name = d.request_param_name
    provider = route.dependency_overrides_provider

    async def handler(request: Request) -> Response:
        if getattr(provider, "dependency_overrides", None) or get_telemetry_data() is not None:
            return await slow(request)
        values: dict[str, Any] = {}
        try:
            if body_field is not None:
                if request.headers.get("content-type") != "application/json":
                    raise _Fallback
                raw = await request.body()
                if not raw:  # FastAPI: the body is missing
                    raise _Fallback
                state = request.scope.get("state", {})
                if JSON_BODY_STATE in state:  # parsed by BatonMiddleware already
                    data = state[JSON_BODY_STATE]
                else:  # the JSON rule of BatonMiddleware (raises 400)
                    data = await read_json_body(raw)
                values[body_field.name] = _field_value(body_field, data, ("body",))
            params = request.path_params
            for name, field in path_fields:
                values[name] = _field_value(field, params.get(name), ("path", name))
            headers = request.headers
            for name, alias, field in header_fields:
                values[name] = _field_value(field, headers.get(alias), ("header", alias))
        except _Fallback:
            return await slow(request)
        for name, call, param in deps:
            values[name] = await call(**{param: request})
        if request_name:
            values[request_name] = request
        response = await run_in_threadpool(endpoint, **values)
        assert isinstance(response, Response), "fast-path endpoints return a Response"
        return response

    route.app = request_response(handler)
