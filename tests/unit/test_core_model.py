"""The lease decision core (``prefect_baton._rules.core`` and ``prefect_baton._rules.transitions``)
against a simple reference model.

A hypothesis state machine drives the pure decision functions with an injected clock over a
few resources, principals and execution keys. Each decision is applied to an in-memory table
of :class:`Generation` rows the way the SQL store's ``_apply`` writes them, and every outcome
(success, or which error) is compared with a separate, deliberately plain model of the rules
in DESIGN.md ("Leases").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import text

from prefect_baton._rules import core as _core
from prefect_baton._rules import scopes as _scopes
from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.core import Decision, Generation, Proof
from prefect_baton._stores.ledger.store import LedgerStore
from prefect_baton._stores.protocol import Caller, Execution
from prefect_baton.errors import (
    BatonError,
    ConflictError,
    ForbiddenError,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
    ValidationError,
    VersionConflictError,
)
from prefect_baton.models import from_ms

RESOURCES = ("r1", "r2")
PRINCIPALS = ("alice", "bob", "carol")
KEYS = (None, "k1", "k2")
TRANSFER_KEYS = ("k1", "k2", "k3", "t-new")
SCOPE_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("src/**",),
    ("src/app/*.py",),
    ("docs/**",),
    ("src/*.md",),
)
PURPOSES = (None, "purpose-zeta", "purpose-omega")
TTLS_S = (10, 30, 300)
T0 = 1_700_000_000_000
UNKNOWN_ID = "L-never-issued"

# Scope pairs (other than a scope with itself) that the model knows to overlap; written by
# hand so the model does not depend on the glob code under test.
_MODEL_OVERLAPS = {
    frozenset({"src/**", "src/app/*.py"}),
    frozenset({"src/**", "src/*.md"}),
}


def model_scopes_overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return any(x == y or frozenset({x, y}) in _MODEL_OVERLAPS for x in a for y in b)


# --------------------------------------------------------------------------- the applier


def apply_decision(rows: dict[str, Generation], d: Decision) -> None:
    """Write a decision into ``rows`` as ``LedgerStore._apply`` writes it to SQL."""
    if d.noop:
        return
    if d.ended is not None:
        e = d.ended
        old = rows[e.lease_id]
        rows[e.lease_id] = replace(
            old, status=e.status, ended_at_ms=e.ended_at_ms, ended_by=e.ended_by
        )
    n = d.new
    if n is None:
        return
    existing = rows.get(n.lease_id)
    if existing is None:
        rows[n.lease_id] = n
    else:
        rows[n.lease_id] = replace(
            existing,
            version=n.version,
            expires_at_ms=n.expires_at_ms,
            ttl_ms=n.ttl_ms,
            status=n.status,
            ended_at_ms=n.ended_at_ms,
            ended_by=n.ended_by,
        )


def head_of(rows: dict[str, Generation], resource: str) -> Generation | None:
    """Newest generation (highest epoch) of ``resource``, as ``LedgerStore._head``."""
    mine = [h for h in rows.values() if h.resource_id == resource]
    return max(mine, key=lambda h: h.epoch) if mine else None


def scope_conflict(
    rows: dict[str, Generation], principal: str, scopes: tuple[str, ...], resource: str, now: int
) -> int | None:
    """Expiry of another principal's effective overlapping lease, as the store computes it."""
    if not scopes:
        return None
    for h in rows.values():
        if h.resource_id == resource or h.owner == principal or not h.effective(now):
            continue
        if h.scopes and _scopes.sets_overlap(scopes, h.scopes):
            return h.expires_at_ms
    return None


# --------------------------------------------------------------------------- the model


@dataclass
class MLease:
    lease_id: str
    resource: str
    owner: str
    key: str | None
    version: int
    epoch: int
    expires: int
    status: str
    scopes: tuple[str, ...]
    purpose: str | None

    def live(self, now: int) -> bool:
        return self.status == "active" and self.expires > now


@dataclass
class MResource:
    version: int = 0
    epoch: int = 0
    current: str | None = None


@dataclass(frozen=True)
class Ok:
    """A predicted success: the lease as it must look afterwards, and the transition."""

    lease: MLease
    action: str
    receipt: str = "ok"
    noop: bool = False


Prediction = Ok | type[BatonError]


class Model:
    """Plain reference rules, one resource record and one record per lease id."""

    def __init__(self) -> None:
        self.leases: dict[str, MLease] = {}
        self.resources: dict[str, MResource] = {r: MResource() for r in RESOURCES}

    def current(self, resource: str) -> MLease | None:
        cur = self.resources[resource].current
        return self.leases[cur] if cur else None

    def scope_blockers(
        self, principal: str, scopes: tuple[str, ...], resource: str, now: int
    ) -> set[int]:
        return {
            m.expires
            for m in self.leases.values()
            if m.live(now)
            and m.owner != principal
            and m.resource != resource
            and model_scopes_overlap(scopes, m.scopes)
        }

    def _new(self, res: MResource, m: MLease) -> None:
        old = self.current(m.resource)
        assert old is None or old.status != "active"
        self.leases[m.lease_id] = m
        res.current = m.lease_id
        res.version = m.version
        res.epoch = m.epoch

    def acquire(
        self,
        *,
        resource: str,
        principal: str,
        key: str | None,
        ttl_ms: int,
        scopes: tuple[str, ...],
        purpose: str | None,
        expected: int | None,
        floor: int,
        now: int,
        new_id: str,
    ) -> Prediction:
        res = self.resources[resource]
        cur = self.current(resource)
        action = "acquire"
        if cur is not None and cur.live(now):
            if cur.owner == principal and key is not None and cur.key == key:
                return Ok(cur, "acquire", noop=True)
            if cur.owner == principal and key is None and cur.key is None:
                action = "supersede"
            else:
                return ConflictError
        if expected is not None and expected != res.version:
            return VersionConflictError
        if self.scope_blockers(principal, scopes, resource, now):
            return ConflictError
        if cur is not None and cur.status == "active":
            if action == "acquire":
                action = "takeover"
                cur.status = "taken_over"
            else:
                cur.status = "superseded"
        m = MLease(
            lease_id=new_id,
            resource=resource,
            owner=principal,
            key=key,
            version=res.version + 1,
            epoch=max(res.epoch, floor) + 1,
            expires=now + ttl_ms,
            status="active",
            scopes=scopes,
            purpose=purpose,
        )
        self._new(res, m)
        return Ok(m, action)

    def _proof(self, lease_id: str, owner: str, key: str | None) -> MLease | type[BatonError]:
        m = self.leases.get(lease_id)
        if m is None or m.owner != owner:
            return NotFoundError
        if m.key != key:
            return LeaseLostError
        return m

    def renew(
        self,
        lease_id: str,
        owner: str,
        key: str | None,
        *,
        ttl_ms: int,
        expected: int | None,
        now: int,
    ) -> Prediction:
        m = self._proof(lease_id, owner, key)
        if not isinstance(m, MLease):
            return m
        if not m.live(now):
            return LeaseLostError
        if expected is not None and expected != m.version:
            return VersionConflictError
        m.version += 1
        m.expires = now + ttl_ms
        self.resources[m.resource].version = m.version
        return Ok(m, "renew")

    def transfer(
        self,
        lease_id: str,
        owner: str,
        key: str | None,
        *,
        to: str,
        new_key: str,
        ttl_ms: int,
        expected: int | None,
        now: int,
        new_id: str,
    ) -> Prediction:
        m = self._proof(lease_id, owner, key)
        if not isinstance(m, MLease):
            return m
        if not m.live(now):
            return LeaseLostError
        if expected is not None and expected != m.version:
            return VersionConflictError
        if new_key == m.key:
            return ValidationError
        if self.scope_blockers(to, m.scopes, m.resource, now):
            return ConflictError
        m.status = "transferred"
        res = self.resources[m.resource]
        n = MLease(
            lease_id=new_id,
            resource=m.resource,
            owner=to,
            key=new_key,
            version=m.version + 1,
            epoch=m.epoch + 1,
            expires=now + ttl_ms,
            status="active",
            scopes=m.scopes,
            purpose=m.purpose,
        )
        self._new(res, n)
        return Ok(n, "transfer")

    @staticmethod
    def _end(m: MLease, now: int, action: str) -> Ok:
        if m.expires > now:
            m.status = "released"
            return Ok(m, action, receipt="released")
        m.status = "expired"
        return Ok(m, action, receipt="expired")

    def release(
        self, lease_id: str, owner: str, key: str | None, *, expected: int | None, now: int
    ) -> Prediction:
        m = self._proof(lease_id, owner, key)
        if not isinstance(m, MLease):
            return m
        if expected is not None and expected != m.version:
            return VersionConflictError
        if m.status in ("released", "expired"):
            return Ok(m, "release", receipt="no_change", noop=True)
        if m.status == "superseded":
            return NotFoundError
        if m.status != "active":
            return LeaseLostError
        return self._end(m, now, "release")

    def release_by_id(self, lease_id: str, principal: str, now: int) -> Prediction:
        m = self.leases.get(lease_id)
        if m is None or m.owner != principal or m.status != "active":
            return NotFoundError
        return self._end(m, now, "release")

    def force_release(self, lease_id: str, role: str) -> Prediction:
        if role == "agent":
            return ForbiddenError
        m = self.leases.get(lease_id)
        if m is None or m.status != "active":
            return NotFoundError
        m.status = "revoked"
        return Ok(m, "force_release", receipt="released")

    def fence_ok(self, lease_id: str, epoch: int, now: int) -> bool:
        m = self.leases.get(lease_id)
        return m is not None and m.epoch == epoch and m.live(now)


# --------------------------------------------------------------------------- the machine


def _call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs), None
    except BatonError as exc:
        return None, exc


def _expected_version(mode: str, current: int) -> int | None:
    if mode == "none":
        return None
    if mode == "right":
        return current
    if mode == "below" and current > 0:
        return current - 1
    return current + 1


exp_modes = st.sampled_from(["none", "none", "none", "right", "above", "below"])
tampers = st.sampled_from(["none", "none", "none", "none", "key", "owner", "unknown"])


class LeaseCoreMachine(RuleBasedStateMachine):
    """Random lease operations on the pure core, checked step by step against ``Model``."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.rows: dict[str, Generation] = {}
        self.model = Model()
        self.issued: list[str] = []
        self.seq = 0
        self.epoch_log: dict[str, list[int]] = {r: [] for r in RESOURCES}

    # ------------------------------------------------------------------ helpers

    def _new_id(self) -> str:
        self.seq += 1
        return f"L{self.seq}"

    def _pick(self, idx: int) -> str:
        """Mostly one of the newest leases (likely still held), sometimes any of them."""
        if idx < 45:
            return self.issued[-1 - idx % min(3, len(self.issued))]
        return self.issued[idx % len(self.issued)]

    def _proof_for(self, lease_id: str, tamper: str, alt: int) -> tuple[str, str, str | None]:
        m = self.model.leases[lease_id]
        owner, key = m.owner, m.key
        if tamper == "unknown":
            return UNKNOWN_ID, owner, key
        if tamper == "key":
            others = [k for k in (None, "k1", "k2", "k3", "t-new") if k != key]
            key = others[alt % len(others)]
        elif tamper == "owner":
            others_p = [p for p in PRINCIPALS if p != owner]
            owner = others_p[alt % len(others_p)]
        return lease_id, owner, key

    def _check_conflict_message(self, exc: BatonError) -> None:
        text = str(exc) + repr(exc.to_dict())
        for name in PRINCIPALS:
            assert name not in text, text
        for purpose in PURPOSES:
            if purpose:
                assert purpose not in text, text
        for scope in ("src", "docs", ".py", ".md"):
            assert scope not in text, text

    def _compare(
        self,
        pred: Prediction,
        result: Decision | None,
        exc: BatonError | None,
        *,
        blockers: set[int] | None = None,
    ) -> None:
        if not isinstance(pred, Ok):
            assert exc is not None, f"expected {pred.__name__}, got success {result}"
            assert type(exc) is pred, f"expected {pred.__name__}, got {exc!r}"
            assert exc.code == pred.code
            if isinstance(exc, ConflictError):
                self._check_conflict_message(exc)
                assert exc.expires_at is not None
                if blockers is not None:
                    assert exc.expires_at in {from_ms(b) for b in blockers}
            if isinstance(exc, VersionConflictError):
                assert exc.current_version != exc.expected_version
            return
        assert exc is None, f"expected success {pred}, got {exc!r}"
        assert result is not None
        assert result.action == pred.action
        assert result.noop == pred.noop
        if pred.receipt != "ok":
            assert result.receipt_status == pred.receipt
        self._compare_row(result.new, pred.lease)

    @staticmethod
    def _compare_row(h: Generation | None, m: MLease) -> None:
        assert h is not None
        assert (
            h.lease_id,
            h.resource_id,
            h.owner,
            h.execution_key,
            h.version,
            h.epoch,
            h.expires_at_ms,
            h.status,
            h.scopes,
            h.purpose,
        ) == (
            m.lease_id,
            m.resource,
            m.owner,
            m.key,
            m.version,
            m.epoch,
            m.expires,
            m.status,
            m.scopes,
            m.purpose,
        )

    def _record_generation(self, d: Decision | None) -> None:
        if d is None or d.noop or d.new is None or d.action in ("renew", "release"):
            return
        if d.action == "force_release":
            return
        log = self.epoch_log[d.new.resource_id]
        assert not log or d.new.epoch > log[-1], (log, d.new.epoch)
        log.append(d.new.epoch)
        self.issued.append(d.new.lease_id)

    # ------------------------------------------------------------------ clock

    @rule(
        kind=st.sampled_from(["tick", "tick", "tick", "jump", "far", "expiry"]),
        ms=st.integers(0, 60_000),
        idx=st.integers(0, 60),
        off=st.sampled_from([-1, 0, 1]),
    )
    def advance(self, kind: str, ms: int, idx: int, off: int) -> None:
        """Time passes: a little, past short TTLs, past every TTL, or onto a lease's expiry."""
        if kind == "tick":
            self.now += ms // 15
        elif kind == "jump":
            self.now += 9_000 + ms
        elif kind == "far":
            self.now += 600_000 + ms
        elif self.issued:
            m = self.model.leases[self._pick(idx)]
            self.now = max(self.now, m.expires + off)

    # ------------------------------------------------------------------ acquire

    @rule(
        resource=st.sampled_from(RESOURCES),
        principal=st.sampled_from(PRINCIPALS),
        key=st.sampled_from(KEYS),
        ttl_s=st.sampled_from(TTLS_S),
        exp_mode=exp_modes,
        scopes=st.sampled_from(SCOPE_SETS),
        purpose=st.sampled_from(PURPOSES),
        floor_mode=st.sampled_from(["zero", "zero", "below", "above"]),
        floor_add=st.integers(1, 1_000),
    )
    def acquire(
        self,
        resource: str,
        principal: str,
        key: str | None,
        ttl_s: int,
        exp_mode: str,
        scopes: tuple[str, ...],
        purpose: str | None,
        floor_mode: str,
        floor_add: int,
    ) -> None:
        """Acquire (or supersede, take over, or retry) a resource."""
        ttl_ms = _core.validate_ttl(ttl_s)
        head = head_of(self.rows, resource)
        cur_epoch = head.epoch if head else 0
        floor = {"zero": 0, "below": max(cur_epoch - 1, 0), "above": cur_epoch + floor_add}[
            floor_mode
        ]
        expected = _expected_version(exp_mode, head.version if head else 0)
        new_id = self._new_id()
        blockers = self.model.scope_blockers(principal, scopes, resource, self.now)
        cur = self.model.current(resource)
        holder_blocks = cur is not None and cur.live(self.now)
        d, exc = _call(
            _core.decide_acquire,
            head,
            _core.AcquireRequest("t", resource, ttl_ms, scopes, purpose, expected),
            principal=principal,
            execution_key=key,
            now_ms=self.now,
            new_lease_id=new_id,
            scope_conflict_expires_ms=scope_conflict(
                self.rows, principal, scopes, resource, self.now
            ),
            epoch_floor=floor,
        )
        pred = self.model.acquire(
            resource=resource,
            principal=principal,
            key=key,
            ttl_ms=ttl_ms,
            scopes=scopes,
            purpose=purpose,
            expected=expected,
            floor=floor,
            now=self.now,
            new_id=new_id,
        )
        conflict_expiries = (
            {cur.expires} if holder_blocks and cur is not None else set()
        ) | blockers
        self._compare(pred, d, exc, blockers=conflict_expiries)
        if d is None:
            return
        assert d.new is not None
        if not d.noop:
            assert d.new.epoch > floor
            assert d.new.epoch > cur_epoch
            assert d.new.version == (head.version if head else 0) + 1
            assert d.new.expires_at_ms == self.now + ttl_ms
        apply_decision(self.rows, d)
        self._record_generation(d)

    @precondition(lambda self: self.issued)
    @rule(
        idx=st.integers(0, 60),
        ttl_s=st.sampled_from(TTLS_S),
        exp_mode=exp_modes,
        scopes=st.sampled_from(SCOPE_SETS),
    )
    def reacquire(self, idx: int, ttl_s: int, exp_mode: str, scopes: tuple[str, ...]) -> None:
        """The holder of an issued lease acquires its resource again (retry or supersede)."""
        m = self.model.leases[self._pick(idx)]
        self.acquire(m.resource, m.owner, m.key, ttl_s, exp_mode, scopes, m.purpose, "zero", 1)

    # ------------------------------------------------------------------ by proof

    @precondition(lambda self: self.issued)
    @rule(
        idx=st.integers(0, 60),
        tamper=tampers,
        alt=st.integers(0, 3),
        ttl_s=st.sampled_from(TTLS_S),
        exp_mode=exp_modes,
    )
    def renew(self, idx: int, tamper: str, alt: int, ttl_s: int, exp_mode: str) -> None:
        """Renew a lease, with its true proof or a wrong one."""
        self._renew(self._pick(idx), tamper, alt, ttl_s, exp_mode)

    @rule(resource=st.sampled_from(RESOURCES), ttl_s=st.sampled_from(TTLS_S), exp_mode=exp_modes)
    def renew_newest(self, resource: str, ttl_s: int, exp_mode: str) -> None:
        """The newest generation of a resource renews with its true proof."""
        cur = self.model.current(resource)
        if cur is not None:
            self._renew(cur.lease_id, "none", 0, ttl_s, exp_mode)

    def _renew(self, picked: str, tamper: str, alt: int, ttl_s: int, exp_mode: str) -> None:
        lease_id, owner, key = self._proof_for(picked, tamper, alt)
        row = self.rows.get(lease_id)
        expected = _expected_version(exp_mode, row.version if row else 0)
        ttl_ms = _core.validate_ttl(ttl_s)
        was_effective = row is not None and row.effective(self.now)
        d, exc = _call(
            _transitions.decide_renew,
            row,
            _core.RenewRequest(Proof(lease_id, owner, key), ttl_ms, expected),
            now_ms=self.now,
        )
        pred = self.model.renew(
            lease_id, owner, key, ttl_ms=ttl_ms, expected=expected, now=self.now
        )
        self._compare(pred, d, exc)
        if d is None:
            return
        assert tamper == "none", "a renew with a wrong proof succeeded"
        assert was_effective, "a renew succeeded on a lease that was not effective"
        assert row is not None
        assert d.new is not None
        assert d.new.version == row.version + 1
        assert (d.new.lease_id, d.new.epoch, d.new.owner, d.new.execution_key) == (
            row.lease_id,
            row.epoch,
            row.owner,
            row.execution_key,
        )
        assert d.new.scopes == row.scopes
        apply_decision(self.rows, d)

    @precondition(lambda self: self.issued)
    @rule(
        idx=st.integers(0, 60),
        tamper=tampers,
        alt=st.integers(0, 3),
        to=st.sampled_from(PRINCIPALS),
        new_key=st.sampled_from(TRANSFER_KEYS),
        ttl_s=st.sampled_from(TTLS_S),
        exp_mode=exp_modes,
    )
    def transfer(
        self,
        idx: int,
        tamper: str,
        alt: int,
        to: str,
        new_key: str,
        ttl_s: int,
        exp_mode: str,
    ) -> None:
        """Transfer a lease to another principal (or execution)."""
        lease_id, owner, key = self._proof_for(self._pick(idx), tamper, alt)
        row = self.rows.get(lease_id)
        expected = _expected_version(exp_mode, row.version if row else 0)
        ttl_ms = _core.validate_ttl(ttl_s)
        new_id = self._new_id()
        sc = scope_conflict(self.rows, to, row.scopes, row.resource_id, self.now) if row else None
        blockers = (
            self.model.scope_blockers(to, row.scopes, row.resource_id, self.now) if row else set()
        )
        d, exc = _call(
            _transitions.decide_transfer,
            row,
            _core.TransferRequest(Proof(lease_id, owner, key), to, new_key, ttl_ms, expected),
            now_ms=self.now,
            new_lease_id=new_id,
            scope_conflict_expires_ms=sc,
        )
        pred = self.model.transfer(
            lease_id,
            owner,
            key,
            to=to,
            new_key=new_key,
            ttl_ms=ttl_ms,
            expected=expected,
            now=self.now,
            new_id=new_id,
        )
        self._compare(pred, d, exc, blockers=blockers)
        if d is None:
            return
        assert tamper == "none", "a transfer with a wrong proof succeeded"
        assert row is not None
        assert d.new is not None
        assert d.ended is not None
        assert d.ended.lease_id == row.lease_id
        assert d.ended.status == "transferred"
        assert d.new.version == row.version + 1
        assert d.new.epoch == row.epoch + 1
        assert d.new.scopes == row.scopes
        assert d.new.lease_id != row.lease_id
        apply_decision(self.rows, d)
        self._record_generation(d)

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), tamper=tampers, alt=st.integers(0, 3), exp_mode=exp_modes)
    def release(self, idx: int, tamper: str, alt: int, exp_mode: str) -> None:
        """Release a lease by proof."""
        lease_id, owner, key = self._proof_for(self._pick(idx), tamper, alt)
        row = self.rows.get(lease_id)
        expected = _expected_version(exp_mode, row.version if row else 0)
        d, exc = _call(
            _transitions.decide_release,
            row,
            _core.ReleaseRequest(Proof(lease_id, owner, key), expected),
            now_ms=self.now,
        )
        pred = self.model.release(lease_id, owner, key, expected=expected, now=self.now)
        self._compare(pred, d, exc)
        if d is None:
            return
        assert tamper == "none", "a release with a wrong proof succeeded"
        assert exp_mode in ("none", "right"), "a release with a wrong version succeeded"
        assert row is not None
        assert d.new is not None
        assert (d.new.version, d.new.epoch) == (row.version, row.epoch)
        apply_decision(self.rows, d)

    @precondition(lambda self: self.issued)
    @rule(
        idx=st.integers(0, 60),
        principal=st.sampled_from(PRINCIPALS),
        role=st.sampled_from(["by_id", "by_id", "agent", "owner", "admin"]),
    )
    def release_without_proof(self, idx: int, principal: str, role: str) -> None:
        """Release by id alone (the seed service's route), or force release by role."""
        lease_id = self._pick(idx)
        row = self.rows.get(lease_id)
        if role == "by_id":
            d, exc = _call(
                _transitions.decide_release_by_id,
                row,
                principal=principal,
                lease_id=lease_id,
                now_ms=self.now,
            )
            pred = self.model.release_by_id(lease_id, principal, self.now)
        else:
            d, exc = _call(
                _transitions.decide_force_release,
                row,
                principal=principal,
                role=role,
                lease_id=lease_id,
                now_ms=self.now,
            )
            pred = self.model.force_release(lease_id, role)
        self._compare(pred, d, exc)
        if d is None:
            return
        assert row is not None
        assert d.new is not None
        if role == "by_id":
            assert row.owner == principal
        else:
            assert d.new.ended_by == principal
        assert (d.new.version, d.new.epoch) == (row.version, row.epoch)
        apply_decision(self.rows, d)

    # ------------------------------------------------------------------ read-only checks

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), wrong_epoch=st.booleans())
    def fence(self, idx: int, wrong_epoch: bool) -> None:
        """A write fenced by a lease passes only while that generation is the effective one."""
        lease_id = self._pick(idx)
        m = self.model.leases[lease_id]
        epoch = m.epoch + 1 if wrong_epoch else m.epoch
        row, exc = _call(
            _core.check_fence,
            self.rows.get(lease_id),
            lease_id=lease_id,
            epoch=epoch,
            now_ms=self.now,
        )
        if self.model.fence_ok(lease_id, epoch, self.now):
            assert exc is None
            assert row is not None
            assert row.lease_id == lease_id
        else:
            assert isinstance(exc, StaleFenceError)

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60))
    def replay(self, idx: int) -> None:
        """A replayed acquire receipt never revives a lease that is no longer held."""
        lease_id = self._pick(idx)
        m = self.model.leases[lease_id]
        row, exc = _call(
            _core.replay_check,
            self.rows.get(lease_id),
            lease_id=lease_id,
            owner=m.owner,
            execution_key=m.key,
            epoch=m.epoch,
            now_ms=self.now,
        )
        if m.live(self.now):
            assert exc is None
            assert row is not None
        else:
            assert isinstance(exc, LeaseLostError)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def one_holder_per_resource(self) -> None:
        """At most one active row (the partial unique index) and one effective holding."""
        for r in RESOURCES:
            mine = [h for h in self.rows.values() if h.resource_id == r]
            assert sum(h.status == "active" for h in mine) <= 1
            assert sum(h.effective(self.now) for h in mine) <= 1

    @invariant()
    def epochs_unique_and_head_newest(self) -> None:
        """Epochs never repeat within a resource; the head holds the highest one."""
        for r in RESOURCES:
            epochs = [h.epoch for h in self.rows.values() if h.resource_id == r]
            assert len(epochs) == len(set(epochs))
            assert self.epoch_log[r] == sorted(epochs)
            cur = self.model.current(r)
            head = head_of(self.rows, r)
            assert (head.lease_id if head else None) == (cur.lease_id if cur else None)

    @invariant()
    def rows_match_model(self) -> None:
        """Every row the core produced equals the reference model's lease."""
        assert set(self.rows) == set(self.model.leases)
        for lid, h in self.rows.items():
            self._compare_row(h, self.model.leases[lid])


LeaseCoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLeaseCore = LeaseCoreMachine.TestCase
TestLeaseCore.__doc__ = "Random lease operation sequences follow the reference model's rules."


# --------------------------------------------------------------------------- examples


def _holding(**kw: object) -> Generation:
    base: dict[str, object] = {
        "lease_id": "L1",
        "resource_type": "t",
        "resource_id": "r",
        "owner": "alice",
        "execution_key": "k1",
        "version": 3,
        "epoch": 2,
        "status": "active",
        "acquired_at_ms": T0,
        "expires_at_ms": T0 + 10_000,
        "ttl_ms": 10_000,
    }
    base.update(kw)
    return Generation(**base)  # type: ignore[arg-type]


def _acquire(head: Generation | None, **kw: object) -> Decision:
    args: dict[str, object] = {
        "resource_type": "t",
        "resource_id": "r",
        "principal": "bob",
        "execution_key": "k9",
        "ttl_ms": 10_000,
        "scopes": (),
        "purpose": None,
        "expected_version": None,
        "now_ms": T0 + 20_000,
        "new_lease_id": "L2",
    }
    args.update(kw)
    fields = {name: args.pop(name) for name in _core.AcquireRequest._fields}
    request = _core.AcquireRequest(**fields)  # type: ignore[arg-type]
    return _core.decide_acquire(head, request, **args)  # type: ignore[arg-type]


def test_epoch_floor_lifts_new_epoch_above_floor() -> None:
    """After Redis data loss the floor keeps fencing tokens rising past every earlier one."""
    d = _acquire(_holding(), epoch_floor=1_000)
    assert d.new is not None
    assert d.new.epoch == 1_001
    d = _acquire(None, epoch_floor=7)
    assert d.new is not None
    assert d.new.epoch == 8
    d = _acquire(_holding(epoch=50), epoch_floor=7)
    assert d.new is not None
    assert d.new.epoch == 51


def test_exhausted_counters_refuse_acquire_and_renew_but_allow_release() -> None:
    """Counters never pass 2**53 - 1; the holder can still release."""
    top = _core.MAX_SAFE_INTEGER
    with pytest.raises(ValidationError):
        _acquire(_holding(version=top, expires_at_ms=T0))
    with pytest.raises(ValidationError):
        _acquire(_holding(epoch=top, expires_at_ms=T0))
    row = _holding(version=top)
    with pytest.raises(ValidationError):
        _transitions.decide_renew(
            row, _core.RenewRequest(Proof("L1", "alice", "k1"), 10_000), now_ms=T0
        )
    d = _transitions.decide_release(
        row, _core.ReleaseRequest(Proof("L1", "alice", "k1")), now_ms=T0
    )
    assert d.receipt_status == "released"
    assert d.new is not None
    assert d.new.version == top


def test_conflict_names_only_the_expiry() -> None:
    """A conflict tells a competitor until when the resource is taken, nothing more."""
    head = _holding(owner="secret-holder", purpose="secret-purpose", scopes=("src/**",))
    with pytest.raises(ConflictError) as ei:
        _acquire(head, now_ms=T0)
    text = str(ei.value) + repr(ei.value.to_dict())
    assert "secret" not in text
    assert "src" not in text
    assert ei.value.expires_at == from_ms(T0 + 10_000)
    assert "2023-11-14T22:13:30.000Z" in str(ei.value)


def test_same_principal_other_execution_conflicts_while_effective() -> None:
    """Two runs of one deployment never both hold a resource."""
    with pytest.raises(ConflictError):
        _acquire(_holding(), principal="alice", execution_key="k2", now_ms=T0)
    with pytest.raises(ConflictError):
        _acquire(_holding(), principal="alice", execution_key=None, now_ms=T0)


def test_keyless_reacquire_supersedes_with_new_id() -> None:
    """Acquiring again without execution keys is not renew: new id, epoch + 1."""
    head = _holding(execution_key=None)
    d = _acquire(head, principal="alice", execution_key=None, now_ms=T0)
    assert d.action == "supersede"
    assert d.ended is not None
    assert d.ended.status == "superseded"
    assert d.new is not None
    assert d.new.lease_id == "L2"
    assert d.new.epoch == head.epoch + 1
    with pytest.raises(NotFoundError):
        _transitions.decide_release_by_id(d.ended, principal="alice", lease_id="L1", now_ms=T0)


def test_renew_at_exact_expiry_is_lost() -> None:
    """A lease whose expiry equals the authority's clock is no longer held."""
    row = _holding()
    with pytest.raises(LeaseLostError):
        _transitions.decide_renew(
            row, _core.RenewRequest(Proof("L1", "alice", "k1"), 10_000), now_ms=row.expires_at_ms
        )


def test_next_epoch_is_above_head_and_floor() -> None:
    """A new epoch is one above the larger of the newest generation's epoch and the floor."""
    assert _core.next_epoch(0, 0) == 1
    assert _core.next_epoch(5, 0) == 6
    assert _core.next_epoch(5, 9) == 10
    assert _core.next_epoch(12, 9) == 13


def test_transfer_epoch_rises_above_the_floor() -> None:
    """A transfer takes an epoch above the floor too (a generation restored after Redis
    data loss keeps its old epoch; its transfer must still get a token above every
    earlier one)."""
    row = _holding()
    request = _core.TransferRequest(
        Proof(lease_id="L1", owner="alice", execution_key="k1"), "bob", "k2", 10_000
    )
    kw: dict[str, object] = {"now_ms": T0 + 1_000, "new_lease_id": "L2"}
    d = _transitions.decide_transfer(row, request, **kw)
    assert d.new is not None
    assert d.new.epoch == 3
    d = _transitions.decide_transfer(row, request, epoch_floor=2**32, **kw)
    assert d.new is not None
    assert d.new.epoch == 2**32 + 1
    assert d.new.version == row.version + 1
    assert d.ended is not None
    assert d.ended.epoch == row.epoch
    d = _transitions.decide_transfer(row, request, epoch_floor=1, **kw)
    assert d.new is not None
    assert d.new.epoch == 3


def test_incarnation_floors_rise_across_data_loss() -> None:
    """Each incarnation's epochs lie above the previous one's ceiling."""
    assert _core.incarnation_epochs(0) == (0, 2**32)
    for n in range(1, 4):
        floor, ceiling = _core.incarnation_epochs(n)
        assert floor == _core.incarnation_epochs(n - 1)[1]
        assert ceiling - floor == _core.EPOCH_RANGE
        assert _core.next_epoch(2**32 - 1, floor) > 2**32 - 1


def test_ledger_transfer_epoch_is_above_every_recorded_epoch(tmp_path: Path) -> None:
    """The ledger passes the highest epoch it recorded for the resource as the floor: a
    transfer's epoch is above every earlier generation's, also one written with a higher
    epoch than the head it transfers (as after a Redis incarnation)."""
    store = LedgerStore(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        caller = Caller(org="org-floor", principal="alice", role="agent")
        lease = store.acquire(caller, _core.AcquireRequest("t", "r", 60_000), Execution("k1"))
        with store.engines.write.begin() as conn:  # an older, ended generation, epoch 2**32
            conn.execute(
                text(
                    "INSERT INTO baton_leases (lease_id, org_id, resource_type, resource_id, "
                    "owner, execution_key, purpose, scopes, has_scopes, version, epoch, status, "
                    "acquired_at_ms, expires_at_ms, ttl_ms) VALUES ('L-old', 'org-floor', 't', "
                    "'r', 'carol', NULL, NULL, '[]', 0, 0, 4294967296, 'released', 0, 1, 10000)"
                )
            )
        moved = store.transfer(
            caller,
            _core.TransferRequest(
                Proof(lease_id=lease.lease_id, owner="alice", execution_key="k1"),
                "bob",
                "k2",
                60_000,
            ),
        )
        assert moved.epoch == 2**32 + 1
        assert moved.version == lease.version + 1
    finally:
        store.close()
