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
``P rebuild``      string the rebuild lock (a random token)
``P i:<digest>``   string an acquire receipt (``PX`` = receipt retention)
``P h:<digest>``   string a lease-carrying handoff's resolution (``a:<lease id>`` / ``r``)
=================  =====  ==============================================================

From the rebuild that installs the marker on, every key from ``inc`` to ``j`` exists: each
hash and sorted set holds a pad entry and the journal stays as an empty stream. Every script
checks that they all exist before it decides anything; when any is missing (evicted, deleted)
it deletes the marker in the same call, so the org's state counts as lost and is rebuilt from
the ledger with higher epochs (:mod:`prefect_baton._stores.redis.rebuild`).

``baton:orgs`` (a set of org ids, outside any org's slot) lists the orgs a reconciler
should drain; it is written with plain commands, never from a script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

DEFAULT_BATCH = 2000
"""Journal entries the reconciler applies per ledger transaction unless told otherwise
(here, with no heavy imports, so ``baton reconcile --help`` need not load Redis or the
drivers)."""

__all__ = [
    "DEFAULT_BATCH",
    "HANDOFF_KEY_TTL_MS",
    "ORGS_KEY",
    "OrgKeys",
    "org_keys",
    "resource_digest",
]

ORGS_KEY = "baton:orgs"
HANDOFF_KEY_TTL_MS = 7 * 86_400_000
"""How long a handoff's resolution key stays in Redis (milliseconds: 7 days)."""


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


@dataclass(frozen=True, slots=True)
class OrgKeys:
    """The key names of one organization.

    Attributes:
        org: the organization id (``str``).
        prefix: ``baton:{<tag>}:``, shared by every key of the org.
        base: the ten keys every operation script receives as ``KEYS[1..10]``.
        rebuild: the rebuild lock.
    """

    org: str
    prefix: str
    base: tuple[str, ...]
    rebuild: str

    @property
    def inc(self) -> str:
        """The incarnation marker."""
        return self.base[0]

    @property
    def journal(self) -> str:
        """The journal stream."""
        return self.base[9]

    def receipt(self, principal: str, key: str, resource_type: str, resource_id: str) -> str:
        """The receipt key of an acquire's idempotency identity: (org, principal,
        ``acquire``, key, resource), as the ledger's receipt identity."""
        ident = "\x00".join(
            ("acquire", principal, key, resource_digest(resource_type, resource_id))
        )
        return f"{self.prefix}i:{_digest(ident)}"

    def handoff(self, handoff_id: str) -> str:
        """The resolution key of a lease-carrying handoff."""
        return f"{self.prefix}h:{_digest(handoff_id)}"


@lru_cache(maxsize=4096)
def org_keys(org: str) -> OrgKeys:
    """The :class:`OrgKeys` of ``org`` (``str``; any valid org id)."""
    prefix = f"baton:{{{_digest(org, 24)}}}:"
    names = ("inc", "heads", "lid", "old", "oldx", "own", "sx", "sl", "se", "j")
    return OrgKeys(
        org=org,
        prefix=prefix,
        base=tuple(prefix + n for n in names),
        rebuild=prefix + "rebuild",
    )
