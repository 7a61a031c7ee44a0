"""The Python surface: :class:`Baton` (sync) and :class:`AsyncBaton`.

Each method validates its input first (a bad request raises :class:`ValidationError` and
writes nothing), then hands one atomic operation to the store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

import anyio.to_thread

from . import _core
from ._authority import Caller, LeaseAuthority
from ._core import Proof
from ._keeper import LeaseKeeper
from ._ledger.store import Fence, LedgerStore
from ._settings import BatonSettings
from .errors import ValidationError
from .models import Checkpoint, Event, Evidence, Handoff, Lease, LeaseInfo, Outcome, Receipt

if TYPE_CHECKING:
    from ._redis.authority import RedisAuthority

T = TypeVar("T")

HANDOFF_RESOLUTIONS = ("accepted", "rejected")
OUTCOME_STATUSES = ("succeeded", "failed", "cancelled")
CHECKPOINT_TTL_MAX_SECONDS = 366 * 86_400


@runtime_checkable
class FenceLike(Protocol):
    """Anything that names a lease generation: a :class:`Lease` or a :class:`LeaseKeeper`."""

    @property
    def lease_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


LeaseLike = Lease | LeaseKeeper


def _lease_of(lease: object) -> Lease:
    if isinstance(lease, LeaseKeeper):
        return lease.lease
    if isinstance(lease, Lease):
        return lease
    raise ValidationError(f"expected a Lease, got {type(lease).__name__}")


def _fence_of(fence: object) -> Fence | None:
    if fence is None:
        return None
    if isinstance(fence, Lease | LeaseKeeper):
        return Fence(fence.lease_id, fence.epoch)
    raise ValidationError(f"fence must be a Lease (or the lease block), got {type(fence).__name__}")


def _limit(limit: object, maximum: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(f"limit must be an integer from 1 to {maximum}")
    return limit


class _API:
    def __init__(self, baton: Baton) -> None:
        self._b = baton

    @property
    def _caller(self) -> Caller:
        return self._b.caller

    @property
    def _store(self) -> LedgerStore:
        self._b._ledger_barrier()
        return self._b.store


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
    ) -> Lease:
        """Extend a lease you hold: expiry = authority's now + ``ttl_seconds`` (default: the
        lease's TTL); version +1; id, owner, key, epoch and scopes unchanged.

        Raises:
            LeaseLostError: the lease ended or already expired (an expired lease is never
                silently re-acquired). NotFoundError: not your lease.
            VersionConflictError: ``expected_version`` differs. ValidationError: bad TTL.
        """
        lease_ = _lease_of(lease)
        ttl_ms = _core.validate_ttl(ttl_seconds if ttl_seconds is not None else lease_.ttl_seconds)
        ev = _core.validate_version("expected_version", expected_version)
        return self._authority.renew(
            self._caller, self._proof(lease_), ttl_ms=ttl_ms, expected_version=ev
        )

    def transfer(
        self,
        lease: LeaseLike,
        *,
        to_principal: str,
        new_execution_key: str,
        ttl_seconds: int,
        expected_version: int | None = None,
    ) -> Lease:
        """Hand a lease you hold to ``to_principal`` under ``new_execution_key``: new
        ``lease_id``, version +1, epoch +1, scopes kept (seed 004 transfer).

        Returns the receiver's :class:`Lease`. Raises as :meth:`renew`, plus
        :class:`ValidationError` when the execution key is not new.
        """
        to = _core.validate_id("to_principal", to_principal)
        key = _core.validate_id("new_execution_key", new_execution_key)
        ttl_ms = _core.validate_ttl(ttl_seconds)
        ev = _core.validate_version("expected_version", expected_version)
        return self._authority.transfer(
            self._caller,
            self._proof(lease),
            to_principal=to,
            new_execution_key=key,
            ttl_ms=ttl_ms,
            expected_version=ev,
        )

    def release(self, lease: LeaseLike, *, expected_version: int | None = None) -> Receipt:
        """Release a lease you hold, by proof (id + your identity + execution key).

        Returns a :class:`Receipt` with status ``released``, ``expired`` (it had run out:
        your protection lapsed) or ``no_change`` (already released by this proof; safe to
        retry after a connection error).

        Raises:
            LeaseLostError: someone else has taken it since. NotFoundError: not your lease.
            VersionConflictError: ``expected_version`` differs.
        """
        ev = _core.validate_version("expected_version", expected_version)
        return self._authority.release(self._caller, self._proof(lease), expected_version=ev)

    def release_by_id(self, lease_id: str) -> Receipt:
        """Release by id alone (the seed service's ``DELETE /v1/leases/:id``), as its holder.

        Raises:
            NotFoundError: released, unknown, another principal's or another org's lease.
        """
        return self._authority.release_by_id(self._caller, _core.validate_id("lease_id", lease_id))

    def force_release(self, lease_id: str) -> Receipt:
        """Release anyone's lease of the org; needs the ``owner`` or ``admin`` role.

        Raises:
            ForbiddenError: the caller is an ``agent``. NotFoundError: not active/unknown.
        """
        return self._authority.force_release(self._caller, _core.validate_id("lease_id", lease_id))

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


class CheckpointAPI(_API):
    """Checkpoints (``b.checkpoints``): resumable progress per (subject, principal, kind)."""

    def save(
        self,
        subject_id: str,
        kind: str,
        state: dict[str, Any],
        *,
        expected_version: int | None = None,
        fence: LeaseLike | None = None,
        idempotency_key: str | None = None,
        ttl_seconds: int | None = None,
    ) -> Checkpoint:
        """Write your checkpoint of ``(subject_id, kind)``; version +1 per write.

        Args:
            state: a JSON object, at most ``state_max_bytes`` (default 1 MiB) of JSON.
            expected_version: compare-and-swap (0 = must not exist yet); without it the
                last write wins and the new ``state_hash`` tells readers it moved.
            fence: a lease (or lease block); the write is rejected once that generation is
                no longer the effective lease of its resource.
            ttl_seconds: after this many seconds (1..31,622,400) the checkpoint is no
                longer returned.

        Raises:
            VersionConflictError, StaleFenceError, IdempotencyMismatchError,
            ValidationError (non-JSON or oversized state, bad ids).
        """
        subject = _core.validate_id("subject_id", subject_id)
        kind_ = _core.validate_id("kind", kind)
        state_, text, digest = _core.validate_state(state, self._store.state_max_bytes)
        ev = _core.validate_version("expected_version", expected_version)
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        ttl_ms = None
        if ttl_seconds is not None:
            if (
                isinstance(ttl_seconds, bool)
                or not isinstance(ttl_seconds, int)
                or not 1 <= ttl_seconds <= CHECKPOINT_TTL_MAX_SECONDS
            ):
                raise ValidationError(
                    f"checkpoint ttl_seconds must be an integer from 1 to "
                    f"{CHECKPOINT_TTL_MAX_SECONDS}"
                )
            ttl_ms = ttl_seconds * 1000
        return self._store.checkpoint_save(
            self._caller,
            subject,
            kind_,
            state_,
            state_text=text,
            state_hash=digest,
            expected_version=ev,
            fence=self._b._fence(fence),
            idempotency_key=key,
            ttl_ms=ttl_ms,
        )

    def get(self, subject_id: str, kind: str, principal: str | None = None) -> Checkpoint | None:
        """The current checkpoint of ``(subject_id, principal, kind)`` (``principal``
        defaults to you), or ``None`` if there is none or it expired."""
        return self._store.checkpoint_get(
            self._caller,
            _core.validate_id("subject_id", subject_id),
            _core.validate_id("kind", kind),
            _core.validate_optional_id("principal", principal),
        )

    def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id. Checkpoints are readable by every principal of the org (a
        handoff's recipient reads the one attached to it; a reviewer follows an outcome's
        ``checkpoint_id``); only their writer changes them.

        Raises:
            NotFoundError: unknown, expired, or another org's.
        """
        return self._store.checkpoint_get_by_id(
            self._caller, _core.validate_id("checkpoint_id", checkpoint_id)
        )

    def history(self, subject_id: str, kind: str, principal: str | None = None) -> list[Checkpoint]:
        """Every version of the checkpoint, oldest first."""
        return self._store.checkpoint_history(
            self._caller,
            _core.validate_id("subject_id", subject_id),
            _core.validate_id("kind", kind),
            _core.validate_optional_id("principal", principal),
        )


class HandoffAPI(_API):
    """Handoffs (``b.handoffs``): explicit transfers of a subject to another principal."""

    def create(
        self,
        to_principal: str,
        subject_id: str,
        *,
        checkpoint_id: str | None = None,
        context_id: str | None = None,
        message: str | None = None,
        lease: LeaseLike | None = None,
        idempotency_key: str | None = None,
        expires_in_seconds: int | None = None,
    ) -> Handoff:
        """Create a pending handoff to ``to_principal`` (who need not have acted yet).

        Args:
            checkpoint_id: a checkpoint of this org the recipient may then read.
            lease: a lease you hold; accepting the handoff transfers it to the recipient.
                When it is the lease block itself (``with b.lease(...) as held``), the block
                then ends cleanly once the recipient has accepted.
            expires_in_seconds: after this (1..31,622,400 s) it reads as ``expired``.

        Raises:
            NotFoundError: unknown checkpoint. LeaseLostError: the lease is not held.
            ValidationError: bad ids, a handoff to yourself.
        """
        to = _core.validate_id("to_principal", to_principal)
        subject = _core.validate_id("subject_id", subject_id)
        ck = _core.validate_optional_id("checkpoint_id", checkpoint_id)
        ctx = _core.validate_optional_id("context_id", context_id)
        msg = _core.validate_text("message", message)
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        exp_ms = None
        if expires_in_seconds is not None:
            if (
                isinstance(expires_in_seconds, bool)
                or not isinstance(expires_in_seconds, int)
                or not 1 <= expires_in_seconds <= CHECKPOINT_TTL_MAX_SECONDS
            ):
                raise ValidationError("expires_in_seconds must be a positive integer")
            exp_ms = expires_in_seconds * 1000
        proof = None
        if lease is not None:
            lease_ = _lease_of(lease)
            proof = Proof(lease_.lease_id, self._caller.principal, lease_.execution_key)
        handoff = self._store.handoff_create(
            self._caller,
            to,
            subject,
            checkpoint_id=ck,
            context_id=ctx,
            message=msg,
            lease=proof,
            expires_in_ms=exp_ms,
            idempotency_key=key,
        )
        if isinstance(lease, LeaseKeeper):
            hid = handoff.handoff_id
            lease.attach_handoff(lambda: self.get(hid).status == "accepted")
        return handoff

    def inbox(self, *, limit: int = 100) -> list[Handoff]:
        """Pending handoffs addressed to you (a sender's own inbox stays empty)."""
        return self._store.handoff_inbox(self._caller, limit=_limit(limit, 10_000))

    def get(self, handoff_id: str) -> Handoff:
        """A handoff you sent or received. Raises :class:`NotFoundError` otherwise."""
        return self._store.handoff_get(self._caller, _core.validate_id("handoff_id", handoff_id))

    def resolve(
        self,
        handoff_id: str,
        status: str,
        note: str | None = None,
        *,
        execution_key: str | None = None,
        ttl_seconds: int | None = None,
    ) -> Handoff:
        """Accept or reject a pending handoff addressed to you.

        Accepting one that carries a lease transfers the lease to you under
        ``execution_key`` (default ``handoff:<handoff_id>``) for ``ttl_seconds`` (default:
        the sender's TTL), atomically with the status change; the result's ``lease`` is it.

        Raises:
            ValidationError: ``status`` is not ``accepted``/``rejected``.
            NotFoundError: unknown, already resolved (a second resolve), or expired.
            ForbiddenError: you are not its target. LeaseLostError: the sender no longer
                holds the attached lease (the handoff stays pending; reject it).
        """
        hid = _core.validate_id("handoff_id", handoff_id)
        if status not in HANDOFF_RESOLUTIONS:
            raise ValidationError(f"status must be 'accepted' or 'rejected', got {status!r}")
        note_ = _core.validate_text("note", note)
        key = _core.validate_optional_id("execution_key", execution_key)
        ttl_ms = _core.validate_ttl(ttl_seconds) if ttl_seconds is not None else None
        redis_ = self._b._redis
        if redis_ is not None:
            from ._redis.handoffs import resolve_handoff

            return resolve_handoff(
                redis_, self._caller, hid, status, note=note_, execution_key=key, ttl_ms=ttl_ms
            )
        return self._store.handoff_resolve(
            self._caller, hid, status, note=note_, execution_key=key, ttl_ms=ttl_ms
        )


class OutcomeAPI(_API):
    """Outcomes (``b.outcomes``): completion or failure of a subject, with evidence."""

    def record(
        self,
        subject_id: str,
        status: str,
        *,
        evidence: Sequence[Evidence | dict[str, Any]],
        fence: LeaseLike | None = None,
        lease_id: str | None = None,
        handoff_id: str | None = None,
        checkpoint_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Outcome:
        """Record ``succeeded``, ``failed`` or ``cancelled`` for ``subject_id``.

        Args:
            evidence: items ``{"kind", "uri", "digest"?, "note"?}`` (at most 1,000; at
                least one for ``succeeded``).
            fence: a lease; rejected with :class:`StaleFenceError` once it is not current.

        Raises:
            ValidationError, StaleFenceError, NotFoundError (a linked id does not exist),
            IdempotencyMismatchError.
        """
        subject = _core.validate_id("subject_id", subject_id)
        if status not in OUTCOME_STATUSES:
            raise ValidationError(
                f"status must be one of {', '.join(OUTCOME_STATUSES)}, got {status!r}"
            )
        if isinstance(evidence, str | bytes | dict) or not isinstance(evidence, Sequence):
            raise ValidationError("evidence must be a list of evidence items")
        if len(evidence) > 1000:
            raise ValidationError("at most 1,000 evidence items")
        items: list[Evidence] = []
        for item in evidence:
            if isinstance(item, Evidence):
                items.append(item)
                continue
            try:
                items.append(Evidence.model_validate(item))
            except Exception as exc:
                raise ValidationError(f"bad evidence item: {exc}") from None
        if status == "succeeded" and not items:
            raise ValidationError("a succeeded outcome needs at least one evidence item")
        return self._store.outcome_record(
            self._caller,
            subject,
            status,
            evidence=items,
            fence=self._b._fence(fence),
            lease_id=_core.validate_optional_id("lease_id", lease_id),
            handoff_id=_core.validate_optional_id("handoff_id", handoff_id),
            checkpoint_id=_core.validate_optional_id("checkpoint_id", checkpoint_id),
            idempotency_key=_core.validate_optional_id("idempotency_key", idempotency_key),
        )

    def list(self, subject_id: str | None = None, *, limit: int = 1000) -> list[Outcome]:
        """Outcomes of the org, of one subject when given, oldest first by the
        ledger clock (outcomes recorded in the same millisecond come in no fixed order)."""
        return self._store.outcome_list(
            self._caller,
            _core.validate_optional_id("subject_id", subject_id),
            limit=_limit(limit, 100_000),
        )


class EventAPI(_API):
    """The event stream (``b.events``)."""

    def list(self, after_seq: int = 0, limit: int = 100, kind: str | None = None) -> list[Event]:
        """Events with ``seq > after_seq`` in commit order (``limit`` 1..1000)."""
        if (
            isinstance(after_seq, bool)
            or not isinstance(after_seq, int)
            or not 0 <= after_seq <= 2**63 - 1
        ):
            raise ValidationError("after_seq must be an integer from 0 to 2**63 - 1")
        return self._store.events_list(
            self._caller,
            after_seq=after_seq,
            limit=_limit(limit, 1000),
            kind=_core.validate_optional_id("kind", kind),
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
        ValidationError: a bad id, role, URL or ``ack``. UnavailableError: the ledger cannot
            be reached.

    Example::

        b = Baton(org="acme", principal="agent-a")
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
    ) -> None:
        s = settings or BatonSettings()
        self.settings = s
        self.caller = Caller(
            org=_core.validate_id("org", s.org if org is None else org),
            principal=_core.validate_id(
                "principal", s.principal if principal is None else principal
            ),
            role=_core.validate_role(s.role if role is None else role),
        )
        self.store = store or LedgerStore(
            ledger_url or s.ledger_url,
            receipt_retention_seconds=s.receipt_retention_seconds,
            state_max_bytes=s.state_max_bytes,
        )
        self.authority: LeaseAuthority = lease_authority or self.store
        self._owns_authority = False
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
        self.leases = LeaseAPI(self)
        self.checkpoints = CheckpointAPI(self)
        self.handoffs = HandoffAPI(self)
        self.outcomes = OutcomeAPI(self)
        self.events = EventAPI(self)

    @classmethod
    def from_settings(cls, **overrides: Any) -> Baton:
        """Build a client from ``BATON_*`` environment variables; keyword arguments
        override individual settings (``org=``, ``principal=``, ``ledger_url=`` ...)."""
        return cls(settings=BatonSettings(**overrides))

    @property
    def org(self) -> str:
        return self.caller.org

    @property
    def principal(self) -> str:
        return self.caller.principal

    @property
    def role(self) -> str:
        return self.caller.role

    def as_principal(self, principal: str, role: str = "agent") -> Baton:
        """Another identity of the same org sharing this client's ledger connections.

        Raises:
            ValidationError: ``principal`` or ``role`` is not valid (``None`` included).
        """
        _core.validate_id("principal", principal)
        _core.validate_role(role)
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
        """Delete idempotency receipts older than the retention; returns the count."""
        return self.store.prune_receipts(self.caller)

    @property
    def _redis(self) -> RedisAuthority | None:
        if getattr(self.authority, "_baton_redis", False):
            return cast("RedisAuthority", self.authority)
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
        """Close the ledger connections (and the Redis authority this client created)."""
        if self._owns_authority:
            redis_ = self._redis
            if redis_ is not None:
                redis_.close()
        self.store.close()

    def __enter__(self) -> Baton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncAPI:
    """Runs the wrapped sync API's methods on a worker thread, as coroutines."""

    def __init__(self, api: object) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._api, name)
        if not callable(fn):
            return fn  # type: ignore[no-any-return]

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

        return call


class AsyncBaton:
    """The asynchronous client: the same methods as :class:`Baton`, as coroutines
    (``await ab.leases.acquire(...)``), and ``async with ab.lease(...)``.

    Blocking database calls run on worker threads (anyio), so the event loop stays free.
    """

    def __init__(
        self,
        ledger_url: str | None = None,
        org: str | None = None,
        principal: str | None = None,
        role: str | None = None,
        *,
        settings: BatonSettings | None = None,
        sync: Baton | None = None,
        redis_url: str | None = None,
        ack: str | None = None,
    ) -> None:
        self.sync = sync or Baton(
            ledger_url, org, principal, role, settings=settings, redis_url=redis_url, ack=ack
        )
        self.leases: Any = _AsyncAPI(self.sync.leases)
        self.checkpoints: Any = _AsyncAPI(self.sync.checkpoints)
        self.handoffs: Any = _AsyncAPI(self.sync.handoffs)
        self.outcomes: Any = _AsyncAPI(self.sync.outcomes)
        self.events: Any = _AsyncAPI(self.sync.events)

    @classmethod
    def from_settings(cls, **overrides: Any) -> AsyncBaton:
        """As :meth:`Baton.from_settings`."""
        return cls(sync=Baton.from_settings(**overrides))

    @property
    def org(self) -> str:
        return self.sync.org

    @property
    def principal(self) -> str:
        return self.sync.principal

    def as_principal(self, principal: str, role: str = "agent") -> AsyncBaton:
        """Another identity of the same org sharing this client's connections."""
        return AsyncBaton(sync=self.sync.as_principal(principal, role))

    def lease(self, resource_type: str, resource_id: str, **kwargs: Any) -> LeaseKeeper:
        """As :meth:`Baton.lease`; use with ``async with``."""
        return self.sync.lease(resource_type, resource_id, **kwargs)

    async def aclose(self) -> None:
        """Close the ledger connections."""
        await anyio.to_thread.run_sync(self.sync.close)
