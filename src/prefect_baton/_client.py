"""The Python surface: :class:`Baton` (sync) and :class:`AsyncBaton`.

Each method validates its input first (a bad request raises :class:`ValidationError` and
writes nothing), then hands one atomic operation to the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from . import _core
from ._authority import Caller, LeaseAuthority
from ._core import Proof
from ._keeper import LeaseKeeper
from ._ledger.store import Fence, LedgerStore
from ._settings import BatonSettings, load_settings
from .errors import ForbiddenError, ValidationError
from .models import Lease, LeaseInfo, Receipt

if TYPE_CHECKING:
    from ._redis.authority import RedisAuthority
    from ._remote import RemoteBackend
from ._api_base import (
    _API,
    CHECKPOINT_TTL_MAX_SECONDS,
    HANDOFF_RESOLUTIONS,
    OUTCOME_STATUSES,
    FenceLike,
    LeaseLike,
    RecordStore,
    _fence_of,
    _lease_of,
    _limit,
)
from ._api_records import CheckpointAPI, EventAPI, HandoffAPI, OutcomeAPI


def _resource_scope(lease: Lease) -> str:
    """The receipt scope of a keyed operation on a lease presented by proof: its resource
    (DESIGN.md: a lease operation's key identity includes the resource)."""
    from ._ledger.convert import resource_key

    return resource_key(lease.resource_type, lease.resource_id)


class LeaseAPI(_API):
    """Lease operations (``b.leases``). Rules: DESIGN.md "Leases" (seeds 000/003 and 004)."""

    @property
    def _authority(self) -> LeaseAuthority:
        return self._b.authority

    def acquire(
        self,
        resource_type: str,
        resource_id: str,
        *,
        ttl_seconds: int,
        purpose: str | None = None,
        scopes: Iterable[str] = (),
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Acquire (or take over after expiry) the lease on ``(resource_type, resource_id)``.

        Args:
            resource_type, resource_id: the resource (``str``, 1..256 characters).
            ttl_seconds: lease duration, integer seconds from 10 to 86,400.
            purpose: free text kept with the lease, shown to the holder only.
            scopes: write-scope globs (e.g. ``["src/**"]``); overlapping scopes on another
                principal's effective lease conflict (seed 004 rule).
            expected_version: compare-and-swap on the resource version (0 = never leased).
            idempotency_key: the execution key. Retrying with the same key and request
                replays the receipt (``lease.replayed``); a replay does not revive a lease that
                was since lost. Acquiring under another key while the lease is effective
                conflicts, even for the same principal.

        Returns:
            The new :class:`Lease` (new ``lease_id``, version +1, epoch +1).

        Raises:
            ConflictError: held by another holder (the message gives only the expiry) or a
                scope overlaps. VersionConflictError: ``expected_version`` is stale.
            IdempotencyMismatchError: the key was used for a different request.
            LeaseLostError: a replay whose lease was since lost. ValidationError: bad input.
        """
        rt = _core.validate_id("resource_type", resource_type)
        rid = _core.validate_id("resource_id", resource_id)
        ttl_ms = _core.validate_ttl(ttl_seconds)
        purpose_ = _core.validate_text("purpose", purpose)
        scopes_ = _core.validate_scopes(scopes)
        ev = _core.validate_version("expected_version", expected_version)
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        return self._authority.acquire(
            self._caller,
            rt,
            rid,
            ttl_ms=ttl_ms,
            scopes=scopes_,
            purpose=purpose_,
            expected_version=ev,
            idempotency_key=key,
        )

    def acquire_many(
        self,
        resources: Iterable[tuple[str, str] | dict[str, Any]],
        *,
        ttl_seconds: int,
        purpose: str | None = None,
        scopes: Iterable[str] = (),
        idempotency_key: str | None = None,
    ) -> list[Lease]:
        """Acquire several resources all-or-nothing, in one round trip (one Redis script, or
        one ledger transaction).

        Args:
            resources: ``(resource_type, resource_id)`` pairs, or mappings with those keys
                and optionally ``ttl_seconds``, ``purpose``, ``scopes``, ``expected_version``
                (overriding the defaults below); 1..1,000 distinct resources.
            ttl_seconds, purpose, scopes: defaults for every resource (as :meth:`acquire`).
            idempotency_key: the execution key for every resource (each resource's receipt
                is its own, as if acquired one by one).

        Returns:
            The leases in the order given; a resource this execution already held, or an
            exact retry, comes back ``replayed``.

        Raises:
            The error :meth:`acquire` would raise for the first resource that is refused
            (``ConflictError``, ``VersionConflictError``, ...); then nothing was acquired.
            ValidationError: bad input (also a resource listed twice).
        """
        from ._many import ledger_acquire_many, requests_of

        reqs = requests_of(resources, ttl_seconds=ttl_seconds, purpose=purpose, scopes=scopes)
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        redis_ = self._b._redis
        if redis_ is not None:
            return redis_.acquire_many(self._caller, reqs, idempotency_key=key)
        remote = self._b._remote
        if remote is not None:
            return remote.acquire_many(self._caller, reqs, idempotency_key=key)
        return ledger_acquire_many(self._b.store, self._caller, reqs, idempotency_key=key)

    def _proof(self, lease: object) -> Proof:
        lease_ = _lease_of(lease)
        return Proof(lease_.lease_id, self._caller.principal, lease_.execution_key)

    def renew(
        self,
        lease: LeaseLike,
        *,
        ttl_seconds: int | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Extend a lease you hold: expiry = authority's now + ``ttl_seconds`` (default: the
        lease's TTL); version +1; id, owner, key, epoch and scopes unchanged.

        Args:
            lease: the :class:`Lease` (or lease block) you hold.
            ttl_seconds: new duration, integer seconds from 10 to 86,400.
            expected_version: compare-and-swap on the lease version.
            idempotency_key: optional key (``str``, 1..256 characters). An exact retry under
                the same key returns the stored result with ``replayed`` true and changes
                nothing; the receipt is kept per (org, principal, operation, key, resource),
                so the same key on another lease of the resource is a different request
                (``IDEMPOTENCY_MISMATCH``).
                A claim whose process died before storing the result lapses after
                :data:`~prefect_baton._ledger.receipts.CLAIM_TIMEOUT_SECONDS`; a retry then
                renews again.

        Raises:
            LeaseLostError: the lease ended or already expired (an expired lease is never
                silently re-acquired). NotFoundError: not your lease.
            VersionConflictError: ``expected_version`` differs. ValidationError: bad TTL.
            IdempotencyMismatchError: the key was used for a different request (nothing
                done). IdempotencyInFlightError: a request under the key is still running.
        """
        lease_ = _lease_of(lease)
        ttl_ms = _core.validate_ttl(ttl_seconds if ttl_seconds is not None else lease_.ttl_seconds)
        ev = _core.validate_version("expected_version", expected_version)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        proof = self._proof(lease_)
        remote = self._b._remote
        if remote is not None and idem is not None:
            return remote.renew(
                self._caller, proof, ttl_ms=ttl_ms, expected_version=ev, idempotency_key=idem
            )
        fields = {
            "lease_id": proof.lease_id,
            "execution_key": proof.execution_key,
            "ttl_seconds": ttl_seconds,
            "expected_version": ev,
        }
        return self._once(
            "renew",
            idem,
            _resource_scope(lease_),
            fields,
            Lease,
            lambda: self._authority.renew(self._caller, proof, ttl_ms=ttl_ms, expected_version=ev),
        )

    def transfer(
        self,
        lease: LeaseLike,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_seconds: int,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Lease:
        """Hand a lease you hold to ``to_principal`` under ``new_execution_key``: new
        ``lease_id``, version +1, epoch +1, scopes kept (seed 004 transfer).

        ``idempotency_key`` (``str``, 1..256 characters, optional): an exact retry returns
        the stored receiver's lease with ``replayed`` true; receipts as :meth:`renew` (a
        retry after a lapsed claim transfers again, which is ``LEASE_LOST``).

        Returns the receiver's :class:`Lease`. Raises as :meth:`renew`, plus
        :class:`ValidationError` when the execution key is not new.
        """
        to = _core.validate_id("to_principal", to_principal)
        key = _core.validate_id("new_execution_key", new_execution_key)
        ttl_ms = _core.validate_ttl(ttl_seconds)
        ev = _core.validate_version("expected_version", expected_version)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        lease_ = _lease_of(lease)
        proof = self._proof(lease_)
        remote = self._b._remote
        if remote is not None and idem is not None:
            return remote.transfer(
                self._caller,
                proof,
                to_principal=to,
                new_execution_key=key,
                ttl_ms=ttl_ms,
                expected_version=ev,
                idempotency_key=idem,
            )
        fields = {
            "lease_id": proof.lease_id,
            "execution_key": proof.execution_key,
            "to_principal": to,
            "new_execution_key": key,
            "ttl_seconds": ttl_seconds,
            "expected_version": ev,
        }
        return self._once(
            "transfer",
            idem,
            _resource_scope(lease_),
            fields,
            Lease,
            lambda: self._authority.transfer(
                self._caller,
                proof,
                to_principal=to,
                new_execution_key=key,
                ttl_ms=ttl_ms,
                expected_version=ev,
            ),
        )

    def release(
        self,
        lease: LeaseLike,
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Release a lease you hold, by proof (id + your identity + execution key).

        ``idempotency_key`` (``str``, 1..256 characters, optional): an exact retry returns
        the stored :class:`Receipt` with ``replayed`` true; receipts as :meth:`renew` (a
        retry after a lapsed claim releases again, which is ``no_change``).

        Returns a :class:`Receipt` with status ``released``, ``expired`` (it had run out:
        your protection lapsed) or ``no_change`` (already released by this proof; safe to
        retry after a connection error).

        Raises:
            LeaseLostError: someone else has taken it since. NotFoundError: not your lease.
            VersionConflictError: ``expected_version`` differs.
            IdempotencyMismatchError: the key was used for a different request (nothing
                done). IdempotencyInFlightError: a request under the key is still running.
        """
        ev = _core.validate_version("expected_version", expected_version)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        lease_ = _lease_of(lease)
        proof = self._proof(lease_)
        remote = self._b._remote
        if remote is not None and idem is not None:
            return remote.release(self._caller, proof, expected_version=ev, idempotency_key=idem)
        fields = {
            "lease_id": proof.lease_id,
            "execution_key": proof.execution_key,
            "expected_version": ev,
        }
        return self._once(
            "release",
            idem,
            _resource_scope(lease_),
            fields,
            Receipt,
            lambda: self._authority.release(self._caller, proof, expected_version=ev),
        )

    def release_by_id(self, lease_id: str, *, idempotency_key: str | None = None) -> Receipt:
        """Release by id alone (the seed service's ``DELETE /v1/leases/:id``), as its holder.

        ``idempotency_key`` (``str``, 1..256 characters, optional): an exact retry returns
        the stored :class:`Receipt` with ``replayed`` true; the receipt is kept per (org,
        principal, operation, key) and binds the lease id, so the key on another lease id is
        ``IDEMPOTENCY_MISMATCH``; otherwise receipts as :meth:`renew`.

        Raises:
            NotFoundError: released, unknown, another principal's or another org's lease.
            IdempotencyMismatchError: the key was used for a different request (nothing
                done). IdempotencyInFlightError: a request under the key is still running.
        """
        lid = _core.validate_id("lease_id", lease_id)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        remote = self._b._remote
        if remote is not None and idem is not None:
            return remote.release_by_id(self._caller, lid, idempotency_key=idem)
        return self._once(
            "release_by_id",
            idem,
            "",
            {"lease_id": lid},
            Receipt,
            lambda: self._authority.release_by_id(self._caller, lid),
        )

    def force_release(self, lease_id: str, *, idempotency_key: str | None = None) -> Receipt:
        """Release anyone's lease of the org; needs the ``owner`` or ``admin`` role.

        ``idempotency_key`` (``str``, 1..256 characters, optional): an exact retry returns
        the stored :class:`Receipt` with ``replayed`` true; the receipt is kept per (org,
        principal, operation, key) and binds the lease id, so the key on another lease id is
        ``IDEMPOTENCY_MISMATCH``; otherwise receipts as :meth:`renew`.

        Raises:
            ForbiddenError: the caller is an ``agent``. NotFoundError: not active/unknown.
            IdempotencyMismatchError: the key was used for a different request (nothing
                done). IdempotencyInFlightError: a request under the key is still running.
        """
        lid = _core.validate_id("lease_id", lease_id)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        remote = self._b._remote
        if remote is not None and idem is not None:
            return remote.force_release(self._caller, lid, idempotency_key=idem)
        return self._once(
            "force_release",
            idem,
            "",
            {"lease_id": lid},
            Receipt,
            lambda: self._authority.force_release(self._caller, lid),
        )

    def inspect(self, resource_type: str, resource_id: str) -> LeaseInfo:
        """Whether a resource is held, until when, and its version and epoch. The holder
        also gets its full :class:`Lease`; others never see holder, purpose or scopes."""
        return self._authority.inspect(
            self._caller,
            _core.validate_id("resource_type", resource_type),
            _core.validate_id("resource_id", resource_id),
        )

    def get(self, lease_id: str) -> Lease:
        """A lease generation by id (yours; any of the org's for owner/admin).

        Raises:
            NotFoundError: unknown, another org's, or another principal's.
        """
        return self._authority.get(self._caller, _core.validate_id("lease_id", lease_id))

    def report_expired(self, *, limit: int = 1000) -> list[Lease]:
        """Record ``lease.expired`` in the event stream once for each lease of the org found
        past its TTL that nobody has acted on since (e.g. a crashed holder's); returns the
        leases newly reported. Nothing about the leases changes: expiry is judged when
        someone next acts (no sweeper is needed for correctness).

        Args:
            limit: at most this many leases per call (1..10,000), oldest expiry first.
        """
        return self._store.report_expired(self._caller, limit=_limit(limit, 10_000))

    def list(
        self,
        *,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: int = 100,
    ) -> list[Lease]:
        """Your effective leases (``owner="*"`` or a name needs owner/admin), newest first.

        Args:
            resource_type: only this type. include_ended: also ended generations.
            limit: 1..10,000 rows.
        """
        return self._authority.list_leases(
            self._caller,
            resource_type=_core.validate_optional_id("resource_type", resource_type),
            owner=_core.validate_optional_id("owner", owner),
            include_ended=bool(include_ended),
            limit=_limit(limit, 10_000),
        )


class Baton:
    """The synchronous client.

    Args:
        ledger_url: SQLAlchemy URL of the ledger (default ``BATON_LEDGER_URL`` or a SQLite
            file ``./.baton/ledger.db``).
        org: organization id (default ``BATON_ORG`` or ``default``).
        principal: acting identity (default ``BATON_PRINCIPAL`` or ``user@host``);
            registered on first use.
        role: ``agent`` (default), ``owner`` or ``admin``.
        settings: a :class:`BatonSettings` to take the defaults from.
        redis_url: Redis URL of the lease authority (default ``BATON_REDIS_URL``; none: the
            ledger is the authority and nothing about Redis applies).
        ack: with Redis, ``"redis"`` (default, ``BATON_REDIS_ACK``: a call returns once
            Redis has the transition; a thread drains the journal into the ledger) or
            ``"ledger"`` (a call returns once the ledger has it).
        lease_authority: an authority to share (e.g. a
            :class:`~prefect_baton._redis.authority.RedisAuthority`); overrides
            ``redis_url``.
        api_url: base URL of the REST API (``str``, e.g. ``http://127.0.0.1:8787``; default
            ``BATON_API_URL`` when no ``ledger_url``, ``store``, ``redis_url`` or
            ``lease_authority`` is given). Every operation then runs through the API over
            HTTP (httpx, one connection pool, ``BATON_API_TIMEOUT_SECONDS`` per request),
            with the same results and errors; no ledger or Redis is opened here.
        api_key: the bearer key for ``api_url`` (``str``; default ``BATON_API_KEY``). It
            decides org, principal and role (asked once, ``GET /v1/me``); an explicit
            ``org``, ``principal`` or ``role`` that differs from the key's raises
            :class:`ForbiddenError`. The key never appears in logs, reprs or messages.

    A remote client (``api_url``) cannot mint identities: :meth:`as_principal` raises
    :class:`ForbiddenError` (make a key per identity instead), so does
    :meth:`prune_receipts` (an operator task on the ledger), and :attr:`store` does not
    exist. Connection failures and timeouts raise :class:`UnavailableError`, a refused key
    ``UNAUTHENTICATED`` (:class:`prefect_baton.errors.UnauthenticatedError`).

    With Redis as the authority, the ledger-backed writes that carry a lease keep their
    guarantees: a fenced checkpoint save or outcome record checks the lease against Redis
    inside its ledger transaction, holding the resource's ledger lock, so fenced writes of a
    resource are judged and committed one at a time and a stale generation is refused
    (``STALE_FENCE``); accepting a lease-carrying handoff transfers the lease in Redis and
    records the acceptance in the ledger through the journal, so that a crash at any point
    ends in (pending, sender holds) or (accepted, recipient holds) (see
    :mod:`prefect_baton._redis.handoffs`). Other ledger operations first drain the journal,
    so they see this client's own lease transitions.

    Raises:
        ValidationError: a bad ``BATON_*`` variable; a bad id, role, URL, key or ``ack``;
            or both ``api_url`` and a ledger.
        UnavailableError: the ledger (or the REST API) cannot be reached.
        ForbiddenError: ``org``/``principal``/``role`` disagree with the API key's.

    Example::

        b = Baton(org="acme", principal="agent-a")
        remote = Baton(api_url="http://127.0.0.1:8787", api_key="bk_...")
        with b.lease("deploy", "checkout-service", ttl_seconds=60) as held:
            ...  # pass fence=held to checkpoint/outcome writes
    """

    def __init__(
        self,
        ledger_url: str | None = None,
        org: str | None = None,
        principal: str | None = None,
        role: str | None = None,
        *,
        settings: BatonSettings | None = None,
        store: LedgerStore | None = None,
        redis_url: str | None = None,
        ack: str | None = None,
        lease_authority: LeaseAuthority | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        s = settings or load_settings()
        self.settings = s
        self._ledger: LedgerStore | None = None
        self._owns_authority = False
        remote = self._remote_of(
            s, api_url, api_key, local=(ledger_url, store, redis_url, lease_authority)
        )
        if remote is not None:
            owned = remote is not lease_authority
            self._init_remote(remote, org, principal, role, owned=owned)
            return
        self.caller = Caller(
            org=_core.validate_id("org", s.org if org is None else org),
            principal=_core.validate_id(
                "principal", s.principal if principal is None else principal
            ),
            role=_core.validate_role(s.role if role is None else role),
        )
        self._ledger = store or LedgerStore(
            ledger_url or s.ledger_url,
            receipt_retention_seconds=s.receipt_retention_seconds,
            state_max_bytes=s.state_max_bytes,
        )
        self._records: RecordStore = self._ledger
        self.authority: LeaseAuthority = lease_authority or self._ledger
        url = redis_url or (s.redis_url.get_secret_value() if s.redis_url else None)
        if lease_authority is None and url:
            from ._redis.authority import RedisAuthority

            try:
                self.authority = RedisAuthority.from_url(
                    url, self.store, ack=ack or s.redis_ack, post_loss=s.redis_post_loss
                )
            except ValueError as exc:  # redis-py's verdict on a malformed URL
                raise ValidationError(f"bad Redis URL: {exc}") from None
            self._owns_authority = True
        self._apis()

    def _apis(self) -> None:
        self.leases = LeaseAPI(self)
        self.checkpoints = CheckpointAPI(self)
        self.handoffs = HandoffAPI(self)
        self.outcomes = OutcomeAPI(self)
        self.events = EventAPI(self)

    @staticmethod
    def _remote_of(
        s: BatonSettings,
        api_url: str | None,
        api_key: str | None,
        *,
        local: tuple[object, ...],
    ) -> RemoteBackend | None:
        """The REST backend this client runs on, or ``None`` for a local client."""
        authority = local[3]
        if getattr(authority, "_baton_remote", False):
            if api_url is not None or api_key is not None:
                raise ValidationError("pass either a remote lease_authority or api_url/api_key")
            return cast("RemoteBackend", authority)
        if api_url is None and any(x is not None for x in local):
            if api_key is not None:
                raise ValidationError("api_key needs api_url (a REST API), not a ledger")
            return None
        if api_url is not None and any(x is not None for x in local):
            raise ValidationError(
                "api_url runs every operation through the REST API; do not also pass "
                "ledger_url, store, redis_url or lease_authority"
            )
        url = api_url if api_url is not None else s.api_url
        if url is None:
            if api_key is not None:
                raise ValidationError("api_key needs api_url (a REST API), not a ledger")
            return None
        key = api_key if api_key is not None else s.api_key
        if key is None:
            raise ValidationError("api_url needs an api_key (or BATON_API_KEY)")
        try:
            from ._remote import RemoteBackend
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise ValidationError("api_url needs httpx: install prefect-baton[rest]") from None
        return RemoteBackend(url, key, timeout_seconds=s.api_timeout_seconds)

    def _init_remote(
        self,
        remote: RemoteBackend,
        org: str | None,
        principal: str | None,
        role: str | None,
        *,
        owned: bool,
    ) -> None:
        self._owns_authority = owned
        try:
            me = remote.identity()
            for name, given, actual in (
                ("org", org, me.org),
                ("principal", principal, me.principal),
                ("role", role, me.role),
            ):
                if given is not None and given != actual:
                    raise ForbiddenError(
                        f"the API key acts as {name} {actual!r}, not {given!r}; a remote "
                        f"client's identity is its key's"
                    )
        except BaseException:
            if owned:
                remote.close()
            raise
        self.caller = Caller(org=me.org, principal=me.principal, role=me.role)
        self._records = remote
        self.authority = remote
        self._apis()

    @classmethod
    def from_settings(cls, **overrides: Any) -> Baton:
        """Build a client from ``BATON_*`` environment variables; keyword arguments
        override individual settings (``org=``, ``principal=``, ``ledger_url=`` ...)."""
        return cls(settings=load_settings(**overrides))

    @property
    def org(self) -> str:
        return self.caller.org

    @property
    def principal(self) -> str:
        return self.caller.principal

    @property
    def role(self) -> str:
        return self.caller.role

    @property
    def store(self) -> LedgerStore:
        """The ledger store of a local client.

        Raises:
            ForbiddenError: a remote client (``api_url``) has no ledger store.
        """
        if self._ledger is None:
            raise ForbiddenError(
                "a REST API client (api_url) has no ledger store; its operations run "
                "through the API"
            )
        return self._ledger

    def as_principal(self, principal: str, role: str = "agent") -> Baton:
        """Another identity of the same org sharing this client's ledger connections.

        Raises:
            ValidationError: ``principal`` or ``role`` is not valid (``None`` included).
            ForbiddenError: a remote client (``api_url``): its identity is its API key's,
                so it cannot act as anyone else; create a key for that identity
                (``baton keys create``) and a client with it.
        """
        _core.validate_id("principal", principal)
        _core.validate_role(role)
        if self._remote is not None:
            raise ForbiddenError(
                "a REST API client cannot act as another principal: its identity is its API "
                "key's; use a key created for that principal"
            )
        return Baton(
            org=self.org,
            principal=principal,
            role=role,
            settings=self.settings,
            store=self.store,
            lease_authority=self.authority,
        )

    def lease(
        self,
        resource_type: str,
        resource_id: str,
        *,
        ttl_seconds: int,
        purpose: str | None = None,
        scopes: Iterable[str] = (),
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        renew_every_seconds: float | None = None,
        on_lost: Callable[[LeaseKeeper], Any] | None = None,
    ) -> LeaseKeeper:
        """A lease held for a ``with`` / ``async with`` block, renewed in the background
        (every ``ttl_seconds / 3`` by default) and released on exit.

        Raises on enter what :meth:`LeaseAPI.acquire` raises; on exit
        :class:`LeaseLostError` if the lease was lost meanwhile (``held.lost`` turns true as
        soon as that is known, and ``on_lost(held)`` is called).
        """
        return LeaseKeeper(
            self.leases,
            resource_type,
            resource_id,
            ttl_seconds=ttl_seconds,
            purpose=purpose,
            scopes=tuple(scopes),
            expected_version=expected_version,
            idempotency_key=idempotency_key,
            renew_every_seconds=renew_every_seconds,
            on_lost=on_lost,
        )

    def prune_receipts(self) -> int:
        """Delete idempotency receipts older than the retention; returns the count.

        Raises:
            ForbiddenError: on a remote client (``api_url``): not offered over REST.
        """
        return self._records.prune_receipts(self.caller)

    @property
    def _redis(self) -> RedisAuthority | None:
        if getattr(self.authority, "_baton_redis", False):
            return cast("RedisAuthority", self.authority)
        return None

    @property
    def _remote(self) -> RemoteBackend | None:
        if getattr(self.authority, "_baton_remote", False):
            return cast("RemoteBackend", self.authority)
        return None

    def _ledger_barrier(self) -> None:
        redis_ = self._redis
        if redis_ is not None:
            redis_.sync_ledger(self.caller.org)

    def _fence(self, fence: object) -> Fence | None:
        """The store's fence for ``fence``; with Redis as the authority it carries the
        resource (whose ledger lock serialises fenced writes) and a check that reads the
        generation from Redis inside the write transaction."""
        plain = _fence_of(fence)
        redis_ = self._redis
        if plain is None or redis_ is None:
            return plain
        lease = _lease_of(fence)
        resource = (lease.resource_type, lease.resource_id)
        caller = self.caller
        redis_.ensure_ready(caller.org)
        return Fence(
            plain.lease_id,
            plain.epoch,
            resource,
            lambda: redis_.fence_check(caller, plain.lease_id, resource),
        )

    def close(self) -> None:
        """Close the ledger connections (and the Redis authority or REST connection pool
        this client created)."""
        remote = self._remote
        if remote is not None:
            if self._owns_authority:
                remote.close()
            return
        if self._owns_authority:
            redis_ = self._redis
            if redis_ is not None:
                redis_.close()
        self.store.close()

    def __enter__(self) -> Baton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


from ._async_client import AsyncBaton  # noqa: E402  (re-export; it builds on Baton)

__all__ = [
    "CHECKPOINT_TTL_MAX_SECONDS",
    "HANDOFF_RESOLUTIONS",
    "OUTCOME_STATUSES",
    "AsyncBaton",
    "Baton",
    "CheckpointAPI",
    "EventAPI",
    "FenceLike",
    "HandoffAPI",
    "LeaseAPI",
    "LeaseLike",
    "OutcomeAPI",
]
