"""The live web page of the REST API: ``GET /ui`` (HTML) and its two assets, ``/ui/ui.js``
and ``/ui/ui.css``, shipped as package data in :mod:`prefect_baton.rest.ui` (no build
step). The page itself carries no data: the browser signs in with a bearer key and reads
everything from the ``/v1`` routes with ``Authorization: Bearer``, so organization
isolation and roles are exactly the REST API's. The routes are left out of the OpenAPI
document, and the page is sent with a strict ``Content-Security-Policy`` (scripts, styles
and requests from the same origin only; no inline script, no framing)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import FastAPI
from starlette.responses import RedirectResponse, Response

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "add_routes", "asset"]

#: The policy sent with the page and its assets: everything from the page's own origin,
#: images also as ``data:``/``blob:`` (the timeline picture), nothing inline, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data: blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

#: File name and media type of each asset served under ``/ui``.
ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def asset(name: str) -> bytes:
    """The bytes of the packaged asset ``name`` (``str``, a key of :data:`ASSETS`).

    Raises:
        KeyError: ``name`` is not an asset.
    """
    if name not in ASSETS:
        raise KeyError(name)
    return files("prefect_baton.rest.ui").joinpath(name).read_bytes()


def _send(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=_HEADERS)


def add_routes(app: FastAPI) -> None:
    """Register ``/ui``, ``/ui/`` (a redirect), ``/ui/ui.js`` and ``/ui/ui.css`` on
    ``app``, none of them in the OpenAPI document and none needing a key (they carry no
    data)."""

    @app.get("/ui", include_in_schema=False)
    def page() -> Response:
        return _send("index.html")

    @app.get("/ui/", include_in_schema=False)
    def page_slash() -> Response:
        return RedirectResponse("/ui", status_code=308)

    @app.get("/ui/ui.js", include_in_schema=False)
    def script() -> Response:
        return _send("ui.js")

    @app.get("/ui/ui.css", include_in_schema=False)
    def style() -> Response:
        return _send("ui.css")
