"""Conversions between the scripts' JSON generations and :class:`prefect_baton._core.Holding`,
and the scope tokens the scripts' overlap check reads.

A generation is a JSON object whose integers are decimal strings (``cjson`` prints numbers
with 14 significant digits; strings keep every integer up to 2**53 exact). Field names are
listed in ``scripts/_lib.lua``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .. import _scopes
from .._core import Holding
from ..models import Lease
from .keys import resource_digest

__all__ = ["from_gen", "lease_from_gen", "opt", "scope_meta", "to_gen"]


def opt(value: str | int | None) -> str:
    """Encode an optional ARGV value: ``""`` for ``None``, ``"=" + value`` otherwise."""
    return "" if value is None else f"={value}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def from_gen(raw: str | bytes | dict[str, Any]) -> Holding:
    """Build a :class:`Holding` from a script's generation (JSON text or parsed object)."""
    g: dict[str, Any] = json.loads(raw) if isinstance(raw, str | bytes) else raw
    scopes = g.get("sc") or ()
    ended = g.get("ea")
    return Holding(
        lease_id=g["id"],
        resource_type=g["rt"],
        resource_id=g["ri"],
        owner=g["o"],
        execution_key=g.get("k"),
        version=int(g["v"]),
        epoch=int(g["e"]),
        status=g["s"],
        acquired_at_ms=int(g["a"]),
        expires_at_ms=int(g["x"]),
        ttl_ms=int(g["t"]),
        scopes=tuple(scopes) if isinstance(scopes, list) else (),
        purpose=g.get("p"),
        ended_at_ms=None if ended is None else int(ended),
        ended_by=g.get("eb"),
    )


def _dt(ms: Any) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000.0, tz=UTC)


def lease_from_gen(raw: str | bytes, *, replayed: bool = False) -> Lease:
    """The :class:`Lease` of a script's generation (JSON text), built without re-validating
    what the script produced: equal, field for field, to
    ``holding_to_lease(from_gen(raw), replayed=replayed)``."""
    g: dict[str, Any] = json.loads(raw)
    scopes = g.get("sc")
    ended = g.get("ea")
    return Lease.model_construct(
        lease_id=g["id"],
        resource_type=g["rt"],
        resource_id=g["ri"],
        owner=g["o"],
        execution_key=g.get("k"),
        version=int(g["v"]),
        epoch=int(g["e"]),
        scopes=tuple(scopes) if isinstance(scopes, list) else (),
        status=g["s"],
        purpose=g.get("p"),
        acquired_at=_dt(g["a"]),
        expires_at=_dt(g["x"]),
        ttl_seconds=int(g["t"]) // 1000,
        released_at=None if ended is None else _dt(ended),
        replayed=replayed,
    )


def to_gen(h: Holding, *, sid: str | None = None) -> dict[str, Any]:
    """The script form of ``h`` (the inverse of :func:`from_gen`), with its resource digest
    and, for a scoped active lease, its scope registration id ``sid``."""
    g: dict[str, Any] = {
        "id": h.lease_id,
        "rt": h.resource_type,
        "ri": h.resource_id,
        "rd": resource_digest(h.resource_type, h.resource_id),
        "o": h.owner,
        "v": str(h.version),
        "e": str(h.epoch),
        "s": h.status,
        "a": str(h.acquired_at_ms),
        "x": str(h.expires_at_ms),
        "t": str(h.ttl_ms),
    }
    if h.execution_key is not None:
        g["k"] = h.execution_key
    if h.scopes:
        g["sc"] = list(h.scopes)
    if h.purpose is not None:
        g["p"] = h.purpose
    if h.ended_at_ms is not None:
        g["ea"] = str(h.ended_at_ms)
    if h.ended_by is not None:
        g["eb"] = h.ended_by
    if sid is not None:
        g["sid"] = sid
    return g


def _token(tok: tuple[object, ...]) -> list[int]:
    kind = tok[0]
    if kind == "lit":
        return [0, ord(str(tok[1]))]
    if kind == "any":
        return [1]
    if kind == "star":
        return [2]
    ranges = tok[2]
    assert isinstance(ranges, frozenset)
    out = [3, 1 if tok[1] else 0]
    for lo, hi in sorted(ranges):
        out += [ord(lo), ord(hi)]
    return out


def scope_tokens(scope: str) -> list[str | list[list[int]]]:
    """Tokenize one normalised scope with :mod:`prefect_baton._scopes`' own tokenizer, as
    the scripts' overlap check (``scope_overlap`` in ``_lib.lua``) reads it: a segment is
    ``"**"`` or a list of tokens whose characters are Unicode code points."""
    out: list[str | list[list[int]]] = []
    for seg in _scopes.normalize_scope(scope).split("/"):
        if seg == "**":
            out.append("**")
        else:
            out.append([_token(t) for t in _scopes._tokenize(seg)])
    return out


def scope_meta(resource_type: str, resource_id: str, scopes: tuple[str, ...]) -> str:
    """The index entry of a scoped lease (JSON text): its resource digest ``r``, scope
    tokens ``t`` and the distinct literal prefixes ``pf`` of its scopes."""
    prefixes = sorted({_scopes.literal_prefix(s) for s in scopes})
    return json.dumps(
        {
            "r": resource_digest(resource_type, resource_id),
            "t": [scope_tokens(s) for s in scopes],
            "pf": prefixes,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
