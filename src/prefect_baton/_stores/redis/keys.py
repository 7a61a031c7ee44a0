"""Redis key names of the lease authority.

Every key of one organization shares the hash tag ``{<org digest>}``, so all of an org's keys
live in one Redis Cluster slot and one script may touch any of them. User-chosen ids never
appear in key names: the org, resources, principals, execution keys and handoff ids are
hashed (SHA-256, hex), so no id can forge a separator or another org's tag.

Layout (``P`` = ``baton:{<sha256(org)[:24]>}:``):

=================  =====  ==============================================================
key                type   content
=================  =====  ==============================================================
``P inc``          hash   incarnation marker: ``id``, ``n``, ``floor``, ``ceil``,
                          ``delay``, ``ret`` (missing = Redis lost its data)
``P heads``        hash   resource digest -> newest generation (``_lib.lua`` text)
``P lid``          hash   lease id -> resource digest
``P old``          hash   lease id -> a generation that is no longer its resource's head
``P oldx``         zset   lease ids of ``old`` by ``ended_at_ms`` (pruning)
``P own``          zset   ``owner \\0 resource digest`` of active heads (lexicographic)
``P sx``           zset   ``literal scope prefix \\0 sid`` of scoped active leases
``P sl``           hash   sid -> ``{"r", "t", "pf"}``: resource, scope tokens, prefixes
``P se``           hash   sid -> ``expires_at_ms \\0 owner``
``P j``            stream the journal of transitions
``P rc``           hash   what an org keeps for a while: field ``i:<digest>`` an acquire
                          receipt (JSON), field ``h:<digest>`` a lease-carrying handoff's
                          resolution (``a:<lease id>``, ``r:<token>``)
``P rcx``          zset   the fields of ``rc`` by expiry (epoch ms; pruning, and a field
                          past its expiry reads as absent)
``P rebuild``      string the rebuild lock (a random token)
=================  =====  ==============================================================

From the rebuild that installs the marker on, every key from ``inc`` to ``rcx`` exists: each
hash and sorted set holds a pad entry and the journal stays as an empty stream. Every script
checks that they all exist before it decides anything; when any is missing (evicted, deleted)
it deletes the marker in the same call, so the org's state counts as lost and is rebuilt from
the ledger with higher epochs (:mod:`prefect_baton._stores.redis.rebuild`).

Receipts and handoff resolutions live in ``rc`` rather than in string keys of their own with
a TTL (as before): a key with a TTL is the first a ``volatile-*`` ``maxmemory-policy``
evicts, and a lost receipt went unnoticed (a retried keyed acquire whose lease had ended was
granted anew, with a new fencing token, instead of ``LEASE_LOST``). In ``rc`` they have no
TTL, so no ``volatile-*`` policy evicts them, and an ``allkeys-*`` eviction of ``rc`` or
``rcx`` is a partial loss like any other: seen, and rebuilt from the ledger's receipts. String
keys ``P i:*`` and ``P h:*`` left by an earlier version are no longer read; they expire on
their own, and a hand-back drops them.

``baton:orgs`` (a set of org ids, outside any org's slot) lists the orgs a reconciler
should drain; it is written with plain commands, never from a script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

DEFAULT_BATCH = 2000
"""Journal entries the reconciler applies per ledger transaction unless told otherwise
(here, with no heavy imports, so ``baton reconcile --help`` need not load Redis or the
drivers)."""

__all__ = [
    "DEFAULT_BATCH",
    "HANDOFF_KEY_TTL_MS",
    "ORGS_KEY",
    "BaseKeys",
    "OrgKeys",
    "org_keys",
    "resource_digest",
]

ORGS_KEY = "baton:orgs"
HANDOFF_KEY_TTL_MS = 7 * 86_400_000
"""How long a lease-carrying handoff's resolution is kept in the org's ``rc`` hash
(milliseconds: 7 days; pruned after that by the writes that keep new entries)."""


def _digest(text: str, n: int = 32) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


@lru_cache(maxsize=4096)
def resource_digest(resource_type: str, resource_id: str) -> str:
    """The digest naming a resource inside its org (``str``, 32 hex digits; the most recent
    4,096 are remembered, as workloads come back to the same resources).

    The resource is length-prefixed before hashing (``"<len>:<type>:<id>"``, as the ledger's
    ``resource_key``), so ``("a:b", "c")`` and ``("a", "b:c")`` differ.
    """
    return _digest(f"{len(resource_type)}:{resource_type}:{resource_id}")


class BaseKeys(NamedTuple):
    """The twelve keys every operation script receives as ``KEYS[1..12]``, in that order
    (the layout table above names what each holds)."""

    inc: str
    heads: str
    lid: str
    old: str
    oldx: str
    own: str
    sx: str
    sl: str
    se: str
    journal: str
    kept: str
    """The hash of acquire receipts and handoff resolutions (``rc``)."""
    kept_expiry: str
    """The sorted set of ``rc``'s fields by expiry (``rcx``)."""


@dataclass(frozen=True, slots=True)
class OrgKeys:
    """The key names of one organization.

    Attributes:
        org: the organization id (``str``).
        prefix: ``baton:{<tag>}:``, shared by every key of the org.
        base: the twelve keys every operation script receives as ``KEYS[1..12]``
            (:class:`BaseKeys`: ``base.inc`` is the incarnation marker, ``base.journal``
            the journal stream, ``base.kept`` and ``base.kept_expiry`` ``rc`` and ``rcx``).
        rebuild: the rebuild lock.
    """

    org: str
    prefix: str
    base: BaseKeys
    rebuild: str

    @staticmethod
    def receipt_field(principal: str, key: str, resource_type: str, resource_id: str) -> str:
        """The field of ``rc`` holding the receipt of an acquire's idempotency identity:
        (org, principal, ``acquire``, key, resource), as the ledger's receipt identity."""
        ident = "\x00".join(
            ("acquire", principal, key, resource_digest(resource_type, resource_id))
        )
        return f"i:{_digest(ident)}"

    @staticmethod
    def handoff_field(handoff_id: str) -> str:
        """The field of ``rc`` holding a lease-carrying handoff's resolution."""
        return f"h:{_digest(handoff_id)}"


@lru_cache(maxsize=4096)
def org_keys(org: str) -> OrgKeys:
    """The :class:`OrgKeys` of ``org`` (``str``; any valid org id)."""
    prefix = f"baton:{{{_digest(org, 24)}}}:"
    names = ("inc", "heads", "lid", "old", "oldx", "own", "sx", "sl", "se", "j", "rc", "rcx")
    return OrgKeys(
        org=org,
        prefix=prefix,
        base=BaseKeys(*(prefix + n for n in names)),
        rebuild=prefix + "rebuild",
    )
