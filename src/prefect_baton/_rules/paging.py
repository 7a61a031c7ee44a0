"""Cursors of paged lists (leases, the handoff inbox, events, outcomes, checkpoint history,
API keys): opaque
strings naming the last item of a page, so the next page starts strictly after it (keyset
paging: a row inserted or ended meanwhile never shifts a page). No I/O.

A cursor is ``c1.`` + base64url of the JSON ``[list, *key]``; the list's name is inside, so
a cursor of another list is refused. The keys, in each list's order:

* ``leases`` (newest first): ``(acquired_at ms, lease_id)``, descending;
* ``handoffs`` (the inbox, oldest first): ``(created_at ms, handoff_id)``, ascending;
* ``events`` (commit order): ``(seq,)``, ascending;
* ``outcomes`` (oldest first): ``(recorded_at ms, outcome_id)``, ascending;
* ``checkpoints`` (a checkpoint's versions, oldest first): ``(version, checkpoint_id)``,
  ascending;
* ``keys`` (the REST API's bearer keys, oldest first): ``(created_at ms, key_id)``,
  ascending.

A page has a next cursor only when an item follows it: the client asks the store for one
item more than the page (:func:`store_limit` lets the store serve that one at the largest
page) and :func:`page_of` keeps the page (a :class:`~prefect_baton.models.Page`) and notes
whether the extra item was there, so a page that is exactly full at the end of the list has
no cursor. :func:`fetch_page` is that exchange, the one every list of the client (and the
key list) runs; it does no I/O itself, the store query it is given does.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar, overload

from prefect_baton._rules.validation import validate_id, validate_limit
from prefect_baton.errors import ValidationError
from prefect_baton.models import Checkpoint, Event, Handoff, Lease, Outcome, Page, to_ms

if TYPE_CHECKING:  # the REST package's model (a key is the item that is none of the others)
    from prefect_baton.rest.keys import ApiKey

__all__ = [
    "HISTORY_PAGE_BYTES",
    "MAX_PAGE",
    "PageKey",
    "decode_cursor",
    "encode_cursor",
    "events_after",
    "fetch_page",
    "history_page_cap",
    "page_of",
    "store_limit",
]

ListName = Literal["leases", "handoffs", "events", "outcomes", "checkpoints", "keys"]
#: The key of the last item of a page: ``(ms, id)`` of leases, handoffs, outcomes and keys,
#: ``(version, checkpoint_id)`` of checkpoint versions, ``(seq,)`` of events.
PageKey = tuple[int, str] | tuple[int]

#: The largest page (``limit``) of each list a caller may ask for.
MAX_PAGE: dict[ListName, int] = {
    "leases": 10_000,
    "handoffs": 10_000,
    "events": 1_000,
    "outcomes": 100_000,
    "checkpoints": 100,
    "keys": 10_000,
}

_PREFIX = "c1."
_MAX_CURSOR = 1024


def encode_cursor(name: ListName, key: PageKey) -> str:
    """The cursor (``str``) continuing list ``name`` after the item whose key is ``key``."""
    raw = json.dumps([name, *key], separators=(",", ":")).encode()
    return _PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@overload
def decode_cursor(
    name: Literal["leases", "handoffs", "outcomes", "checkpoints", "keys"], cursor: str
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
    """Whether ``value`` could be the id a cursor names (a lease, handoff, outcome,
    checkpoint or key id): an id as :func:`~prefect_baton._rules.validation.validate_id`
    admits it. A decoded cursor can hold any JSON string, and one no database can store (a
    lone surrogate; NUL, which PostgreSQL refuses) must be refused here, not fail in the
    query."""
    try:
        validate_id("cursor", value)
    except ValidationError:
        return False
    return True


def _key(item: Lease | Handoff | Event | Outcome | Checkpoint | ApiKey) -> PageKey:
    if isinstance(item, Lease):
        return (to_ms(item.acquired_at), item.lease_id)
    if isinstance(item, Handoff):
        return (to_ms(item.created_at), item.handoff_id)
    if isinstance(item, Outcome):
        return (to_ms(item.recorded_at), item.outcome_id)
    if isinstance(item, Event):
        return (item.seq,)
    if isinstance(item, Checkpoint):
        return (item.version, item.checkpoint_id)
    return (item.created_at_ms, item.key_id)


_Item = TypeVar("_Item", bound="Lease | Handoff | Event | Outcome | Checkpoint | ApiKey")


def store_limit(name: ListName, limit: int) -> int:
    """How many items a store serves for a query of ``limit`` (``int``) of list ``name``:
    ``limit`` within 1 and :data:`MAX_PAGE` + 1 (the client asks one item more than the
    largest page, to learn whether another page follows)."""
    return max(1, min(limit, MAX_PAGE[name] + 1))


def page_of(name: ListName, items: Sequence[_Item], limit: int) -> Page[_Item]:
    """The page of at most ``limit`` items of list ``name`` from ``items``, the store's
    answer to a query of ``limit + 1``: its first ``limit`` items, with a
    :attr:`~Page.next_cursor` (naming its last item) only when ``items`` held more, so
    a page exactly full at the end of the list has none (:attr:`Page.next_cursor
    <prefect_baton.models.Page.next_cursor>`)."""
    if len(items) <= limit:
        return Page(items)
    page = items[:limit]
    return Page(page, encode_cursor(name, _key(page[-1])))


def fetch_page(
    name: ListName,
    limit: object,
    fetch: Callable[[int], Sequence[_Item]],
    *,
    cap: int | None = None,
) -> Page[_Item]:
    """One page of list ``name``: ``limit`` checked (an ``int`` from 1 to
    :data:`MAX_PAGE` of the list), lowered to ``cap`` when given, then ``fetch`` (the store
    query, given how many items to serve) asked for that many + 1 items, of which
    :func:`page_of` makes the page.

    Raises:
        ValidationError: a bad ``limit`` (``fetch`` is not called), or what ``fetch``
            raises.
    """
    n = validate_limit(limit, MAX_PAGE[name])
    if cap is not None:
        n = max(1, min(n, cap))
    return page_of(name, fetch(n + 1), n)


#: The most bytes of checkpoint states one page of a checkpoint's history holds (16 MiB):
#: each version carries its whole state, so a page of :data:`MAX_PAGE` versions of the
#: largest states would be 100 MiB in the store, and several times that as a REST or MCP
#: answer (JSON escapes, MCP's text copy of the structured result).
HISTORY_PAGE_BYTES = 16 * 1024 * 1024


def history_page_cap(state_max_bytes: int) -> int:
    """The most versions one page of a checkpoint's history holds when a state may be
    ``state_max_bytes`` (``int``) long: :data:`HISTORY_PAGE_BYTES` of the largest states,
    at least 1 and at most :data:`MAX_PAGE` (16 with the default 1 MiB states). A
    ``limit`` above it gets a shorter page, whose ``next_cursor`` goes on."""
    return max(1, min(MAX_PAGE["checkpoints"], HISTORY_PAGE_BYTES // max(1, state_max_bytes)))


def events_after(
    after: object, cursor: str | None, *, name: str, cursor_name: str = "cursor"
) -> int:
    """The ``seq`` an event listing starts after: ``after`` when given (``int`` from 0 to
    2**63 - 1; ``None``: not given), else the one ``cursor`` (an ``events`` cursor, or
    ``None``) names, else 0 (from the start). The one check of every surface; ``name`` and
    ``cursor_name`` are the caller's names of ``after`` and ``cursor`` (``after_seq`` in
    Python, ``after`` over REST and MCP, ``--after`` and ``--cursor`` on the command line),
    for the messages.

    Raises:
        ValidationError: ``after`` not such an integer (``bool`` included), both ``after``
            and ``cursor`` given (``after=0`` too), or a cursor not of the events list.
    """
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= 2**63 - 1:
            raise ValidationError(f"{name} must be an integer from 0 to 2**63 - 1")
        if cursor is not None:
            raise ValidationError(f"give {name} or {cursor_name}, not both")
        return after
    if cursor is None:
        return 0
    return decode_cursor("events", cursor)[0]
