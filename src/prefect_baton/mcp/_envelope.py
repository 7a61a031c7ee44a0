"""The JSON-RPC envelope rule of both MCP transports: one parse of each message (duplicate
keys refused as the REST API refuses them), an id that is a string or an integer, and short
readable errors (``-32700`` not JSON, ``-32600`` not a request, ``-32602`` bad params) instead
of the ``mcp`` package's silence or pydantic dumps; a notification is never answered
(JSON-RPC 2.0), so one that is refused is only logged.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import pydantic

from prefect_baton.errors import (
    from_pydantic,
)
from prefect_baton.rest._json_body import (
    DuplicateKey,
    NotUtf8,
    body_text,
    unique_keys,
)

__all__ = [
    "Dropped",
    "Refusal",
    "is_request_id",
    "read_bytes",
    "read_message",
    "refusal",
    "screen_message",
]

logger = logging.getLogger("prefect_baton.mcp")


@dataclass(frozen=True)
class Dropped:
    """A notification (a ``method``, no ``id``) that :func:`screen_message` refuses: it
    gets no answer (JSON-RPC 2.0: a notification is never answered; over HTTP ``202``
    with no body), only a warning in the log naming its ``method`` and the ``error``
    (the JSON-RPC error it would have had)."""

    method: str
    error: types.ErrorData


class Refusal(types.JSONRPCError):
    """The JSON-RPC error with which the server refuses a message a client sent (made by
    :func:`refusal`), told apart from a JSON-RPC error response the client sent (a plain
    :class:`mcp.types.JSONRPCError`, which is a response like a ``result``: passed to the
    ``mcp`` package, never echoed back)."""


def refusal(code: int, label: str, detail: str, rid: types.RequestId | None) -> Refusal:
    """The JSON-RPC error ``code`` (``int``) answering request ``rid`` (``None``: its id
    could not be told), with the message ``"<label>: <detail>"``."""
    return Refusal(
        jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=f"{label}: {detail}")
    )


class _Pairs(list[tuple[str, Any]]):
    """The key/value pairs of one JSON object that names a key twice, as read."""


def is_request_id(value: Any) -> bool:
    """Whether ``value`` is an MCP request id: a string or an integer (not a boolean)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _envelope_problem(exc: pydantic.ValidationError) -> tuple[int, str, str]:
    """The JSON-RPC code, label and one-line detail of a message that is JSON but not a
    JSON-RPC message of MCP: ``-32602`` (invalid params) when only its ``params`` are
    wrong, else ``-32600`` (invalid request); the detail names each field and what it
    must be (:func:`~prefect_baton.errors.from_pydantic`, no pydantic URL)."""
    errors = exc.errors()
    detail = str(from_pydantic(exc, root="message"))
    if errors and all(tuple(e.get("loc", ()))[:1] == ("params",) for e in errors):
        return types.INVALID_PARAMS, "Invalid params", detail
    return types.INVALID_REQUEST, "Invalid Request", detail


def _notified_method(doc: Any) -> str | None:
    """The ``method`` of ``doc`` when it is a notification: an object with ``jsonrpc``
    ``"2.0"``, a string ``method`` and no ``id`` (read as given, the last of a key given
    twice), else ``None``."""
    fields = dict(doc) if isinstance(doc, (dict, _Pairs)) else {}
    method = fields.get("method")
    if "id" in fields or fields.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return None
    return method


def screen_message(
    doc: Any, duplicate: DuplicateKey | None = None
) -> types.JSONRPCMessage | Refusal | Dropped:
    """One JSON document ``doc`` a client sent (a stdin line or an HTTP body, read once by
    :func:`read_message`) as the JSON-RPC message the ``mcp`` package serves (a JSON-RPC
    error response the client sent is such a message, a response like a ``result``), or
    the :class:`Refusal` that answers it instead, or :class:`Dropped` when that error would
    answer a notification (``jsonrpc`` ``"2.0"``, a string ``method``, no ``id``: a key
    given twice, or ``params`` that are not an object). The one envelope rule of both
    transports:

    - an object naming a key twice, at any depth (``duplicate``: the first one, by the
      REST API's rule :func:`~prefect_baton.rest._json_body.unique_keys`): ``-32600`` with the
      rule's words, and the request's ``id`` when its top-level ``id`` is given once as a
      string or integer, else ``id`` null;
    - a request (``method`` given) whose ``id`` is not a string or an integer (``null``,
      an object, ``1.5``, ``true``): ``-32600``, ``id`` null. MCP ids are strings or
      integers, and the package would take such a message for a notification and answer
      nothing (HTTP ``202``), leaving its client waiting;
    - a request whose ``params`` are not an object, or a ``tools/call`` whose ``name`` is
      not a string or whose ``arguments`` are not an object: ``-32602`` (invalid params)
      with its ``id``; any other shape that is not a JSON-RPC message: ``-32600``, ``id``
      null. The message names the field and what it must be, in one line
      (``Invalid params: params.arguments: Input should be a valid dictionary``); an
      object with none of ``method``, ``result`` and ``error`` says so.
    """
    answer = _screened(doc, duplicate)
    method = _notified_method(doc)
    if isinstance(answer, Refusal) and method is not None:
        logger.warning("notification %r not served: %s", method, answer.error.message)
        return Dropped(method, answer.error)
    return answer


def _screened(doc: Any, duplicate: DuplicateKey | None) -> types.JSONRPCMessage | Refusal:
    """:func:`screen_message` before a notification's error is dropped."""
    if duplicate is not None:
        if isinstance(doc, _Pairs):
            ids = [v for k, v in doc if k == "id"]
        else:
            ids = [doc.get("id")] if isinstance(doc, dict) else []
        rid = ids[0] if len(ids) == 1 and is_request_id(ids[0]) else None
        detail = f"invalid JSON ({duplicate})"
        return refusal(types.INVALID_REQUEST, "Invalid Request", detail, rid)
    if not isinstance(doc, dict):
        detail = f"a JSON-RPC message is a JSON object, not {_json_kind(doc)}"
        return refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    if "method" in doc and "id" in doc and not is_request_id(doc["id"]):
        detail = "id must be a string or an integer"
        return refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    if not {"method", "result", "error"} & doc.keys():
        detail = (
            "a JSON-RPC message needs a method (a request or notification), a result or an error"
        )
        return refusal(types.INVALID_REQUEST, "Invalid Request", detail, None)
    try:
        if "method" not in doc:
            return types.jsonrpc_message_adapter.validate_python(doc, by_name=False)
        kind = types.JSONRPCRequest if "id" in doc else types.JSONRPCNotification
        message = kind.model_validate(doc, by_name=False)
    except pydantic.ValidationError as exc:
        code, label, detail = _envelope_problem(exc)
        rid = doc.get("id") if code == types.INVALID_PARAMS else None
        return refusal(code, label, detail, rid)
    params_type = _PARAMS.get(message.method)
    if isinstance(message, types.JSONRPCRequest) and params_type is not None:
        try:
            params_type.model_validate(message.params or {}, by_name=False)
        except pydantic.ValidationError as exc:
            detail = str(from_pydantic(exc, name=lambda loc: ".".join(map(str, ("params", *loc)))))
            return refusal(types.INVALID_PARAMS, "Invalid params", detail, message.id)
    return message


#: The ``params`` model of each method whose params :func:`screen_message` checks, so a
#: malformed ``tools/call`` (``arguments`` not an object, ``name`` not a string or
#: missing) gets a message naming the field instead of the package's bare ``Invalid
#: request parameters``.
_PARAMS: dict[str, type[pydantic.BaseModel]] = {"tools/call": types.CallToolRequestParams}


def _json_kind(doc: Any) -> str:
    """What JSON value ``doc`` is (``an array``, ``a string``, ...)."""
    if isinstance(doc, list):
        return "an array"
    if isinstance(doc, str):
        return "a string"
    if isinstance(doc, bool):
        return "a boolean"
    if doc is None:
        return "null"
    return "a number"


class _NotJSON(ValueError):
    """A ``NaN``, ``Infinity`` or ``-Infinity`` literal: Python's :mod:`json` reads them,
    JSON (RFC 8259) has no such value."""


def _not_json(literal: str) -> Any:
    """``json``'s ``parse_constant`` hook: refuse ``literal``."""
    raise _NotJSON(literal)


#: A JSON string (skipped) or a literal that is not JSON, in text that is JSON up to it.
_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _literal_at(text: str, literal: str) -> int:
    """The offset in ``text`` of the first ``literal`` outside a string: the one
    :func:`json.loads` stopped at, as the text before it is JSON."""
    for match in _LITERAL.finditer(text):
        if match.group(1) == literal:
            return match.start()
    return 0  # not reached: json.loads read the literal outside a string


def read_message(text: str) -> types.JSONRPCMessage | Refusal | Dropped | None:
    """The message of one client document ``text`` (``str``: a stdin line or an HTTP
    body), parsed once and screened by :func:`screen_message`; ``None`` for blank text
    (no message, no answer). Text that is not JSON (RFC 8259: ``NaN``, ``Infinity`` and
    ``-Infinity`` are not JSON either) is answered ``-32700`` (parse error, ``id`` null,
    the position of the fault), and so is a string with a lone surrogate (``"\\ud800"``:
    not Unicode text, so it cannot be echoed in UTF-8, and the ``mcp`` package's own
    parser refuses it too); JSON nested too deeply for Python is ``-32600``."""
    if not text.strip():
        return None
    found: list[DuplicateKey] = []

    def pairs(items: list[tuple[str, Any]]) -> Any:
        try:
            return unique_keys(items)
        except DuplicateKey as exc:
            found.append(exc)
            return _Pairs(items)

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        detail = f"invalid JSON at byte {_byte(text, exc.pos)} ({exc.msg})"
        return refusal(types.PARSE_ERROR, "Parse error", detail, None)
    except _NotJSON as exc:
        literal = str(exc)
        at = _byte(text, _literal_at(text, literal))
        detail = f"invalid JSON at byte {at} ({literal} is not a JSON value)"
        return refusal(types.PARSE_ERROR, "Parse error", detail, None)
    except RecursionError:
        return refusal(types.INVALID_REQUEST, "Invalid Request", "nested too deeply", None)
    except ValueError as exc:  # an integer over the digits int() reads
        return refusal(types.PARSE_ERROR, "Parse error", f"invalid JSON ({exc})", None)
    if (surrogate := _lone_surrogate_at(text)) is not None:
        at = _byte(text, surrogate)
        detail = f"invalid JSON at byte {at} (a lone surrogate is not Unicode text)"
        return refusal(types.PARSE_ERROR, "Parse error", detail, None)
    return screen_message(doc, found[0] if found else None)


def read_bytes(raw: bytes) -> types.JSONRPCMessage | Refusal | Dropped | None:
    """The message of one client document ``raw`` (``bytes``: a stdin line or an HTTP
    body, UTF-8 text as :func:`~prefect_baton.rest._json_body.body_text` reads it, the REST
    API's rule), by :func:`read_message`; the one reading rule of both transports. Bytes
    that are not UTF-8 text (UTF-16 and UTF-32 among them) are answered ``-32700`` (``id``
    null) naming the offset of the first bad one, ``Parse error: invalid JSON at byte N
    (not UTF-8 text)``: the ``mcp`` package would read them with ``errors="replace"``, so
    ``x\\xff`` and ``x\\xfe`` would both become ``x\\ufffd``."""
    try:
        text = body_text(raw)
    except NotUtf8 as exc:
        return refusal(types.PARSE_ERROR, "Parse error", str(exc), None)
    return read_message(text)


def _lone_surrogate_at(text: str) -> int | None:
    """The offset in JSON ``text`` of the first string (a key or a value) holding a lone
    surrogate (U+D800 to U+DFFF not in a pair), escaped (``\\udc00``) or as is, else
    ``None``."""
    if "\\u" not in text and _utf8(text):  # no escape and no surrogate: nothing to find
        return None
    for match in _LITERAL.finditer(text):
        string = match.group()
        suspect = "\\u" in string or not _utf8(string)
        if match.group(1) is None and suspect and not _utf8(json.loads(string)):
            return match.start()
    return None


def _utf8(text: str) -> bool:
    """Whether ``text`` is Unicode text (encodes as UTF-8: no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _byte(text: str, pos: int) -> int:
    """The character offset ``pos`` of ``text`` as a byte offset of its UTF-8 encoding."""
    return len(text[:pos].encode("utf-8", "surrogatepass"))
