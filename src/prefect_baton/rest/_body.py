"""The request body as the ASGI layer delivers it: whether a request announces one, reading
it whole (or not at all, when the client goes away first), giving it again to the app, and
whether FastAPI reads it as JSON. Used by :class:`~prefect_baton.rest._http.BatonMiddleware`
and the MCP server's HTTP screen."""

from __future__ import annotations

import email.message

from starlette.types import Message, Receive, Scope

__all__ = ["BodyCut", "content_length", "has_body", "is_json", "receive_body", "replaying"]


def replaying(body: bytes, receive: Receive) -> Receive:
    """An ASGI ``receive`` for an app behind a middleware that has read the request's
    whole ``body`` (``bytes``): it gives ``body`` as one message, then defers to
    ``receive`` (e.g. for the disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodyCut(Exception):
    """The client went away before its request's body ended."""


async def receive_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole body of a request, read from its ASGI ``receive``; ``None`` once it is
    over ``limit`` (``int``, bytes; default none), the rest left unread. A body ends with a
    message saying no more follows; an ``http.disconnect`` before it (the client closed
    the connection, or the server did at its body deadline) leaves a body cut short, which
    no route may take for the whole: nothing runs for it.

    Raises:
        BodyCut: the client went away before the body's end (no answer is due).
    """
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            raise BodyCut
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    return b"".join(chunks)


def is_json(scope: Scope) -> bool:
    """Whether FastAPI reads the body of this request as JSON: a ``Content-Type`` of
    ``application/json`` or ``application/*+json`` (the first such header, parsed as
    FastAPI parses it). Without one FastAPI (``strict_content_type``, its default) does not
    read it as JSON; the route's validation error then says what to send."""
    value = next((v for n, v in scope.get("headers", []) if n.lower() == b"content-type"), None)
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value.decode("latin-1")
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def content_length(value: bytes) -> int | None:
    """The length in bytes (``int``) a ``Content-Length`` header's ``value`` announces, read
    as a number (``00`` is 0), or ``None`` when it is not digits alone (both HTTP parsers
    refuse such a head with ``400`` before the app sees it)."""
    value = value.strip()
    return int(value) if value.isdigit() and value.isascii() else None


def has_body(scope: Scope) -> bool:
    """Whether the request announces a body (a ``Content-Length`` other than 0, ``00``
    and the like, or a ``Transfer-Encoding``)."""
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name == b"content-length" and value.strip() and content_length(value) != 0:
            return True
        if name == b"transfer-encoding":
            return True
    return False
