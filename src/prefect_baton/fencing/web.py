"""The fencing guard for FastAPI services: check the ``Baton-Fencing-Token`` header of a
request in the transaction of its write.

Needs FastAPI 0.121.1 or later (the ``rest`` extra; ``Depends(scope="function")`` commits
before the response is sent). A guarded route::

    from typing import Annotated
    from fastapi import FastAPI
    from sqlalchemy import Connection, create_engine, update
    from prefect_baton.fencing import ensure_fence_table
    from prefect_baton.fencing.web import add_error_handler, fenced_connection

    engine = create_engine("postgresql+psycopg://app@db/app")
    ensure_fence_table(engine)
    app = FastAPI()
    add_error_handler(app)  # errors as {"error": {"code": ..., "message": ...}}

    Fenced = Annotated[Connection, fenced_connection(engine, "deploy", "{service}")]

    @app.put("/deploys/{service}")
    def put_deploy(service: str, version: str, conn: Fenced) -> dict[str, str]:
        conn.execute(update(deploys).where(...).values(version=version))
        return {"service": service, "version": version}

A client sends :func:`prefect_baton.fencing.headers` of its lease with the request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from sqlalchemy.engine import Connection, Engine
from starlette.responses import Response

from prefect_baton.errors import BatonError
from prefect_baton.fencing._sql import DEFAULT_NAMESPACE, guard
from prefect_baton.fencing._token import FencingToken, token_from_headers
from prefect_baton.rest._http import STATUS_BY_CODE, baton_error_response

__all__ = ["FenceRefused", "add_error_handler", "fenced_connection", "fencing_token"]

ResourceId = str | Callable[[Request], str]


class FenceRefused(HTTPException):
    """A request refused by the fencing guard: ``409`` (``STALE_FENCE``: a newer holder has
    written, or the token is another resource's) or ``400`` (``VALIDATION_ERROR``: the
    token header is missing or malformed).

    With :func:`add_error_handler` the body is the REST API's error envelope,
    ``{"error": {"code": ..., "message": ...}}``; without it FastAPI answers the same
    status with ``{"detail": {"code": ..., "message": ...}}``.

    Attributes:
        error: the :class:`~prefect_baton.errors.BatonError` behind it.
    """

    def __init__(self, error: BatonError) -> None:
        super().__init__(status_code=STATUS_BY_CODE.get(error.code, 500), detail=error.to_dict())
        self.error = error


def _resource_id(resource_id: ResourceId, request: Request) -> str:
    if callable(resource_id):
        return resource_id(request)
    try:
        return resource_id.format_map(request.path_params)
    except (KeyError, IndexError, ValueError) as exc:
        raise RuntimeError(
            f"fencing resource id template {resource_id!r} does not fit the route's path "
            f"parameters {sorted(request.path_params)}: {exc!r}"
        ) from None


def _token_dependency(
    resource_type: str, resource_id: ResourceId
) -> Callable[[Request], FencingToken]:
    def fencing_token_of(request: Request) -> FencingToken:
        try:
            rid = _resource_id(resource_id, request)
            return token_from_headers(request.headers, resource_type, rid)
        except BatonError as exc:
            raise FenceRefused(exc) from exc

    return fencing_token_of


def fencing_token(resource_type: str, resource_id: ResourceId) -> Any:
    """A FastAPI dependency giving the request's validated
    :class:`~prefect_baton.fencing.FencingToken` for the resource the route writes, for a
    route that runs its own transaction and calls :func:`~prefect_baton.fencing.guard`.

    Args:
        resource_type: the resource type the route writes (``str``).
        resource_id: the resource id: a template formatted with the route's path parameters
            (``"{service}"``) or a function of the :class:`~fastapi.Request`.

    Returns:
        ``Depends(...)``: use as ``token: Annotated[FencingToken, fencing_token(...)]``.
        The dependency raises :class:`FenceRefused` (400 for a missing or malformed header,
        409 for another resource's token).
    """
    return Depends(_token_dependency(resource_type, resource_id))


def fenced_connection(
    engine: Engine,
    resource_type: str,
    resource_id: ResourceId,
    *,
    namespace: str = DEFAULT_NAMESPACE,
) -> Any:
    """A FastAPI dependency giving a :class:`~sqlalchemy.engine.Connection` in a transaction
    that has passed :func:`~prefect_baton.fencing.guard` for the request's fencing token.

    Write through it in the route (a ``def`` route: the connection is synchronous). The
    transaction commits when the route returns (before the response is sent, so a failed
    commit is an error response) and rolls back when it raises. A request whose token is
    lower than one that has written the resource is refused with ``409 STALE_FENCE`` before
    the route runs; one without a valid token with ``400 VALIDATION_ERROR`` (see
    :func:`~prefect_baton.fencing.token_from_headers` for the headers).

    Args:
        engine: your database (SQLite 3.35+ or PostgreSQL) with the fence table
            (:func:`~prefect_baton.fencing.ensure_fence_table`).
        resource_type: the resource type the route writes (``str``).
        resource_id: the resource id: a template formatted with the route's path parameters
            (``"{service}"``) or a function of the :class:`~fastapi.Request`.
        namespace: the guard's namespace (``str``, default ``"default"``).

    Returns:
        ``Depends(...)``: use as ``conn: Annotated[Connection, fenced_connection(...)]``.
    """
    token_of = _token_dependency(resource_type, resource_id)

    def fenced(token: FencingToken = Depends(token_of)) -> Iterator[Connection]:
        with engine.begin() as conn:
            try:
                guard(conn, token, namespace=namespace)
            except BatonError as exc:
                raise FenceRefused(exc) from exc
            yield conn

    return Depends(fenced, scope="function")


async def _on_refused(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FenceRefused)
    return baton_error_response(exc.error)


async def _on_baton_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BatonError)
    return baton_error_response(exc)


def add_error_handler(app: FastAPI) -> None:
    """Answer fencing refusals (and any :class:`~prefect_baton.errors.BatonError` a route
    raises, e.g. from its own :func:`~prefect_baton.fencing.guard` call) with the REST API's
    error envelope ``{"error": {"code": ..., "message": ...}}`` and its status (``409`` for
    ``STALE_FENCE``, ``400`` for ``VALIDATION_ERROR``)."""
    app.add_exception_handler(FenceRefused, _on_refused)
    app.add_exception_handler(BatonError, _on_baton_error)
