"""Input validation and canonical JSON: every public call checks its arguments here
before anything is written (a bad request raises ``ValidationError`` and stores nothing)."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from prefect_baton._rules import scopes as _scopes
from prefect_baton.errors import (
    ValidationError,
)

TTL_MIN_SECONDS = 10
TTL_MAX_SECONDS = 86_400
MAX_SAFE_INTEGER = 2**53 - 1
MAX_ID_LENGTH = 256
MAX_TEXT_LENGTH = 4096
MAX_SCOPES = 64
MAX_SCOPE_LENGTH = 1024
DEFAULT_STATE_MAX_BYTES = 1024 * 1024
#: The deepest nesting of a JSON object the ledger stores (checkpoint state, handoff
#: ``parameters``), in levels: the object itself is level 1, each object or array inside
#: it one more. One limit for every surface (Python client, CLI, REST API, MCP over stdio
#: and HTTP), far below what their JSON parsers allow (the ``mcp`` package's pydantic parser
#: stops near 200 levels of the whole message, Python's near 1000), so each reaches this
#: check and gives its ``VALIDATION_ERROR``.
MAX_JSON_DEPTH = 100
#: The floor of the HTTP request body limit of the REST API and the MCP server over HTTP
#: (bytes, 2 MiB): the limit whatever the checkpoint state cap, see
#: :func:`request_body_limit`.
MAX_REQUEST_BODY_BYTES = 2 * 1024 * 1024
#: How many bytes a client's JSON may spend on one byte of a state's canonical JSON: ASCII
#: escapes (``json.dumps``' default) write a 2-byte UTF-8 character as 6 bytes (``\u00e9``)
#: and a 4-byte one as a 12-byte surrogate pair; a 3-byte one as 6 bytes, a space after each
#: ``:`` and ``,`` at most doubles a 1-byte token. See :func:`request_body_limit`.
STATE_ESCAPE_FACTOR = 3
#: Room in a checkpoint-save body for everything but the state (bytes, 64 KiB). The largest
#: other fields: over REST ``subject_id``, ``kind`` and ``fence_lease_id`` (ids of at most
#: 256 characters; a character outside the BMP, ASCII-escaped, is 12 bytes: 3,072 bytes
#: each), ``expected_version`` and ``fence_epoch`` (at most 16 digits), ``ttl_seconds``
#: (8 digits); over MCP ``subject_id``, ``kind``, ``lease_id`` and ``idempotency_key`` (4 times
#: 3,072 bytes), ``expected_version``, ``epoch``, ``ttl_seconds`` and the JSON-RPC envelope
#: (``jsonrpc``, ``id``, ``method``, ``params.name``). With field names, quotes and spaces
#: that is under 13 KiB; the rest of the 64 KiB is for a client's own JSON-RPC ``id`` and
#: ``_meta``.
REQUEST_BODY_MARGIN_BYTES = 64 * 1024
ROLES = ("agent", "owner", "admin")
TTL_RANGE = f"{TTL_MIN_SECONDS} to {TTL_MAX_SECONDS}"
"""The legal lease TTL range in seconds as messages and help texts write it."""
CHECKPOINT_TTL_MAX_SECONDS = 366 * 86_400
"""The longest lifetime of a checkpoint (``ttl_seconds``) or a pending handoff
(``expires_in_seconds``): 366 days, in seconds."""
LIFETIME_RANGE = f"1 to {CHECKPOINT_TTL_MAX_SECONDS}"
"""The legal range of such a lifetime in seconds as messages and help texts write it."""


# --------------------------------------------------------------------------- validation


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def validate_id(name: str, value: object) -> str:
    """Check an identifier (org, principal, resource type/id, subject, kind, key).

    Args:
        name: the argument's name, for the message.
        value: must be a ``str`` of 1..256 characters with no control characters
            (U+0000..U+001F, U+007F, U+0080..U+009F), no line or paragraph separator
            (U+2028, U+2029), no format characters (Unicode category ``Cf``, e.g. U+200B),
            no lone surrogates, and no white space at either end.

    Raises:
        ValidationError: otherwise.
    """
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_ID_LENGTH:
        raise ValidationError(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH}")
    # the characters first: "\x85" or "\n" alone is refused for what it holds, not as empty
    if _CONTROL.search(value) is not None:
        raise ValidationError(f"{name} must not contain control characters")
    if not value.isascii():
        _check_no_format_character(name, value)
        _check_utf8(name, value)
    if not value.strip():
        raise ValidationError(f"{name} must not be empty")
    if value[0].isspace() or value[-1].isspace():
        # invisible when printed: "bob " would be another principal than "bob", and a
        # handoff to it would never reach bob's inbox
        raise ValidationError(f"{name} must not start or end with white space, got {value!r}")
    return value


def _check_no_format_character(name: str, value: str) -> None:
    """Reject an identifier holding a Unicode format character (category ``Cf``: zero-width
    space U+200B, soft hyphen U+00AD, byte order mark U+FEFF, word joiner U+2060,
    bidirectional marks and overrides, tag characters U+E0000..U+E007F, ...): invisible
    when printed, they make two different ids look the same; or a C1 control character
    (U+0080..U+009F, e.g. NEL U+0085) or U+2028/U+2029, which break lines and logs."""
    for char in value:
        category = unicodedata.category(char)
        if category == "Cf":
            raise ValidationError(
                f"{name} must not contain invisible format characters "
                f"(Unicode category Cf), found U+{ord(char):04X}"
            )
        if category in ("Cc", "Zl", "Zp"):  # C1 controls (U+0080..U+009F), U+2028, U+2029
            raise ValidationError(
                f"{name} must not contain control characters or line breaks, "
                f"found U+{ord(char):04X}"
            )


def _check_utf8(name: str, value: str) -> None:
    """Reject strings that are not valid Unicode text (lone surrogates, e.g. from
    undecodable command-line bytes): no database or Redis can store them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid UTF-8 text") from None


EVERYONE = "*"
"""The party or owner of a listing that means every principal of the org; no principal may
carry this name."""


def validate_principal(name: str, value: object) -> str:
    """Check a principal id (the caller, a key's principal, a transfer's or a handoff's
    recipient): an identifier as :func:`validate_id` checks, other than ``"*"``, which a
    listing reads as every principal (``owner="*"``, ``party="*"``).

    Raises:
        ValidationError: otherwise.
    """
    principal = validate_id(name, value)
    if principal == EVERYONE:
        raise ValidationError(f"{name} must not be '*': a listing reads it as every principal")
    return principal


def validate_optional_id(name: str, value: object) -> str | None:
    """Like :func:`validate_id` but ``None`` passes through."""
    return None if value is None else validate_id(name, value)


def validate_text(name: str, value: object, limit: int = MAX_TEXT_LENGTH) -> str | None:
    """Check a free-text field (purpose, message, note): ``None`` or a ``str`` of at most
    ``limit`` characters. Raises :class:`ValidationError` otherwise."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ValidationError(f"{name} is {len(value)} characters long; at most {limit}")
    if "\x00" in value:
        raise ValidationError(f"{name} must not contain NUL characters")
    _check_utf8(name, value)
    return value


def validate_evidence(kind: object, uri: object, digest: object, note: object) -> None:
    """Check the fields of an outcome's evidence item (beyond the lengths and types its
    model checks): ``kind`` names what the item is (``file``, ``log``, ``ci-run``), an
    identifier as :func:`validate_id` checks (1 to 256 characters, no control characters,
    no format characters, no white space at either end), as a checkpoint's ``kind`` is;
    ``uri``, ``digest`` and ``note`` are text as :func:`validate_text` checks (no NUL,
    valid UTF-8; ``digest`` and ``note`` may be ``None``). The one rule of every surface:
    the Python API, the CLI, the REST API and MCP all record an outcome through it.

    Raises:
        ValidationError: ``evidence kind must not contain control characters`` and the
            like, naming the field.
    """
    validate_id("evidence kind", kind)
    for name, value in (("uri", uri), ("digest", digest), ("note", note)):
        validate_text(f"evidence {name}", value)


def check_paired(
    lead: tuple[str, object],
    follower: tuple[str, object],
    what: str,
    *,
    lead_alone: bool = False,
) -> None:
    """The rule of two fields that make one value (a fence: a lease id and its epoch; a
    lease proof: a lease id and its execution key), each a ``(name, value)`` pair given
    when its value is not ``None``: both or neither; with ``lead_alone`` (``bool``) the
    lead may come alone (the follower is then the lead's own, e.g. the lease's epoch), the
    follower never (it would be dropped silently). The one rule of every surface that
    takes such fields by halves (the MCP tools' ``lease_id`` + ``epoch``, the REST API's
    ``fence_lease_id`` + ``fence_epoch`` and ``lease_id`` + ``lease_execution_key``).

    Raises:
        ValidationError: ``<lead> and <follower> are given together (<what>) or not at
            all``; with ``lead_alone``: ``<follower> is given only with <lead> (<what>)``.
    """
    (lead_name, lead_value), (follower_name, follower_value) = lead, follower
    if lead_alone:
        if follower_value is not None and lead_value is None:
            raise ValidationError(f"{follower_name} is given only with {lead_name} ({what})")
    elif (lead_value is None) != (follower_value is None):
        raise ValidationError(
            f"{lead_name} and {follower_name} are given together ({what}) or not at all"
        )


def validate_ttl(ttl_seconds: object, name: str = "ttl_seconds") -> int:
    """Check a lease TTL: an integer number of seconds from 10 to 86,400 (seed service rule).

    Returns the TTL in milliseconds. Only an ``int`` is one: a ``float`` (even ``60.0``, as
    the CLI and the REST API refuse it too), ``bool``, strings and out-of-range values raise
    :class:`ValidationError`.
    """
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
        raise ValidationError(
            f"{name} must be an integer number of seconds from {TTL_RANGE}, "
            f"got {type(ttl_seconds).__name__}"
        )
    ttl = ttl_seconds
    if not TTL_MIN_SECONDS <= ttl <= TTL_MAX_SECONDS:
        raise ValidationError(f"{name} must be from {TTL_RANGE} seconds, got {ttl}")
    return ttl * 1000


def validate_version(name: str, value: object) -> int | None:
    """Check an expected version: ``None`` or an ``int`` from 0 to 2**53 - 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer from 0 to {MAX_SAFE_INTEGER}")
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValidationError(f"{name} must be from 0 to {MAX_SAFE_INTEGER}")
    return value


def validate_scopes(scopes: object) -> tuple[str, ...]:
    """Check write scopes: an iterable of up to 64 glob strings of up to 1,024 characters.

    Returns them normalised, de-duplicated and sorted. A bare string is rejected (a common
    mistake: ``scopes="src/**"`` instead of ``scopes=["src/**"]``), and so is a ``..``
    segment: overlap is decided on the globs as written, so ``src/../docs/a`` would not meet
    ``docs/**`` although it names a path under it.

    Raises:
        ValidationError: any of the above.
    """
    if scopes is None:
        return ()
    if isinstance(scopes, str | bytes) or not isinstance(scopes, Iterable):
        raise ValidationError("scopes must be a list of glob strings, not a single string")
    out: set[str] = set()
    for s in scopes:
        if not isinstance(s, str):
            raise ValidationError("each scope must be a string")
        if len(s) > MAX_SCOPE_LENGTH:
            raise ValidationError(f"a scope is longer than {MAX_SCOPE_LENGTH} characters")
        if any(ord(c) < 32 or ord(c) == 127 for c in s):
            raise ValidationError("a scope must not contain control characters")
        _check_utf8("scope", s)
        if ".." in s.split("/"):
            raise ValidationError(
                f"a scope must not contain a '..' segment, got {s!r}: scopes are compared as "
                "written, so write the path it means ('src/../docs/a' is 'docs/a')"
            )
        norm = _scopes.normalize_scope(s)
        if not norm:
            raise ValidationError("a scope must not be empty")
        out.add(norm)
    if len(out) > MAX_SCOPES:
        raise ValidationError(f"at most {MAX_SCOPES} scopes per lease")
    return tuple(sorted(out))


def validate_role(role: object) -> str:
    """Check a role: one of ``agent``, ``owner``, ``admin``."""
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


def canonical_json(value: object) -> str:
    """Canonical JSON text of ``value`` (sorted keys, no spaces, UTF-8, no NaN/Infinity).

    Raises:
        ValidationError: ``value`` is not representable as JSON.
    """
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"value is not JSON-serialisable: {exc}") from None


def validate_state(
    state: object, max_bytes: int = DEFAULT_STATE_MAX_BYTES, name: str = "state"
) -> tuple[dict[str, Any], str, str]:
    """Check checkpoint state (or another JSON object the ledger stores, such as a
    handoff's ``parameters``): a JSON object of at most ``max_bytes`` bytes (UTF-8);
    ``name`` (``str``) is what error messages call it.

    Returns ``(state, canonical_text, state_hash)`` where ``state_hash`` is
    ``"sha256:" + hex digest`` of the canonical JSON.

    Raises:
        ValidationError: not a JSON object, a non-string key, objects and arrays nested
            more than :data:`MAX_JSON_DEPTH` (100) levels (``state is nested more than 100
            levels deep``), a lone surrogate, or over ``max_bytes``.
    """
    if not isinstance(state, Mapping):
        raise ValidationError(f"{name} must be a JSON object, got {type(state).__name__}")
    _check_keys(state, name)
    text = canonical_json(dict(state))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid UTF-8 text (lone surrogate)") from None
    if size > max_bytes:
        raise ValidationError(f"{name} is {size} bytes of JSON; at most {max_bytes}")
    parsed: dict[str, Any] = json.loads(text)
    return parsed, text, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_body_limit(state_max_bytes: int) -> int:
    """The largest HTTP request body (bytes) the REST API and the MCP server over HTTP accept
    from a server whose checkpoint state cap is ``state_max_bytes`` (``int``, bytes of
    canonical JSON, ``BATON_STATE_MAX_BYTES``): the larger of :data:`MAX_REQUEST_BODY_BYTES`
    (2 MiB) and :data:`STATE_ESCAPE_FACTOR` (3) times ``state_max_bytes`` +
    :data:`REQUEST_BODY_MARGIN_BYTES` (64 KiB).

    Why: the cap counts canonical JSON (UTF-8, ``ensure_ascii=False``, no spaces), but a
    client may send the same state with ASCII escapes and spaces (Python's ``json.dumps``
    default, ``requests``' ``json=``), up to 3 times larger; every state within the cap then
    fits in a body within the limit, whatever the client's encoding, and a state over the cap
    gets the cap's own ``400 VALIDATION_ERROR`` rather than ``413``. (Not covered: a client
    that indents, pads numbers or escapes ASCII letters.) One limit for every route: the
    middleware applies it before the route is known.

    Raises:
        ValidationError: ``state_max_bytes`` is not a positive ``int`` (``bool`` included).
    """
    scaled = STATE_ESCAPE_FACTOR * _state_cap(state_max_bytes) + REQUEST_BODY_MARGIN_BYTES
    return max(MAX_REQUEST_BODY_BYTES, scaled)


def request_container_limit(state_max_bytes: int) -> int:
    """The most JSON objects and arrays (counted together, at any depth) an HTTP request
    body of the REST API or the MCP server over HTTP may hold, for a server whose
    checkpoint state cap is ``state_max_bytes`` (``int``, bytes of canonical JSON,
    ``BATON_STATE_MAX_BYTES``): half the larger of ``state_max_bytes`` and
    :data:`DEFAULT_STATE_MAX_BYTES` (the cap of a handoff's ``parameters``), plus half of
    :data:`REQUEST_BODY_MARGIN_BYTES`; 557,056 with the default cap.

    Why: parsing JSON builds one Python object per object or array while holding the GIL
    (about 1 s for the 1.6 million arrays that fit in a 3 MiB body), so every other request
    of the process waits; a body over this count is refused before it is parsed. Every
    legitimate body is within it: an object or an array takes at least 2 bytes (its
    brackets), so a state within the cap, or ``parameters`` within theirs, holds at most
    half as many, however it is encoded; the rest of a body holds few (``acquire_many``:
    1,000 resources with a scope list each, about 2,000; an outcome: 1,000 evidence items),
    far fewer than the 32,768 of the margin.

    Raises:
        ValidationError: ``state_max_bytes`` is not a positive ``int`` (``bool`` included).
    """
    document = max(_state_cap(state_max_bytes), DEFAULT_STATE_MAX_BYTES)
    return (document + REQUEST_BODY_MARGIN_BYTES) // 2


def _state_cap(state_max_bytes: int) -> int:
    """``state_max_bytes`` (``int``), checked: a positive ``int``.

    Raises:
        ValidationError: not an ``int`` (``bool`` included), or not positive.
    """
    if isinstance(state_max_bytes, bool) or not isinstance(state_max_bytes, int):
        raise ValidationError(
            f"state_max_bytes must be an integer, got {type(state_max_bytes).__name__}"
        )
    if state_max_bytes < 1:
        raise ValidationError(f"state_max_bytes must be positive, got {state_max_bytes}")
    return state_max_bytes


def _check_keys(value: object, name: str, depth: int = 1) -> None:
    """JSON object keys are strings: reject ``{1: ...}`` rather than silently turning it
    into ``{"1": ...}`` (two different states would then share one hash); and objects and
    arrays are nested at most :data:`MAX_JSON_DEPTH` levels (``value`` is at level
    ``depth``); ``name``: what the messages call the value."""
    if not isinstance(value, Mapping | list | tuple):
        return
    if depth > MAX_JSON_DEPTH:
        raise ValidationError(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError(f"{name} object keys must be strings, got {k!r}")
            _check_keys(v, name, depth + 1)
    else:
        for v in value:
            _check_keys(v, name, depth + 1)


def request_digest(operation: str, fields: Mapping[str, object]) -> str:
    """SHA-256 hex digest of the canonical request (idempotency receipts bind it)."""
    text = canonical_json({"op": operation, **fields})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def validate_limit(limit: object, maximum: int) -> int:
    """``limit`` (the size of a page, or of a batch), checked: an ``int`` from 1 to
    ``maximum`` (``bool`` excluded).

    Raises:
        ValidationError: anything else (``limit must be an integer from 1 to <maximum>``).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(f"limit must be an integer from 1 to {maximum}")
    return limit


def validate_lifetime(seconds: object, name: str) -> int | None:
    """Milliseconds of an optional lifetime given in whole seconds (a checkpoint's
    ``ttl_seconds``, a handoff's ``expires_in_seconds``): ``None`` for none.

    Args:
        seconds: ``None``, or an integer from 1 to :data:`CHECKPOINT_TTL_MAX_SECONDS`.
        name: the field as the message names it (``str``, e.g. ``"expires_in_seconds"``).

    Raises:
        ValidationError: ``seconds`` is not ``None`` nor such an integer (``bool``
            included): ``<name> must be an integer from 1 to 31622400 seconds, got <value>``
            (the range of :data:`LIFETIME_RANGE`, as the REST API and the CLI help state it).
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        got = type(seconds).__name__
    elif not 1 <= seconds <= CHECKPOINT_TTL_MAX_SECONDS:
        got = str(seconds)
    else:
        return seconds * 1000
    raise ValidationError(f"{name} must be an integer from {LIFETIME_RANGE} seconds, got {got}")
