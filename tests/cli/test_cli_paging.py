"""Paging on the command line: ``baton lease list``, ``baton handoff inbox``, ``baton
outcome list`` and ``baton keys list`` take ``--cursor`` and report the next page's cursor
(``next_cursor`` in the JSON receipt, a hint on stderr in the table format), the cursor of
``_rules.paging`` that the REST lists use."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_baton import Baton

from ..conftest import REDIS_URL, require_redis
from .conftest import Cli


class RedisCli(Cli):
    """``baton`` with leases on the Redis fast path (``--redis-url``)."""

    def argv(self, args: tuple[str, ...], principal: str, role: str, fmt: str) -> list[str]:
        return ["--redis-url", REDIS_URL, *super().argv(args, principal, role, fmt)]


def _pages(cli: Cli, *args: str, key: str, limit: int, **kwargs: Any) -> list[list[Any]]:
    """Every page of a list command, following ``next_cursor`` until it is null."""
    pages: list[list[Any]] = []
    cursor: tuple[str, ...] = ()
    while True:
        receipt = cli.ok(*args, "--limit", str(limit), *cursor, **kwargs)
        pages.append(receipt[key])
        assert len(pages) <= 50, "paging does not end"
        if receipt["next_cursor"] is None:
            return pages
        assert len(receipt[key]) == limit  # only a full page has a next one
        cursor = ("--cursor", receipt["next_cursor"])


def _lease_order(leases: list[dict[str, Any]]) -> list[str]:
    """Lease ids in the list's documented order: newest first, by acquire time then id."""
    ordered = sorted(leases, key=lambda x: (x["acquired_at"], x["lease_id"]), reverse=True)
    return [x["lease_id"] for x in ordered]


def _acquire(cli: Cli, count: int, *, redis: bool = False) -> list[str]:
    extra: dict[str, Any] = {"redis_url": REDIS_URL, "ack": "ledger"} if redis else {}
    with Baton(ledger_url=cli.ledger_url, org=cli.org, principal="alice", **extra) as b:
        return [
            b.leases.acquire("deploy", f"svc-{i}", ttl_seconds=300).lease_id for i in range(count)
        ]


def test_lease_list_pages_through_every_lease_once(cli: Cli) -> None:
    """Seven leases (two of them ended) paged three at a time: every lease exactly once,
    newest first, and the last page's next_cursor is null."""
    ids = _acquire(cli, 7)
    with Baton(ledger_url=cli.ledger_url, org=cli.org, principal="alice") as b:
        for lease_id in ids[2:4]:
            b.leases.release(b.leases.get(lease_id))
    pages = _pages(cli, "lease", "list", "--all", key="leases", limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    rows = [x for p in pages for x in p]
    assert sorted(x["lease_id"] for x in rows) == sorted(ids)
    assert [x["lease_id"] for x in rows] == _lease_order(rows)
    active = [x for p in _pages(cli, "lease", "list", key="leases", limit=2) for x in p]
    assert sorted(x["lease_id"] for x in active) == sorted(ids[:2] + ids[4:])


def test_lease_list_of_an_exactly_full_last_page_has_no_next_cursor(cli: Cli) -> None:
    """Six leases by three: the second page is full but nothing follows it, so its
    next_cursor is null (no empty page to fetch). Seven leases by six: the first page names
    a cursor, the second holds the one lease left and none."""
    ids = _acquire(cli, 6)
    pages = _pages(cli, "lease", "list", key="leases", limit=3)
    assert [len(p) for p in pages] == [3, 3]
    assert sorted(x["lease_id"] for p in pages for x in p) == sorted(ids)
    assert cli.ok("lease", "list", "--limit", "6")["next_cursor"] is None
    assert cli.ok("lease", "list", "--limit", "100")["next_cursor"] is None
    with Baton(ledger_url=cli.ledger_url, org=cli.org, principal="alice") as b:
        ids.append(b.leases.acquire("deploy", "svc-6", ttl_seconds=300).lease_id)
    pages = _pages(cli, "lease", "list", key="leases", limit=6)
    assert [len(p) for p in pages] == [6, 1]
    assert sorted(x["lease_id"] for p in pages for x in p) == sorted(ids)


def test_handoff_inbox_of_an_exactly_full_page_has_no_next_cursor(cli: Cli) -> None:
    """Three handoffs by three: one page, next_cursor null; a fourth: a page of three with a
    cursor, then the one handoff left with none."""
    _offer(cli, 3)
    assert [len(p) for p in _pages(cli, "handoff", "inbox", key="handoffs", limit=3)] == [3]
    _offer(cli, 1)
    assert [len(p) for p in _pages(cli, "handoff", "inbox", key="handoffs", limit=3)] == [3, 1]


def test_lease_list_pages_on_redis(cli: Cli) -> None:
    """With --redis-url the leases list from the Redis fast path pages the same way."""
    require_redis()
    rcli = RedisCli(cli.ledger_url, cli.org)
    ids = _acquire(rcli, 5, redis=True)
    pages = _pages(rcli, "lease", "list", key="leases", limit=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    rows = [x for p in pages for x in p]
    assert sorted(x["lease_id"] for x in rows) == sorted(ids)
    assert [x["lease_id"] for x in rows] == _lease_order(rows)
    bad = rcli("lease", "list", "--cursor", "c1.bm90LWEtY3Vyc29y")
    assert bad.code == 2
    assert bad.json["error"]["code"] == "VALIDATION_ERROR"


def _offer(cli: Cli, count: int) -> list[str]:
    with Baton(ledger_url=cli.ledger_url, org=cli.org, principal="bob") as b:
        return [b.handoffs.create("alice", f"doc-{i}").handoff_id for i in range(count)]


def _handoff_order(handoffs: list[dict[str, Any]]) -> list[str]:
    """Handoff ids in the inbox's documented order: oldest first, by creation time then id."""
    ordered = sorted(handoffs, key=lambda h: (h["created_at"], h["handoff_id"]))
    return [h["handoff_id"] for h in ordered]


def test_handoff_inbox_pages_through_every_handoff_once(cli: Cli) -> None:
    """Seven handoffs to alice paged three at a time: each exactly once, oldest first, the
    last page's next_cursor null; --all (as owner) pages the same list of the org."""
    ids = _offer(cli, 7)
    pages = _pages(cli, "handoff", "inbox", key="handoffs", limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    rows = [h for p in pages for h in p]
    assert [h["handoff_id"] for h in rows] == _handoff_order(rows)
    assert sorted(h["handoff_id"] for h in rows) == sorted(ids)
    everyone = _pages(
        cli, "handoff", "inbox", "--all", key="handoffs", limit=4, principal="boss", role="owner"
    )
    assert [len(p) for p in everyone] == [4, 3]
    assert [h["handoff_id"] for p in everyone for h in p] == [h["handoff_id"] for h in rows]


def test_table_format_names_the_next_cursor_on_stderr(cli: Cli) -> None:
    """In the table format stdout is the table alone; a full page adds one stderr line with
    the cursor of the next page (the JSON receipt's next_cursor), the last page none."""
    _acquire(cli, 3)
    _offer(cli, 3)
    for args, key in ((("lease", "list"), "leases"), (("handoff", "inbox"), "handoffs")):
        receipt = cli.ok(*args, "--limit", "2")
        assert len(receipt[key]) == 2
        cursor = receipt["next_cursor"]
        first = cli(*args, "--limit", "2", fmt="table")
        assert first.code == 0, first.text
        assert "c1." not in first.stdout
        name = " ".join(args)
        assert first.stderr == f"baton {name}: more rows; next page: --cursor {cursor}\n"
        last = cli(*args, "--limit", "2", "--cursor", cursor, fmt="table")
        assert last.code == 0, last.text
        assert last.stderr == ""
        assert f"{args[0]}.{args[1]} (1)" in last.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("lease", "list"),
        ("handoff", "inbox"),
        ("handoff", "inbox", "--all"),
        ("handoff", "inbox", "--party", "alice"),
    ],
)
def test_a_bad_cursor_is_validation_error(cli: Cli, args: tuple[str, ...]) -> None:
    """A malformed or altered cursor, and a cursor of the other list (a handoffs cursor given
    to lease list, a leases cursor to handoff inbox), exit 2 with the VALIDATION_ERROR
    envelope (JSON on stdout; one line on stderr in the table format)."""
    _acquire(cli, 2)
    _offer(cli, 2)
    leases_cursor = cli.ok("lease", "list", "--limit", "1")["next_cursor"]
    handoffs_cursor = cli.ok("handoff", "inbox", "--limit", "1")["next_cursor"]
    assert leases_cursor
    assert handoffs_cursor
    other = handoffs_cursor if args[0] == "lease" else leases_cursor
    action = f"{args[0]}.{args[1]}"
    for bad in ("not-a-cursor", "c1.", "c1.!!!", leases_cursor[:-3] + "xyz", other):
        run = cli(*args, "--cursor", bad, principal="alice", role="owner")
        assert run.code == 2, (bad, run.text)
        assert run.json == {
            "ok": False,
            "action": action,
            "error": {"code": "VALIDATION_ERROR", "message": run.json["error"]["message"]},
        }
        assert "cursor" in run.json["error"]["message"]
        table = cli(*args, "--cursor", bad, principal="alice", role="owner", fmt="table")
        assert table.code == 2
        assert table.stdout == ""
        assert table.stderr.startswith(f"baton {args[0]} {args[1]}: VALIDATION_ERROR: ")
        assert table.stderr.count("\n") == 1


def _record(cli: Cli, count: int) -> list[str]:
    with Baton(ledger_url=cli.ledger_url, org=cli.org, principal="bob") as b:
        return [b.outcomes.record(f"doc-{i % 2}", "failed").outcome_id for i in range(count)]


def test_outcome_list_pages_through_every_outcome_once(cli: Cli) -> None:
    """Seven outcomes paged three at a time: each exactly once, oldest first (by record
    time, then outcome id), the order of the unpaged list; a subject's pages alike."""
    ids = _record(cli, 7)
    pages = _pages(cli, "outcome", "list", key="outcomes", limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    rows = [o for p in pages for o in p]
    assert [o["outcome_id"] for o in rows] == [
        o["outcome_id"] for o in cli.ok("outcome", "list")["outcomes"]
    ]
    assert sorted(o["outcome_id"] for o in rows) == sorted(ids)
    keys = [(o["recorded_at"], o["outcome_id"]) for o in rows]
    assert keys == sorted(keys)
    one = [
        o["outcome_id"]
        for p in _pages(cli, "outcome", "list", "doc-1", key="outcomes", limit=2)
        for o in p
    ]
    assert one == [o["outcome_id"] for o in rows if o["subject_id"] == "doc-1"]


def _make_keys(cli: Cli, count: int) -> list[str]:
    return [cli.ok("keys", "create", principal=f"agent-{i}")["key"]["key_id"] for i in range(count)]


def test_keys_list_pages_through_every_key_once(cli: Cli) -> None:
    """Five keys of the org paged two at a time: each exactly once, oldest first (by
    creation time, then key id); --active-only pages the unrevoked ones."""
    ids = _make_keys(cli, 5)
    cli.ok("keys", "revoke", ids[1])
    pages = _pages(cli, "keys", "list", key="keys", limit=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    rows = [k for p in pages for k in p]
    assert [k["key_id"] for k in rows] == [k["key_id"] for k in cli.ok("keys", "list")["keys"]]
    assert sorted(k["key_id"] for k in rows) == sorted(ids)
    keys = [(k["created_at"], k["key_id"]) for k in rows]
    assert keys == sorted(keys)
    active = [
        k["key_id"]
        for p in _pages(cli, "keys", "list", "--active-only", key="keys", limit=2)
        for k in p
    ]
    assert active == [k for k in [r["key_id"] for r in rows] if k != ids[1]]


def test_outcome_and_keys_table_format_name_the_next_cursor(cli: Cli) -> None:
    """In the table format a page of outcome list or keys list that more rows follow adds
    the stderr line with the next page's cursor; the last page adds none."""
    _record(cli, 3)
    _make_keys(cli, 3)
    for args, key in ((("outcome", "list"), "outcomes"), (("keys", "list"), "keys")):
        cursor = cli.ok(*args, "--limit", "2")["next_cursor"]
        first = cli(*args, "--limit", "2", fmt="table")
        assert first.code == 0, first.text
        name = " ".join(args)
        assert first.stderr == f"baton {name}: more rows; next page: --cursor {cursor}\n"
        last = cli(*args, "--limit", "2", "--cursor", cursor, fmt="table")
        assert last.code == 0, last.text
        assert last.stderr == ""
        assert len(cli.ok(*args, "--limit", "2", "--cursor", cursor)[key]) == 1


def test_outcome_and_keys_lists_of_an_exactly_full_last_page_have_no_next_cursor(
    cli: Cli,
) -> None:
    """Four outcomes, and four keys, by two: two full pages, the second with next_cursor
    null (no empty page to fetch); by four: one page without a cursor."""
    _record(cli, 4)
    _make_keys(cli, 4)
    for args, key in ((("outcome", "list"), "outcomes"), (("keys", "list"), "keys")):
        assert [len(p) for p in _pages(cli, *args, key=key, limit=2)] == [2, 2], key
        assert cli.ok(*args, "--limit", "4")["next_cursor"] is None, key


@pytest.mark.parametrize("args", [("outcome", "list"), ("keys", "list")])
def test_a_bad_outcome_or_key_cursor_is_validation_error(cli: Cli, args: tuple[str, ...]) -> None:
    """A malformed or altered cursor, and a cursor of another list (leases, or the other of
    outcomes and keys), and a --limit out of range, exit 2 with the VALIDATION_ERROR
    envelope; nothing is listed."""
    _acquire(cli, 2)
    _record(cli, 2)
    _make_keys(cli, 2)
    cursors = {
        name: cli.ok(*cmd, "--limit", "1")["next_cursor"]
        for name, cmd in (
            ("lease", ("lease", "list")),
            ("outcome", ("outcome", "list")),
            ("keys", ("keys", "list")),
        )
    }
    assert all(cursors.values())
    own = cursors[args[0]]
    others = [c for name, c in cursors.items() if name != args[0]]
    for bad in ("not-a-cursor", "c1.", "c1.!!!", own[:-3] + "xyz", *others):
        run = cli(*args, "--cursor", bad)
        assert run.code == 2, (bad, run.text)
        assert run.json["error"]["code"] == "VALIDATION_ERROR"
        assert "cursor" in run.json["error"]["message"]
    for limit in ("0", "100001"):
        run = cli(*args, "--limit", limit)
        assert run.code == 2, run.text
        assert run.json["error"]["code"] == "VALIDATION_ERROR"
