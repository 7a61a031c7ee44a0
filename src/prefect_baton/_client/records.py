"""Checkpoints, handoffs, outcomes and the event stream of the client surface."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from prefect_baton._client.api_base import (
    _API,
    HANDOFF_RESOLUTIONS,
    OUTCOME_STATUSES,
    LeaseLike,
)
from prefect_baton._client.keeper import LeaseKeeper
from prefect_baton._client.requests import keyed, resolve_fields
from prefect_baton._rules import core as _core
from prefect_baton._rules.events import validate_event_kind, validate_resource_filter
from prefect_baton._rules.handoffs import listing_status, validate_status_filter
from prefect_baton._rules.paging import (
    decode_cursor,
    events_after,
    fetch_page,
    history_page_cap,
)
from prefect_baton._rules.validation import validate_evidence, validate_lifetime
from prefect_baton._stores.protocol import (
    CheckpointWrite,
    HandoffOffer,
    OutcomeWrite,
    ResolveRequest,
)
from prefect_baton._stores.queries import EventQuery, HandoffQuery, HistoryQuery, OutcomeQuery
from prefect_baton.errors import ValidationError, from_pydantic
from prefect_baton.models import Checkpoint, Event, Evidence, Handoff, Outcome, Page


class CheckpointAPI(_API):
    """Checkpoints (``b.checkpoints``): resumable progress per (subject, principal, kind)."""

    @property
    def state_max_bytes(self) -> int:
        """The largest state the store takes (``int``, bytes of canonical JSON)."""
        return self._b._records.state_max_bytes

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
        ttl_ms = validate_lifetime(ttl_seconds, "checkpoint ttl_seconds")
        write = CheckpointWrite(
            subject, kind_, state_, text, digest, ev, self._b._fence(fence), ttl_ms
        )
        return self._store.checkpoint_save(self._caller, write, idempotency_key=key)

    def get(self, subject_id: str, kind: str, principal: str | None = None) -> Checkpoint | None:
        """The current checkpoint of ``(subject_id, principal, kind)`` (``principal``
        defaults to you), or ``None`` if there is none, it expired, or you may not read it
        (see :meth:`get_by_id`: a recipient reads it only while the handoff carrying it is
        pending or accepted)."""
        return self._store.checkpoint_get(
            self._caller,
            _core.validate_id("subject_id", subject_id),
            _core.validate_id("kind", kind),
            _core.validate_optional_id("principal", principal),
        )

    def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id. Who may read a checkpoint (DESIGN.md "Checkpoints"): its
        writer, the recipient of a handoff that carries it while that handoff is pending or
        accepted (not once it is rejected or expired: past its expiry, or its carried lease
        ended), and ``owner``/``admin``; only its writer changes it.

        Args:
            checkpoint_id: the checkpoint's id (``str``).

        Raises:
            NotFoundError: unknown, expired, another org's, or one you may not read.
        """
        return self._store.checkpoint_get_by_id(
            self._caller, _core.validate_id("checkpoint_id", checkpoint_id)
        )

    def delete(self, checkpoint_id: str, *, idempotency_key: str | None = None) -> Checkpoint:
        """Delete your checkpoint ``checkpoint_id`` (the seed service's ``DELETE``): it
        then reads as absent (as one past its TTL), its history stays readable, a later
        save of the same subject and kind continues its versions, and
        ``checkpoint.deleted`` is recorded.

        Returns:
            The checkpoint as deleted (``expires_at``: when).

        Raises:
            NotFoundError: unknown, already deleted or expired, or another org's.
            ForbiddenError: not yours (only the writer deletes, whatever the role).
            ConflictError: a pending handoff carries it (its recipient was promised it):
                delete it once that handoff is resolved or has expired.
            IdempotencyMismatchError: the key was used for another request.
        """
        return self._store.checkpoint_delete(
            self._caller,
            _core.validate_id("checkpoint_id", checkpoint_id),
            idempotency_key=_core.validate_optional_id("idempotency_key", idempotency_key),
        )

    def history(
        self,
        subject_id: str,
        kind: str,
        principal: str | None = None,
        *,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[Checkpoint]:
        """The versions of the checkpoint of ``(subject_id, principal, kind)``
        (``principal`` defaults to you), oldest first, one page at a time (empty when there
        is none or you may not read it, see :meth:`get_by_id`).

        Args:
            limit: 1..100 versions. Each holds its whole state, up to
                :attr:`state_max_bytes`, so a page holds at most 16 MiB of states' worth of
                versions (:func:`~prefect_baton._rules.paging.history_page_cap`: 16 with
                the default 1 MiB states); a larger ``limit`` gets a page that short, whose
                ``next_cursor`` goes on.
            cursor: continue after the page this cursor ends (``str``, as
                :meth:`prefect_baton.Baton.leases` ``list`` takes it).

        Returns:
            One page: a list of checkpoints whose ``next_cursor`` is the ``cursor`` of the
            next page (``str``), or ``None`` when no version follows.

        Raises:
            ValidationError: bad ids, a bad limit, or a cursor that is not one of this
                list.
        """
        query = HistoryQuery(
            _core.validate_id("subject_id", subject_id),
            _core.validate_id("kind", kind),
            _core.validate_optional_id("principal", principal),
            after=None if cursor is None else decode_cursor("checkpoints", cursor),
        )
        return fetch_page(
            "checkpoints",
            limit,
            lambda n: self._store.checkpoint_history(self._caller, replace(query, limit=n)),
            cap=history_page_cap(self.state_max_bytes),
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
        parameters: dict[str, Any] | None = None,
    ) -> Handoff:
        """Create a pending handoff to ``to_principal`` (who need not have acted yet).

        Args:
            checkpoint_id: a checkpoint you may read (else ``NotFoundError``); the
                recipient may then read it too.
            lease: a lease you hold; accepting the handoff transfers it to the recipient.
                When it is the lease block itself (``with b.lease(...) as held``), the
                block gives its lease to the handoff (:meth:`LeaseKeeper.attach_handoff
                <prefect_baton._client.keeper.LeaseKeeper.attach_handoff>`): its exit does
                not release it but leaves it held, unrenewed, for the recipient to accept
                (choose a TTL longer than the recipient takes), and ends cleanly
                (``held.receipt_status == "handed_off"``), also after the recipient
                accepted, rejected it or it expired (both release the lease). A create
                that fails leaves the block as it was.
            expires_in_seconds: after this (1..31,622,400 s) it reads as ``expired``.
            parameters: parameters for the recipient's run (a JSON object of at most the
                checkpoint state size, 1 MiB), kept with the handoff as ``parameters``;
                ``flows/dispatch_handoffs.py`` starts the recipient's deployment with them.

        Raises:
            NotFoundError: the checkpoint is unknown, deleted or expired. LeaseLostError: the
                lease is not held.
            ValidationError: bad ids, a handoff to yourself.
        """
        to = _core.validate_principal("to_principal", to_principal)
        subject = _core.validate_id("subject_id", subject_id)
        ck = _core.validate_optional_id("checkpoint_id", checkpoint_id)
        ctx = _core.validate_optional_id("context_id", context_id)
        msg = _core.validate_text("message", message)
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        exp_ms = validate_lifetime(expires_in_seconds, "expires_in_seconds")
        params = (
            None if parameters is None else _core.validate_state(parameters, name="parameters")[0]
        )
        proof = None if lease is None else self._proof(lease)
        fence = None if lease is None else self._b._fence(lease)
        offer = HandoffOffer(to, subject, ck, ctx, msg, proof, exp_ms, params, fence)
        handoff = self._store.handoff_create(self._caller, offer, idempotency_key=key)
        if isinstance(lease, LeaseKeeper):
            hid = handoff.handoff_id
            # accepted: the lease moved on; rejected or expired: its end released it
            # (_rules.handoffs.releases_carried). Either way the sender's block ends cleanly.
            lease.attach_handoff(
                handoff, lambda: self.get(hid).status in ("accepted", "rejected", "expired")
            )
        return handoff

    def inbox(self, *, limit: int = 100, cursor: str | None = None) -> Page[Handoff]:
        """Pending handoffs addressed to you (a sender's own inbox stays empty), oldest
        first.

        Args:
            limit: 1..10,000 handoffs.
            cursor: continue after the page this cursor ends (``str``, as
                :meth:`prefect_baton.Baton.leases` ``list`` takes it).

        Returns:
            One page: a list of handoffs whose ``next_cursor`` is the ``cursor`` of the
            next page (``str``), or ``None`` when no handoff follows.

        Raises:
            ValidationError: a bad limit, or a cursor that is not one of the inbox.
        """
        after = None if cursor is None else decode_cursor("handoffs", cursor)
        return fetch_page(
            "handoffs",
            limit,
            lambda n: self._store.handoff_inbox(self._caller, limit=n, after=after),
        )

    def list(
        self,
        *,
        party: str | None = None,
        status: str = "pending",
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[Handoff]:
        """Handoffs of your organization, oldest first (by creation time, then id).

        Args:
            party: whose handoffs (``str``): ``None`` (yours: those you sent or received),
                a principal id (those it sent or received) or ``"*"`` (everyone's in the
                organization). Another principal's or everyone's needs the ``owner`` or
                ``admin`` role, as listing another's leases does
                (:func:`prefect_baton._rules.access.check_list_owner`).
            status: only handoffs that read as this status: ``"pending"`` (default),
                ``"accepted"``, ``"rejected"``, ``"expired"`` (a pending one past its
                expiry, or whose carried lease ended, reads ``expired``) or ``"any"``.
            limit: 1..10,000 handoffs.
            cursor: continue after the page this cursor ends (``str``, as :meth:`inbox`
                takes it; the two lists share their order and cursors).

        Returns:
            One page, as :meth:`inbox` returns it. An accepted handoff that carried a lease
            has its ``lease`` set as :meth:`get` gives it (:class:`~prefect_baton.Handoff`).

        Raises:
            ValidationError: a bad party, status or limit (``VALIDATION_ERROR``), or a
                cursor that is not one of the handoff lists.
            ForbiddenError: another principal's or everyone's handoffs asked with the
                ``agent`` role (``FORBIDDEN``).
        """

        def fetch(n: int) -> Sequence[Handoff]:
            query = HandoffQuery(
                party=_core.validate_optional_id("party", party),
                status=validate_status_filter(status),
                limit=n,
                after=None if cursor is None else decode_cursor("handoffs", cursor),
            )
            return self._store.handoff_list(self._caller, query)

        return fetch_page("handoffs", limit, fetch)

    def get(self, handoff_id: str) -> Handoff:
        """A handoff you sent or received. Raises :class:`NotFoundError` otherwise.

        An accepted handoff that carried a lease has ``lease`` set for its recipient (and an
        ``owner``/``admin``): the generation the acceptance gave, as it stands now
        (:class:`~prefect_baton.Handoff`); the sender reads ``None``.

        The first read of a pending handoff past its expiry ends it (stored ``expired``):
        the lease it carries, if still the sender's, is released then, and this result's
        ``released_lease`` is that lease (``_rules.handoffs.decide_handoff_expiry``)."""
        hid = _core.validate_id("handoff_id", handoff_id)
        h = self._store.handoff_get(self._caller, hid)
        if h.status != "expired" or h.resolved_at is not None:
            return h  # not expired, or stored expired already (by whoever read it first)
        released = self._b.authority.expire_handoffs(self._caller, handoff_id=hid)
        h = self._store.handoff_get(self._caller, hid)
        return h.model_copy(update={"released_lease": released[0]}) if released else h

    def resolve(
        self,
        handoff_id: str,
        status: str,
        note: str | None = None,
        *,
        execution_key: str | None = None,
        ttl_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> Handoff:
        """Accept or reject a pending handoff addressed to you.

        Accepting one that carries a lease transfers the lease to you under
        ``execution_key`` (default ``handoff:<handoff_id>``) for ``ttl_seconds`` (default:
        the sender's TTL), atomically with the status change; the result's ``lease`` is it.

        ``idempotency_key`` (``str``, 1..256 characters, optional): an exact retry returns
        the stored :class:`Handoff` with ``replayed`` true and changes nothing; the receipt
        is kept per (org, principal, ``resolve``, key, handoff id). A claim whose process
        died before storing the result lapses after
        :data:`~prefect_baton._stores.ledger.receipts.CLAIM_TIMEOUT_SECONDS`; a retry then
        replays the handoff if it reads as this request resolved it (same status and note;
        an accepted carried lease under this execution key), else resolves again, which is
        ``NOT_FOUND``.

        Raises:
            ValidationError: ``status`` is not ``accepted``/``rejected``.
            NotFoundError: unknown, already resolved (a second resolve), or expired (its
                own expiry passed, or the lease it carries is no longer in effect: ran out,
                released, transferred, superseded, force-released or taken over).
            ValidationError: you are not its target ("Only the target principal can
                resolve a handoff.", as the seed service answers).
            LeaseLostError: the sender's attached lease ended in the instant of acceptance
                (the handoff then reads ``expired``).
            IdempotencyMismatchError: the key was used for a different request (nothing
                done). IdempotencyInFlightError: a request under the key is still running.
        """
        hid = _core.validate_id("handoff_id", handoff_id)
        if status not in HANDOFF_RESOLUTIONS:
            raise ValidationError(f"status must be 'accepted' or 'rejected', got {status!r}")
        note_ = _core.validate_text("note", note)
        key = _core.validate_optional_id("execution_key", execution_key)
        ttl_ms = _core.validate_ttl(ttl_seconds) if ttl_seconds is not None else None
        idem = _core.validate_optional_id("idempotency_key", idempotency_key)
        fields = resolve_fields(hid, status, note=note_, execution_key=key, ttl_seconds=ttl_seconds)
        return self._b.authority.handoff_resolve(
            self._caller,
            ResolveRequest(hid, status, note_, key, ttl_ms),
            idempotency=keyed(idem, lambda: (f"handoff:{hid}", fields)),
        )


def handoff_listing(
    handoffs: HandoffAPI,
    party: str | None,
    status: str | None,
    *,
    limit: int,
    cursor: str | None,
) -> Page[Handoff]:
    """The handoff listing every surface gives (``baton handoff inbox``/``list``,
    ``GET /v1/handoffs``, ``baton_handoff_inbox``), as
    :func:`prefect_baton._rules.handoffs.listing_status` decides it: without ``party`` the
    caller's inbox (:meth:`HandoffAPI.inbox`), else the handoffs ``party`` (a principal, or
    ``"*"``: everyone's) sent or received of ``status`` (``None``: ``"pending"``), by
    :meth:`HandoffAPI.list`. One page of ``limit`` (1..10,000) after ``cursor``.

    Raises:
        ValidationError: ``status`` without ``party`` (``VALIDATION_ERROR``, the message
            :data:`prefect_baton._rules.handoffs.STATUS_NEEDS_PARTY`), or a bad party,
            status, limit or cursor.
        ForbiddenError: another principal's or everyone's handoffs asked with the ``agent``
            role.
    """
    wanted = listing_status(party, status)
    if wanted is None:
        return handoffs.inbox(limit=limit, cursor=cursor)
    return handoffs.list(party=party, status=wanted, limit=limit, cursor=cursor)


class OutcomeAPI(_API):
    """Outcomes (``b.outcomes``): completion or failure of a subject, with evidence."""

    def record(
        self,
        subject_id: str,
        status: str,
        *,
        evidence: Sequence[Evidence | dict[str, Any]] = (),
        fence: LeaseLike | None = None,
        lease_id: str | None = None,
        handoff_id: str | None = None,
        checkpoint_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Outcome:
        """Record ``succeeded``, ``failed`` or ``cancelled`` for ``subject_id``.

        Args:
            evidence: items ``{"kind", "uri", "digest"?, "note"?}`` (at most 1,000; at
                least one for ``succeeded``; default none): ``kind`` an id (1 to 256
                characters, no control characters), ``uri`` (at most 4,096 characters),
                ``digest`` (512) and ``note`` (4,096) text without NUL
                (``_rules.validation.validate_evidence``).
            fence: a lease; rejected with :class:`StaleFenceError` once it is not current.

        Raises:
            ValidationError: bad input, or a ``lease_id`` that is not the fence's lease
            (``_rules.outcomes.outcome_lease``: an outcome is recorded under one lease
            generation). StaleFenceError, NotFoundError (a linked id does not exist,
            or the caller may not read it: an agent links only its own lease generations,
            the handoffs it sent or received and the checkpoints it may read;
            ``_rules.access.check_outcome_link``), IdempotencyMismatchError.
            ConflictError: a ``succeeded`` outcome of this subject under the same lease
            generation (``lease_id`` or the fence's) exists already
            (``_rules.outcomes.check_outcome``); nothing is written.
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
            try:
                ev = item if isinstance(item, Evidence) else Evidence.model_validate(item)
            except PydanticValidationError as exc:
                raise from_pydantic(exc, "bad evidence item: ", root="item") from None
            validate_evidence(ev.kind, ev.uri, ev.digest, ev.note)
            items.append(ev)
        if status == "succeeded" and not items:
            raise ValidationError("a succeeded outcome needs at least one evidence item")
        record = OutcomeWrite(
            subject,
            status,
            items,
            self._b._fence(fence),
            lease_id=_core.validate_optional_id("lease_id", lease_id),
            handoff_id=_core.validate_optional_id("handoff_id", handoff_id),
            checkpoint_id=_core.validate_optional_id("checkpoint_id", checkpoint_id),
            ledger_authority=self._b.authority is self._b._stores.store,
        )
        key = _core.validate_optional_id("idempotency_key", idempotency_key)
        return self._store.outcome_record(self._caller, record, idempotency_key=key)

    def list(
        self, subject_id: str | None = None, *, limit: int = 1000, cursor: str | None = None
    ) -> Page[Outcome]:
        """Outcomes of the org, of one subject when given, oldest first by the ledger
        clock, then by outcome id.

        Args:
            subject_id: only this subject's outcomes (``str`` id), or ``None`` (all).
            limit: 1..100,000 outcomes.
            cursor: continue after the page this cursor ends (``str``: the
                ``next_cursor`` of a previous page, of the REST list, MCP tool or CLI
                receipt); give the same ``subject_id`` again.

        Returns:
            One page: a list of outcomes whose ``next_cursor`` is the ``cursor`` of the
            next page (``str``), or ``None`` when no outcome follows.

        Raises:
            ValidationError: a bad subject id or limit, or a cursor that is not one of the
                outcome list.
        """
        return fetch_page(
            "outcomes",
            limit,
            lambda n: self._store.outcome_list(
                self._caller,
                OutcomeQuery(
                    subject_id=_core.validate_optional_id("subject_id", subject_id),
                    limit=n,
                    after=None if cursor is None else decode_cursor("outcomes", cursor),
                ),
            ),
        )


class EventAPI(_API):
    """The event stream (``b.events``)."""

    def list(
        self,
        after_seq: int | None = None,
        limit: int = 100,
        kind: str | None = None,
        resource_type: str | None = None,
        resource_id: str | None = None,
        subject: str | None = None,
        *,
        cursor: str | None = None,
    ) -> Page[Event]:
        """Events with ``seq > after_seq`` in commit order (``limit`` 1..1000), every role
        alike; each filter given narrows the list:

        * ``kind`` (``str``, one of :data:`~prefect_baton._rules.events.EVENT_KINDS`): one
          kind;
        * ``resource_type`` and ``resource_id`` (``str`` ids as for ``leases.acquire``, given
          together): the events of that resource's leases: its ``lease.*`` and
          ``fence.rejected`` events, and the ``handoff.*`` events of the handoffs that
          carried one of its leases (checkpoint and outcome events, and handoffs without a
          lease, name a subject, not a resource: filter them by ``subject``). A lease
          transition is listed here once the ledger has it (on Redis: once drained);
        * ``subject`` (``str`` id): the events whose ``subject`` is exactly this (the
          ``subject_id`` of a checkpoint, handoff or outcome; a lease event's subject is
          ``<resource_type>/<resource_id>``).

        ``after_seq`` (``int`` >= 0) and ``cursor`` (``str``, the ``next_cursor`` of a
        previous page) are alternatives; with neither the list starts at the beginning.
        Page on with ``cursor=page.next_cursor`` (or ``after_seq`` set to the last ``seq``
        returned), with the same filters.

        Returns:
            One page: a list of events whose ``next_cursor`` is the ``cursor`` of the next
            page (``str``), or ``None`` when no event follows.

        Raises:
            ValidationError: a bad ``after_seq``, ``limit`` or cursor, both ``after_seq``
                and ``cursor`` given, an unknown ``kind``, only one of
                ``resource_type``/``resource_id``, or a bad id.
        """
        start = events_after(after_seq, cursor, name="after_seq")

        def fetch(n: int) -> Sequence[Event]:
            query = EventQuery(
                after_seq=start,
                limit=n,
                kind=validate_event_kind(kind),
                resource=validate_resource_filter(resource_type, resource_id),
                subject=_core.validate_optional_id("subject", subject),
            )
            return self._store.events_list(self._caller, query)

        return fetch_page("events", limit, fetch)
