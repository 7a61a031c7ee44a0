"""The end of ``baton demo``: the lease timelines of the run's busiest resources (the files
whose researcher crashed or was paused, taken over, with late writes rejected, and the
report's delivery with its handoffs), written as one HTML page into the run directory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from prefect_baton import Baton, Event
from prefect_baton._rules.events import EXPIRY_TAKEN_OVER, FENCE_REJECTED
from prefect_baton.demo.roles import FILE, REPORT
from prefect_baton.timeline import build_timeline, read_events, render_page

__all__ = ["busiest_resources", "write_demo_timelines"]

#: The resource the operator leases to deliver the report: its timeline carries the two
#: accepted handoffs of subject ``report`` and the delivery's outcome.
DELIVERY = ("delivery", REPORT)


def busiest_resources(events: Sequence[Event], *, files: int = 3) -> list[tuple[str, str]]:
    """The ``files`` busiest file resources of a demo org's ``events`` (its whole stream,
    oldest first), then the report's delivery.

    A file's score: 3 per takeover after expiry, 3 per fenced write rejected, 1 per lease
    generation; ties go to the first leased. Files with no
    generation are left out, and so is the delivery when it was never leased.
    """
    score: Counter[str] = Counter()
    subjects: set[str] = set()
    for e in events:
        subjects.add(e.subject)
        if not e.subject.startswith(f"{FILE}/"):
            continue
        if e.kind == "lease.acquired":
            score[e.subject] += 1
        elif e.kind == FENCE_REJECTED or (
            e.kind == "lease.expired" and e.payload.get("reason") == EXPIRY_TAKEN_OVER
        ):
            score[e.subject] += 3
    chosen = [tuple(s.split("/", 1)) for s, _n in score.most_common(files)]
    if "/".join(DELIVERY) in subjects:
        chosen.append(DELIVERY)
    return [(t, i) for t, i in chosen]


def write_demo_timelines(b: Baton, run_dir: Path) -> Path:
    """Write ``run_dir/timeline.html``: the timelines of :func:`busiest_resources`, as
    ``b`` may see them (give it the ``owner`` role to show every holder). Returns the path.

    Raises:
        OSError: the file cannot be written. UnavailableError: the ledger cannot be read.
    """
    events = read_events(b)
    timelines = [build_timeline(b, t, i, events=events) for t, i in busiest_resources(events)]
    path = run_dir / "timeline.html"
    path.write_text(
        render_page(timelines, title=f"prefect-baton demo: lease timelines of org {b.org}"),
        encoding="utf-8",
    )
    return path
