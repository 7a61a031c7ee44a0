"""Write-scope globs (``prefect_baton._rules.scopes``): overlap of two globs and literal prefixes.

The oracle for "does this path match this glob" is wcmatch's ``globmatch`` with ``GLOBSTAR``
and ``DOTGLOB``. One deliberate difference: the design says a whole ``**`` segment matches
*zero* or more segments, so ``src/**`` also covers ``src`` itself (wcmatch requires at least
one segment after a trailing ``/**``). The oracle adds that case explicitly.
"""

from __future__ import annotations

import itertools
import re
from importlib import resources

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from wcmatch import glob as wglob

from prefect_baton import ValidationError
from prefect_baton._rules.scopes import (
    SCOPE_CHECK_STEPS,
    ScopeCheckBudget,
    latest_overlap,
    literal_prefix,
    normalize_scope,
    prefixes_meet,
    scope_prefixes,
    scopes_overlap,
    sets_overlap,
)

FLAGS = wglob.GLOBSTAR | wglob.DOTGLOB


def oracle_match(path: str, pattern: str) -> bool:
    """Whether ``path`` matches ``pattern``, trailing ``/**`` also matching zero segments."""
    pat = normalize_scope(pattern)
    variants = [pat]
    while pat.endswith("/**"):
        pat = pat[: -len("/**")]
        variants.append(pat)
    return any(wglob.globmatch(path, v, flags=FLAGS) for v in variants if v)


def _segments(s: str) -> list[str]:
    return s.split("/") if s else []


# --------------------------------------------------------------------------- strategies

TOKENS = ["a", "b", "c", ".", "*", "?", "[ab]", "[!a]", "[a-b]", "[!ab]", "[b.]"]


def glob_segment(tokens: list[str], max_tokens: int) -> st.SearchStrategy[str]:
    plain = st.lists(st.sampled_from(tokens), min_size=1, max_size=max_tokens).map("".join)
    return st.one_of(st.just("**"), plain, plain)


def _usable(pattern: str) -> bool:
    return bool(pattern) and ".." not in pattern.split("/")


def globs(
    tokens: list[str] = TOKENS, max_segments: int = 4, max_tokens: int = 3
) -> st.SearchStrategy[str]:
    """Normalised globs of a few segments built from ``tokens`` (``**`` as a whole segment)."""
    return (
        st.lists(glob_segment(tokens, max_tokens), min_size=1, max_size=max_segments)
        .map(lambda segs: normalize_scope("/".join(segs)))
        .filter(_usable)
    )


literal_segment = st.text("abc.", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))
literal_paths = st.lists(literal_segment, min_size=1, max_size=4).map("/".join)


@st.composite
def path_from_glob(draw: st.DrawFn, pattern: str) -> str:
    """A concrete path that matches ``pattern`` (each wildcard filled in at random)."""
    out: list[str] = []
    for seg in pattern.split("/"):
        if seg == "**":
            out.extend(draw(st.lists(literal_segment, max_size=2)))
            continue
        chars: list[str] = []
        i = 0
        while i < len(seg):
            c = seg[i]
            if c == "*":
                chars.append(draw(st.text("abc.", max_size=2)))
                i += 1
            elif c == "?":
                chars.append(draw(st.sampled_from("abc.")))
                i += 1
            elif c == "[":
                j = seg.index("]", i + 2)
                body = seg[i + 1 : j]
                if body.startswith("!"):
                    pool = [x for x in "abc." if x not in body[1:]]
                elif "-" in body:
                    lo, hi = body[0], body[2]
                    pool = [x for x in "abc." if lo <= x <= hi]
                else:
                    pool = list(body)
                chars.append(draw(st.sampled_from(pool)))
                i = j + 1
            else:
                chars.append(c)
                i += 1
        s = "".join(chars) or "c"  # only stars, all empty: any one character fits
        assume(s not in (".", ".."))  # not a file name
        out.append(s)
    assume(out)  # `**` alone may have drawn no segment at all
    return "/".join(out)


@st.composite
def glob_matching(draw: st.DrawFn, path: str) -> str:
    """A glob built by generalising ``path``, so that ``path`` matches it."""
    segs = path.split("/")
    out: list[str] = []
    i = 0
    while i < len(segs):
        hows = ["keep", "chars", "chars", "star"]
        if not out or out[-1] != "**":
            hows.append("globstar")
        how = draw(st.sampled_from(hows))
        if how == "globstar":
            out.append("**")
            i += draw(st.integers(0, len(segs) - i))
            continue
        seg = segs[i]
        i += 1
        if how == "keep":
            out.append(seg)
            continue
        if how == "star":
            out.append("*")
            continue
        toks: list[str] = []
        j = 0
        while j < len(seg):
            c = seg[j]
            kind = draw(st.sampled_from(["lit", "any", "class", "neg", "star", "star_lit"]))
            if kind == "star":
                toks.append("*")
                j += draw(st.integers(1, len(seg) - j))
                continue
            if kind == "lit":
                toks.append(c)
            elif kind == "star_lit":
                toks.append("*" + c)
            elif kind == "any":
                toks.append("?")
            elif kind == "class":
                extra = draw(st.sampled_from(["", "a", "bc", "."]))
                toks.append("[" + "".join(sorted(set(c + extra))) + "]")
            else:
                others = [x for x in "abcxy." if x != c]
                toks.append("[!" + draw(st.sampled_from(others)) + "]")
            j += 1
        out.append("".join(toks))
    return "/".join(out)


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(globs(), globs())
def test_overlap_is_symmetric(a: str, b: str) -> None:
    """Whether two leases' scopes clash does not depend on which one asks."""
    assert scopes_overlap(a, b) == scopes_overlap(b, a)


@settings(max_examples=400, deadline=None)
@given(globs(), literal_paths)
def test_glob_overlaps_literal_iff_it_matches(pattern: str, path: str) -> None:
    """A glob scope clashes with a literal file scope exactly when the file matches the glob."""
    assert scopes_overlap(pattern, path) == oracle_match(path, pattern), (pattern, path)
    assert scopes_overlap(path, pattern) == oracle_match(path, pattern), (pattern, path)


@settings(max_examples=300, deadline=None)
@given(st.data(), globs())
def test_path_drawn_from_glob_overlaps_it(data: st.DataObject, pattern: str) -> None:
    """Any file a glob covers clashes with that glob."""
    path = data.draw(path_from_glob(pattern))
    assert oracle_match(path, pattern), (pattern, path)
    assert scopes_overlap(pattern, path), (pattern, path)


@settings(max_examples=400, deadline=None)
@given(st.data(), globs())
def test_common_match_implies_overlap(data: st.DataObject, a: str) -> None:
    """Two globs that can both match one file always clash (no missed conflict)."""
    path = data.draw(path_from_glob(a))
    b = data.draw(glob_matching(path))
    assert oracle_match(path, a), (a, path)
    assert oracle_match(path, b), (b, path)
    assert scopes_overlap(a, b), (a, b, path)
    assert scopes_overlap(b, a), (a, b, path)


@settings(max_examples=300, deadline=None)
@given(globs(), globs())
def test_overlap_implies_literal_prefixes_nest(a: str, b: str) -> None:
    """Overlapping scopes have literal prefixes where one is a segment-prefix of the other."""
    if not scopes_overlap(a, b):
        return
    pa, pb = _segments(literal_prefix(a)), _segments(literal_prefix(b))
    n = min(len(pa), len(pb))
    assert pa[:n] == pb[:n], (a, b)


# Small globs over letters a, b and "other" c: a common path, if any, has at most two
# segments of at most two characters, so trying every such path decides overlap exactly.
SMALL_TOKENS = ["a", "b", "c", "*", "?", "[ab]", "[!a]", "[a-b]", "[!ab]", "[b]"]
_SMALL_SEGS = ["".join(p) for n in (1, 2) for p in itertools.product("abc", repeat=n)]
SMALL_PATHS = _SMALL_SEGS + [f"{x}/{y}" for x in _SMALL_SEGS for y in _SMALL_SEGS]


@settings(max_examples=300, deadline=None)
@given(
    globs(SMALL_TOKENS, max_segments=2, max_tokens=2),
    globs(SMALL_TOKENS, max_segments=2, max_tokens=2),
)
def test_small_globs_overlap_iff_some_path_matches_both(a: str, b: str) -> None:
    """Two small globs clash exactly when some file matches both (no false alarm either)."""
    witness = next((p for p in SMALL_PATHS if oracle_match(p, a) and oracle_match(p, b)), None)
    assert scopes_overlap(a, b) == (witness is not None), (a, b, witness)


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("src/**", "src/app/*.py", True),
        ("src/*.py", "docs/**", False),
        ("src/*.py", "src/*.md", False),
        ("src/**", "src", True),
        ("src/**", "srcx/a.py", False),
        ("src/app/*.py", "src/app/main.py", True),
        ("src/app/*.py", "src/app/sub/main.py", False),
        ("src/**/test_*.py", "src/a/b/test_x.py", True),
        ("src/**/test_*.py", "src/*/conftest.py", False),
        ("**/*.py", "docs/*.md", False),
        ("*", "a/b", False),
        ("a/*", "a", False),
        ("./src//app/", "src/app", True),
        ("src/*.py", "src/*", True),
        ("src/a*", "src/*b", True),
        ("src/a?", "src/abc", False),
    ],
)
def test_overlap_examples(a: str, b: str, overlap: bool) -> None:
    """Documented overlap examples hold in both argument orders."""
    assert scopes_overlap(a, b) is overlap
    assert scopes_overlap(b, a) is overlap


@pytest.mark.parametrize("other", ["a", "a/b/c", "src/**", "*.py", "[!x]/?", ".hidden/x", "**"])
def test_globstar_overlaps_everything(other: str) -> None:
    """A lease on ``**`` clashes with every other scope."""
    assert scopes_overlap("**", other)
    assert scopes_overlap(other, "**")


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("src/[ab].py", "src/a.py", True),
        ("src/[ab].py", "src/c.py", False),
        ("src/[!a].py", "src/a.py", False),
        ("src/[!a].py", "src/b.py", True),
        ("src/[^a].py", "src/a.py", False),
        ("src/[a-c]*", "src/[x-z]*", False),
        ("src/[a-c]*", "src/[c-e]*", True),
        ("src/[!a]*", "src/[!b]*", True),
        ("src/[ab]", "src/[!ab]", False),
        ("src/[]]", "src/]", True),
        ("src/[a-]", "src/-", True),
        ("src/[abc", "src/[abc", True),
        ("src/[abc", "src/a", False),
    ],
)
def test_character_classes(a: str, b: str, overlap: bool) -> None:
    """Character classes (ranges, negation, literal ``]``, unterminated ``[``) are honoured."""
    assert scopes_overlap(a, b) is overlap
    assert scopes_overlap(b, a) is overlap


def test_sets_overlap_any_pair() -> None:
    """Two leases clash when any scope of one overlaps any scope of the other."""
    assert sets_overlap(("docs/**", "src/app/*.py"), ("src/**",))
    assert not sets_overlap(("docs/**", "src/*.md"), ("src/*.py", "tests/**"))
    assert not sets_overlap((), ("**",))


@pytest.mark.parametrize(
    ("scope", "prefix"),
    [
        ("src/app/*.py", "src/app"),
        ("src/**", "src"),
        ("**", ""),
        ("*.py", ""),
        ("src/app/main.py", "src/app/main.py"),
        ("./src//app/", "src/app"),
        ("src/a[bc]/x", "src"),
        ("src/a?b/c", "src"),
        ("", ""),
    ],
)
def test_literal_prefix_examples(scope: str, prefix: str) -> None:
    """The literal prefix is the leading run of segments with no glob characters."""
    assert literal_prefix(scope) == prefix


@pytest.mark.parametrize(
    ("scope", "normal"),
    [
        ("src/", "src"),
        ("./src/./app//x", "src/app/x"),
        ("/abs/path", "abs/path"),
        ("src/**", "src/**"),
    ],
)
def test_normalize_scope_examples(scope: str, normal: str) -> None:
    """Equivalent spellings of a scope normalise to one form."""
    assert normalize_scope(scope) == normal


# Long segments full of '*' make the walk take the product of the two patterns' lengths:
# these two take 161,203 steps (no path matches both: one ends in b, the other in c).
COSTLY_A = "a*" * 200 + "b"
COSTLY_B = "*a" * 200 + "c"


def test_patterns_of_the_longest_allowed_length_are_compared_without_recursion() -> None:
    """Two 1,024-character patterns are compared (a few thousand steps), not refused with
    an interpreter error as a recursive walk 1,024 deep was."""
    assert scopes_overlap("a" * 1024, "a" * 1023 + "*")
    assert not scopes_overlap("a" * 1024, "a" * 1023 + "b")
    assert scopes_overlap("/".join(["a"] * 512), "/".join(["*"] * 511) + "/**")


def test_a_comparison_over_its_steps_is_a_validation_error() -> None:
    """A decision may spend SCOPE_CHECK_STEPS steps comparing scopes; past that it is
    VALIDATION_ERROR (the caller writes nothing), whatever the answer would have been."""
    with pytest.raises(ValidationError, match=r"too costly to compare .* 100,000 steps"):
        scopes_overlap(COSTLY_A, COSTLY_B)
    with pytest.raises(ValidationError, match="too costly"):  # a remembered answer too
        scopes_overlap(COSTLY_A, COSTLY_B)
    roomy = ScopeCheckBudget(10**6)
    assert not scopes_overlap(COSTLY_A, COSTLY_B, roomy)
    assert 10**6 - roomy.left == 161_203
    again = ScopeCheckBudget(10**6)  # remembered, and spending the same steps
    assert not scopes_overlap(COSTLY_A, COSTLY_B, again)
    assert again.left == roomy.left


def test_one_budget_is_shared_by_the_checks_of_one_decision() -> None:
    """Checks that each fit the budget run out of it together: sets_overlap spends every
    pair's steps from one ScopeCheckBudget."""
    one = ScopeCheckBudget(10**9)
    assert not sets_overlap(["a*" * 120 + "b"], ["*a" * 120 + "c"], one)
    per_pair = 10**9 - one.left
    assert SCOPE_CHECK_STEPS / 2 < per_pair < SCOPE_CHECK_STEPS
    shared = ScopeCheckBudget()
    assert not sets_overlap(["a*" * 120 + "b"], ["*a" * 120 + "c"], shared)
    with pytest.raises(ValidationError, match="too costly"):
        sets_overlap(["a*" * 120 + "b"], ["*a" * 120 + "c"], shared)


def test_ordinary_scopes_take_a_few_steps() -> None:
    """The budget leaves room for thousands of ordinary comparisons in one decision."""
    budget = ScopeCheckBudget(10**9)
    held = ["src/app/**/*.py", "docs/**", "tests/unit/test_[a-m]*.py"]
    assert not sets_overlap(["src/lib/*.ts", "README.md", "tests/e2e/**"], held, budget)
    assert 10**9 - budget.left < 100


def test_the_lua_mirror_has_the_same_step_budget() -> None:
    """The Redis scripts' SCOPE_CHECK_STEPS is the Python constant."""
    lua = (
        resources.files("prefect_baton._stores.redis")
        .joinpath("scripts", "_lib.lua")
        .read_text(encoding="utf-8")
    )
    found = re.search(r"^local SCOPE_CHECK_STEPS = (\d+)$", lua, re.M)
    assert found is not None
    assert int(found.group(1)) == SCOPE_CHECK_STEPS


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("[ -\u2000]", "[\u3000-\u5000]", False),  # wide positive classes, disjoint
        ("[ -\u3000]", "[\u3000-\u5000]", True),
        ("[!a-z]", "[a-z]", False),
        ("[!a-y]", "[a-z]", True),  # z
        ("[!a-cb-d]", "[a-d]", False),  # overlapping ranges of a negated class
        ("[!a-cb-d]", "[a-e]", True),
        ("[!a-m]", "[!n-z]", True),  # neither covers '0'
    ],
)
def test_classes_are_compared_by_their_ranges(a: str, b: str, overlap: bool) -> None:
    """Two classes overlap when some character lies in both, however wide their ranges
    (wide positive classes were taken to overlap without looking)."""
    assert scopes_overlap(a, b) is overlap
    assert scopes_overlap(b, a) is overlap


def _wide_class(first: int) -> str:
    """A class of 340 ranges of 4,096 code points each: 1,022 characters."""
    return "[" + "".join(chr(first + k) + "-" + chr(first + k + 4095) for k in range(340)) + "]"


def test_classes_of_many_ranges_spend_their_comparison_in_steps() -> None:
    """Comparing two classes spends the product of their range counts: two classes of 340
    ranges (115,600) are over the budget at once, where listing their characters took
    about 20 s."""
    with pytest.raises(ValidationError, match="too costly"):
        scopes_overlap(_wide_class(0x10000), _wide_class(0x30000))
    budget = ScopeCheckBudget(10**6)
    assert not scopes_overlap(_wide_class(0x10000), _wide_class(0x30000), budget)
    assert 10**6 - budget.left == 340 * 340 + 2  # and one state of the segment, one of the scope


@pytest.mark.parametrize(
    ("a", "b", "meet"),
    [
        (["src"], ["src/app"], True),
        (["src/app"], ["src"], True),
        (["src"], ["src"], True),
        (["src"], ["srcs"], False),  # a prefix of the text, not of the segments
        (["src/app"], ["src/lib"], False),
        ([""], ["anything/at/all"], True),
        (["docs", "src/a"], ["lib", "src"], True),
        (["docs", "src/a"], ["lib", "src/b"], False),
        ([], ["src"], False),
    ],
)
def test_prefixes_meet_examples(a: list[str], b: list[str], meet: bool) -> None:
    """Literal prefixes meet when one of each side nests in the other, by whole segments."""
    assert prefixes_meet(a, b) is meet
    assert prefixes_meet(b, a) is meet


def test_scope_prefixes_are_distinct_and_sorted() -> None:
    """A scope set's prefixes, as the Redis index files them (codec.scope_meta "pf")."""
    assert scope_prefixes(["src/**", "docs/*.md", "src/*.py", "**/x"]) == ("", "docs", "src")


# globs behind a literal run of one to three segments over a, b: prefixes that often nest
# and often do not
prefixed_globs = st.tuples(
    st.lists(st.sampled_from(["a", "b", "ab"]), min_size=1, max_size=3).map("/".join), globs()
).map(lambda p: normalize_scope(f"{p[0]}/{p[1]}"))
scope_sets = st.lists(st.one_of(prefixed_globs, globs()), min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(scope_sets, scope_sets)
def test_scope_sets_whose_prefixes_cannot_meet_never_overlap(a: list[str], b: list[str]) -> None:
    """Skipping a lease whose prefixes cannot meet the request's (as every store does,
    spending no steps on it) never misses a conflict."""
    if not prefixes_meet(scope_prefixes(a), scope_prefixes(b)):
        assert not sets_overlap(a, b, ScopeCheckBudget(10**9)), (a, b)


def _latest(scopes: list[str], others: list[tuple[list[str], int]], steps: int) -> object:
    try:
        return latest_overlap(scopes, others, ScopeCheckBudget(steps))
    except ValidationError:
        return "too costly"


@settings(max_examples=200, deadline=None)
@given(
    globs(),
    st.lists(st.tuples(st.lists(globs(), min_size=1, max_size=2), st.integers(1, 9)), max_size=5),
    st.integers(1, 400),
    st.randoms(use_true_random=False),
)
def test_latest_overlap_does_not_depend_on_the_order_of_candidates(
    wanted: str, others: list[tuple[list[str], int]], steps: int, rnd: object
) -> None:
    """The verdict (an expiry, none, or too costly) is the same in any order of the
    candidates (the ledger and Redis meet them in different orders), and the expiry is the
    latest among the overlapping ones."""
    shuffled = list(others)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert _latest([wanted], others, steps) == _latest([wanted], shuffled, steps)
    overlapping = [exp for scopes, exp in others if sets_overlap([wanted], scopes)]
    assert _latest([wanted], others, 10**9) == (max(overlapping) if overlapping else None)
