"""``BatonBlock``: an optional Prefect Block holding the ledger and Redis URLs.

``Baton.from_settings()`` (``BATON_*`` variables) stays the primary configuration; the block
is for teams that keep connection strings in Prefect. The URLs are ``SecretStr`` because
they usually embed passwords.
"""

from __future__ import annotations

from typing import ClassVar

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from prefect_baton._client.sync import Baton
from prefect_baton._settings import BatonSettings

__all__ = ["BatonBlock"]


class BatonBlock(Block):
    """Where prefect-baton's ledger (and optional Redis fast path) live.

    Attributes:
        ledger_url: SQLAlchemy URL of the ledger (``SecretStr``; ``sqlite:///...`` or
            ``postgresql://user:password@host/db``).
        org: the organization (``str``, default ``default``).
        redis_url: ``redis://...`` of the lease fast path (``SecretStr``), or ``None``: the
            ledger alone, whatever ``BATON_REDIS_URL`` says.
        role: ``agent``, ``owner`` or ``admin`` for clients built from the block.
        principal: the principal that ``@leased``, ``lease``, ``handoff_to`` and
            ``accept_handoff`` act as when given ``baton="baton/<block name>"`` (``str`` or
            ``None``: the run's own principal; an explicit ``principal=`` still wins), and
            the default of :meth:`baton`.

    Give ``baton="baton/<block name>"`` to ``@leased`` (and the others) rather than a
    factory that loads the block: the block is then loaded from the Prefect API once per
    process and its client reused, instead of one load (about 50 ms) per call.

    Example::

        BatonBlock(ledger_url="postgresql://...", org="acme").save("prod")
        b = BatonBlock.load("prod").baton(principal="writer")

        @task
        @leased("deploy", "{service}", ttl_seconds=60, baton="baton/prod")
        def deploy(service: str) -> None: ...
    """

    _block_type_name: ClassVar[str] = "Baton"
    _block_type_slug: ClassVar[str] = "baton"
    _description: ClassVar[str] = (
        "Ledger and Redis connection for prefect-baton leases, checkpoints and handoffs."
    )

    ledger_url: SecretStr = Field(description="SQLAlchemy URL of the prefect-baton ledger.")
    org: str = Field(default="default", description="Organization id.")
    redis_url: SecretStr | None = Field(default=None, description="Redis URL (fast path).")
    role: str = Field(default="agent", description="Role: agent, owner or admin.")
    principal: str | None = Field(
        default=None,
        description="Principal that Prefect runs act as (default: derived from the run).",
    )

    def settings(self, **overrides: object) -> BatonSettings:
        """:class:`BatonSettings` from this block; ``BATON_*`` variables fill the rest, but
        never the Redis URL: the block names the ledger and its Redis together, so a block
        without ``redis_url`` runs on the ledger alone even where a worker sets
        ``BATON_REDIS_URL`` (a Redis of another ledger's clients would otherwise be paired
        with this ledger)."""
        values: dict[str, object] = {
            "ledger_url": self.ledger_url.get_secret_value(),
            "org": self.org,
            "role": self.role,
            "redis_url": None if self.redis_url is None else self.redis_url.get_secret_value(),
        }
        values.update(overrides)
        return BatonSettings(**values)  # type: ignore[arg-type]

    def baton(self, principal: str | None = None) -> Baton:
        """A :class:`Baton` client acting as ``principal`` (default: the block's
        ``principal``, else ``BATON_PRINCIPAL``).

        Raises:
            ValidationError: a bad id or role. UnavailableError: the ledger is unreachable.
        """
        principal = principal or self.principal
        if principal is None:
            return Baton(settings=self.settings())
        return Baton(settings=self.settings(principal=principal))
