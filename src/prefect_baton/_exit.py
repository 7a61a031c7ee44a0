"""The exit status of each error code, and the one-line error on stderr, shared by the
command-line entry points: ``baton`` (:mod:`prefect_baton.cli`) and
``python -m prefect_baton.rest`` (:func:`prefect_baton.rest.__main__.main`). Imports nothing
of the package, so the server's entry point can use it without loading the CLI."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "error_line",
    "exit_code_for",
    "one_line",
    "visible",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

#: Exit status of ``baton`` per error code. Usage errors (missing option, bad value) exit
#: with 2 like ``VALIDATION_ERROR``; any other failure (audit violations, an internal
#: error, an unavailable ``baton demo``) exits with 1.
EXIT_CODES: dict[str, int] = {
    "OK": EXIT_OK,
    "VALIDATION_ERROR": EXIT_USAGE,
    "CONFLICT": 3,
    "VERSION_CONFLICT": 4,
    "NOT_FOUND": 5,
    "FORBIDDEN": 6,
    "IDEMPOTENCY_MISMATCH": 7,
    "IDEMPOTENCY_IN_FLIGHT": 8,
    "LEASE_LOST": 9,
    "STALE_FENCE": 10,
    "UNAVAILABLE": 11,
    "UNAUTHENTICATED": 12,
}


def exit_code_for(code: str) -> int:
    """The exit status for an error ``code`` (1 for codes not in :data:`EXIT_CODES`)."""
    return EXIT_CODES.get(code, EXIT_FAILURE)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


#: What :func:`visible` escapes: the C0 controls and DEL, the C1 controls (U+0080 to U+009F),
#: the line and paragraph separators, and the bidirectional formatting characters (marks,
#: embeddings, overrides and isolates), which could move the cursor, recolour or clear a
#: terminal, set its title, or make text read in another order than it is stored.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str) -> str:
    """``text`` (``str``) safe to print on a terminal: each character :data:`_INVISIBLE`
    matches (controls such as ESC and BEL, C1 controls, bidirectional overrides) is written
    as its Python escape (``\\t``, ``\\n``, ``\\x1b``, ``\\x85``, ``\\u202e``); everything
    else is kept."""
    return _INVISIBLE.sub(_escape, text)


def error_line(who: str, error: Mapping[str, Any]) -> str:
    """The error ``{"code", "message", ...}`` (``Mapping``) as one line for stderr,
    ``who: CODE: message`` (``who``: the command, ``str``), with the versions of a
    ``VERSION_CONFLICT`` the message does not already name, control characters made
    :func:`visible`; ends with a newline."""
    code = visible(str(error.get("code", "ERROR")))
    message = visible(one_line(str(error.get("message", ""))))
    details = [
        f"{k}={error[k]}"
        for k in ("current_version", "expected_version")
        if k in error and str(error[k]) not in message
    ]
    tail = f" ({', '.join(details)})" if details else ""
    return f"{who}: {code}: {message}{tail}\n"
