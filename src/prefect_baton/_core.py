"""The pure decision core: input validation and the lease state machine.

No I/O and no clock: every function takes ``now_ms`` (epoch milliseconds read from the
authority) and the rows it needs, and returns a decision or raises a :class:`BatonError`.
The ledger store and the Redis scripts apply these rules; the Lua scripts mirror them and
the conformance suite holds both to the same results.

Rules come from ``DESIGN.md`` ("Leases"), which merges the seed coordination service
(seed 000/003: TTL 10..86,400 s, conflicts name only the expiry, re-acquire is not renew,
release by id of a released lease is not found) and the task-lease lifecycle (seed 004:
versions, epochs, execution keys, write scopes, proof-bearing renew/transfer/release,
durable ``no_change`` release receipts, safe-integer exhaustion).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import _scopes
from .errors import (
    ConflictError,
    ForbiddenError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)
from .models import from_ms

TTL_MIN_SECONDS = 10
TTL_MAX_SECONDS = 86_400
MAX_SAFE_INTEGER = 2**53 - 1
MAX_ID_LENGTH = 256
MAX_TEXT_LENGTH = 4096
MAX_SCOPES = 64
MAX_SCOPE_LENGTH = 1024
DEFAULT_STATE_MAX_BYTES = 1024 * 1024
ROLES = ("agent", "owner", "admin")

Status = Literal[
    "active", "released", "expired", "taken_over", "transferred", "superseded", "revoked"
]


# --------------------------------------------------------------------------- validation


def validate_id(name: str, value: object) -> str:
    """Check an identifier (org, principal, resource type/id, subject, kind, key).

    Args:
        name: the argument's name, for the message.
        value: must be a ``str`` of 1..256 characters with no control characters.

    Raises:
        ValidationError: otherwise.
    """
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise ValidationError(f"{name} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValidationError(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValidationError(f"{name} must not contain control characters")
    _check_utf8(name, value)
    return value


def _check_utf8(name: str, value: str) -> None:
    """Reject strings that are not valid Unicode text (lone surrogates, e.g. from
    undecodable command-line bytes): no database or Redis can store them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid UTF-8 text") from None


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


def validate_ttl(ttl_seconds: object, name: str = "ttl_seconds") -> int:
    """Check a lease TTL: an integer number of seconds from 10 to 86,400 (seed service rule).

    Returns the TTL in milliseconds. Floats with no fractional part are accepted; ``bool``,
    fractions, strings and out-of-range values raise :class:`ValidationError`.
    """
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise ValidationError(f"{name} must be an integer number of seconds")
    if isinstance(ttl_seconds, float) and (
        not math.isfinite(ttl_seconds) or not ttl_seconds.is_integer()
    ):
        raise ValidationError(f"{name} must be an integer number of seconds")
    ttl = int(ttl_seconds)
    if not TTL_MIN_SECONDS <= ttl <= TTL_MAX_SECONDS:
        raise ValidationError(
            f"{name} must be from {TTL_MIN_SECONDS} to {TTL_MAX_SECONDS} seconds, got {ttl}"
        )
    return ttl * 1000


def validate_version(name: str, value: object) -> int | None:
    """Check an expected version: ``None`` or an ``int`` from 0 to 2**53 - 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer")
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValidationError(f"{name} must be from 0 to {MAX_SAFE_INTEGER}")
    return value


def validate_scopes(scopes: object) -> tuple[str, ...]:
    """Check write scopes: an iterable of up to 64 glob strings of up to 1,024 characters.

    Returns them normalised, de-duplicated and sorted. A bare string is rejected (a common
    mistake: ``scopes="src/**"`` instead of ``scopes=["src/**"]``).
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
    state: object, max_bytes: int = DEFAULT_STATE_MAX_BYTES
) -> tuple[dict[str, Any], str, str]:
    """Check checkpoint state: a JSON object of at most ``max_bytes`` bytes (UTF-8).

    Returns ``(state, canonical_text, state_hash)`` where ``state_hash`` is
    ``"sha256:" + hex digest`` of the canonical JSON.
    """
    if not isinstance(state, Mapping):
        raise ValidationError(f"state must be a JSON object, got {type(state).__name__}")
    _check_keys(state)
    text = canonical_json(dict(state))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError("state is not valid UTF-8 text (lone surrogate)") from None
    if size > max_bytes:
        raise ValidationError(f"state is {size} bytes of JSON; at most {max_bytes}")
    parsed: dict[str, Any] = json.loads(text)
    return parsed, text, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_keys(value: object, depth: int = 0) -> None:
    """JSON object keys are strings: reject ``{1: ...}`` rather than silently turning it
    into ``{"1": ...}`` (two different states would then share one hash)."""
    if depth > 200:
        raise ValidationError("state is nested more than 200 levels deep")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError(f"state object keys must be strings, got {k!r}")
            _check_keys(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            _check_keys(v, depth + 1)


def request_digest(operation: str, fields: Mapping[str, object]) -> str:
    """SHA-256 hex digest of the canonical request (idempotency receipts bind it)."""
    text = canonical_json({"op": operation, **fields})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- lease rows


@dataclass(frozen=True, slots=True)
class Holding:
    """A lease generation as the core sees it (one ledger row, one Redis hash)."""

    lease_id: str
    resource_type: str
    resource_id: str
    owner: str
    execution_key: str | None
    version: int
    epoch: int
    status: Status
    acquired_at_ms: int
    expires_at_ms: int
    ttl_ms: int = 0
    scopes: tuple[str, ...] = ()
    purpose: str | None = None
    ended_at_ms: int | None = None
    ended_by: str | None = None

    def effective(self, now_ms: int) -> bool:
        """Active and not yet expired on the authority's clock."""
        return self.status == "active" and self.expires_at_ms > now_ms


@dataclass(frozen=True, slots=True)
class Proof:
    """What a caller presents to act on its lease: id, owner, execution key, version."""

    lease_id: str
    owner: str
    execution_key: str | None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of a lease decision.

    ``ended`` is the previous generation with its new terminal status (to be written back),
    ``new`` the generation to insert or update, ``action`` the transition's name for the
    history and the event stream, and ``noop`` true when nothing must be written.
    """

    action: str
    new: Holding | None = None
    ended: Holding | None = None
    receipt_status: Literal["ok", "released", "expired", "no_change"] = "ok"
    noop: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def conflict(expires_at_ms: int, what: str = "Resource", *, by: str = "principal") -> ConflictError:
    """The conflict error: says only that the resource is taken and until when (``by`` is
    ``execution`` when the holder is another execution of the caller's own principal)."""
    exp = from_ms(expires_at_ms)
    assert exp is not None
    stamp = exp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return ConflictError(f"{what} is leased by another {by} until {stamp}.", expires_at=exp)


def _check_counters(head: Holding | None, *, epoch_too: bool) -> None:
    if head is None:
        return
    if head.version >= MAX_SAFE_INTEGER or (epoch_too and head.epoch >= MAX_SAFE_INTEGER):
        raise ValidationError(
            "lease generation counters are exhausted (2**53 - 1); only release is allowed"
        )


def _check_version(current: int, expected: int | None) -> None:
    if expected is not None and expected != current:
        raise VersionConflictError(
            f"expected version {expected}, current version is {current}",
            current_version=current,
            expected_version=expected,
        )


def decide_acquire(
    head: Holding | None,
    *,
    resource_type: str,
    resource_id: str,
    principal: str,
    execution_key: str | None,
    ttl_ms: int,
    scopes: tuple[str, ...],
    purpose: str | None,
    expected_version: int | None,
    now_ms: int,
    new_lease_id: str,
    scope_conflict_expires_ms: int | None = None,
    epoch_floor: int = 0,
) -> Decision:
    """Decide an acquire or takeover of the resource whose newest generation is ``head``.

    Args:
        head: newest generation of the resource (any status), ``None`` if never leased.
        scope_conflict_expires_ms: expiry of another principal's effective lease whose scopes
            overlap ``scopes`` (computed by the store), or ``None``.
        epoch_floor: the new epoch is at least ``epoch_floor + 1`` (used after Redis data
            loss, so fencing tokens keep rising).

    Returns:
        A :class:`Decision`: ``noop`` when the same execution already holds it (``new`` is
        the current generation), else ``new`` is the generation to insert and ``ended`` the
        previous one with status ``superseded`` or ``taken_over``.

    Raises:
        ConflictError: another holder (or another execution of the same principal) holds an
            effective lease, or a scope overlaps another principal's effective lease.
        VersionConflictError: ``expected_version`` differs from the current version (0 when
            never leased).
        ValidationError: counters exhausted.
    """
    ended: Holding | None = None
    action = "acquire"
    if head is not None and head.effective(now_ms):
        same_owner = head.owner == principal
        if same_owner and execution_key is not None and head.execution_key == execution_key:
            return Decision(action="acquire", new=head, noop=True)
        if same_owner and execution_key is None and head.execution_key is None:
            ended = replace(head, status="superseded", ended_at_ms=now_ms)
            action = "supersede"
        else:
            raise conflict(head.expires_at_ms, by="execution" if same_owner else "principal")
    current_version = head.version if head is not None else 0
    _check_version(current_version, expected_version)
    if scope_conflict_expires_ms is not None:
        raise conflict(scope_conflict_expires_ms, "A write scope")
    _check_counters(head, epoch_too=True)
    if head is not None and head.status == "active" and ended is None:
        ended = replace(head, status="taken_over", ended_at_ms=now_ms)
        action = "takeover"
    epoch = max(head.epoch if head is not None else 0, epoch_floor) + 1
    new = Holding(
        lease_id=new_lease_id,
        resource_type=resource_type,
        resource_id=resource_id,
        owner=principal,
        execution_key=execution_key,
        version=current_version + 1,
        epoch=epoch,
        status="active",
        acquired_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms,
        ttl_ms=ttl_ms,
        scopes=scopes,
        purpose=purpose,
    )
    return Decision(action=action, new=new, ended=ended)


def _check_proof(row: Holding | None, proof: Proof) -> Holding:
    """Common proof check: unknown or another principal's lease is not found; a wrong
    execution key is a lost lease (the generation belongs to another execution)."""
    if row is None or row.owner != proof.owner:
        raise NotFoundError(f"lease {proof.lease_id} not found")
    if row.execution_key != proof.execution_key:
        raise LeaseLostError(f"lease {proof.lease_id} is held by another execution")
    return row


def decide_renew(
    row: Holding | None,
    proof: Proof,
    *,
    ttl_ms: int,
    expected_version: int | None,
    now_ms: int,
) -> Decision:
    """Decide a renewal: version +1, expiry = now + ttl; id, owner, key, epoch, scopes kept.

    Raises:
        NotFoundError: unknown lease id, or owned by another principal.
        LeaseLostError: the generation ended or expired (an expired lease is never silently
            re-acquired by a renew).
        VersionConflictError: ``expected_version`` differs from the lease's version.
    """
    row = _check_proof(row, proof)
    if not row.effective(now_ms):
        raise LeaseLostError(
            f"lease {row.lease_id} is no longer held ({_lost_reason(row, now_ms)})"
        )
    _check_version(row.version, expected_version)
    _check_counters(row, epoch_too=False)
    new = replace(row, version=row.version + 1, expires_at_ms=now_ms + ttl_ms, ttl_ms=ttl_ms)
    return Decision(action="renew", new=new)


def decide_transfer(
    row: Holding | None,
    proof: Proof,
    *,
    to_principal: str,
    new_execution_key: str,
    ttl_ms: int,
    expected_version: int | None,
    now_ms: int,
    new_lease_id: str,
    scope_conflict_expires_ms: int | None = None,
) -> Decision:
    """Decide a transfer: new generation for ``to_principal`` under ``new_execution_key``;
    version +1, epoch +1, scopes kept (seed 004 transfer rule).

    Raises:
        NotFoundError, LeaseLostError, VersionConflictError: as :func:`decide_renew`.
        ValidationError: the new execution key equals the current one.
        ConflictError: the kept scopes overlap another effective lease of the receiver's
            competitors.
    """
    row = _check_proof(row, proof)
    if not row.effective(now_ms):
        raise LeaseLostError(
            f"lease {row.lease_id} is no longer held ({_lost_reason(row, now_ms)})"
        )
    _check_version(row.version, expected_version)
    if new_execution_key == row.execution_key:
        raise ValidationError("transfer needs a new execution key for the receiver")
    if scope_conflict_expires_ms is not None:
        raise conflict(scope_conflict_expires_ms, "A write scope")
    _check_counters(row, epoch_too=True)
    ended = replace(row, status="transferred", ended_at_ms=now_ms)
    new = replace(
        row,
        lease_id=new_lease_id,
        owner=to_principal,
        execution_key=new_execution_key,
        version=row.version + 1,
        epoch=row.epoch + 1,
        acquired_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms,
        ttl_ms=ttl_ms,
        status="active",
        ended_at_ms=None,
        ended_by=None,
    )
    return Decision(action="transfer", new=new, ended=ended)


def decide_release(
    row: Holding | None,
    proof: Proof,
    *,
    expected_version: int | None,
    now_ms: int,
) -> Decision:
    """Decide a release by proof (seed 004 release rule, with DESIGN.md's receipts).

    - effective lease: ``released``;
    - own lease past expiry that nobody took: cleaned up, receipt status ``expired``;
    - already released by the same proof: durable ``no_change``;
    - superseded by the holder's own re-acquire: :class:`NotFoundError` (seed service: the
      old id is not found);
    - taken over, transferred or revoked: :class:`LeaseLostError`.

    Version and epoch are kept. Raises :class:`NotFoundError` for an unknown or foreign
    lease and :class:`VersionConflictError` for a wrong ``expected_version``.
    """
    row = _check_proof(row, proof)
    _check_version(row.version, expected_version)
    if row.status in ("released", "expired"):
        return Decision(action="release", new=row, receipt_status="no_change", noop=True)
    if row.status == "superseded":
        # Re-acquire is not renew: the old id is then not found (seed service rule).
        raise NotFoundError(f"lease {row.lease_id} not found")
    if row.status != "active":
        raise LeaseLostError(f"lease {row.lease_id} is no longer held ({row.status})")
    return _end_by_holder(row, now_ms, action="release")


def _end_by_holder(row: Holding, now_ms: int, *, action: str) -> Decision:
    if row.expires_at_ms > now_ms:
        ended = replace(row, status="released", ended_at_ms=now_ms)
        return Decision(action=action, new=ended, receipt_status="released")
    ended = replace(row, status="expired", ended_at_ms=now_ms)
    return Decision(action=action, new=ended, receipt_status="expired")


def decide_release_by_id(
    row: Holding | None, *, principal: str, lease_id: str, now_ms: int
) -> Decision:
    """Decide a release by lease id alone (the seed service's ``DELETE /v1/leases/:id``).

    Only the owner may release this way; a lease that is released, unknown, another
    principal's or in another org is not found (seed service rule).
    """
    if row is None or row.owner != principal or row.status != "active":
        raise NotFoundError(f"lease {lease_id} not found")
    return _end_by_holder(row, now_ms, action="release")


def decide_force_release(
    row: Holding | None, *, principal: str, role: str, lease_id: str, now_ms: int
) -> Decision:
    """Decide a force release: only an ``owner`` or ``admin`` of the org; the lease ends as
    ``revoked`` with who forced it. A lease that is not active is not found."""
    if role not in ("owner", "admin"):
        raise ForbiddenError("force release needs the owner or admin role")
    if row is None or row.status != "active":
        raise NotFoundError(f"lease {lease_id} not found")
    ended = replace(row, status="revoked", ended_at_ms=now_ms, ended_by=principal)
    return Decision(action="force_release", new=ended, receipt_status="released")


def check_fence(
    row: Holding | None,
    *,
    lease_id: str,
    epoch: int,
    now_ms: int,
    principal: str | None = None,
) -> Holding:
    """Check a write fenced by a lease: the generation must still be the effective one, and
    (when ``principal`` is given) held by the writer: a write is fenced by *its own* lease.

    Raises:
        StaleFenceError: the lease is unknown, another principal's, ended, expired, or its
            epoch is not the one presented.
    """
    if row is None or (principal is not None and row.owner != principal):
        raise StaleFenceError(f"fence lease {lease_id} is not a current lease of the writer")
    if row.epoch != epoch or not row.effective(now_ms):
        raise StaleFenceError(
            f"fence lease {lease_id} (epoch {epoch}) is no longer the effective lease of "
            f"{row.resource_type}/{row.resource_id}"
        )
    return row


def _lost_reason(row: Holding, now_ms: int) -> str:
    if row.status == "active" and row.expires_at_ms <= now_ms:
        return "expired"
    return row.status


def replay_check(
    row: Holding | None,
    *,
    lease_id: str,
    owner: str,
    execution_key: str | None,
    epoch: int,
    now_ms: int,
) -> Holding:
    """Check that a replayed acquire's lease is still held by the same execution.

    A receipt is history, not authority: a replay whose lease was since transferred,
    released or expired does not revive it (seed 004 replay rule).

    Raises:
        LeaseLostError: the generation is no longer effective.
    """
    if (
        row is None
        or row.owner != owner
        or row.execution_key != execution_key
        or row.epoch != epoch
        or not row.effective(now_ms)
    ):
        why = "gone" if row is None else _lost_reason(row, now_ms)
        raise LeaseLostError(
            f"lease {lease_id} acquired under this execution key is no longer held ({why}); "
            "a replayed receipt does not revive it: use a new execution key"
        )
    return row


def check_checkpoint_version(current: int, expected: int | None) -> None:
    """Compare-and-swap on a checkpoint: ``expected`` must equal ``current`` (0 if none)."""
    _check_version(current, expected)
