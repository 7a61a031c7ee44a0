"""Cursors of paged lists (leases, the handoff inbox, events, outcomes, API keys): opaque
strings naming the last item of a page, so the next page starts strictly after it (keyset
paging: a row inserted or ended meanwhile never shifts a page). No I/O.

A cursor is ``c1.`` + base64url of the JSON ``[list, *key]``; the list's name is inside, so
a cursor of another list is refused. The keys, in each list's order:

* ``leases`` (newest first): ``(acquired_at ms, lease_id)``, descending;
* ``handoffs`` (the inbox, oldest first): ``(created_at ms, handoff_id)``, ascending;
* ``events`` (commit order): ``(seq,)``, ascending;
* ``outcomes`` (oldest first): ``(recorded_at ms, outcome_id)``, ascending;
* ``keys`` (the REST API's bearer keys, oldest first): ``(created_at ms, key_id)``,
  ascending.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, overload

from prefect_baton._rules.validation import validate_id
from prefect_baton.errors import ValidationError
from prefect_baton.models import Event, Handoff, Lease, Outcome, to_ms

if TYPE_CHECKING:  # the REST package's model (a key is the item that is none of the others)
    from prefect_baton.rest.keys import ApiKey

__all__ = ["PageKey", "decode_cursor", "encode_cursor", "next_cursor"]

ListName = Literal["leases", "handoffs", "events", "outcomes", "keys"]
#: The key of the last item of a page: ``(ms, id)`` of leases, handoffs, outcomes and keys,
#: ``(seq,)`` of events.
PageKey = tuple[int, str] | tuple[int]

_PREFIX = "c1."
_MAX_CURSOR = 1024


def encode_cursor(name: ListName, key: PageKey) -> str:
    """The cursor (``str``) continuing list ``name`` after the item whose key is ``key``."""
    raw = json.dumps([name, *key], separators=(",", ":")).encode()
    return _PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@overload
def decode_cursor(
    name: Literal["leases", "handoffs", "outcomes", "keys"], cursor: str
) -> tuple[int, str]: ...
@overload
def decode_cursor(name: Literal["events"], cursor: str) -> tuple[int]: ...
def decode_cursor(name: ListName, cursor: str) -> PageKey:
    """The key a cursor of list ``name`` names.

    Raises:
        ValidationError: not a cursor this server wrote for list ``name`` (malformed,
            altered, or of another list).
    """
    bad = ValidationError(f"cursor is not a cursor of the {name} list")
    if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR or not cursor.startswith(_PREFIX):
        raise bad
    body = cursor[len(_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(value, list) or not value or value[0] != name:
        raise bad
    key = value[1:]
    ints = [k for k in key[:1] if isinstance(k, int) and not isinstance(k, bool)]
    if not ints or not 0 <= ints[0] <= 2**63 - 1:
        raise bad
    if name == "events":
        if len(key) != 1:
            raise bad
        return (ints[0],)
    if len(key) != 2 or not _is_id(key[1]):
        raise bad
    return (ints[0], key[1])


def _is_id(value: object) -> bool:
    """Whether ``value`` could be the id a cursor names (a lease, handoff, outcome or key
    id): an id as :func:`~prefect_baton._rules.validation.validate_id` admits it. A decoded
    cursor can hold any JSON string, and one no database can store (a lone surrogate; NUL,
    which PostgreSQL refuses) must be refused here, not fail in the query."""
    try:
        validate_id("cursor", value)
    except ValidationError:
        return False
    return True


def _key(item: Lease | Handoff | Event | Outcome | ApiKey) -> PageKey:
    if isinstance(item, Lease):
        return (to_ms(item.acquired_at), item.lease_id)
    if isinstance(item, Handoff):
        return (to_ms(item.created_at), item.handoff_id)
    if isinstance(item, Outcome):
        return (to_ms(item.recorded_at), item.outcome_id)
    if isinstance(item, Event):
        return (item.seq,)
    return (item.created_at_ms, item.key_id)


def next_cursor(
    name: ListName,
    items: Sequence[Lease]
    | Sequence[Handoff]
    | Sequence[Event]
    | Sequence[Outcome]
    | Sequence[ApiKey],
    limit: int,
) -> str | None:
    """The cursor of the page after ``items`` (a full page of at most ``limit`` items of
    list ``name``), or ``None`` when the page is not full (nothing follows it)."""
    if not items or len(items) < limit:
        return None
    return encode_cursor(name, _key(items[-1]))
