"""What ``baton`` prints for humans cannot drive the reader's terminal: text another
principal wrote (a handoff message, a lease purpose) is shown with its control characters,
C1 controls and bidirectional overrides escaped, and never read as Rich markup; JSON output
stays exact JSON; every printed time is a wire time (``...Z``)."""

from __future__ import annotations

import json
import re

import pytest

from prefect_baton._exit import error_line, visible

from .conftest import Cli

# ESC sequences (set the title, clear the screen, colour), BEL, a C1 control (NEL), a
# right-to-left override, a line separator, and Rich markup.
HOSTILE = "hi\x1b]0;pwned\x07\x1b[2J\x1b[31mRED \x85 \u202eabc \u2028 [bold red]x[/]"
SHOWN = r"hi\x1b]0;pwned\x07\x1b[2J\x1b[31mRED \x85 \u202eabc \u2028 [bold red]x[/]"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def test_visible_escapes_controls_and_keeps_other_text() -> None:
    """C0 controls and DEL, C1 controls, bidi overrides and isolates and the line and
    paragraph separators are written as their escapes; letters, accents and emoji stay."""
    assert visible(HOSTILE) == SHOWN
    assert visible("tab\there\nnl\x7f\u2066i\u2069") == r"tab\there\nnl\x7f\u2066i\u2069"
    assert visible("café 東京 🚀 [b]x[/b]") == "café 東京 🚀 [b]x[/b]"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("zero\u200bwidth", r"zero\u200bwidth"),
        ("\ufeffbom", r"\ufeffbom"),
        ("soft\u00adhyphen", r"soft\xadhyphen"),
        ("word\u2060joiner", r"word\u2060joiner"),
        ("tag\U000e0041\U000e007f", r"tag\U000e0041\U000e007f"),
        ("arabic\u0600mark", r"arabic\u0600mark"),
    ],
    ids=["U+200B", "U+FEFF", "U+00AD", "U+2060", "tags", "U+0600"],
)
def test_visible_escapes_format_characters(text: str, shown: str) -> None:
    """Format characters (Unicode category Cf), invisible on a terminal, are escaped, so
    two strings that differ only by one never print the same."""
    assert visible(text) == shown
    assert visible(text) != visible(text.encode("ascii", "ignore").decode())


def test_visible_is_unambiguous_about_backslashes() -> None:
    """A backslash prints as two, so the escape of a control character and the same
    characters typed literally print differently."""
    assert visible("a\x1bb") == r"a\x1bb"
    assert visible(r"a\x1bb") == r"a\\x1bb"
    assert visible("C:\\dir") == r"C:\\dir"
    assert visible("\\\n") == r"\\\n"


def test_a_hostile_handoff_message_prints_escaped_in_the_table(cli: Cli) -> None:
    """The recipient's ``handoff show`` and ``handoff inbox`` tables print the sender's
    message with visible escapes, markup literally; no raw control character reaches
    stdout."""
    hid = cli.ok("handoff", "create", "bob", "doc-1", "--message", HOSTILE)["handoff"]["handoff_id"]
    shown = cli("handoff", "show", hid, principal="bob", fmt="table")
    assert shown.code == 0, shown.text
    assert SHOWN in shown.stdout
    assert RAW.search(shown.stdout) is None
    inbox = cli("handoff", "inbox", principal="bob", fmt="table")
    assert inbox.code == 0, inbox.text
    assert RAW.search(inbox.stdout) is None


def test_json_output_keeps_the_exact_text_as_ascii_json(cli: Cli) -> None:
    """The JSON receipt holds the message exactly, every control, C1 and bidi character as
    a JSON escape (the receipt is ASCII)."""
    hid = cli.ok("handoff", "create", "bob", "doc-1", "--message", HOSTILE)["handoff"]["handoff_id"]
    run = cli("handoff", "show", hid, principal="bob")
    assert run.stdout.isascii()
    assert "\\u001b]0;pwned\\u0007" in run.stdout
    assert "\\u0085" in run.stdout
    assert "\\u202e" in run.stdout
    assert json.loads(run.stdout)["handoff"]["message"] == HOSTILE


def test_a_hostile_lease_purpose_prints_escaped(cli: Cli) -> None:
    """A lease purpose is escaped in the acquire table and inside the lease a handoff
    carries, as the recipient's table shows it."""
    run = cli(
        "lease", "acquire", "deploy", "svc", "--ttl-seconds", "60", "--purpose", HOSTILE,
        "--idempotency-key", "run-1", fmt="table",
    )  # fmt: skip
    assert run.code == 0, run.text
    assert SHOWN in run.stdout
    assert RAW.search(run.stdout) is None
    lease_id = cli.ok("lease", "list")["leases"][0]["lease_id"]
    hid = cli.ok(
        "handoff", "create", "bob", "svc", "--lease-id", lease_id, "--execution-key", "run-1"
    )["handoff"]["handoff_id"]
    shown = cli("handoff", "show", hid, principal="bob", fmt="table")
    assert shown.code == 0, shown.text
    assert RAW.search(shown.stdout) is None


def test_an_error_line_escapes_controls() -> None:
    """The one-line error on stderr escapes what a message quotes (ids may hold C1 and bidi
    characters)."""
    line = error_line("baton x", {"code": "NOT_FOUND", "message": "no \u202ecba\x1b[2J here"})
    assert line == "baton x: NOT_FOUND: no \\u202ecba\\x1b[2J here\n"


def test_events_follow_prints_wire_times_and_escaped_fields(cli: Cli) -> None:
    """``events tail --follow`` in table format prints one tab-separated line per event with
    the time as a wire time (milliseconds, ``Z``), like every other output."""
    from prefect_baton.cli import events as events_cli
    from prefect_baton.cli._state import CliState

    cli.ok("handoff", "create", "bob", "doc-\\x1b")  # a backslash: ids refuse controls
    st = CliState(ledger_url=cli.ledger_url, org=cli.org, principal="alice")
    try:
        ev = st.client().events.list(after_seq=0, limit=10)[0]
        line = events_cli._line(st, ev)
    finally:
        st.close()
    fields = line.split("\t")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields[1]), line
    assert fields[3] == "doc-\\\\x1b"  # not to be read as the escape of ESC
