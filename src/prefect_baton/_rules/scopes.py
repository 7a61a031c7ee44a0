"""Write-scope globs: validation, overlap of two globs, and literal prefixes.

A scope is a ``/``-separated glob: ``*`` and ``?`` match within one segment, ``[...]`` is a
character class, and a whole ``**`` segment matches zero or more segments (``src/**``).
Two scopes *overlap* when some path matches both, e.g. ``src/**`` and ``src/app/*.py``.

Written here rather than taken from wcmatch or pathspec: those match a path against a glob,
and a lease needs to know whether two globs can ever match the same path, which neither
offers. The algorithm is a memoised walk over the product of the two patterns; the steps
one request may spend on it are bounded (:class:`ScopeCheckBudget`), so that long
patterns full of ``*`` cannot hold a store for seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import TypeVar

from prefect_baton.errors import ValidationError

__all__ = [
    "SCOPE_CHECK_STEPS",
    "ScopeCheckBudget",
    "ScopeConflict",
    "latest_overlap",
    "literal_prefix",
    "normalize_scope",
    "prefixes_meet",
    "scope_conflict_expiry",
    "scope_prefixes",
    "scopes_overlap",
    "sets_overlap",
    "too_costly",
]

SCOPE_CHECK_STEPS = 100_000
"""Steps one request may spend comparing write scopes (:class:`ScopeCheckBudget`): an
acquire, a whole ``acquire_many`` (all its resources together), the receiver's check of a
transfer. About 0.1 s of Python or 0.03 s of Lua; ordinary scopes take a few steps a
pair."""

_GLOB_CHARS = frozenset("*?[")

# A token is ("lit", ch) | ("any",) | ("star",) | ("class", negated, frozenset of ranges)
_Token = tuple[object, ...]
_T = TypeVar("_T")


def normalize_scope(scope: str) -> str:
    """Return ``scope`` with ``./`` prefixes, empty segments and a trailing ``/`` removed."""
    parts = [p for p in scope.split("/") if p not in ("", ".")]
    return "/".join(parts)


@lru_cache(maxsize=8192)
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


def scope_prefixes(scopes: Iterable[str]) -> tuple[str, ...]:
    """The distinct literal prefixes (:func:`literal_prefix`) of ``scopes``, sorted: what the
    Redis scope index files a scoped lease under (``codec.scope_meta``'s ``"pf"``)."""
    return tuple(sorted({literal_prefix(s) for s in scopes}))


def prefixes_meet(a: Iterable[str], b: Iterable[str]) -> bool:
    """Whether a scope check compares two scope sets whose literal prefixes
    (:func:`scope_prefixes`) are ``a`` and ``b`` (``str`` each): some prefix of ``a`` and
    some of ``b`` nest, one being the other or a leading run of its segments (``""`` nests
    with every prefix; ``src`` with ``src/app``, not with ``srcs``).

    When they do not, no scope of the one set overlaps a scope of the other
    (:func:`sets_overlap` is ``False``: their paths differ in a segment both fix), and every
    store skips the pair without spending steps of the :class:`ScopeCheckBudget`: the
    ledger by this function, the Redis scripts by their prefix index (``scope_conflict``
    in ``_lib.lua`` visits exactly the leases for which this holds), so a request is
    refused as too costly on every store alike."""
    bs = tuple(b)
    return any(_nest(p, q) for p in a for q in bs)


def _nest(p: str, q: str) -> bool:
    if len(p) > len(q):
        p, q = q, p
    return p == "" or p == q or q.startswith(p + "/")


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


_MAX_CODE_POINT = 0x10FFFF


@lru_cache(maxsize=4096)
def _ranges(tok: _Token) -> tuple[tuple[int, int], ...]:
    """A class token's ranges as code points, sorted (the order ``codec._token`` gives the
    scripts), empty ranges (``z-a``) included: they match nothing."""
    ranges = tok[2]
    assert isinstance(ranges, frozenset)
    return tuple(sorted((ord(lo), ord(hi)) for lo, hi in ranges))


def _in_class(ch: str, tok: _Token) -> bool:
    negated = bool(tok[1])
    hit = any(lo <= ord(ch) <= hi for lo, hi in _ranges(tok))
    return hit != negated


def _gap(lo: int, hi: int, ranges: Sequence[tuple[int, int]]) -> bool:
    """Whether some code point from ``lo`` to ``hi`` lies in none of ``ranges`` (sorted by
    their first code point): one pass over them."""
    c = lo
    for rlo, rhi in ranges:
        if rhi < c:
            continue
        if rlo > c:
            return True
        c = rhi + 1
        if c > hi:
            return False
    return c <= hi


def _classes_meet(a: _Token, b: _Token) -> bool:
    """Whether some character lies in both classes ``a`` and ``b``, by their ranges (at
    most one pass over ``b``'s ranges per range of ``a``)."""
    ra, rb = _ranges(a), _ranges(b)
    if a[1] and b[1]:  # outside both: any code point neither covers
        return _gap(0, _MAX_CODE_POINT, sorted(ra + rb))
    if a[1]:
        a, b, ra, rb = b, a, rb, ra
    if b[1]:  # a character of a that b's ranges leave out
        return any(_gap(lo, hi, rb) for lo, hi in ra if lo <= hi)
    return any(max(lo, blo) <= min(hi, bhi) for lo, hi in ra for blo, bhi in rb)


def _chars_compatible(a: _Token, b: _Token) -> bool:
    if a[0] == "any" or b[0] == "any":
        return True
    if a[0] == "lit" and b[0] == "lit":
        return a[1] == b[1]
    if a[0] == "lit":
        return _in_class(str(a[1]), b)
    if b[0] == "lit":
        return _in_class(str(b[1]), a)
    return _classes_meet(a, b)


def _chars_cost(a: _Token, b: _Token) -> int:
    """The steps, beyond the state's own, of comparing two single-character tokens: none for
    literals and ``?``; with a class, the product of both tokens' range counts (a literal
    or ``?`` counting 1), which bounds the comparison's work."""
    if a[0] != "class" and b[0] != "class":
        return 0
    na = len(_ranges(a)) if a[0] == "class" else 1
    nb = len(_ranges(b)) if b[0] == "class" else 1
    return na * nb


class ScopeCheckBudget:
    """The steps one request may spend comparing write scopes: a step is one state of the
    overlap walk (a pair of positions in two patterns, or in two scopes' segment lists)
    worked out for the first time. The walk is linear in ordinary scopes (``src/**``
    against ``docs/*.md`` takes a few steps) but can take the product of two patterns'
    lengths for long segments full of ``*``, so the total is bounded.

    Args:
        steps: how many steps may be spent (``int``; default :data:`SCOPE_CHECK_STEPS`).

    Raises:
        ValidationError: from :meth:`spend`, once more steps than ``steps`` are spent.
    """

    __slots__ = ("left",)

    def __init__(self, steps: int = SCOPE_CHECK_STEPS) -> None:
        self.left = steps

    def spend(self, steps: int) -> None:
        """Spend ``steps``.

        Raises:
            ValidationError: fewer than ``steps`` were left (nothing is decided or written).
        """
        self.left -= steps
        if self.left < 0:
            raise too_costly()


def latest_overlap(
    scopes: tuple[str, ...] | list[str],
    others: Iterable[tuple[tuple[str, ...] | list[str], int]],
    budget: ScopeCheckBudget,
) -> int | None:
    """The latest expiry (epoch ms) among ``others`` whose scopes overlap ``scopes``, or
    ``None`` when none does: the write-scope check of an acquire or transfer (DESIGN.md
    "Leases", write scopes).

    Args:
        scopes: the requested scopes (normalised globs).
        others: the other principals' effective scoped leases to compare with, each as
            ``(its scopes, its expiry in epoch ms)``; those whose literal prefixes cannot
            meet the request's (:func:`prefixes_meet`) are skipped without spending steps.
        budget: the request's steps (:class:`ScopeCheckBudget`).

    Every candidate is compared, even after an overlap was found, so that neither the
    verdict nor the expiry depends on the order the store meets the candidates in (the
    ledger's rows and the Redis prefix index order them differently; ``scope_conflict`` in
    ``_lib.lua`` applies this rule too). The expiry is the latest because the request can
    only succeed once every overlapping lease has ended.

    Raises:
        ValidationError: the comparisons took more than the budget's steps
            (:func:`too_costly`).
    """
    prefixes = scope_prefixes(scopes)
    found: int | None = None
    for theirs, expires_ms in others:
        if not prefixes_meet(prefixes, scope_prefixes(theirs)):
            continue
        if sets_overlap(scopes, theirs, budget) and (found is None or expires_ms > found):
            found = expires_ms
    return found


#: What a decision is told of the scopes of other leases (``scope_conflict_expires_ms`` of
#: ``core.decide_acquire`` and ``transitions.decide_transfer``): the expiry (epoch ms) of
#: another principal's effective lease whose scopes overlap the requested ones, ``None``
#: when none does, or a function of no arguments finding it out (the store's scope check,
#: which spends the request's :class:`ScopeCheckBudget`).
ScopeConflict = int | None | Callable[[], int | None]


def scope_conflict_expiry(found: ScopeConflict) -> int | None:
    """The expiry ``found`` tells (``int`` epoch ms, or ``None``), calling it if it is a
    function. A decision asks this after its other checks, so a request refused for another
    reason (the resource held, a version or proof that does not match) spends none of its
    steps, as in the Redis scripts, and both stores answer it the same refusal.

    Raises:
        ValidationError: ``found`` ran out of steps (:func:`too_costly`).
    """
    return found() if callable(found) else found


def too_costly() -> ValidationError:
    """The error of a request whose write-scope comparisons ran out of steps
    (``VALIDATION_ERROR``; the Redis scripts answer it with their code 19)."""
    return ValidationError(
        "the write scopes are too costly to compare with the scopes of the leases held in "
        f"this org (more than {SCOPE_CHECK_STEPS:,} steps); use fewer patterns, or fewer "
        "'*' in long path segments"
    )


def _overlap(
    a: Sequence[_T],
    b: Sequence[_T],
    star: _T,
    compatible: Callable[[_T, _T], bool],
    budget: ScopeCheckBudget,
    cost: Callable[[_T, _T], int] | None = None,
) -> bool:
    """Whether some text matches both patterns ``a`` and ``b``, given as item sequences in
    which ``star`` matches any run of items and two other items match a common item when
    ``compatible(x, y)``: the one rule of segments (``*``) and of whole scopes (``**``).

    A memoised walk over pairs of positions ``(i, j)``, with an explicit stack (patterns of
    1,024 items would pass the interpreter's recursion limit). Each state is worked out once
    and costs one step of ``budget``, and ``cost(x, y)`` steps more (when given) before
    ``compatible(x, y)`` is asked, in the order the Lua mirror (``overlap`` in ``_lib.lua``)
    works them out, so both spend the same steps.

    Raises:
        ValidationError: ``budget`` ran out.
    """
    na, nb = len(a), len(b)
    memo: dict[int, bool] = {}
    matched: set[int] = set()  # states whose two items were found compatible (asked once)
    stack = [(0, 0)]
    while stack:
        i, j = stack[-1]
        key = i * (nb + 1) + j
        if key in memo:
            stack.pop()
            continue
        # The states this one may move to, in the order they are tried: it holds if any of
        # them does. `result` is set instead when it holds or fails by itself.
        nexts: tuple[tuple[int, int], ...] = ()
        result: bool | None = None
        if i == na and j == nb:
            result = True
        elif i < na and a[i] == star:
            nexts = ((i + 1, j), (i, j + 1)) if j < nb else ((i + 1, j),)
        elif j < nb and b[j] == star:
            nexts = ((i, j + 1), (i + 1, j)) if i < na else ((i, j + 1),)
        elif i == na or j == nb:
            result = False
        elif key in matched:
            nexts = ((i + 1, j + 1),)
        elif (cost is None or _spend(budget, cost(a[i], b[j]))) and compatible(a[i], b[j]):
            matched.add(key)
            nexts = ((i + 1, j + 1),)
        else:
            result = False
        if result is None:
            for ni, nj in nexts:
                done = memo.get(ni * (nb + 1) + nj)
                if done is None:  # work that state out first, then come back
                    stack.append((ni, nj))
                    break
                if done:
                    result = True
                    break
            else:
                result = False
            if result is None:
                continue
        budget.spend(1)
        memo[key] = result
        stack.pop()
    return memo[0]


def _spend(budget: ScopeCheckBudget, steps: int) -> bool:
    """Spend ``steps`` of ``budget`` (then ``True``, for use in a condition).

    Raises:
        ValidationError: as :meth:`ScopeCheckBudget.spend`.
    """
    if steps:
        budget.spend(steps)
    return True


def _segments_overlap(a: str, b: str, budget: ScopeCheckBudget) -> bool:
    return _spent(_segment_walk, a, b, budget)


def _segment_walk(a: str, b: str, budget: ScopeCheckBudget) -> bool:
    return _overlap(_tokenize(a), _tokenize(b), ("star",), _chars_compatible, budget, _chars_cost)


def _scope_walk(a: str, b: str, budget: ScopeCheckBudget) -> bool:
    sa = normalize_scope(a).split("/")
    sb = normalize_scope(b).split("/")
    return _overlap(sa, sb, "**", lambda x, y: _segments_overlap(x, y, budget), budget)


_known: dict[tuple[Callable[..., bool], str, str], tuple[bool, int]] = {}


def _spent(
    walk: Callable[[str, str, ScopeCheckBudget], bool], a: str, b: str, budget: ScopeCheckBudget
) -> bool:
    """``walk(a, b, budget)``, remembered (up to 8,192 answers): a remembered answer still
    spends the steps it took, so a request spends the same steps as the Lua mirror, which
    remembers nothing between calls."""
    found = _known.get((walk, a, b))
    if found is not None:
        budget.spend(found[1])
        return found[0]
    before = budget.left
    answer = walk(a, b, budget)
    if len(_known) >= 8192:
        _known.clear()
    _known[(walk, a, b)] = (answer, before - budget.left)
    return answer


def scopes_overlap(a: str, b: str, budget: ScopeCheckBudget | None = None) -> bool:
    """Whether some path matches both globs ``a`` and ``b`` (``str``, ``/``-separated).

    Examples: ``src/**`` overlaps ``src/app/*.py``; ``src/*.py`` does not overlap
    ``docs/**``; ``src/*.py`` does not overlap ``src/*.md``.

    Args:
        budget: the steps this check may spend (default: a fresh
            :class:`ScopeCheckBudget`).

    Raises:
        ValidationError: the check took more than the budget's steps.
    """
    return _spent(_scope_walk, a, b, ScopeCheckBudget() if budget is None else budget)


def sets_overlap(
    a: tuple[str, ...] | list[str],
    b: tuple[str, ...] | list[str],
    budget: ScopeCheckBudget | None = None,
) -> bool:
    """Whether any scope of ``a`` overlaps any scope of ``b`` (pairs tried in order, ``a``
    outer), spending from ``budget`` (default: a fresh :class:`ScopeCheckBudget`; pass one
    budget to every call of one request).

    Raises:
        ValidationError: the checks took more than the budget's steps.
    """
    spend = ScopeCheckBudget() if budget is None else budget
    return any(scopes_overlap(x, y, spend) for x in a for y in b)
