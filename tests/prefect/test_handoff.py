"""Handoffs between deployments served in the test, and the receiving side's rules."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prefect import flow

from prefect_baton import Baton, Handoff, NotFoundError
from prefect_baton.prefect import (
    HandoffRejected,
    accept_handoff,
    current_lease,
    handoff_to,
    lease,
    leased,
)

from .conftest import load_script

MakeBaton = Callable[..., Baton]


def test_handoff_between_two_served_deployments(
    baton_env: dict[str, str], make_baton: MakeBaton
) -> None:
    """Sender's lease moves to the receiver's run, the checkpoint resumes, old writes fail."""
    example = load_script("examples/prefect_handoff.py")
    out = example.main(report="weekly-e2e")
    sent, recv = out["sender"], out["receiver"]
    assert out["states"] == {"sender": "Completed", "receiver": "Completed"}
    assert recv["lease_owner"] == example.RECEIVER
    assert recv["lease_execution_key"] == recv["flow_run_id"]  # the receiver's run holds it
    assert recv["epoch"] == sent["epoch"] + 1
    assert recv["resumed_from"] == {"sections_done": 2, "next": "charts"}
    assert recv["sections_done"] == 3
    assert sent["stale_write_rejected"] is True
    sender = make_baton(example.SENDER)
    assert sender.leases.get(sent["lease_id"]).status == "transferred"
    assert sender.handoffs.get(sent["handoff_id"]).status == "accepted"
    assert make_baton(example.RECEIVER).leases.get(recv["lease_id"]).status == "released"


def test_rejection_before_acceptance_releases_the_carried_lease(make_baton: MakeBaton) -> None:
    """Raising HandoffRejected before accepting rejects it and releases the lease it carries
    (nobody would hold it until its TTL otherwise)."""
    sender, receiver = make_baton("sender"), make_baton("receiver")
    held = sender.leases.acquire("report", "r1", ttl_seconds=30, idempotency_key="s1")
    sent = handoff_to("receiver", "r1", checkpoint={"step": 1}, lease=held, baton=sender)

    @flow(name="baton-test-reject")
    def reject(handoff_id: str) -> str:
        with accept_handoff(handoff_id, defer=True, baton=receiver) as h:
            assert h.state == {"step": 1}
            raise HandoffRejected("cannot take reports today")
        return h.status

    assert reject(sent.handoff_id) == "rejected"
    assert sender.handoffs.get(sent.handoff_id).note == "cannot take reports today"
    assert sender.leases.get(held.lease_id).status == "released"
    assert not sender.leases.inspect("report", "r1").held


def test_accepting_a_rejected_handoff_with_a_checkpoint_names_its_status(
    make_baton: MakeBaton,
) -> None:
    """A rejected handoff no longer lets its recipient read the checkpoint it carries, so
    accept_handoff says the handoff is not pending (naming its status), not that the
    checkpoint is not found."""
    sender, receiver = make_baton("sender"), make_baton("receiver")
    sent = handoff_to("receiver", "r2", checkpoint={"step": 1}, baton=sender)
    receiver.handoffs.resolve(sent.handoff_id, "rejected")

    @flow(name="baton-test-accept-rejected")
    def accept(handoff_id: str) -> None:
        with accept_handoff(handoff_id, baton=receiver):
            pass

    with pytest.raises(NotFoundError, match=r"pending handoff \S+ not found \(rejected\)"):
        accept(sent.handoff_id)


def test_rejection_after_acceptance_logs_that_rejecting_needs_defer(
    make_baton: MakeBaton, caplog: pytest.LogCaptureFixture
) -> None:
    """HandoffRejected raised in a block that accepted on entry (no ``defer=True``) cannot
    reject: the handoff stays accepted, the run fails, and the run log says to open the
    handoff with ``defer=True`` and raise before ``h.accept()``."""
    sender, receiver = make_baton("sender"), make_baton("receiver")
    held = sender.leases.acquire("report", "r9", ttl_seconds=30, idempotency_key="s9")
    sent = handoff_to("receiver", "r9", lease=held, baton=sender)

    @flow(name="baton-test-reject-late")
    def reject_late(handoff_id: str) -> None:
        with accept_handoff(handoff_id, baton=receiver):
            raise HandoffRejected("too late")

    with caplog.at_level(logging.ERROR):
        state: Any = reject_late(sent.handoff_id, return_state=True)
    assert state.is_failed()
    assert sender.handoffs.get(sent.handoff_id).status == "accepted"
    [message] = [
        r.getMessage() for r in caplog.records if "HandoffRejected after" in r.getMessage()
    ]
    assert message == (
        f"HandoffRejected after {sent.handoff_id} was accepted: releasing its lease; the "
        "handoff stays accepted (to be able to reject it, open it with "
        "accept_handoff(handoff_id, defer=True) and raise HandoffRejected before h.accept())"
    )


def test_handoff_end_that_releases_the_lease_emits_lease_released_once(
    make_baton: MakeBaton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When accept_handoff ends a handoff unaccepted and that releases its carried lease (a
    rejection; the first read past the handoff's expiry, on entry or by a deferred
    ``accept()``), the run emits ``prefect-baton.lease.released`` once for that lease,
    naming the reason and the handoff, as the ledger records it."""
    from prefect_baton.errors import NotFoundError
    from prefect_baton.prefect import _events
    from prefect_baton.prefect._outbox import PendingEvent

    emitted: list[PendingEvent] = []  # what the run queues for Prefect, in order
    monkeypatch.setattr(_events, "later", emitted.append)
    sender, receiver = make_baton("sender"), make_baton("receiver")
    leases = {
        name: sender.leases.acquire("report", name, ttl_seconds=300, idempotency_key=name)
        for name in ("rejected", "on-entry", "deferred")
    }
    sent = {
        "rejected": handoff_to("receiver", "r", lease=leases["rejected"], baton=sender),
        "on-entry": handoff_to(
            "receiver", "r", lease=leases["on-entry"], baton=sender, expires_in_seconds=1
        ),
    }

    def wait_past(h: Handoff) -> None:
        assert h.expires_at is not None
        time.sleep(max(0.0, (h.expires_at - datetime.now(UTC)).total_seconds()) + 0.05)

    @flow(name="baton-test-handoff-release")
    def receive() -> list[str]:
        out = []
        with accept_handoff(sent["rejected"].handoff_id, defer=True, baton=receiver):
            raise HandoffRejected("not today")
        sent["deferred"] = handoff_to(
            "receiver", "r", lease=leases["deferred"], baton=sender, expires_in_seconds=1
        )
        try:
            with accept_handoff(sent["deferred"].handoff_id, defer=True, baton=receiver) as h:
                wait_past(sent["deferred"].handoff)
                h.accept()
        except NotFoundError:
            out.append("deferred expired")
        try:
            with accept_handoff(sent["on-entry"].handoff_id, baton=receiver):
                pass
        except NotFoundError:
            out.append("on-entry expired")
        return out

    assert receive() == ["deferred expired", "on-entry expired"]

    def released(lease_id: str) -> list[dict[str, Any]]:
        return [
            ev.payload
            for ev in emitted
            if ev.event == "prefect-baton.lease.released"
            and ev.resource.get("prefect-baton.lease-id") == lease_id
        ]

    for name, reason in (
        ("rejected", "handoff_rejected"),
        ("on-entry", "handoff_expired"),
        ("deferred", "handoff_expired"),
    ):
        lease = leases[name]
        (payload,) = released(lease.lease_id)
        assert (payload["reason"], payload["handoff_id"]) == (reason, sent[name].handoff_id)
        assert payload["status"] == "released"
        (recorded,) = [
            e
            for e in sender.events.list(kind="lease.released")
            if e.payload["lease_id"] == lease.lease_id
        ]
        assert recorded.payload["reason"] == reason
        assert not sender.leases.inspect("report", name).held


def test_accept_in_a_flow_then_retry_resumes(make_baton: MakeBaton) -> None:
    """A flow retry after acceptance resumes the accepted handoff and its lease."""
    sender = make_baton("sender")
    held = sender.leases.acquire("report", "r2", ttl_seconds=30, idempotency_key="s2")
    sent = handoff_to("baton-test-resume", "r2", lease=held, baton=sender)
    seen: list[tuple[str, int]] = []

    @flow(name="baton-test-resume", retries=1, retry_delay_seconds=0)
    def receive(handoff_id: str) -> list[tuple[str, int]]:
        with accept_handoff(handoff_id, baton=make_baton) as h:
            lease = current_lease()
            assert lease is h.lease
            assert lease is not None
            seen.append((lease.lease_id, lease.epoch))
            if len(seen) == 1:
                raise RuntimeError("crash after accepting")
        return seen

    first, second = receive(sent.handoff_id)
    assert first == second
    assert first[1] == held.epoch + 1
    lease: Any = make_baton("baton-test-resume").leases.get(first[0])
    assert lease.status == "released"


def test_handoff_to_needs_a_recipient(make_baton: MakeBaton) -> None:
    """Neither principal nor deployment: a validation error before anything is written."""
    from prefect_baton import ValidationError

    with pytest.raises(ValidationError):
        handoff_to(None, "x", baton=make_baton("a"))


def test_handoff_to_an_unknown_deployment_records_nothing(make_baton: MakeBaton) -> None:
    """``deployment="flow/typo"``: NotFoundError before anything is recorded; the lease stays
    with the sender and no handoff is left pending."""
    from prefect_baton import NotFoundError, ValidationError

    sender = make_baton("sender")
    held = sender.leases.acquire("report", "r3", ttl_seconds=30, idempotency_key="s3")
    with pytest.raises(NotFoundError, match="flow/typo"):
        handoff_to(None, "r3", lease=held, deployment="flow/typo", baton=sender)
    with pytest.raises(ValidationError):
        handoff_to(None, "r3", lease=held, deployment="no-slash", baton=sender)
    assert sender.as_principal("flow/typo").handoffs.inbox() == []
    assert sender.events.list(kind="handoff.created") == []
    assert sender.leases.release(held).status == "released"


def test_handoff_to_a_deployment_refusing_the_parameters_records_nothing(
    make_baton: MakeBaton,
) -> None:
    """A recipient deployment whose flow requires a parameter not given: ``handoff_to``
    raises the ValidationError ``start_recipient`` gives for Prefect's 409 before anything
    is recorded, so no handoff is left pending (``dispatch_handoffs`` would fail the same
    way forever) and the lease stays with the sender's block, which releases it at its end
    (another principal acquires it at once, not a TTL later). Parameters that fit start the
    run; with ``enforce_parameter_schema`` off Prefect takes any, and so does ``handoff_to``."""
    from prefect_baton import ValidationError

    @flow(name="baton-test-load")
    def load(handoff_id: str, table: str) -> str:
        return table

    load.to_deployment(name="db").apply()
    load.to_deployment(name="lax", enforce_parameter_schema=False).apply()
    name = "baton-test-load/db"
    sender = make_baton("sender")
    with lease("report", "r4", ttl_seconds=600, baton=sender) as held:
        with pytest.raises(ValidationError) as info:
            handoff_to(None, "r4", lease=current_lease(), deployment=name, parameters={"n": 1})
        assert held is not None
    message = info.value.message
    assert message.startswith(f"deployment {name!r} refused the parameters")
    assert "(handoff_id, n)" in message
    assert "'table' is a required property; its flow takes no parameter 'n'" in message
    everyone = make_baton("auditor", role="owner").handoffs.list(party="*", status="any")
    assert [h for h in everyone if h.subject_id == "r4"] == []
    assert sender.events.list(kind="handoff.created") == []
    assert sender.leases.get(held.lease_id).status == "released"
    make_baton("other").leases.acquire("report", "r4", ttl_seconds=30)
    fits = handoff_to(None, "r6", deployment=name, parameters={"table": "t"}, baton=sender)
    assert fits.flow_run.parameters == {"table": "t", "handoff_id": fits.handoff_id}
    lax = handoff_to(None, "r5", deployment="baton-test-load/lax", baton=sender)
    assert lax.flow_run is not None
    assert lax.flow_run.parameters == {"handoff_id": lax.handoff_id}


def test_handoff_to_a_flow_not_taking_a_parameter_records_nothing(
    make_baton: MakeBaton,
) -> None:
    """Prefect's parameter schema lets any extra name through, and the recipient run then
    crashes with ``SignatureMismatchError``, leaving the handoff pending and its lease held
    by nobody until the TTL. ``handoff_to`` refuses a name the recipient flow does not take
    (``parameters={"extra": 1}``, or ``handoff_id`` itself for a flow without it) before
    anything is recorded, and the sender's block releases its lease (a flow taking
    ``**kwargs``: the next test)."""
    from prefect_baton import ValidationError

    @flow(name="baton-test-strict")
    def strict(handoff_id: str, table: str) -> str:
        return table

    @flow(name="baton-test-no-handoff-id")
    def migrator(table: str, seconds: int = 1) -> str:
        return table

    strict.to_deployment(name="db").apply()
    migrator.to_deployment(name="db").apply()
    sender = make_baton("sender")
    refused: list[str] = []
    for subject, name, params in [
        ("x1", "baton-test-strict/db", {"table": "t", "extra": 1}),
        ("x2", "baton-test-no-handoff-id/db", {"table": "t", "seconds": 2}),
    ]:
        with lease("report", subject, ttl_seconds=600, baton=sender) as held:
            with pytest.raises(ValidationError) as info:
                handoff_to(None, subject, lease=current_lease(), deployment=name, parameters=params)
            assert held is not None
        refused.append(info.value.message)
        assert refused[-1].startswith(f"deployment {name!r} refused the parameters")
        assert sender.leases.get(held.lease_id).status == "released"
        make_baton("other").leases.acquire("report", subject, ttl_seconds=30)
    assert "takes no parameter 'extra'" in refused[0]
    assert "must take a 'handoff_id'" not in refused[0]
    assert "takes no parameter 'handoff_id'" in refused[1]
    assert "must take a 'handoff_id' parameter" in refused[1]
    everyone = make_baton("auditor", role="owner").handoffs.list(party="*", status="any")
    assert [h for h in everyone if h.subject_id in ("x1", "x2")] == []
    assert sender.events.list(kind="handoff.created") == []


def test_handoff_to_a_flow_taking_kwargs_packs_the_extra_names_into_them(
    make_baton: MakeBaton,
) -> None:
    """Prefect calls a flow with the names of its signature only: ``**kwargs`` is one
    parameter named like it holding a dict, and an extra name at the top crashes the run
    with ``SignatureMismatchError`` (the handoff pending, its lease held by nobody).
    ``handoff_to`` packs the names the flow does not declare into that parameter, merged
    with a dict given under its name, so the recipient's function can be called with the
    run's parameters as Prefect's engine calls it (``parameters_to_args_kwargs``). The
    same name given both ways with different values is refused before anything is
    recorded."""
    from prefect.utilities.callables import parameters_to_args_kwargs

    from prefect_baton import ValidationError

    @flow(name="baton-test-kwargs")
    def r_kw(handoff_id: str, **kwargs: Any) -> dict[str, Any]:
        return {"handoff_id": handoff_id, **kwargs}

    r_kw.to_deployment(name="db").apply()
    sender = make_baton("sender")
    with lease("report", "x3", ttl_seconds=600, baton=sender) as held:
        sent = handoff_to(
            None,
            "x3",
            lease=current_lease(),
            deployment="baton-test-kwargs/db",
            parameters={"report": "r", "extra": 1, "kwargs": {"more": [2]}},
        )
    assert held is not None
    assert sent.handoff.parameters == {"report": "r", "extra": 1, "kwargs": {"more": [2]}}
    received = sent.flow_run.parameters
    assert received == {
        "handoff_id": sent.handoff_id,
        "kwargs": {"more": [2], "report": "r", "extra": 1},
    }
    args, kwargs = parameters_to_args_kwargs(r_kw.fn, received)
    assert r_kw.fn(*args, **kwargs) == {
        "handoff_id": sent.handoff_id,
        "report": "r",
        "extra": 1,
        "more": [2],
    }
    with pytest.raises(ValidationError) as info:
        handoff_to(
            None,
            "x4",
            deployment="baton-test-kwargs/db",
            parameters={"report": "r", "kwargs": {"report": "s"}},
            baton=sender,
        )
    assert "'report' are given both by name and in 'kwargs'" in info.value.message
    everyone = make_baton("auditor", role="owner").handoffs.list(party="*", status="any")
    assert [h.subject_id for h in everyone] == ["x3"]


def test_handoff_to_with_the_prefect_api_unreachable_records_nothing(
    make_baton: MakeBaton,
) -> None:
    """With ``PREFECT_API_URL`` on a closed port, ``handoff_to(..., deployment=...)`` and
    ``start_recipient`` raise UnavailableError naming the URL (not httpx's ``ConnectError``),
    and nothing is recorded: the lease stays with the sender."""
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_baton import BatonError, UnavailableError
    from prefect_baton.prefect import start_recipient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    sender = make_baton("sender")
    held = sender.leases.acquire("report", "u1", ttl_seconds=30, idempotency_key="u1")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        with pytest.raises(UnavailableError) as info:
            handoff_to(None, "u1", lease=held, deployment="some/where", baton=sender)
        with pytest.raises(UnavailableError) as started:
            start_recipient("hoff_x", "some/where")
    for error in (info.value, started.value):
        assert isinstance(error, BatonError)
        assert error.code == "UNAVAILABLE"
        assert f"the Prefect API at {url} is unavailable (ConnectError" in error.message
    assert sender.as_principal("some/where").handoffs.inbox() == []
    assert sender.events.list(kind="handoff.created") == []
    assert sender.leases.release(held).status == "released"


def test_a_5xx_from_the_prefect_api_is_unavailable_a_4xx_is_not() -> None:
    """``raise_if_unavailable``: a 5xx answer is UnavailableError, a 4xx is left alone."""
    import httpx

    from prefect_baton import UnavailableError
    from prefect_baton.prefect._handoff import raise_if_unavailable

    def status_error(code: int) -> httpx.HTTPStatusError:
        request = httpx.Request("GET", "http://prefect.invalid/api/x")
        response = httpx.Response(code, request=request)
        return httpx.HTTPStatusError("bad", request=request, response=response)

    with pytest.raises(UnavailableError, match=r"\(it answered HTTP 503\)$"):
        raise_if_unavailable(status_error(503))
    raise_if_unavailable(status_error(404))
    raise_if_unavailable(ValueError("not an HTTP error"))


def test_start_recipient_of_an_unknown_deployment_says_so(make_baton: MakeBaton) -> None:
    """``start_recipient`` for a deployment Prefect does not know: the same NotFoundError
    message as ``handoff_to`` gives (not Prefect's ``ObjectNotFound: None``)."""
    from prefect_baton import NotFoundError
    from prefect_baton.prefect import start_recipient

    with pytest.raises(NotFoundError, match=r"^deployment 'someone/else' not found$") as info:
        start_recipient("hoff_x", "someone/else")
    assert info.value.code == "NOT_FOUND"


def test_accepting_a_handoff_of_other_principals_names_the_runs_principal(
    make_baton: MakeBaton,
) -> None:
    """A handoff neither sent nor received by the run's principal stays NOT_FOUND (nothing of
    it is shown), and the message names the principal the run acted as."""
    from prefect_baton import NotFoundError

    sent = make_baton("sender").handoffs.create("reviewer/reviewer", "r9", message="secret")

    @flow(name="baton-test-wrong-principal")
    def receive(handoff_id: str) -> None:
        with accept_handoff(handoff_id, baton=make_baton, principal="writer/writer"):
            pass

    with pytest.raises(NotFoundError) as info:
        receive(sent.handoff_id)
    msg = str(info.value)
    assert info.value.code == "NOT_FOUND"
    assert f"handoff {sent.handoff_id} not found for principal 'writer/writer'" in msg
    assert "BATON_PREFECT_PRINCIPAL" in msg
    for detail in ("reviewer/reviewer", "'sender'", "secret"):  # nothing of the handoff
        assert detail not in msg
    assert make_baton("sender").handoffs.get(sent.handoff_id).status == "pending"


def test_async_handoff_and_accept(make_baton: MakeBaton) -> None:
    """``ahandoff_to`` and ``async with accept_handoff`` move the lease in async flows."""
    import asyncio

    from prefect_baton.prefect import ahandoff_to

    box: dict[str, Any] = {}

    @flow(name="baton-test-async-sender")
    @leased("report", "async-r", ttl_seconds=30, baton=make_baton)
    async def send() -> str:
        sent = await ahandoff_to(
            "baton-test-async-receiver", "async-r", checkpoint={"n": 1}, lease=current_lease()
        )
        return sent.handoff_id

    @flow(name="baton-test-async-receiver")
    async def receive(handoff_id: str) -> tuple[int, int]:
        async with accept_handoff(handoff_id, baton=make_baton) as h:
            assert h.lease is not None
            assert current_lease() is h.lease
            box["state"] = h.state
            return h.lease.epoch, h.lease.renewals

    handoff_id = asyncio.run(send())
    epoch, _ = asyncio.run(receive(handoff_id))
    assert epoch == 2
    assert box["state"] == {"n": 1}
    assert make_baton("baton-test-async-receiver").handoffs.get(handoff_id).status == "accepted"


def _generations(make_baton: MakeBaton, resource_id: str) -> list[tuple[int, str]]:
    """``(epoch, status)`` of every generation of ``report/<resource_id>``, oldest first."""
    admin = make_baton("admin", role="owner")
    rows = admin.leases.list(resource_type="report", owner="*", include_ended=True)
    return sorted((g.epoch, g.status) for g in rows if g.resource_id == resource_id)


@pytest.mark.parametrize("use", ["decorator", "block"])
def test_retry_of_a_sender_whose_handoff_was_accepted_ends_handed_off(
    make_baton: MakeBaton, use: str
) -> None:
    """A Prefect retry of a run whose lease was handed off and accepted does not take the
    resource again nor run the body: it ends ``Completed(name="HandedOff")``, naming the
    resource, the handoff and its recipient (``@leased`` and ``with lease(...)`` alike)."""
    reviewer = make_baton("reviewer")
    runs: list[int] = []
    sent: list[str] = []

    def body(report: str) -> None:
        held = current_lease()
        assert held is not None
        runs.append(held.epoch)
        handoff = handoff_to("reviewer", report, checkpoint={"sections_done": 2}, lease=held)
        sent.append(handoff.handoff_id)
        # the recipient accepts (and finishes) before the sender's retry
        accepted = reviewer.handoffs.resolve(handoff.handoff_id, "accepted")
        assert accepted.lease is not None
        reviewer.leases.release(accepted.lease)
        raise RuntimeError("crash after handing off")

    if use == "decorator":

        @flow(name="baton-test-handed-off", retries=1, retry_delay_seconds=0)
        @leased("report", "{report}", ttl_seconds=30, baton=make_baton)
        def writer(report: str) -> None:
            body(report)

    else:

        @flow(name="baton-test-handed-off", retries=1, retry_delay_seconds=0)
        def writer(report: str) -> Any:
            block = lease("report", report, ttl_seconds=30, baton=make_baton)
            with block as held:
                if held is None:
                    return block.skip_state
                body(report)
            return None

    state: Any = writer("q3", return_state=True)
    assert runs == [1]  # the retry did not run the body
    assert state.is_completed()
    assert state.name == "HandedOff"
    (handoff_id,) = sent
    for part in ("report/q3", "transferred", handoff_id, "to reviewer"):
        assert part in state.message
    # no generation after the recipient's: the sender's, transferred; the reviewer's, released
    assert _generations(make_baton, "q3") == [(1, "transferred"), (2, "released")]
    assert not reviewer.leases.inspect("report", "q3").held


def test_handoffs_create_with_the_current_lease_hands_it_off(make_baton: MakeBaton) -> None:
    """``handoffs.create(..., lease=current_lease())`` in a ``@leased`` flow gives the lease
    to the handoff as :func:`handoff_to` does: the flow ends without releasing it, and the
    recipient accepts it afterwards with the next epoch."""
    from prefect_baton.prefect import current_baton

    @flow(name="baton-test-create-sender")
    @leased("report", "create-r", ttl_seconds=30, baton=make_baton)
    def send() -> tuple[str, int]:
        b, held = current_baton(), current_lease()
        assert b is not None
        assert held is not None
        h = b.handoffs.create("reviewer", "create-r", lease=held)
        return h.handoff_id, held.epoch

    handoff_id, epoch = send()
    reviewer = make_baton("reviewer")
    assert reviewer.leases.inspect("report", "create-r").held
    accepted = reviewer.handoffs.resolve(handoff_id, "accepted")
    assert accepted.lease is not None
    assert (accepted.lease.owner, accepted.lease.epoch) == ("reviewer", epoch + 1)
    assert _generations(make_baton, "create-r") == [(1, "transferred"), (2, "active")]


def test_retry_of_a_sender_whose_handoff_was_rejected_sends_a_new_one(
    make_baton: MakeBaton,
) -> None:
    """A rejection released the carried lease, so the sender's Prefect retry acquires the
    resource anew (next epoch) and runs the body again: its ``handoff_to`` with the default
    key sends a new handoff carrying the new lease, instead of failing with
    ``IDEMPOTENCY_MISMATCH`` against the rejected one."""
    reviewer = make_baton("reviewer")
    sent: list[Any] = []

    @flow(name="baton-test-rejected-retry", retries=1, retry_delay_seconds=0)
    @leased("report", "{report}", ttl_seconds=30, baton=make_baton)
    def writer(report: str) -> None:
        held = current_lease()
        assert held is not None
        handoff = handoff_to("reviewer", report, checkpoint={"sections_done": 2}, lease=held)
        sent.append((handoff.handoff_id, handoff.handoff.lease_id, held.epoch))
        if len(sent) == 1:
            rejected = reviewer.handoffs.resolve(handoff.handoff_id, "rejected", "not today")
            assert rejected.released_lease is not None
            raise RuntimeError("crash after the rejection")

    state: Any = writer("q4", return_state=True)
    assert state.is_completed(), state
    (first, lease1, epoch1), (second, lease2, epoch2) = sent
    assert second != first
    assert lease2 != lease1
    assert epoch2 == epoch1 + 1
    assert reviewer.handoffs.get(first).status == "rejected"
    pending = reviewer.handoffs.get(second)
    assert pending.status == "pending"
    assert pending.lease_id == lease2
    accepted = reviewer.handoffs.resolve(second, "accepted")
    assert accepted.lease is not None
    assert accepted.lease.epoch == epoch2 + 1


def test_retry_of_a_sender_whose_handoff_is_pending_replays_it(make_baton: MakeBaton) -> None:
    """While the handoff is pending, the retry replays the lease and the body, and the body's
    ``handoff_to`` (checkpoint given as a dict) replays the same handoff: one handoff, one
    lease, and the recipient accepts it with the next epoch."""
    reviewer = make_baton("reviewer")
    sent: list[Any] = []

    @flow(name="baton-test-pending-retry", retries=1, retry_delay_seconds=0)
    @leased("report", "{report}", ttl_seconds=30, baton=make_baton)
    def writer(report: str) -> None:
        held = current_lease()
        assert held is not None
        handoff = handoff_to("reviewer", report, checkpoint={"sections_done": 2}, lease=held)
        sent.append((handoff.handoff_id, handoff.handoff.replayed, held.epoch))
        if len(sent) == 1:
            raise RuntimeError("crash with the handoff pending")

    state: Any = writer("q5", return_state=True)
    assert state.is_completed(), state
    (first, replayed1, epoch1), (second, replayed2, epoch2) = sent
    assert second == first
    assert (replayed1, replayed2) == (False, True)
    assert epoch2 == epoch1
    accepted = reviewer.handoffs.resolve(first, "accepted")
    assert accepted.lease is not None
    assert accepted.lease.epoch == epoch1 + 1


def test_the_default_handoff_key_of_long_names_stays_an_id() -> None:
    """A recipient and subject long enough to make the default key longer than an id may be
    (256 characters) give a key of the same execution that ends with the SHA-256 of the rest:
    still one key per (recipient, subject, lease), accepted as an idempotency key."""
    from prefect_baton._rules.validation import validate_id
    from prefect_baton.prefect._handoff import default_handoff_key

    run = "5ccac60a-f71c-4b7c-97af-928d3d539bf9"
    short = default_handoff_key(run, "reviewer", "q1", None)
    assert short == f"{run}:handoff:reviewer:q1"
    long_a = default_handoff_key(run, "r" * 200, "s" * 200, None)
    long_b = default_handoff_key(run, "r" * 200, "s" * 199, None)
    assert long_a.startswith(f"{run}:handoff:sha256:")
    assert long_a != long_b
    assert validate_id("idempotency_key", long_a) == long_a


def test_retry_of_a_recipient_whose_resource_was_taken_fails_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry of the run that accepted a handoff, after its lease lapsed and another
    principal took the resource, fails with one ``ConflictError`` line naming the resource
    and the holder's expiry (as ``@leased`` does): no traceback, and run as a deployment's
    flow run no "Engine execution exited with unexpected exception"."""
    from prefect.flow_engine import run_flow

    from prefect_baton import ConflictError
    from prefect_baton.testing import ManualClock, memory_baton

    clock = ManualClock()
    runs: list[int] = []
    with memory_baton(org="test", principal="admin", role="owner", clock=clock) as admin:
        sender = admin.as_principal("sender")
        held = sender.leases.acquire("report", "r9", ttl_seconds=10, idempotency_key="s9")
        sent = handoff_to("baton-test-taken", "r9", lease=held, baton=sender)

        @flow(name="baton-test-taken", retries=1, retry_delay_seconds=0)
        def receive(handoff_id: str) -> None:
            with accept_handoff(handoff_id, baton=admin.as_principal):
                runs.append(1)
                clock.advance(11)  # the lease lapses and someone else takes the resource
                admin.as_principal("someone").leases.acquire("report", "r9", ttl_seconds=60)
                raise RuntimeError("crash after accepting")

        engine_logger = logging.getLogger("prefect.flow_runs")
        with (
            caplog.at_level(logging.INFO, logger="prefect.flow_runs"),
            pytest.raises(ConflictError) as info,
        ):
            run_flow(
                receive, parameters={"handoff_id": sent.handoff_id}, error_logger=engine_logger
            )
    assert runs == [1]
    message = info.value.message
    assert message.startswith("report/r9: Resource is leased by another principal until ")
    assert message.endswith(f"(accepting handoff {sent.handoff_id})")
    assert info.value.expires_at is not None
    text = [r.getMessage() for r in caplog.records]
    assert any("Finished in state Failed" in m and "report/r9" in m for m in text), text
    assert not any(m == "Engine execution exited with unexpected exception" for m in text), text
    assert all(r.exc_info is None for r in caplog.records if "report/r9" in r.getMessage())
