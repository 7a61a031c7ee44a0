"""Lease operations of the client surface (``b.leases``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Required, TypedDict

from prefect_baton._client.api_base import _API, LeaseLike, _lease_of, _limit
from prefect_baton._client.requests import (
    force_release_fields,
    keyed,
    release_by_id_fields,
    release_fields,
    renew_fields,
    resource_scope,
    transfer_fields,
)
from prefect_baton._rules import core as _core
from prefect_baton._rules.core import ReleaseRequest, RenewRequest, TransferRequest
from prefect_baton._rules.paging import decode_cursor, fetch_page
from prefect_baton._stores.protocol import AcquireRequest, Execution, LeaseAuthority
from prefect_baton._stores.queries import LeaseQuery
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Lease, LeaseInfo, Page, Receipt


class AcquireKeywords(TypedDict, total=False):
    """The keyword arguments of :meth:`LeaseAPI.acquire` (see there for each), as
    :meth:`Baton.lease <prefect_baton.Baton.lease>` passes them on: ``ttl_seconds`` (``int``,
    required), ``purpose``, ``scopes``, ``expected_version``, ``idempotency_key`` and
    ``attempt``."""

    ttl_seconds: Required[int]
    purpose: str | None
    scopes: Iterable[str]
    expected_version: int | None
    idempotency_key: str | None
    attempt: str | None


def _execution(idempotency_key: str | None, attempt: str | None) -> Execution:
    """The validated :class:`Execution` of an acquire (ValidationError: a bad key or
    attempt)."""
    return Execution(
        _core.validate_optional_id("idempotency_key", idempotency_key),
        _core.validate_optional_id("attempt", attempt),
    )


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
        attempt: str | None = None,
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
            attempt: the token of this attempt of the execution (``str``, 1..256
                characters; default ``None``, an anonymous attempt). Two attempts of one
                execution (the same key presented by two processes) never both hold the
                lease: only the attempt that acquired replays its receipt; another one gets
                ``IDEMPOTENCY_IN_FLIGHT`` while the lease is held, and once it ended or
                expired acquires afresh (a new generation, a new epoch), except once it
                was transferred: then every attempt gets ``LEASE_LOST`` (status
                ``transferred``; the execution's work went to the recipient). Retry after
                a lost response with the same token. :meth:`Baton.lease` and ``@leased`` pass one.

        Returns:
            The new :class:`Lease` (new ``lease_id``, version +1, epoch +1).

        Raises:
            ConflictError: held by another holder (the message gives only the expiry) or a
                scope overlaps. VersionConflictError: ``expected_version`` is stale.
            IdempotencyMismatchError: the key was used for a different request.
            LeaseLostError: a replay whose lease was since lost; any attempt under a key
                whose lease was transferred. ValidationError: bad input.
            IdempotencyInFlightError: another attempt of the execution holds the lease.
        """
        rt = _core.validate_id("resource_type", resource_type)
        rid = _core.validate_id("resource_id", resource_id)
        ttl_ms = _core.validate_ttl(ttl_seconds)
        purpose_ = _core.validate_text("purpose", purpose)
        scopes_ = _core.validate_scopes(scopes)
        ev = _core.validate_version("expected_version", expected_version)
        request = AcquireRequest(rt, rid, ttl_ms, scopes_, purpose_, ev)
        return self._authority.acquire(self._caller, request, _execution(idempotency_key, attempt))

    def acquire_many(
        self,
        resources: Iterable[tuple[str, str] | dict[str, Any]],
        *,
        ttl_seconds: int,
        purpose: str | None = None,
        scopes: Iterable[str] = (),
        idempotency_key: str | None = None,
        attempt: str | None = None,
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
            attempt: the attempt token for every resource (as :meth:`acquire`).

        Returns:
            The leases in the order given; a resource this execution already held, or an
            exact retry, comes back ``replayed``.

        Raises:
            The error :meth:`acquire` would raise for the first resource that is refused
            (``ConflictError``, ``VersionConflictError``, ...), its message ending
            ``(acquire_many item <index>: <type>/<id>)`` (index from 0); then nothing was
            acquired.
            ValidationError: bad input (also a resource listed twice).
        """
        from prefect_baton._stores.ledger.many import requests_of

        reqs = requests_of(resources, ttl_seconds=ttl_seconds, purpose=purpose, scopes=scopes)
        return self._authority.acquire_many(
            self._caller, reqs, _execution(idempotency_key, attempt)
        )

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
                :data:`~prefect_baton._stores.ledger.receipts.CLAIM_TIMEOUT_SECONDS`; a retry then
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
        return self._authority.renew(
            self._caller,
            RenewRequest(proof, ttl_ms, ev),
            idempotency=keyed(
                idem,
                lambda: (
                    resource_scope(lease_),
                    renew_fields(proof, ttl_seconds=ttl_seconds, expected_version=ev),
                ),
            ),
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
        to = _core.validate_principal("to_principal", to_principal)
        key = _core.validate_id("new_execution_key", new_execution_key)
        ttl_ms = _core.validate_ttl(ttl_seconds)
        ev = _core.validate_version("expected_version", expected_version)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        lease_ = _lease_of(lease)
        proof = self._proof(lease_)
        fields = transfer_fields(
            proof,
            to_principal=to,
            new_execution_key=key,
            ttl_seconds=ttl_seconds,
            expected_version=ev,
        )
        return self._authority.transfer(
            self._caller,
            TransferRequest(proof, to, key, ttl_ms, ev),
            idempotency=keyed(idem, lambda: (resource_scope(lease_), fields)),
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
        return self._authority.release(
            self._caller,
            ReleaseRequest(proof, ev),
            idempotency=keyed(
                idem,
                lambda: (resource_scope(lease_), release_fields(proof, expected_version=ev)),
            ),
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
        return self._authority.release_by_id(
            self._caller, lid, idempotency=keyed(idem, lambda: ("", release_by_id_fields(lid)))
        )

    def force_release(self, lease_id: str, *, idempotency_key: str | None = None) -> Receipt:
        """Release anyone's lease of the org; needs the ``owner`` or ``admin`` role.

        ``idempotency_key`` (``str``, 1..256 characters, optional): as for
        :meth:`release_by_id` (the receipt binds the lease id).

        Raises:
            ForbiddenError: the caller is an ``agent``. NotFoundError: not active/unknown.
            IdempotencyMismatchError, IdempotencyInFlightError: as :meth:`release_by_id`.
        """
        lid = _core.validate_id("lease_id", lease_id)
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        return self._authority.force_release(
            self._caller, lid, idempotency=keyed(idem, lambda: ("", force_release_fields(lid)))
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

        It also ends the org's pending handoffs that expired unaccepted (at most ``limit``):
        each is stored ``expired``, and the lease it carries, if still its sender's, is
        released (``lease.released`` with ``reason`` ``handoff_expired``; such a lease was
        not past its TTL, so it is not among the leases returned).

        Args:
            limit: at most this many leases per call (1..10,000), oldest expiry first.
        """
        n = _limit(limit, 10_000)
        self._authority.expire_handoffs(self._caller, limit=n)
        return self._authority.report_expired(self._caller, limit=n)

    def list(
        self,
        *,
        resource_type: str | None = None,
        owner: str | None = None,
        include_ended: bool = False,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[Lease]:
        """Your effective leases (``owner="*"`` or a name needs owner/admin), newest first.

        Args:
            resource_type: only this type. include_ended: also ended generations.
            limit: 1..10,000 rows.
            cursor: continue after the page this cursor ends (``str``, the
                ``next_cursor`` of a previous page, of the REST list or of the MCP tool).

        Returns:
            One page: a list of leases whose ``next_cursor`` is the ``cursor`` of the next
            page (``str``), or ``None`` when no lease follows.

        Raises:
            ValidationError: a bad argument, or a cursor that is not one of this list.
        """
        after = None if cursor is None else decode_cursor("leases", cursor)

        def fetch(n: int) -> Sequence[Lease]:
            query = LeaseQuery(
                resource_type=_core.validate_optional_id("resource_type", resource_type),
                owner=_core.validate_optional_id("owner", owner),
                include_ended=bool(include_ended),
                limit=n,
                after=after,
            )
            return self._authority.list_leases(self._caller, query)

        return fetch_page("leases", limit, fetch)


def fence_by_id(leases: LeaseAPI, lease_id: str, epoch: int | None = None) -> Lease:
    """The lease a fenced write presents when the writer names it by id (the CLI's
    ``--fence``, the MCP tools' ``lease_id``): the caller's lease ``lease_id``, at ``epoch``
    when given. A lease the caller can read is returned as it is, so the write itself judges
    it (as the Python API judges a :class:`Lease` passed as ``fence=``: STALE_FENCE, with a
    ``fence.rejected`` event when the lease is another principal's or no longer current).

    Args:
        leases: the caller's lease API (``b.leases``).
        lease_id: the fence's lease id (``str``).
        epoch: the fencing token presented (``int``), ``None`` for the lease's own.

    Returns:
        The :class:`Lease` to pass as ``fence=``.

    Raises:
        StaleFenceError: the lease id is unknown to the caller (unknown, another org's, or
            another principal's that the caller's role cannot read), as a write fenced by
            it is refused.
        ValidationError: a malformed lease id.
    """
    try:
        lease = leases.get(lease_id)
    except NotFoundError:
        _core.check_fence(None, lease_id=lease_id, epoch=epoch or 0, now_ms=0)
        raise  # not reached: check_fence refuses a fence it cannot find
    return lease if epoch in (None, lease.epoch) else lease.model_copy(update={"epoch": epoch})


def proof_by_id(
    leases: LeaseAPI, lease_id: str, execution_key: str | None, *, key_given: bool = True
) -> Lease:
    """The proof of holding a lease when the holder names it by id (the CLI's ``--lease-id``
    with ``--execution-key``, the REST routes' ``lease_id`` with ``execution_key`` or
    ``lease_execution_key``): the caller's lease ``lease_id`` as the authority holds it,
    with the execution key presented. A wrong key is then refused by the authority as a
    lost lease (``LEASE_LOST``), never silently corrected.

    Args:
        leases: the caller's lease API (``b.leases``).
        lease_id: the lease id (``str``).
        execution_key: the execution key presented (``str``; ``None``: a lease acquired
            without one).
        key_given: ``False`` when no key was presented at all (a REST body without the
            field): the lease keeps the key it is read with, and ``execution_key`` is not
            used.

    Returns:
        The :class:`Lease` to pass as the proof (``lease=`` of renew, transfer, release,
        handoff create).

    Raises:
        NotFoundError: unknown, another org's or another principal's lease (``NOT_FOUND``).
        ValidationError: a malformed lease id.
    """
    lease = leases.get(lease_id)
    return lease.model_copy(update={"execution_key": execution_key}) if key_given else lease
