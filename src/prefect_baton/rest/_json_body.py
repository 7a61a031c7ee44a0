"""Reading JSON request bodies: the one JSON rule of the REST API and of the MCP server
(:func:`parse_json_body`: no key twice in one object, no ``NaN``), the count of objects and
arrays that refuses a body before it is parsed (:func:`too_many_containers`), and the
parse of a large body off the event loop (:func:`run_for_body`, :func:`read_json_body`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

from prefect_baton.errors import ValidationError

__all__ = [
    "THREAD_PARSE_BYTES",
    "DuplicateKey",
    "NotUtf8",
    "body_text",
    "parse_json_body",
    "quoted",
    "read_json_body",
    "run_for_body",
    "too_many_containers",
    "unique_keys",
]


class DuplicateKey(ValueError):
    """A JSON object names ``key`` (``str``) twice; ``str()`` of it is the rule's words,
    ``the key 'k' appears twice in one object``."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {quoted(key)} appears twice in one object")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of ``pairs`` (``json``'s ``object_pairs_hook``): the one rule on repeated
    keys of the REST API and of the MCP server (over HTTP through
    :func:`parse_json_body`, over stdio by itself).

    Raises:
        DuplicateKey: a key appears twice (``dict`` would keep the last value silently).
    """
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def quoted(key: str, limit: int = 64) -> str:
    """``key`` quoted for an error message, cut to ``limit`` characters."""
    return repr(key if len(key) <= limit else key[:limit] + "...")


class _NotJson(ValueError):
    """A literal :func:`json.loads` reads that JSON has not (``NaN``, ``Infinity``,
    ``-Infinity``); ``str()`` of it says so."""


def _not_json(literal: str) -> Any:
    """``json``'s ``parse_constant``: refuse the non-JSON ``literal`` (``str``)."""
    raise _NotJson(f"{literal} is not JSON")


class NotUtf8(ValueError):
    """A body is not UTF-8 text; ``start`` (``int``) is the offset of its first bad byte and
    ``str()`` of it reads ``invalid JSON at byte N (not UTF-8 text)``."""

    def __init__(self, start: int) -> None:
        super().__init__(f"invalid JSON at byte {start} (not UTF-8 text)")
        self.start = start


def body_text(raw: bytes) -> str:
    """The text of a JSON request body or MCP message ``raw`` (``bytes``): UTF-8, strictly.
    No other encoding is guessed (:func:`json.loads` of bytes would read UTF-16 and UTF-32
    too, and ``json.detect_encoding`` takes a NUL among the first four bytes for one of
    them: here that NUL is the first byte that is not UTF-8 JSON text), an encoded
    surrogate is not UTF-8, and a byte order mark is not skipped (RFC 8259: a JSON text
    has none). The one text rule of the REST API and of the MCP server (stdio and HTTP).

    Raises:
        NotUtf8: the bytes are not UTF-8 text, naming the first bad byte.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(exc.start) from None
    nul = raw.find(b"\x00", 0, 4)
    if nul >= 0:
        raise NotUtf8(nul)
    return text


def parse_json_body(raw: bytes) -> Any:
    """The JSON document of a request body ``raw`` (``bytes``, UTF-8 text:
    :func:`body_text`), read as :func:`json.loads` reads it except that an
    object naming a key twice is refused (``json.loads`` keeps the last value, so a check
    of the first would pass a value that never takes effect). The one JSON rule of the REST
    API (:class:`BatonMiddleware` applies it to every JSON body before any route runs, and
    the fast path of :mod:`prefect_baton.rest._fastpath` to the bodies it reads) and of the
    MCP server over HTTP.

    Raises:
        ValidationError: ``body: invalid JSON at byte N (reason)``: malformed (the offset
            counts bytes of ``raw``), not UTF-8 text (``(not UTF-8 text)``, see
            :func:`body_text`), or an integer longer than
            Python reads (:func:`sys.get_int_max_str_digits`); ``body: invalid JSON (the
            key 'k' appears twice in one object)``; ``body: invalid JSON (nested too
            deeply)``; ``body: invalid JSON (NaN is not JSON)`` (likewise ``Infinity`` and
            ``-Infinity``, which :func:`json.loads` reads by default; RFC 8259 has no such
            value).
    """
    try:
        text = body_text(raw)
    except NotUtf8 as exc:
        raise ValidationError(f"body: {exc}") from None

    def at(pos: int) -> int:  # a character offset of ``text`` as a byte offset of ``raw``
        return len(text[:pos].encode("utf-8"))

    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"body: invalid JSON at byte {at(exc.pos)} ({exc.msg})") from None
    except (DuplicateKey, _NotJson) as exc:
        raise ValidationError(f"body: invalid JSON ({exc})") from None
    except RecursionError:
        raise ValidationError("body: invalid JSON (nested too deeply)") from None
    except ValueError:  # an integer over the digits int() reads
        most = sys.get_int_max_str_digits()
        found = re.search(f"[0-9]{{{most + 1},}}", text)
        where = f" at byte {at(found.start())}" if found else ""
        raise ValidationError(
            f"body: invalid JSON{where} (an integer of more than {most} digits)"
        ) from None


def too_many_containers(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` (``bytes``, UTF-8) holds more than ``limit`` (``int``)
    objects and arrays, counted without parsing it: the bytes ``[`` and ``{`` (at most a
    few milliseconds for 3 MiB); only when there are more of them than ``limit``, those
    outside strings (the text split at its quotes, once ``\\\\`` and ``\\"`` escapes are
    taken out; about 15 ms for 3 MiB of short strings). Text that is not JSON may be
    counted wrong (it is refused either way), and text that is not UTF-8 is not counted
    (``False``): the parser refuses it before it builds anything.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:  # every object or array opens so
        return False
    try:
        text = body_text(raw)
    except NotUtf8:
        return False
    if "\\" in text:  # a quote escaped inside a string does not end it
        text = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(text.split('"')[::2])
    return outside.count("[") + outside.count("{") > limit


#: Bodies of more than this many bytes are parsed on a worker thread by
#: :func:`read_json_body` (and :func:`run_for_body`), smaller ones on the event loop: a
#: parse of 16 KiB (up to about 0.5 ms for deeply nested text) costs about what the hop to
#: a thread and back does, and a larger one would hold up every other request of the
#: process while it runs (a 3 MB nested body takes about a second).
THREAD_PARSE_BYTES = 16 * 1024

_T = TypeVar("_T")


async def run_for_body(read: Callable[[bytes], _T], raw: bytes) -> _T:
    """``read(raw)`` for an ``async`` caller (``read``: a function of a request body such
    as :func:`parse_json_body`; ``raw``: the body, ``bytes``): on a worker thread when
    ``raw`` is over :data:`THREAD_PARSE_BYTES`, so a large body does not stall the event
    loop (the other requests of the process) while it is read, else at once.

    Raises:
        Exception: whatever ``read`` raises.
    """
    if len(raw) <= THREAD_PARSE_BYTES:
        return read(raw)
    return await anyio.to_thread.run_sync(read, raw)


async def read_json_body(raw: bytes) -> Any:
    """:func:`parse_json_body` of ``raw`` (``bytes``) for an ``async`` caller, by
    :func:`run_for_body` (on a worker thread when ``raw`` is large).

    Raises:
        ValidationError: as :func:`parse_json_body`.
    """
    return await run_for_body(parse_json_body, raw)
