"""The four roles of the seed scenario, as plain functions over a :class:`~prefect_baton.Baton`.

Each role runs in its own OS process in ``baton demo`` and inside a Prefect flow in the
Prefect variant; the functions themselves do no process management.

- researcher: leases each file (short TTL), resumes from the shared checkpoint, analyses the
  file chunk by chunk saving fenced checkpoints, and records a fenced outcome with evidence;
- writer: compiles a report from the researchers' outcomes and checkpoints (reusing the
  research, never repeating it) and hands it off to the operator;
- operator: accepts, leases ``delivery``, writes the report file, records the delivery
  outcome and hands off to the reviewer;
- reviewer: accepts, recomputes every file's sha256 against the evidence and records the
  verdict.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from prefect_baton import (
    Baton,
    ConflictError,
    Handoff,
    LeaseKeeper,
    LeaseLostError,
    NotFoundError,
    StaleFenceError,
)
from prefect_baton._rules.validation import TTL_MIN_SECONDS
from prefect_baton.demo import analysis

FILE = "file"
ANALYSIS = "analysis"
REPORT = "report"

FaultHook = Callable[[str, LeaseKeeper, int], None]


@dataclass
class ResearcherStats:
    """What one researcher saw (counts)."""

    worker: str
    completed: int = 0
    resumed: int = 0
    stale_rejected: int = 0
    conflicts: int = 0
    lost: int = 0
    skipped_done: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The principal the researchers hand their analyses to (the writer reads them).
WRITER = "writer"


def _done(b: Baton, file_id: str) -> bool:
    return any(o.status == "succeeded" for o in b.outcomes.list(file_id))


def _analyse(
    b: Baton,
    file_id: str,
    path: Path,
    held: LeaseKeeper,
    stats: ResearcherStats,
    *,
    lines_per_chunk: int,
    work_seconds: float,
    started: int,
    fault: FaultHook | None,
) -> None:
    ck = b.checkpoints.get(file_id, ANALYSIS)
    state: dict[str, Any] = dict(ck.state) if ck is not None else {}
    digests: list[str] = list(state.get("chunk_digests", []))
    lines = int(state.get("lines", 0))
    done_chunks = int(state.get("chunks_done", 0))
    if done_chunks or state.get("done"):
        stats.resumed += 1
    result = state.get("result") if state.get("done") else None
    try:
        if result is None:
            for chunk in analysis.chunks(path, lines_per_chunk):
                if chunk.index < done_chunks:
                    continue
                time.sleep(work_seconds)
                digests.append(chunk.digest)
                lines += chunk.line_count
                ck = b.checkpoints.save(
                    file_id,
                    ANALYSIS,
                    {
                        "file": file_id,
                        "chunks_done": chunk.index + 1,
                        "total_chunks": chunk.total,
                        "chunk_digests": digests,
                        "lines": lines,
                    },
                    fence=held,
                )
                if fault is not None:
                    fault(file_id, held, started)
            result = analysis.finish(path, digests, lines)
            ck = b.checkpoints.save(
                file_id,
                ANALYSIS,
                {
                    "file": file_id,
                    "chunks_done": len(digests),
                    "chunk_digests": digests,
                    "lines": lines,
                    "done": True,
                    "result": result,
                },
                fence=held,
            )
        assert ck is not None
        # The writer compiles the report from this checkpoint: a handoff carrying it is
        # what lets the writer read it (only the writer of a checkpoint, the recipient of a
        # handoff carrying it, and owner/admin may). Keyed, so a redo replays it.
        b.handoffs.create(
            WRITER,
            file_id,
            checkpoint_id=ck.checkpoint_id,
            message=f"analysis of {file_id}",
            idempotency_key=f"analysis:{file_id}",
        )
        b.outcomes.record(
            file_id,
            "succeeded",
            evidence=[
                {"kind": "file", "uri": path.resolve().as_uri(), "digest": result["sha256"]},
                {
                    "kind": "checkpoint",
                    "uri": f"baton:checkpoint/{ck.checkpoint_id}",
                    "note": f"{result['lines']} lines, {len(result['definitions'])} definitions",
                },
            ],
            fence=held,
            checkpoint_id=ck.checkpoint_id,
        )
        stats.completed += 1
    except StaleFenceError:
        stats.stale_rejected += 1
        raise


def researcher(
    b: Baton,
    files: dict[str, Path],
    *,
    worker: str,
    ttl_seconds: int = TTL_MIN_SECONDS,
    lines_per_chunk: int = 60,
    work_seconds: float = 0.02,
    offset: int = 0,
    fault: FaultHook | None = None,
) -> ResearcherStats:
    """Analyse every file that has no succeeded outcome yet, leasing each one first.

    Args:
        b: the client (principal shared by all researchers, e.g. ``researcher``).
        files: resource id -> path (see :func:`analysis.list_files`).
        worker: this worker's name; execution keys are ``<worker>:<random>``.
        ttl_seconds: lease TTL in seconds (``TTL_MIN_SECONDS`` to ``TTL_MAX_SECONDS``).
        lines_per_chunk: checkpoint granularity.
        work_seconds: pause per chunk (seconds), so a file takes long enough to be caught
            mid-way by a crash. offset: where in the file list this worker starts.
        fault: called after every checkpoint save with ``(file_id, lease, files_started)``;
            the demo uses it to crash or pause a worker mid-file.

    Returns:
        The worker's :class:`ResearcherStats`.
    """
    stats = ResearcherStats(worker=worker)
    order = list(files)
    if order:
        k = offset % len(order)
        order = order[k:] + order[:k]
    pending = list(order)
    started = 0
    while pending:
        wait_until: list[float] = []
        for file_id in list(pending):
            if _done(b, file_id):
                pending.remove(file_id)
                continue
            key = f"{worker}:{uuid.uuid4().hex[:8]}"
            try:
                with b.lease(
                    FILE,
                    file_id,
                    ttl_seconds=ttl_seconds,
                    idempotency_key=key,
                    purpose=f"analyse {file_id}",
                ) as held:
                    if _done(b, file_id):
                        stats.skipped_done += 1
                    else:
                        started += 1
                        _analyse(
                            b,
                            file_id,
                            files[file_id],
                            held,
                            stats,
                            lines_per_chunk=lines_per_chunk,
                            work_seconds=work_seconds,
                            started=started,
                            fault=fault,
                        )
                pending.remove(file_id)
            except ConflictError as exc:
                stats.conflicts += 1
                if exc.expires_at is not None:
                    wait_until.append(exc.expires_at.timestamp())
            except (LeaseLostError, StaleFenceError):
                stats.lost += 1
        if pending:
            soonest = min(wait_until) if wait_until else time.time() + 0.5
            time.sleep(min(max(soonest - time.time() + 0.05, 0.1), float(ttl_seconds)))
    return stats


def wait_for_handoff(
    b: Baton, subject_id: str, *, timeout_seconds: float, poll_seconds: float = 0.2
) -> Handoff:
    """Poll the inbox until a handoff about ``subject_id`` arrives.

    Raises:
        TimeoutError: none arrived within ``timeout_seconds``.
    """
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        for h in b.handoffs.inbox():
            if h.subject_id == subject_id:
                return h
        time.sleep(poll_seconds)
    raise TimeoutError(f"no handoff about {subject_id!r} for {b.principal} in {timeout_seconds} s")


def writer(
    b: Baton,
    files: dict[str, Path],
    *,
    to_principal: str = "operator",
    researcher_principal: str = "researcher",
    ttl_seconds: int = 30,
) -> Handoff:
    """Compile the report from the outcomes and the researchers' checkpoints and hand it off.

    Returns the created :class:`Handoff` (idempotent: a retried writer replays it).
    """
    rows: list[dict[str, Any]] = []
    for file_id in files:
        outcomes = [o for o in b.outcomes.list(file_id) if o.status == "succeeded"]
        ck = b.checkpoints.get(file_id, ANALYSIS, principal=researcher_principal)
        result = ck.state.get("result", {}) if ck is not None else {}
        rows.append(
            {
                "file": file_id,
                "sha256": result.get("sha256"),
                "lines": result.get("lines"),
                "definitions": len(result.get("definitions", [])),
                "outcome_ids": [o.outcome_id for o in outcomes],
            }
        )
    report = {
        "files": rows,
        "totals": {
            "files": len(rows),
            "lines": sum(r["lines"] or 0 for r in rows),
            "definitions": sum(r["definitions"] for r in rows),
        },
    }
    with b.lease(REPORT, "draft", ttl_seconds=ttl_seconds, purpose="compile report") as held:
        ck = b.checkpoints.save(REPORT, "draft", report, fence=held)
        sent = b.handoffs.create(
            to_principal,
            REPORT,
            checkpoint_id=ck.checkpoint_id,
            message=f"Report compiled from {len(rows)} files; please deliver it.",
            idempotency_key=f"report-draft-v{ck.version}",
        )
    _accept_analyses(b, files, researcher_principal)
    return sent


def _accept_analyses(b: Baton, files: dict[str, Path], researcher_principal: str) -> None:
    """Accept the researchers' per-file handoffs (each carries a file's analysis
    checkpoint, which the report was just compiled from), so none is left pending in the
    writer's inbox; the writer keeps reading those checkpoints (the recipient of an
    accepted handoff carrying one may; of a rejected or expired one, not). One resolved
    meanwhile (a retried writer) is passed over."""
    analysed: list[Handoff] = []
    cursor: str | None = None
    while True:
        page = b.handoffs.inbox(limit=1000, cursor=cursor)
        analysed += [
            h for h in page if h.from_principal == researcher_principal and h.subject_id in files
        ]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    for h in analysed:
        try:
            b.handoffs.resolve(h.handoff_id, "accepted", note="compiled into the report")
        except NotFoundError:
            pass


def operator(
    b: Baton,
    out_dir: Path,
    *,
    to_principal: str = "reviewer",
    ttl_seconds: int = 30,
    timeout_seconds: float = 300.0,
) -> Path:
    """Accept the writer's handoff, lease ``delivery``, write the report, hand off to review.

    Returns the path of the written report.
    """
    h = wait_for_handoff(b, REPORT, timeout_seconds=timeout_seconds)
    b.handoffs.resolve(h.handoff_id, "accepted", note="delivering the report")
    assert h.checkpoint_id is not None
    with b.lease("delivery", REPORT, ttl_seconds=ttl_seconds, purpose="write report") as held:
        draft = b.checkpoints.get_by_id(h.checkpoint_id)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "report.json"
        path.write_text(json.dumps(draft.state, indent=2, sort_keys=True) + "\n")
        digest = analysis.sha256_file(path)
        outcome = b.outcomes.record(
            REPORT,
            "succeeded",
            evidence=[{"kind": "file", "uri": path.resolve().as_uri(), "digest": digest}],
            fence=held,
            handoff_id=h.handoff_id,
            checkpoint_id=draft.checkpoint_id,
        )
        delivery = b.checkpoints.save(
            REPORT,
            "delivery",
            {
                "report_path": str(path.resolve()),
                "sha256": digest,
                "draft_checkpoint_id": draft.checkpoint_id,
                "outcome_id": outcome.outcome_id,
            },
            fence=held,
        )
        b.handoffs.create(
            to_principal,
            REPORT,
            checkpoint_id=delivery.checkpoint_id,
            message="Report delivered; please verify it against the evidence.",
            idempotency_key=f"report-delivery-v{delivery.version}",
        )
    return path


def _path_of(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


def reviewer(b: Baton, files: dict[str, Path], *, timeout_seconds: float = 300.0) -> dict[str, Any]:
    """Accept the operator's handoff, recompute every file's sha256 against the evidence,
    and record the verdict as the outcome of subject ``review``.

    Returns ``{"verdict": "accepted"|"rejected", "checked": n, "problems": [...]}``.
    """
    h = wait_for_handoff(b, REPORT, timeout_seconds=timeout_seconds)
    b.handoffs.resolve(h.handoff_id, "accepted", note="reviewing")
    assert h.checkpoint_id is not None
    delivery = b.checkpoints.get_by_id(h.checkpoint_id)
    problems: list[str] = []
    checked = 0
    for file_id in files:
        succeeded = [o for o in b.outcomes.list(file_id) if o.status == "succeeded"]
        if len(succeeded) != 1:
            problems.append(f"{file_id}: {len(succeeded)} succeeded outcomes")
            continue
        for ev in succeeded[0].evidence:
            if ev.kind == "file":
                checked += 1
                actual = analysis.sha256_file(_path_of(ev.uri))
                if actual != ev.digest:
                    problems.append(f"{file_id}: sha256 {actual} != evidence {ev.digest}")
    report_path = Path(delivery.state["report_path"])
    if not report_path.exists() or analysis.sha256_file(report_path) != delivery.state["sha256"]:
        problems.append("report file does not match the delivery evidence")
    verdict = "accepted" if not problems else "rejected"
    b.outcomes.record(
        "review",
        "succeeded" if verdict == "accepted" else "failed",
        evidence=[
            {
                "kind": "verdict",
                "uri": f"baton:verdict/{verdict}",
                "note": "; ".join(problems)[:4000] or None,
            },
            {
                "kind": "file",
                "uri": report_path.resolve().as_uri(),
                "digest": delivery.state["sha256"],
            },
        ],
        handoff_id=h.handoff_id,
        checkpoint_id=delivery.checkpoint_id,
    )
    return {"verdict": verdict, "checked": checked, "problems": problems}
