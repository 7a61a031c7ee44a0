"""The exit status of each error code, and the one-line error on stderr, shared by the
command-line entry points: ``baton`` (:mod:`prefect_baton.cli`) and
``python -m prefect_baton.rest`` (:func:`prefect_baton.rest.__main__.main`). Imports nothing
of the package, so the server's entry point can use it without loading the CLI."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "error_line",
    "exit_code_for",
    "exit_code_for_signal",
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


def exit_code_for_signal(signum: int) -> int:
    """The exit status of a command stopped by the signal ``signum`` (``int``) after it
    cleaned up: 128 + ``signum``, as a shell reports a process killed by it (130 for
    SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


#: The characters :func:`visible` looks at: an ASCII backslash or control (decided here),
#: and any character outside ASCII (decided by its category, :func:`_escaped`).
_CANDIDATES = re.compile("[\\\\\x00-\x1f\x7f]|[^\x00-\x7f]")

#: The Unicode categories :func:`visible` escapes: controls (C0, DEL, C1), format
#: characters (zero-width spaces and joiners, the soft hyphen, the byte order mark, word
#: joiners, the bidirectional marks, embeddings, overrides and isolates, the tag
#: characters U+E0000..U+E007F, ...), and the line and paragraph separators. They could
#: move the cursor, recolour or clear a terminal, set its title, make text read in another
#: order than it is stored, or make two different strings print the same.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

_SHORT = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    if unicodedata.category(char) not in _ESCAPED_CATEGORIES:
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` (``str``) safe to print on a terminal, and unambiguous: each control
    character (C0 such as ESC and BEL, DEL, C1), format character (Unicode category
    ``Cf``: zero-width space U+200B, soft hyphen U+00AD, byte order mark U+FEFF, word
    joiner U+2060, bidirectional marks and overrides such as U+202E, tag characters
    U+E0000..U+E007F, ...) and line or paragraph separator is written as its Python escape
    (``\\t``, ``\\n``, ``\\x1b``, ``\\x85``, ``\\u202e``, ``\\U000e0041``), and a
    backslash as two (``\\\\``), so an escape in the output always stands for the character
    it names: ``a<ESC>b`` prints ``a\\x1bb``, the text ``a\\x1bb`` prints ``a\\\\x1bb``.
    Everything else (letters of any script, accents, emoji) is kept."""
    return _CANDIDATES.sub(_escaped, text)


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
