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

from fastapi import Depends, FastAPI, Request
from starlette.responses import RedirectResponse, Response

from prefect_baton._rules.access import check_scope
from prefect_baton.rest._deps import B
from prefect_baton.timeline import build_timeline, render_svg

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "TIMELINE_SCOPES", "add_routes", "asset"]

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

#: Scopes a key needs for a resource's timeline: it is drawn from the event stream, the
#: lease generations, and the outcomes (with their evidence) and handoffs of the resource,
#: so it needs every read scope those routes need.
TIMELINE_SCOPES = ("events:read", "leases:read", "outcomes:read", "handoffs:read")

#: The timeline picture is an image: nothing in it may load or run.
_SVG_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
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
    ``app``, none of them needing a key (they carry no data), and the timeline picture
    ``GET /v1/resources/timeline.svg?resource_type=T&resource_id=I`` (a bearer key with
    :data:`TIMELINE_SCOPES`); none of them is in the OpenAPI document, whose ``/v1``
    operations all answer JSON envelopes."""

    def timeline_scopes(request: Request) -> None:
        """A route dependency, so it is checked before the query parameters are: a key
        without :data:`TIMELINE_SCOPES` is refused whatever its query."""
        granted: tuple[str, ...] = request.state.scopes
        for need in TIMELINE_SCOPES:
            check_scope(granted, need)

    # The ids are query parameters, as for inspect: an id may contain "/".
    @app.get(
        "/v1/resources/timeline.svg",
        include_in_schema=False,
        dependencies=[Depends(timeline_scopes)],
    )
    def timeline(resource_type: str, resource_id: str, b: B) -> Response:
        """The resource's lease timeline as SVG (``image/svg+xml``), as the key's principal
        may see it (:func:`~prefect_baton.timeline.build_timeline`): another org's resource
        is an empty picture. Errors are JSON envelopes: ``403`` for a key without
        :data:`TIMELINE_SCOPES` (before anything of the query is looked at), then ``400``
        for a missing or bad id."""
        svg = render_svg(build_timeline(b, resource_type, resource_id))
        return Response(svg, media_type="image/svg+xml", headers=_SVG_HEADERS)

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
