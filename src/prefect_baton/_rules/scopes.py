"""Write-scope globs: validation, overlap of two globs, and literal prefixes.

A scope is a ``/``-separated glob: ``*`` and ``?`` match within one segment, ``[...]`` is a
character class, and a whole ``**`` segment matches zero or more segments (``src/**``).
Two scopes *overlap* when some path matches both, e.g. ``src/**`` and ``src/app/*.py``.

Written here rather than taken from wcmatch or pathspec: those match a path against a glob,
and a lease needs to know whether two globs can ever match the same path, which neither
offers. The algorithm is a memoised walk over the product of the two patterns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from typing import TypeVar

__all__ = ["literal_prefix", "normalize_scope", "scopes_overlap", "sets_overlap"]

_GLOB_CHARS = frozenset("*?[")

# A token is ("lit", ch) | ("any",) | ("star",) | ("class", negated, frozenset of ranges)
_Token = tuple[object, ...]
_T = TypeVar("_T")


def normalize_scope(scope: str) -> str:
    """Return ``scope`` with ``./`` prefixes, empty segments and a trailing ``/`` removed."""
    parts = [p for p in scope.split("/") if p not in ("", ".")]
    return "/".join(parts)


def literal_prefix(scope: str) -> str:
    """The leading segments of ``scope`` that contain no glob character (``str``, maybe
    empty). Two scopes can only overlap if one's literal prefix is a prefix (by segment) of
    the other's, which is what an index by prefix relies on."""
    out: list[str] = []
    for seg in normalize_scope(scope).split("/"):
        if seg == "" or any(c in _GLOB_CHARS for c in seg):
            break
        out.append(seg)
    return "/".join(out)


def _tokenize(segment: str) -> tuple[_Token, ...]:
    toks: list[_Token] = []
    i = 0
    n = len(segment)
    while i < n:
        c = segment[i]
        if c == "*":
            if not toks or toks[-1] != ("star",):
                toks.append(("star",))
            i += 1
        elif c == "?":
            toks.append(("any",))
            i += 1
        elif c == "[":
            j = i + 1
            negated = j < n and segment[j] in "!^"
            if negated:
                j += 1
            start = j
            if j < n and segment[j] == "]":
                j += 1
            while j < n and segment[j] != "]":
                j += 1
            if j >= n:  # unterminated: a literal '['
                toks.append(("lit", "["))
                i += 1
                continue
            body = segment[start:j]
            ranges: set[tuple[str, str]] = set()
            k = 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    ranges.add((body[k], body[k + 2]))
                    k += 3
                else:
                    ranges.add((body[k], body[k]))
                    k += 1
            toks.append(("class", negated, frozenset(ranges)))
            i = j + 1
        else:
            toks.append(("lit", c))
            i += 1
    return tuple(toks)


def _in_class(ch: str, tok: _Token) -> bool:
    negated = bool(tok[1])
    ranges = tok[2]
    assert isinstance(ranges, frozenset)
    hit = any(lo <= ch <= hi for lo, hi in ranges)
    return hit != negated


def _class_chars(tok: _Token) -> list[str] | None:
    """Enumerate a positive class's characters, or ``None`` when too large / negated."""
    if tok[1]:
        return None
    ranges = tok[2]
    assert isinstance(ranges, frozenset)
    chars: list[str] = []
    for lo, hi in ranges:
        if ord(hi) - ord(lo) > 4096:
            return None
        chars.extend(chr(c) for c in range(ord(lo), ord(hi) + 1))
    return chars


def _chars_compatible(a: _Token, b: _Token) -> bool:
    if a[0] == "any" or b[0] == "any":
        return True
    if a[0] == "lit" and b[0] == "lit":
        return a[1] == b[1]
    if a[0] == "lit":
        return _in_class(str(a[1]), b)
    if b[0] == "lit":
        return _in_class(str(b[1]), a)
    # class vs class
    for x, y in ((a, b), (b, a)):
        chars = _class_chars(x)
        if chars is not None:
            return any(_in_class(ch, y) for ch in chars)
    return True  # two negated (or huge) classes: some character fits both


def _overlap(
    a: Sequence[_T], b: Sequence[_T], star: _T, compatible: Callable[[_T, _T], bool]
) -> bool:
    """Whether some text matches both patterns ``a`` and ``b``, given as item sequences in
    which ``star`` matches any run of items and two other items match a common item when
    ``compatible(x, y)``: the one rule of segments (``*``) and of whole scopes (``**``)."""

    @cache
    def go(i: int, j: int) -> bool:
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == star:
            if go(i + 1, j):
                return True
            return j < len(b) and go(i, j + 1)
        if j < len(b) and b[j] == star:
            if go(i, j + 1):
                return True
            return i < len(a) and go(i + 1, j)
        if i == len(a) or j == len(b):
            return False
        return compatible(a[i], b[j]) and go(i + 1, j + 1)

    return go(0, 0)


@lru_cache(maxsize=4096)
def _segments_overlap(a: str, b: str) -> bool:
    return _overlap(_tokenize(a), _tokenize(b), ("star",), _chars_compatible)


@lru_cache(maxsize=8192)
def scopes_overlap(a: str, b: str) -> bool:
    """Whether some path matches both globs ``a`` and ``b`` (``str``, ``/``-separated).

    Examples: ``src/**`` overlaps ``src/app/*.py``; ``src/*.py`` does not overlap
    ``docs/**``; ``src/*.py`` does not overlap ``src/*.md``.
    """
    sa = normalize_scope(a).split("/")
    sb = normalize_scope(b).split("/")
    return _overlap(sa, sb, "**", _segments_overlap)


def sets_overlap(a: tuple[str, ...] | list[str], b: tuple[str, ...] | list[str]) -> bool:
    """Whether any scope of ``a`` overlaps any scope of ``b``."""
    return any(scopes_overlap(x, y) for x in a for y in b)
