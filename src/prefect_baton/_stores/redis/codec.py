"""Conversions between the scripts' generations and journal entries and
:class:`prefect_baton._rules.core.Generation` / :class:`prefect_baton.models.Lease`, and the scope
tokens the scripts' overlap check reads.

A generation is one string of 17 NUL-separated fields (no id, free text or scope can hold a
NUL): ``id, rt, ri, rd, o, k, v, e, s, a, x, t, sc, p, ea, eb, sid`` (see
``scripts/_lib.lua``). An empty field is ``None``, except the purpose, stored as
``"=" + purpose``; integers are decimal; the scopes are a JSON list. Generations written by
earlier versions as JSON objects (first character ``{``) are still read, as are JSON
journal entries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from prefect_baton._rules import scopes as _scopes
from prefect_baton._rules.core import Generation
from prefect_baton._stores.redis.keys import resource_digest
from prefect_baton.models import Lease, private_state

__all__ = [
    "GEN_FIELDS",
    "construct",
    "encode_gen",
    "from_gen",
    "journal_payload",
    "lease_from_gen",
    "opt",
    "plain_leases",
    "scope_meta",
    "to_gen",
]

GEN_FIELDS = 17
"""Fields of a generation string."""
_HEADER = 7
_ITEM = 3 + 2 * GEN_FIELDS


def opt(value: str | int | None) -> str:
    """Encode an optional ARGV value: ``""`` for ``None``, ``"=" + value`` otherwise."""
    return "" if value is None else f"={value}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(raw: str | bytes | dict[str, Any] | list[str]) -> list[str]:
    """The 17 fields of a generation in either format (a legacy JSON object is converted)."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, bytes):
        raw = raw.decode()
    if isinstance(raw, str):
        if not raw.startswith("{"):
            f = raw.split("\x00")
            if len(f) != GEN_FIELDS:
                raise ValueError(f"not a lease generation ({len(f)} fields)")
            return f
        raw = json.loads(raw)
    assert isinstance(raw, dict)
    g = raw
    sc = g.get("sc")
    p = g.get("p")
    return [
        g["id"],
        g["rt"],
        g["ri"],
        g.get("rd", ""),
        g["o"],
        g.get("k") or "",
        str(g["v"]),
        str(g["e"]),
        g["s"],
        str(g["a"]),
        str(g["x"]),
        str(g["t"]),
        json.dumps(sc, ensure_ascii=False) if sc else "",
        "" if p is None else "=" + p,
        "" if g.get("ea") is None else str(g["ea"]),
        g.get("eb") or "",
        g.get("sid") or "",
    ]


def _scopes_of(text: str) -> tuple[str, ...]:
    if not text:
        return ()
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else ()


def from_gen(raw: str | bytes | dict[str, Any] | list[str]) -> Generation:
    """Build a :class:`Generation` from a script's generation (text in either format, a parsed
    legacy JSON object, or the 17 fields).

    Raises:
        ValueError: ``raw`` is not a generation.
    """
    f = _fields(raw)
    return Generation(
        lease_id=f[0],
        resource_type=f[1],
        resource_id=f[2],
        owner=f[4],
        execution_key=f[5] or None,
        version=int(f[6]),
        epoch=int(f[7]),
        status=f[8],  # type: ignore[arg-type]
        acquired_at_ms=int(f[9]),
        expires_at_ms=int(f[10]),
        ttl_ms=int(f[11]),
        scopes=_scopes_of(f[12]),
        purpose=f[13][1:] if f[13] else None,
        ended_at_ms=int(f[14]) if f[14] else None,
        ended_by=f[15] or None,
    )


_fromts = datetime.fromtimestamp
_setattr = object.__setattr__
M = TypeVar("M", bound=BaseModel)


def construct(cls: type[M], values: dict[str, Any]) -> M:
    """``cls.model_construct(**values)`` for a complete set of trusted field values (every
    field given, in declaration order), without its per-call bookkeeping."""
    m = cls.__new__(cls)
    _setattr(m, "__dict__", values)
    _setattr(m, "__pydantic_fields_set__", set(values))
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", private_state(cls))
    return m


_TIMES: dict[str, datetime] = {}
"""Recently converted times (``{ms text: datetime}``): a lease's acquire, renew and release
replies carry the same times. Emptied when it reaches :data:`_TIMES_MAX` entries."""
_TIMES_MAX = 4096


def _dt(ms: str, cache: dict[str, datetime]) -> datetime:
    dt = cache.get(ms)
    if dt is None:
        if len(cache) >= _TIMES_MAX:
            cache.clear()
        dt = cache[ms] = _fromts(int(ms) / 1000.0, tz=UTC)
    return dt


def lease_from_gen(
    raw: str | bytes | list[str],
    *,
    replayed: bool = False,
    times: dict[str, datetime] | None = None,
) -> Lease:
    """The :class:`Lease` of a script's generation, built without re-validating what the
    script produced: equal, field for field, to
    ``generation_to_lease(from_gen(raw), replayed=replayed)``.

    Args:
        times: a cache of converted times (``{ms text: datetime}``); by default the
            module's own cache of recent times.

    Raises:
        ValueError: ``raw`` is not a generation.
    """
    if type(raw) is bytes:
        raw = raw.decode()
    if type(raw) is str and not raw.startswith("{"):
        f = raw.split("\x00")
        if len(f) != GEN_FIELDS:
            raise ValueError(f"not a lease generation ({len(f)} fields)")
    else:
        f = _fields(raw)
    ended = f[14]
    t = _TIMES if times is None else times
    return construct(
        Lease,
        {
            "lease_id": f[0],
            "resource_type": f[1],
            "resource_id": f[2],
            "owner": f[4],
            "execution_key": f[5] or None,
            "version": int(f[6]),
            "epoch": int(f[7]),
            "scopes": _scopes_of(f[12]),
            "status": f[8],
            "purpose": f[13][1:] if f[13] else None,
            "acquired_at": _dt(f[9], t),
            "expires_at": _dt(f[10], t),
            "ttl_seconds": int(f[11]) // 1000,
            "released_at": _dt(ended, t) if ended else None,
            "replayed": replayed,
        },
    )


def is_plain(requests: Sequence[Any], idempotency_key: str | None) -> bool:
    """Whether ``acquire_plain.lua`` takes an ``acquire_many`` call of ``requests``
    (:class:`~prefect_baton._stores.redis.authority.AcquireRequest` values): no execution key, no
    scopes, no expected version, one TTL and one purpose (the same decisions, less work)."""
    first = requests[0]
    return idempotency_key is None and all(
        not r.scopes
        and r.expected_version is None
        and r.ttl_ms == first.ttl_ms
        and r.purpose == first.purpose
        for r in requests
    )


def plain_args(principal: str, role: str, requests: Sequence[Any], base: str) -> list[str]:
    """ARGV of ``acquire_plain.lua`` for ``requests`` that :func:`is_plain` accepts, with
    lease ids ``lease_<base><i as 6 hex digits>``. Each resource sends the start of its new
    generation (id, type, id, digest, owner, no execution key), its digest and its id."""
    first = requests[0]
    args = [principal, role, str(len(requests)), str(first.ttl_ms), opt(first.purpose)]
    for i, req in enumerate(requests):
        lease_id = f"lease_{base}{i:06x}"
        rd = resource_digest(req.resource_type, req.resource_id)
        prefix = "\x00".join((lease_id, req.resource_type, req.resource_id, rd, principal, ""))
        args += (prefix, rd, lease_id)
    return args


def plain_leases(
    owner: str, requests: Sequence[Any], base: str, reply: Sequence[Any]
) -> list[Lease]:
    """The leases of an ``acquire_plain.lua`` reply (``[0, entry id, now_ms, then a
    (kind, a, b) triple per request]``): kind 3 is a grant made there, with ``a`` the version
    and ``b`` the epoch, the rest being the request's (lease id ``lease_<base><i as 6 hex
    digits>``, ``owner``, the request's TTL and purpose, acquired at ``now_ms``); kinds 0, 1
    and 2 carry the generation text in ``a`` (1 and 2: ``replayed``).

    Raises:
        ValueError: a malformed reply.
    """
    now = int(reply[2])
    t = _TIMES
    acquired = _dt(str(now), t)
    out: list[Lease] = []
    for i, req in enumerate(requests):
        kind, a, b = reply[3 + 3 * i : 6 + 3 * i]
        kind = int(kind)
        if kind != 3:
            out.append(lease_from_gen(a, replayed=kind != 0))
            continue
        ttl_ms = req.ttl_ms
        out.append(
            construct(
                Lease,
                {
                    "lease_id": f"lease_{base}{i:06x}",
                    "resource_type": req.resource_type,
                    "resource_id": req.resource_id,
                    "owner": owner,
                    "execution_key": None,
                    "version": int(a),
                    "epoch": int(b),
                    "scopes": (),
                    "status": "active",
                    "purpose": req.purpose,
                    "acquired_at": acquired,
                    "expires_at": _dt(str(now + ttl_ms), t),
                    "ttl_seconds": ttl_ms // 1000,
                    "released_at": None,
                    "replayed": False,
                },
            )
        )
    return out


def encode_gen(h: Generation, *, sid: str | None = None) -> str:
    """The script form of ``h`` (the inverse of :func:`from_gen`) as text, with its resource
    digest and, for a scoped active lease, its scope registration id ``sid``."""
    return "\x00".join(
        [
            h.lease_id,
            h.resource_type,
            h.resource_id,
            resource_digest(h.resource_type, h.resource_id),
            h.owner,
            h.execution_key or "",
            str(h.version),
            str(h.epoch),
            h.status,
            str(h.acquired_at_ms),
            str(h.expires_at_ms),
            str(h.ttl_ms),
            json.dumps(list(h.scopes), ensure_ascii=False) if h.scopes else "",
            "" if h.purpose is None else "=" + h.purpose,
            "" if h.ended_at_ms is None else str(h.ended_at_ms),
            h.ended_by or "",
            sid or "",
        ]
    )


def to_gen(h: Generation, *, sid: str | None = None) -> dict[str, Any]:
    """The legacy JSON-object form of ``h`` (what :func:`from_gen` also reads)."""
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


def journal_payload(raw: str | bytes) -> dict[str, Any]:
    """A journal entry's ``p`` field as a dict: ``i`` (incarnation id), ``ac`` (actor),
    ``ro`` (role), ``at`` (ms), ``it`` (items: ``a`` action, ``n`` new generation, ``x``
    ended generation or absent, ``rc`` receipt ``{"d", "ex"}`` (and ``"a"``, the attempt
    token, when the acquire named one) or absent, generations as
    field lists) and ``ho`` (``{"id", "nt"}`` of an accepted handoff) when present.

    Raises:
        ValueError: ``raw`` is not a journal entry.
    """
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text.startswith("{"):
        legacy: dict[str, Any] = json.loads(text)
        return legacy
    f = text.split("\x00")
    n = int(f[6])
    if len(f) != _HEADER + n * _ITEM:
        raise ValueError("malformed journal entry")
    items: list[dict[str, Any]] = []
    for b in range(_HEADER, len(f), _ITEM):
        it: dict[str, Any] = {"a": f[b], "n": f[b + 3 : b + 3 + GEN_FIELDS]}
        if f[b + 1]:
            digest, _, attempt = f[b + 1].partition("|")
            it["rc"] = {"d": digest, "ex": f[b + 2]}
            if attempt:
                it["rc"]["a"] = attempt
        ended = f[b + 3 + GEN_FIELDS : b + _ITEM]
        if ended[0]:
            it["x"] = ended
        items.append(it)
    out: dict[str, Any] = {"i": f[0], "ac": f[1], "ro": f[2], "at": f[3], "it": items}
    if f[4]:
        out["ho"] = {"id": f[4], "nt": f[5][1:] if f[5] else None}
    return out


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
    """Tokenize one normalised scope with :mod:`prefect_baton._rules.scopes`' own tokenizer, as
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
    prefixes = list(_scopes.scope_prefixes(scopes))
    return json.dumps(
        {
            "r": resource_digest(resource_type, resource_id),
            "t": [scope_tokens(s) for s in scopes],
            "pf": prefixes,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
