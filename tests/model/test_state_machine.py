"""The lease authorities held to the decision core by one state machine.

The Lua scripts of the Redis authority (``_stores/redis/scripts/*.lua``) and the SQL ledger
store both restate the decisions of :mod:`prefect_baton._rules.core` and
:mod:`prefect_baton._rules.transitions`. A hypothesis state machine runs the same random
operation sequences, in lock step, against:

* two references built on the core itself (:class:`CoreRef`: lease rows by id, the newest
  row of a resource being its head, and acquire receipts; every outcome is decided by
  ``decide_acquire``, ``replay_check``, ``decide_renew``, ``decide_transfer``,
  ``decide_release``, ``decide_release_by_id`` and ``decide_force_release``, and applied with
  the appliers of the core's own model test, ``tests/unit/test_core_model.py``); the
  ``ledger`` reference never loses data, the ``redis`` one follows the Redis arms through
  their data losses (its epoch floor rises, see below);
* the SQLite ledger (``sqlite``);
* the Redis authority on fakeredis (``fakeredis``) and on the real server (``redis``),

and after every operation compares the result (status, owner, execution key, version, epoch,
scopes, purpose, TTL, receipt status and action, replayed flag; or the error code) and then
the state each arm shows: ``inspect`` of every resource as every principal, the effective
leases (``list_leases(owner="*")``) and the whole history (``include_ended=True``, which on a
Redis arm is the ledger behind it after a drain: the reconciler is held to the core too).
Lease ids are random per arm; the test maps each arm's ids to the model's. The ``sqlite``
and ``fakeredis`` arms run on the model's clock, so their instants (acquired, expires,
released) are compared exactly too; the ``redis`` arm runs on the server's wall clock, so its
times are compared through what they decide (``held``, effective or not).

Operations: acquire with and without execution keys, with or without ``expected_version``,
with write scopes that overlap or not; exact replays of an earlier keyed acquire (and a
changed request under the same key); another execution of the holder's principal; renew,
transfer, release by proof (with true and tampered proofs), release by id, force release as
owner, admin or agent; time passing (a little, exactly onto a lease's expiry, past every TTL;
how each arm is made to see it is in :mod:`tests.model._arms`); and, on the Redis arms, the
loss of the org's Redis data followed by the rebuild from the ledger. Leases live 120 s to
1 h here (the wall clock moves on under the real server while an example runs, see
``_arms.MARGIN_MS``); acquire receipts are kept 24 h and an example spans at most 20 h of
model time, so no receipt lapses.

``BATON_MODEL_EXAMPLES`` and ``BATON_MODEL_STEPS`` (default 40 and 25) run it longer.

Epoch floor. After the ``n``-th loss the rebuilt state grants epochs above ``n * 2**32``
(``_stores/redis/rebuild.py``), so the ``redis`` reference passes ``epoch_floor`` to
``decide_acquire`` and ``decide_transfer`` (``transfer.lua`` lifts a transfer's epoch above the
incarnation's floor too); and the test checks that every generation granted after a loss has an
epoch above every epoch handed out before it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from prefect_baton._rules import core as _core
from prefect_baton._rules import transitions as _transitions
from prefect_baton._rules.core import Decision, Generation, Proof
from prefect_baton._stores.ledger.convert import generation_to_lease
from prefect_baton._stores.protocol import (
    AcquireRequest,
    Caller,
    Execution,
    ReleaseRequest,
    RenewRequest,
    TransferRequest,
)
from prefect_baton._stores.queries import LeaseQuery
from prefect_baton._stores.redis.rebuild import EPOCH_RANGE
from prefect_baton.errors import BatonError, IdempotencyMismatchError
from prefect_baton.models import Lease, LeaseInfo, Receipt, to_ms
from tests.conftest import redis_authority, require_redis
from tests.model._arms import (
    MARGIN_MS,
    MIN_TTL_S,
    Arm,
    FakeRedisArm,
    LedgerArm,
    ServerRedisArm,
    new_org,
)
from tests.unit.test_core_model import (
    KEYS,
    PRINCIPALS,
    PURPOSES,
    RESOURCES,
    SCOPE_SETS,
    TRANSFER_KEYS,
    UNKNOWN_ID,
    _expected_version,
    apply_decision,
    exp_modes,
    head_of,
    scope_conflict,
    tampers,
)

RTYPE = "res"
TTLS_S = (MIN_TTL_S, 600, 3600)
T0 = 1_800_000_000_000
MAX_ELAPSED_MS = 20 * 3_600_000
"""Virtual time stays below the receipt retention (24 h): receipts never lapse in a run."""
MAX_LOSSES = 2
ADMINS = (("root", "owner"), ("ops", "admin"))


# --------------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class KeyedRequest:
    """A keyed acquire as sent, kept so that a later step can send it again."""

    resource: str
    principal: str
    key: str
    ttl_s: int
    scopes: tuple[str, ...]
    purpose: str | None
    expected: int | None
    attempt: str | None = None


ATTEMPTS = (None, "pod-1", "pod-2")
"""Attempt tokens of the keyed acquires (``None``: an anonymous attempt)."""


def acquire_digest(
    ttl_ms: int, scopes: tuple[str, ...], purpose: str | None, ev: int | None
) -> str:
    """The request digest of an acquire receipt (the core's ``request_digest``)."""
    return _core.request_digest(
        "acquire",
        {"expected_version": ev, "ttl_ms": ttl_ms, "scopes": list(scopes), "purpose": purpose},
    )


class CoreRef:
    """The reference authority: lease rows (lease id -> :class:`Generation`; a resource's head
    is its row with the highest epoch) and acquire receipts ((principal, key, resource) ->
    (digest, lease id, epoch)), every decision taken by :mod:`prefect_baton._rules.core`.

    Its only rule of its own is the ledger's receipt check (a stored receipt under the same
    key with another request digest is ``IDEMPOTENCY_MISMATCH``). ``floor`` is the epoch
    floor of the current Redis incarnation (0 for the ledger).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: dict[str, Generation] = {}
        self.receipts: dict[tuple[str, str, str], tuple[str, str, int, str | None]] = {}
        self.floor = 0

    def acquire(
        self, principal: str, req: KeyedRequest | None, now: int, new_id: str, **kw: Any
    ) -> Lease:
        """Acquire: ``req`` (keyed) or the keyword arguments ``resource``, ``ttl_s``,
        ``scopes``, ``purpose``, ``expected`` (keyless)."""
        attempt = None
        if req is not None:
            resource, key, ttl_s, attempt = req.resource, req.key, req.ttl_s, req.attempt
            scopes, purpose, expected = req.scopes, req.purpose, req.expected
        else:
            resource, key, ttl_s = kw["resource"], None, kw["ttl_s"]
            scopes, purpose, expected = kw["scopes"], kw["purpose"], kw["expected"]
        ttl_ms = ttl_s * 1000
        digest = acquire_digest(ttl_ms, scopes, purpose, expected)
        if key is not None:
            stored = self.receipts.get((principal, key, resource))
            if stored is not None:
                if stored[0] != digest:
                    raise IdempotencyMismatchError(f"idempotency key {key!r} was reused")
                held = _core.replay_check(
                    self.rows.get(stored[1]),
                    lease_id=stored[1],
                    owner=principal,
                    execution_key=key,
                    epoch=stored[2],
                    now_ms=now,
                    attempt=attempt,
                    receipt_attempt=stored[3],
                )
                if held is not None:
                    return generation_to_lease(held, replayed=True)
        d = _core.decide_acquire(
            head_of(self.rows, resource),
            AcquireRequest(RTYPE, resource, ttl_ms, scopes, purpose, expected),
            principal=principal,
            execution_key=key,
            now_ms=now,
            new_lease_id=new_id,
            scope_conflict_expires_ms=scope_conflict(self.rows, principal, scopes, resource, now),
            epoch_floor=self.floor,
        )
        assert d.new is not None
        if d.noop:
            return generation_to_lease(d.new, replayed=True)
        apply_decision(self.rows, d)
        if key is not None:
            self.receipts[(principal, key, resource)] = (
                digest,
                d.new.lease_id,
                d.new.epoch,
                attempt,
            )
        return generation_to_lease(d.new)

    def renew(self, proof: Proof, ttl_s: int, expected: int | None, now: int) -> Lease:
        d = _transitions.decide_renew(
            self.rows.get(proof.lease_id), RenewRequest(proof, ttl_s * 1000, expected), now_ms=now
        )
        apply_decision(self.rows, d)
        assert d.new is not None
        return generation_to_lease(d.new)

    def transfer(
        self,
        proof: Proof,
        *,
        to: str,
        new_key: str,
        ttl_s: int,
        expected: int | None,
        now: int,
        new_id: str,
    ) -> Lease:
        row = self.rows.get(proof.lease_id)
        d = _transitions.decide_transfer(
            row,
            TransferRequest(proof, to, new_key, ttl_s * 1000, expected),
            epoch_floor=self.floor,
            now_ms=now,
            new_lease_id=new_id,
            scope_conflict_expires_ms=(
                scope_conflict(self.rows, to, row.scopes, row.resource_id, now) if row else None
            ),
        )
        apply_decision(self.rows, d)
        assert d.new is not None
        return generation_to_lease(d.new)

    def _receipt(self, action: str, d: Decision) -> Receipt:
        assert d.new is not None
        apply_decision(self.rows, d)
        status = "no_change" if d.noop else d.receipt_status
        return Receipt(action=action, status=status, lease=generation_to_lease(d.new))  # type: ignore[arg-type]

    def release(self, proof: Proof, expected: int | None, now: int) -> Receipt:
        row = self.rows.get(proof.lease_id)
        d = _transitions.decide_release(row, ReleaseRequest(proof, expected), now_ms=now)
        return self._receipt("release", d)

    def release_by_id(self, principal: str, lease_id: str, now: int) -> Receipt:
        row = self.rows.get(lease_id)
        d = _transitions.decide_release_by_id(
            row, principal=principal, lease_id=lease_id, now_ms=now
        )
        return self._receipt("release_by_id", d)

    def force_release(self, principal: str, role: str, lease_id: str, now: int) -> Receipt:
        row = self.rows.get(lease_id)
        d = _transitions.decide_force_release(
            row, principal=principal, role=role, lease_id=lease_id, now_ms=now
        )
        return self._receipt("force_release", d)

    # ------------------------------------------------------------------ what it shows

    def inspect(self, principal: str, resource: str, now: int) -> LeaseInfo:
        head = head_of(self.rows, resource)
        if head is None:
            return LeaseInfo(
                resource_type=RTYPE, resource_id=resource, held=False, version=0, epoch=0
            )
        held = head.effective(now)
        return LeaseInfo(
            resource_type=RTYPE,
            resource_id=resource,
            held=held,
            version=head.version,
            epoch=head.epoch,
            expires_at=generation_to_lease(head).expires_at if held else None,
            lease=generation_to_lease(head) if held and head.owner == principal else None,
        )

    def leases(self, now: int, *, include_ended: bool) -> list[Lease]:
        return [
            generation_to_lease(h) for h in self.rows.values() if include_ended or h.effective(now)
        ]


# --------------------------------------------------------------------------- normal forms


def _ms(t: datetime | None) -> int:
    return -1 if t is None else to_ms(t)


def norm_lease(
    lease: Lease, ids: Callable[[str], str], *, epochs: bool = True, instants: bool = False
) -> tuple[Any, ...]:
    """What must agree between the arms about one lease: its instants (ms) only with
    ``instants`` (arms on the model's clock), its epoch unless ``epochs=False``."""
    times = (lease.acquired_at, lease.expires_at, lease.released_at) if instants else ()
    return (
        ids(lease.lease_id),
        lease.resource_type,
        lease.resource_id,
        lease.owner,
        lease.execution_key,
        lease.version,
        lease.epoch if epochs else "-",
        tuple(lease.scopes),
        lease.status,
        lease.purpose,
        lease.ttl_seconds,
        lease.released_at is not None,
        lease.replayed,
        *map(_ms, times),
    )


def norm(
    result: Any, ids: Callable[[str], str], *, epochs: bool = True, instants: bool = False
) -> Any:
    """The normal form of an operation's result, or of the error it raised (see
    :func:`norm_lease`)."""
    if isinstance(result, BatonError):
        return ("error", result.code)
    if isinstance(result, Lease):
        return ("lease", norm_lease(result, ids, epochs=epochs, instants=instants))
    if isinstance(result, Receipt):
        lease = norm_lease(result.lease, ids, epochs=epochs, instants=instants)
        return ("receipt", result.action, result.status, result.replayed, lease)
    if isinstance(result, LeaseInfo):
        return (
            "info",
            result.resource_id,
            result.held,
            result.version,
            result.epoch if epochs else "-",
            _ms(result.expires_at) if instants else result.expires_at is not None,
            None
            if result.lease is None
            else norm_lease(result.lease, ids, epochs=epochs, instants=instants),
        )
    raise AssertionError(f"unexpected result {result!r}")


def outcome(call: Callable[[], Any]) -> Any:
    """The call's result, or the :class:`BatonError` it raised."""
    try:
        return call()
    except BatonError as exc:
        return exc


def same(model_id: str) -> str:
    return model_id


# --------------------------------------------------------------------------- the machine


class AuthoritiesMachine(RuleBasedStateMachine):
    """Random lease operations on the references and every arm, compared step by step."""

    def __init__(self, arms: list[Arm]) -> None:
        super().__init__()
        self.arms = arms
        self.org = new_org()
        self.now = T0
        for arm in arms:
            arm.set_time(self.now)
            arm.start(self.org)
        self.refs = {"ledger": CoreRef("ledger"), "redis": CoreRef("redis")}
        self.issued: list[str] = []
        self.keyed: list[KeyedRequest] = []
        self.seq = 0
        self.losses = 0
        self.top_before_loss = 0  # the highest epoch handed out before the latest loss

    def teardown(self) -> None:
        for arm in self.arms:
            arm.finish(self.org)

    # ------------------------------------------------------------------ plumbing

    @property
    def model(self) -> CoreRef:
        """The reference whose rows drive the choice of steps (both hold the same rows but
        for the epochs)."""
        return self.refs["ledger"]

    def _caller(self, principal: str, role: str = "agent") -> Caller:
        return Caller(self.org, principal, role)

    def _arm_id(self, arm: Arm, model_id: str) -> str:
        return arm.back.get(model_id, model_id)

    def _step(
        self,
        what: str,
        on_ref: Callable[[CoreRef, str], Any],
        on_arm: Callable[[Arm, Callable[[str], str]], Any],
    ) -> None:
        """Run one operation on both references and every arm and compare the outcomes.

        ``on_ref(ref, new_id)`` and ``on_arm(arm, to_arm_id)`` perform it; a success that
        returns the generation ``new_id`` made a new generation, whose id on each arm is
        bound to it.
        """
        self.seq += 1
        new_id = f"m{self.seq}"
        expected = {n: outcome(lambda r=ref: on_ref(r, new_id)) for n, ref in self.refs.items()}
        forms = {name: norm(res, same, instants=True) for name, res in expected.items()}
        bare = [norm(res, same, epochs=False, instants=True) for res in expected.values()]
        assert bare[0] == bare[1], (what, forms)
        if not self.losses:
            assert forms["ledger"] == forms["redis"], (what, forms)
        made = isinstance(expected["ledger"], Lease) and expected["ledger"].lease_id == new_id
        for arm in self.arms:
            got = outcome(lambda a=arm: on_arm(a, lambda mid, a=a: self._arm_id(a, mid)))
            if made and isinstance(got, Lease) and got.lease_id not in arm.ids:
                arm.bind(got.lease_id, new_id)
                if arm.kind == "redis" and self.losses:
                    assert got.epoch > self.top_before_loss, (
                        f"{arm.name}: {what} granted epoch {got.epoch} after a data loss, "
                        f"not above {self.top_before_loss} handed out before it"
                    )
            exact = arm.exact_time
            want = norm(expected[arm.kind], same, instants=exact)
            have = norm(got, lambda aid, a=arm: a.ids.get(aid, f"<{a.name}:{aid}>"), instants=exact)
            assert have == want, (
                f"{arm.name} disagrees with the core on {what}:\n"
                f"  core: {want}\n  {arm.name}: {have}"
                + (f"\n  error: {got!r}" if isinstance(got, BatonError) else "")
            )
        if made:
            self.issued.append(new_id)

    def _pick(self, idx: int) -> str:
        """Mostly one of the newest generations (likely still held), sometimes any."""
        if idx < 45:
            return self.issued[-1 - idx % min(3, len(self.issued))]
        return self.issued[idx % len(self.issued)]

    def _proof_for(self, model_id: str, tamper: str, alt: int) -> Proof:
        h = self.model.rows[model_id]
        owner, key = h.owner, h.execution_key
        if tamper == "unknown":
            return Proof(UNKNOWN_ID, owner, key)
        if tamper == "key":
            others = [k for k in (None, *TRANSFER_KEYS) if k != key]
            key = others[alt % len(others)]
        elif tamper == "owner":
            others_p = [p for p in PRINCIPALS if p != owner]
            owner = others_p[alt % len(others_p)]
        return Proof(model_id, owner, key)

    def _arm_proof(self, proof: Proof, to_arm: Callable[[str], str]) -> Proof:
        return Proof(to_arm(proof.lease_id), proof.owner, proof.execution_key)

    def _version_of(self, model_id: str) -> int:
        row = self.model.rows.get(model_id)
        return row.version if row is not None else 0

    # ------------------------------------------------------------------ acquire

    def _acquire(
        self,
        resource: str,
        principal: str,
        key: str | None,
        ttl_s: int,
        scopes: tuple[str, ...],
        purpose: str | None,
        expected: int | None,
        attempt: str | None = None,
    ) -> None:
        req = None
        if key is not None:
            req = KeyedRequest(resource, principal, key, ttl_s, scopes, purpose, expected, attempt)
            self.keyed.append(req)
        kw = {"resource": resource, "ttl_s": ttl_s, "scopes": scopes, "purpose": purpose}
        self._step(
            f"acquire {resource} by {principal} key={key} attempt={attempt} ttl={ttl_s}s "
            f"scopes={scopes} expected={expected}",
            lambda ref, new_id: ref.acquire(
                principal, req, self.now, new_id, expected=expected, **kw
            ),
            lambda arm, _ids: arm.auth.acquire(
                self._caller(principal),
                AcquireRequest(RTYPE, resource, ttl_s * 1000, scopes, purpose, expected),
                Execution(key, attempt),
            ),
        )

    @rule(
        resource=st.sampled_from(RESOURCES),
        principal=st.sampled_from(PRINCIPALS),
        key=st.sampled_from(KEYS),
        ttl_s=st.sampled_from(TTLS_S),
        exp_mode=exp_modes,
        scopes=st.sampled_from(SCOPE_SETS),
        purpose=st.sampled_from(PURPOSES),
        attempt=st.sampled_from(ATTEMPTS),
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
        attempt: str | None,
    ) -> None:
        """Acquire, take over, supersede or retry a resource, with or without a key (as
        one of the attempts), an expected version and write scopes."""
        head = head_of(self.model.rows, resource)
        expected = _expected_version(exp_mode, head.version if head else 0)
        self._acquire(resource, principal, key, ttl_s, scopes, purpose, expected, attempt)

    @precondition(lambda self: self.keyed)
    @rule(
        idx=st.integers(0, 60),
        change=st.sampled_from(["none", "none", "none", "ttl", "attempt"]),
        alt=st.integers(0, 3),
    )
    def replay(self, idx: int, change: str, alt: int) -> None:
        """Send an earlier keyed acquire again: exactly (a replay, or LEASE_LOST when its
        lease is gone), changed under the same key (IDEMPOTENCY_MISMATCH), or as another
        attempt of the execution (IDEMPOTENCY_IN_FLIGHT while held, else a new generation)."""
        n = len(self.keyed)
        req = self.keyed[-1 - idx % n] if idx < 40 else self.keyed[idx % n]
        ttl_s, attempt = req.ttl_s, req.attempt
        if change == "ttl":
            ttl_s = TTLS_S[(TTLS_S.index(ttl_s) + 1) % len(TTLS_S)]
        if change == "attempt":
            others = [a for a in ATTEMPTS if a != attempt]
            attempt = others[alt % len(others)]
        self._acquire(
            req.resource,
            req.principal,
            req.key,
            ttl_s,
            req.scopes,
            req.purpose,
            req.expected,
            attempt,
        )

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), ttl_s=st.sampled_from(TTLS_S), exp_mode=exp_modes)
    def reacquire(self, idx: int, ttl_s: int, exp_mode: str) -> None:
        """The holder of an issued generation acquires its resource again under the same
        execution key (the same execution: no change) or without one (supersede)."""
        h = self.model.rows[self._pick(idx)]
        head = head_of(self.model.rows, h.resource_id)
        expected = _expected_version(exp_mode, head.version if head else 0)
        self._acquire(h.resource_id, h.owner, h.execution_key, ttl_s, h.scopes, h.purpose, expected)

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), alt=st.integers(0, 3), ttl_s=st.sampled_from(TTLS_S))
    def other_execution(self, idx: int, alt: int, ttl_s: int) -> None:
        """The holder's principal acquires the resource again under another execution key
        (or none): a conflict while the lease is effective."""
        h = self.model.rows[self._pick(idx)]
        others = [k for k in KEYS if k != h.execution_key]
        key = others[alt % len(others)]
        self._acquire(h.resource_id, h.owner, key, ttl_s, h.scopes, h.purpose, None)

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
        """Renew with the true proof or a tampered one."""
        self._renew(self._proof_for(self._pick(idx), tamper, alt), ttl_s, exp_mode)

    @rule(resource=st.sampled_from(RESOURCES), ttl_s=st.sampled_from(TTLS_S), exp_mode=exp_modes)
    def renew_head(self, resource: str, ttl_s: int, exp_mode: str) -> None:
        """The newest generation of a resource renews with its true proof."""
        head = head_of(self.model.rows, resource)
        if head is not None:
            self._renew(self._proof_for(head.lease_id, "none", 0), ttl_s, exp_mode)

    def _renew(self, proof: Proof, ttl_s: int, exp_mode: str) -> None:
        expected = _expected_version(exp_mode, self._version_of(proof.lease_id))
        self._step(
            f"renew {proof} ttl={ttl_s}s expected={expected}",
            lambda ref, _new: ref.renew(proof, ttl_s, expected, self.now),
            lambda arm, ids: arm.auth.renew(
                self._caller(proof.owner),
                RenewRequest(self._arm_proof(proof, ids), ttl_s * 1000, expected),
            ),
        )

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
        self, idx: int, tamper: str, alt: int, to: str, new_key: str, ttl_s: int, exp_mode: str
    ) -> None:
        """Transfer to another principal (or execution) with the true proof or a tampered one."""
        proof = self._proof_for(self._pick(idx), tamper, alt)
        expected = _expected_version(exp_mode, self._version_of(proof.lease_id))
        self._transfer(proof, to, new_key, ttl_s, expected)

    def _transfer(
        self, proof: Proof, to: str, new_key: str, ttl_s: int, expected: int | None
    ) -> None:
        self._step(
            f"transfer {proof} to {to}/{new_key} ttl={ttl_s}s expected={expected}",
            lambda ref, new_id: ref.transfer(
                proof,
                to=to,
                new_key=new_key,
                ttl_s=ttl_s,
                expected=expected,
                now=self.now,
                new_id=new_id,
            ),
            lambda arm, ids: arm.auth.transfer(
                self._caller(proof.owner),
                TransferRequest(self._arm_proof(proof, ids), to, new_key, ttl_s * 1000, expected),
            ),
        )

    @rule(
        resource=st.sampled_from(RESOURCES),
        to=st.sampled_from(PRINCIPALS),
        new_key=st.sampled_from(TRANSFER_KEYS),
        ttl_s=st.sampled_from(TTLS_S),
    )
    def transfer_head(self, resource: str, to: str, new_key: str, ttl_s: int) -> None:
        """The newest generation of a resource is transferred with its true proof."""
        head = head_of(self.model.rows, resource)
        if head is not None:
            self._transfer(self._proof_for(head.lease_id, "none", 0), to, new_key, ttl_s, None)

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), tamper=tampers, alt=st.integers(0, 3), exp_mode=exp_modes)
    def release(self, idx: int, tamper: str, alt: int, exp_mode: str) -> None:
        """Release by proof (again after a release: ``no_change``)."""
        proof = self._proof_for(self._pick(idx), tamper, alt)
        expected = _expected_version(exp_mode, self._version_of(proof.lease_id))
        self._release(proof, expected)

    def _release(self, proof: Proof, expected: int | None) -> None:
        self._step(
            f"release {proof} expected={expected}",
            lambda ref, _new: ref.release(proof, expected, self.now),
            lambda arm, ids: arm.auth.release(
                self._caller(proof.owner), ReleaseRequest(self._arm_proof(proof, ids), expected)
            ),
        )

    @precondition(lambda self: any(h.status != "active" for h in self.model.rows.values()))
    @rule(idx=st.integers(0, 60))
    def release_ended(self, idx: int) -> None:
        """A generation that has ended (superseded, taken over, transferred, revoked,
        released, expired) is released with its own proof: NOT_FOUND, LEASE_LOST or
        ``no_change``, by status."""
        ended = [k for k, h in self.model.rows.items() if h.status != "active"]
        self._release(self._proof_for(ended[idx % len(ended)], "none", 0), None)

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), how=st.sampled_from(["release", "release_by_id", "renew"]))
    def act_at_expiry(self, idx: int, how: str) -> None:
        """Time moves exactly onto an effective lease's expiry and its holder then releases
        it (``expired``), releases it by id, or renews it (LEASE_LOST)."""
        live = [k for k, h in self.model.rows.items() if h.effective(self.now)]
        if not live:
            return
        lease_id = live[idx % len(live)]
        self.advance("onto_exactly", 0, 0, lease_id=lease_id)
        if self.now != self.model.rows[lease_id].expires_at_ms:
            return  # the model's clock would have to pass 20 h
        proof = self._proof_for(lease_id, "none", 0)
        if how == "release":
            self._release(proof, None)
        elif how == "renew":
            self._renew(proof, MIN_TTL_S, "none")
        else:
            self._step(
                f"release_by_id {lease_id} by {proof.owner} at its expiry",
                lambda ref, _new: ref.release_by_id(proof.owner, lease_id, self.now),
                lambda arm, ids: arm.auth.release_by_id(self._caller(proof.owner), ids(lease_id)),
            )

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), principal=st.sampled_from(PRINCIPALS))
    def release_by_id(self, idx: int, principal: str) -> None:
        """Release by lease id alone (only its owner may)."""
        lease_id = self._pick(idx)
        self._step(
            f"release_by_id {lease_id} by {principal}",
            lambda ref, _new: ref.release_by_id(principal, lease_id, self.now),
            lambda arm, ids: arm.auth.release_by_id(self._caller(principal), ids(lease_id)),
        )

    @precondition(lambda self: self.issued)
    @rule(idx=st.integers(0, 60), who=st.sampled_from([*ADMINS, ("alice", "agent")]))
    def force_release(self, idx: int, who: tuple[str, str]) -> None:
        """Force release: revoked as owner or admin, FORBIDDEN as an agent."""
        lease_id = self._pick(idx)
        principal, role = who
        self._step(
            f"force_release {lease_id} by {principal} ({role})",
            lambda ref, _new: ref.force_release(principal, role, lease_id, self.now),
            lambda arm, ids: arm.auth.force_release(self._caller(principal, role), ids(lease_id)),
        )

    # ------------------------------------------------------------------ time, data loss

    @precondition(lambda self: self.issued)
    @rule(
        kind=st.sampled_from(["tick", "tick", "tick", "onto", "onto", "far"]),
        ms=st.integers(0, 60_000),
        idx=st.integers(0, 60),
    )
    def advance(self, kind: str, ms: int, idx: int, lease_id: str | None = None) -> None:
        """Time passes on every arm: a little, onto an issued lease's expiry, or past every
        TTL. The target is pushed onto the expiry of any effective lease that would end
        within :data:`MARGIN_MS` after it, so the wall time a step takes never decides."""
        if lease_id is not None:
            target = max(self.now, self.model.rows[lease_id].expires_at_ms)
        elif kind == "tick":
            target = self.now + ms // 2
        elif kind == "onto" and self.issued:
            target = max(self.now, self.model.rows[self._pick(idx)].expires_at_ms + ms % 2)
        else:
            target = self.now + 3_600_000 + ms
        live = sorted(h.expires_at_ms for h in self.model.rows.values() if h.status == "active")
        for exp in live:  # ascending: each push can only bring later expiries into range
            if target < exp <= target + MARGIN_MS:
                target = exp
        if target - T0 > MAX_ELAPSED_MS or target == self.now:
            return
        delta = target - self.now
        self.now = target
        for arm in self.arms:
            arm.set_time(target)
            arm.advance(self.org, delta)

    @precondition(lambda self: self.issued and self.losses < MAX_LOSSES)
    @rule()
    def lose_redis_data(self) -> None:
        """The Redis arms lose the org's data; the next operation rebuilds it from the
        ledger, and epochs granted from then on lie above ``losses * 2**32``."""
        ref = self.refs["redis"]
        self.top_before_loss = max((h.epoch for h in ref.rows.values()), default=0)
        self.losses += 1
        ref.floor = self.losses * EPOCH_RANGE
        for arm in self.arms:
            if arm.kind == "redis":
                arm.lose(self.org)

    # ------------------------------------------------------------------ state

    @invariant()
    def same_state(self) -> None:
        """Every arm shows what its reference shows: each resource as each principal sees
        it, the effective leases, and the whole history."""
        for arm in self.arms:
            ref = self.refs[arm.kind]

            def ids(aid: str, a: Arm = arm) -> str:
                return a.ids.get(aid, f"<{a.name}:{aid}>")

            for resource in RESOURCES:
                for principal in PRINCIPALS:
                    exact = arm.exact_time
                    want = norm(ref.inspect(principal, resource, self.now), same, instants=exact)
                    info = arm.auth.inspect(self._caller(principal), RTYPE, resource)
                    got = norm(info, ids, instants=exact)
                    assert got == want, f"{arm.name}: inspect {resource} as {principal}"
            viewer = self._caller("ops", "admin")
            for include_ended in (False, True):
                want_set = sorted(
                    norm_lease(x, same, instants=arm.exact_time)
                    for x in ref.leases(self.now, include_ended=include_ended)
                )
                got_list = arm.auth.list_leases(
                    viewer, LeaseQuery(owner="*", include_ended=include_ended, limit=10_000)
                )
                got_set = sorted(norm_lease(x, ids, instants=arm.exact_time) for x in got_list)
                assert got_set == want_set, (
                    f"{arm.name}: list_leases(include_ended={include_ended})\n"
                    f"  core: {want_set}\n  {arm.name}: {got_set}"
                )

    @invariant()
    def epochs_rise(self) -> None:
        """Within a resource every generation has its own epoch (in both references)."""
        for ref in self.refs.values():
            for resource in RESOURCES:
                epochs = [h.epoch for h in ref.rows.values() if h.resource_id == resource]
                assert len(epochs) == len(set(epochs)), (ref.name, resource, epochs)


def _settings() -> settings:
    return settings(
        max_examples=int(os.environ.get("BATON_MODEL_EXAMPLES", "40")),
        stateful_step_count=int(os.environ.get("BATON_MODEL_STEPS", "25")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.mark.timeout(900)  # a failure's shrinking may take hypothesis up to 5 minutes
def test_authorities_follow_the_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite ledger and the Redis authority (fakeredis and the real server) give the
    core's results and show the core's state for random operation sequences, through time
    passing and Redis data loss."""
    require_redis()
    arms: list[Arm] = []
    try:
        arms.append(LedgerArm(tmp_path / "sqlite.db"))
        arms.append(FakeRedisArm(tmp_path / "fakeredis.db", monkeypatch))
        arms.append(ServerRedisArm(tmp_path / "redis.db", redis_authority))
        run_state_machine_as_test(lambda: AuthoritiesMachine(arms), settings=_settings())
    finally:
        for arm in arms:
            arm.close()
