"""The lease timeline of a resource (issue 17): its generations as bands along time, with
renewals, takeovers after expiry, transfers and handoffs, fenced writes rejected and
outcomes with their evidence, as one caller may see them.

The stable API (also what the live page ``/ui`` embeds)::

    from prefect_baton.timeline import build_timeline, render_svg, render_html

    tl = build_timeline(baton, "file", "report.py")   # a Timeline (pydantic model)
    svg = render_svg(tl, width=1000)                   # self-contained SVG text
    page = render_html(tl)                             # SVG + tables, one HTML page
    many = render_page([tl, tl2], title="busiest")     # several on one page
    write_timeline(tl, Path("timeline.svg"))           # by the file's extension

Everything is read through the public client (:class:`~prefect_baton.Baton`), so it works on
every arm and respects organization isolation and roles.
"""

from __future__ import annotations

from pathlib import Path

from prefect_baton.errors import ValidationError
from prefect_baton.timeline._model import (
    GenerationEnd,
    GenerationStart,
    MarkKind,
    Timeline,
    TimelineGeneration,
    TimelineMark,
    build_timeline,
    timeline_from_events,
)
from prefect_baton.timeline._render import (
    END_COLORS,
    MARK_STYLES,
    render_html,
    render_page,
    render_svg,
)

__all__ = [
    "END_COLORS",
    "FORMATS",
    "MARK_STYLES",
    "GenerationEnd",
    "GenerationStart",
    "MarkKind",
    "Timeline",
    "TimelineGeneration",
    "TimelineMark",
    "build_timeline",
    "render_html",
    "render_page",
    "render_svg",
    "timeline_format",
    "timeline_from_events",
    "write_timeline",
]

FORMATS = (".svg", ".html")
"""The file extensions :func:`write_timeline` writes."""


def timeline_format(path: Path) -> str:
    """The format of a timeline file named ``path``: ``.svg`` or ``.html`` (any case).

    Raises:
        ValidationError: any other extension; ``.png`` is refused because rendering SVG to
            PNG needs a library with a system dependency (libcairo), which this package
            does not require: convert the SVG with a tool of your choice.
    """
    suffix = path.suffix.lower()
    if suffix == ".png":
        raise ValidationError(
            "PNG output is not offered (rendering SVG to PNG needs a system library such as "
            "libcairo); write .svg or .html and convert it if you need a PNG"
        )
    if suffix not in FORMATS:
        raise ValidationError(
            f"unsupported timeline file {path.name!r}: the extension must be .svg or .html"
        )
    return suffix


def write_timeline(timeline: Timeline, path: Path, *, width: int = 1000) -> Path:
    """Write ``timeline`` to ``path`` as SVG or HTML, by its extension (parent directories
    are created); returns the path written.

    Raises:
        ValidationError: an extension other than ``.svg`` / ``.html``
            (:func:`timeline_format`), or a bad ``width``.
        OSError: the file cannot be written.
    """
    fmt = timeline_format(path)
    text = (
        render_svg(timeline, width=width) if fmt == ".svg" else render_html(timeline, width=width)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
