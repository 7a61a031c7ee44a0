"""Drawing a :class:`~prefect_baton.timeline.Timeline`: a self-contained SVG (no scripts,
no external assets; hover tooltips are SVG ``<title>`` elements) and a small HTML page
around it with a table of the marks.

Hand-written with :mod:`xml.etree.ElementTree` (which escapes every text and attribute):
bands, markers and an axis need no plotting library. The elements carry stable classes and
``data-*`` attributes (``band`` with ``data-epoch``, ``data-end``; ``mark`` with
``data-kind``, ``data-epoch``, ``data-seq``) for pages that embed the picture.
"""

from __future__ import annotations

import html
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import datetime, timedelta

from prefect_baton.errors import ValidationError
from prefect_baton.models import wire_time
from prefect_baton.timeline._model import LINK_SCHEMES, MarkKind, Timeline, TimelineMark

__all__ = ["END_COLORS", "MARK_STYLES", "render_html", "render_page", "render_svg"]

#: Band fill colour by how the generation ended.
END_COLORS = {
    "active": "#2e7d32",
    "released": "#5c6bc0",
    "expired": "#9e9e9e",
    "taken_over": "#ef6c00",
    "superseded": "#8d6e63",
    "transferred": "#00838f",
    "handed_off": "#6a1b9a",
    "revoked": "#c62828",
}

#: Marker shape and colour by mark kind, with the legend's wording.
MARK_STYLES: dict[MarkKind, tuple[str, str, str]] = {
    "acquired": ("circle", "#1b5e20", "acquired"),
    "renewed": ("tick", "#212121", "renewed"),
    "taken_over": ("diamond", "#e65100", "taken over after expiry"),
    "transferred": ("triangle", "#006064", "transferred"),
    "released": ("square", "#283593", "released"),
    "expired": ("ring", "#616161", "expiry observed"),
    "handoff_created": ("triangle", "#8e24aa", "handoff created"),
    "handoff_accepted": ("triangle", "#4a148c", "handoff accepted"),
    "handoff_rejected": ("cross", "#8e24aa", "handoff rejected"),
    "handoff_expired": ("ring", "#8e24aa", "handoff expired"),
    "fence_rejected": ("cross", "#d50000", "fenced write rejected"),
    "outcome": ("star", "#2e7d32", "outcome recorded"),
}

_MARGIN = 16
_LABEL_W = 180  # the column of band labels, left of the plot
_LABEL_CHARS = 26
_BAND_H = 22
_ROW_GAP = 10
_AXIS_H = 34
_HEAD_H = 40


#: Code points XML 1.0 does not allow in a document.
_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _svg(tag: str, parent: ET.Element | None = None, **attrs: object) -> ET.Element:
    clean = {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items() if v is not None}
    if parent is None:
        return ET.Element(tag, clean)
    return ET.SubElement(parent, tag, clean)


def _title(parent: ET.Element, text: str) -> None:
    _svg("title", parent).text = text


def _ticks(start: datetime, end: datetime) -> list[datetime]:
    span = (end - start).total_seconds()
    step = 1.0
    for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        step = float(s)
        if span / s <= 8:
            break
    else:
        step = max(86400.0, span / 8)
    first = datetime.fromtimestamp((start.timestamp() // step + 1) * step, tz=start.tzinfo)
    out = []
    t = first
    while t <= end:
        out.append(t)
        t += timedelta(seconds=step)
    return out


def _marker(parent: ET.Element, shape: str, x: float, y: float, color: str) -> None:
    r = 5.0
    if shape == "circle":
        _svg("circle", parent, cx=f"{x:.1f}", cy=f"{y:.1f}", r=r, fill=color)
    elif shape == "ring":
        _svg(
            "circle",
            parent,
            cx=f"{x:.1f}",
            cy=f"{y:.1f}",
            r=r,
            fill="white",
            stroke=color,
            stroke_width=2,
        )
    elif shape == "tick":
        _svg(
            "line",
            parent,
            x1=f"{x:.1f}",
            y1=f"{y - 6:.1f}",
            x2=f"{x:.1f}",
            y2=f"{y + 6:.1f}",
            stroke=color,
            stroke_width=1.5,
        )
    elif shape == "square":
        _svg(
            "rect",
            parent,
            x=f"{x - r:.1f}",
            y=f"{y - r:.1f}",
            width=2 * r,
            height=2 * r,
            fill=color,
        )
    elif shape == "diamond":
        pts = f"{x:.1f},{y - 7:.1f} {x + 7:.1f},{y:.1f} {x:.1f},{y + 7:.1f} {x - 7:.1f},{y:.1f}"
        _svg("polygon", parent, points=pts, fill=color, stroke="white")
    elif shape == "triangle":
        pts = f"{x - 6:.1f},{y - 6:.1f} {x + 6:.1f},{y:.1f} {x - 6:.1f},{y + 6:.1f}"
        _svg("polygon", parent, points=pts, fill=color, stroke="white")
    elif shape == "cross":
        d = (
            f"M{x - 6:.1f},{y - 6:.1f} L{x + 6:.1f},{y + 6:.1f} "
            f"M{x + 6:.1f},{y - 6:.1f} L{x - 6:.1f},{y + 6:.1f}"
        )
        _svg("path", parent, d=d, stroke=color, stroke_width=3)
    else:  # star
        star: list[str] = []
        for i in range(10):
            a = math.pi / 2 + i * math.pi / 5
            rad = 7.0 if i % 2 == 0 else 3.0
            star.append(f"{x + rad * math.cos(a):.1f},{y - rad * math.sin(a):.1f}")
        _svg("polygon", parent, points=" ".join(star), fill=color, stroke="white")


def _mark_text(m: TimelineMark) -> str:
    lines = [f"{wire_time(m.at)}  {m.summary}"]
    lines += [
        f"evidence: {e.kind} {e.uri}" + (f" ({e.digest})" if e.digest else "") for e in m.evidence
    ]
    return "\n".join(lines)


def render_svg(timeline: Timeline, *, width: int = 1000) -> str:
    """The timeline as a self-contained SVG document (``str``).

    A title, a UTC time axis, one band per lease generation (``epoch N · holder``, the
    holder ``hidden`` where the caller may not see it; coloured by how it ended), the marks
    on their generation's row (marks of no generation on a row of their own below), each
    with a ``<title>`` tooltip, and a legend of the marks present.

    Args:
        timeline: from :func:`~prefect_baton.timeline.build_timeline`.
        width: the picture's width in pixels (``int``, 400 to 10,000).

    Raises:
        ValidationError: ``width`` out of range.
    """
    if isinstance(width, bool) or not isinstance(width, int) or not 400 <= width <= 10_000:
        raise ValidationError("width must be an integer from 400 to 10,000 (pixels)")
    t = timeline
    start, end = t.bounds
    if end <= start:
        end = start + timedelta(seconds=1)
    pad = (end - start) * 0.02
    start, end = start - pad, end + pad
    plot_w = width - 2 * _MARGIN - _LABEL_W
    span = (end - start).total_seconds()

    def x_of(at: datetime) -> float:
        return _MARGIN + _LABEL_W + (at - start).total_seconds() / span * plot_w

    rows = {g.epoch: i for i, g in enumerate(t.generations)}
    loose = any(m.epoch not in rows for m in t.marks)
    n_rows = len(rows) + (1 if loose else 0)
    kinds = [k for k in MARK_STYLES if any(m.kind == k for m in t.marks)]
    legend_rows = (len(kinds) + 3) // 4 + (1 if t.generations else 0)
    top = _HEAD_H + _AXIS_H
    height = top + max(n_rows, 1) * (_BAND_H + _ROW_GAP) + 16 + legend_rows * 20 + _MARGIN
    root = _svg(
        "svg",
        None,
        xmlns="http://www.w3.org/2000/svg",
        width=width,
        height=height,
        viewBox=f"0 0 {width} {height}",
        font_family="sans-serif",
        font_size=12,
    )
    root.set("class", "baton-timeline")
    _title(root, f"Lease timeline of {t.resource_type}/{t.resource_id}")
    _svg("rect", root, x=0, y=0, width=width, height=height, fill="white")
    head = _svg("text", root, x=_MARGIN, y=22, font_size=16, font_weight="bold")
    head.text = f"{t.resource_type}/{t.resource_id}"
    sub = _svg("text", root, x=_MARGIN, y=36, fill="#555")
    sub.text = (
        f"org {t.org} · seen by {t.viewer} ({t.role}) · {len(t.generations)} "
        f"generation(s), {len(t.marks)} mark(s) · times UTC"
        + (f" · since {wire_time(t.since)}" if t.since else "")
    )
    axis = _svg("g", root, stroke="#999")
    axis.set("class", "axis")
    _svg("line", axis, x1=_MARGIN + _LABEL_W, y1=top - 8, x2=width - _MARGIN, y2=top - 8)
    for tick in _ticks(start, end):
        x = x_of(tick)
        _svg(
            "line",
            axis,
            x1=f"{x:.1f}",
            y1=top - 12,
            x2=f"{x:.1f}",
            y2=top + n_rows * (_BAND_H + _ROW_GAP),
            stroke="#eee",
        )
        label = _svg(
            "text",
            axis,
            x=f"{x:.1f}",
            y=top - 14,
            text_anchor="middle",
            fill="#555",
            stroke="none",
            font_size=10,
        )
        label.text = tick.strftime("%H:%M:%S")
    if t.empty:
        empty = _svg("text", root, x=_MARGIN, y=top + 16, fill="#555")
        empty.text = "nothing recorded for this resource that you may see"

    def row_y(epoch: int | None) -> float:
        i = rows.get(epoch, len(rows)) if epoch is not None else len(rows)
        return top + i * (_BAND_H + _ROW_GAP)

    bands = _svg("g", root)
    bands.set("class", "bands")
    for g in t.generations:
        y = row_y(g.epoch)
        x0 = x_of(g.started_at)
        x1 = max(x_of(g.ended_at or g.expires_at), x0 + 2)
        band = _svg("g", bands, data_epoch=g.epoch, data_end=g.end, data_lease=g.lease_id)
        band.set("class", f"band band-{g.end}")
        who = g.holder or "hidden"
        tip = [
            f"epoch {g.epoch} · {who}",
            f"lease {g.lease_id}",
            f"{wire_time(g.started_at)} → "
            f"{wire_time(g.ended_at) if g.ended_at else 'active until ' + wire_time(g.expires_at)}",
            f"began: {g.start.replace('_', ' ')}; ended: {g.end.replace('_', ' ')}; "
            f"renewals: {g.renewals}",
        ]
        if g.execution_key:
            tip.append(f"execution key: {g.execution_key}")
        if g.purpose:
            tip.append(f"purpose: {g.purpose}")
        _title(band, "\n".join(tip))
        _svg(
            "rect",
            band,
            x=f"{x0:.1f}",
            y=f"{y:.1f}",
            width=f"{x1 - x0:.1f}",
            height=_BAND_H,
            rx=3,
            fill=END_COLORS[g.end],
            fill_opacity=0.35,
            stroke=END_COLORS[g.end],
        )
        label = _svg("text", band, x=_MARGIN, y=f"{y + 15:.1f}", fill="#111")
        text = f"epoch {g.epoch} · {who}"
        label.text = text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"
    if loose:
        y = row_y(None)
        label = _svg("text", bands, x=_MARGIN, y=f"{y + 15:.1f}", fill="#777", font_size=10)
        label.text = "other events of the resource"
    marks = _svg("g", root)
    marks.set("class", "marks")
    for m in t.marks:
        shape, color, _ = MARK_STYLES[m.kind]
        g_ = _svg("g", marks, data_kind=m.kind, data_epoch=m.epoch, data_seq=m.seq)
        g_.set("class", f"mark mark-{m.kind.replace('_', '-')}")
        _title(g_, _mark_text(m))
        _marker(g_, shape, x_of(m.at), row_y(m.epoch) + _BAND_H / 2, color)
    legend = _svg("g", root, font_size=11)
    legend.set("class", "legend")
    y = top + max(n_rows, 1) * (_BAND_H + _ROW_GAP) + 16
    if t.generations:
        x = float(_MARGIN)
        for end_ in dict.fromkeys(g.end for g in t.generations):
            _svg(
                "rect",
                legend,
                x=f"{x:.1f}",
                y=f"{y - 9:.1f}",
                width=14,
                height=10,
                fill=END_COLORS[end_],
                fill_opacity=0.35,
                stroke=END_COLORS[end_],
            )
            txt = _svg("text", legend, x=f"{x + 18:.1f}", y=f"{y:.1f}")
            txt.text = "active" if end_ == "active" else f"ended: {end_.replace('_', ' ')}"
            x += 150
        y += 20
    col_w = (width - 2 * _MARGIN) / 4
    for i, kind in enumerate(kinds):
        shape, color, words = MARK_STYLES[kind]
        x = _MARGIN + (i % 4) * col_w
        yy = y + (i // 4) * 20
        _marker(legend, shape, x + 7, yy - 4, color)
        txt = _svg("text", legend, x=f"{x + 18:.1f}", y=f"{yy:.1f}")
        txt.text = words
    # ElementTree escapes markup but passes code points XML forbids (control characters a
    # purpose or an id may hold): replace them, so the picture stays well-formed XML
    return _NOT_XML.sub("\ufffd", ET.tostring(root, encoding="unicode"))


def _link(uri: str) -> str:
    text = html.escape(uri)
    if uri.lower().startswith(LINK_SCHEMES):
        return f'<a href="{html.escape(uri, quote=True)}">{text}</a>'
    return text


def _section(t: Timeline, width: int, level: int) -> str:
    """One timeline's heading, picture and tables (HTML)."""
    e = html.escape
    gen_rows = "".join(
        f"<tr><td>{g.epoch}</td><td>{e(g.holder or 'hidden')}</td>"
        f"<td>{e(g.execution_key or '')}</td><td>{e(g.lease_id)}</td>"
        f"<td>{wire_time(g.started_at)}</td>"
        f"<td>{wire_time(g.ended_at) if g.ended_at else ''}</td><td>{e(g.start)}</td>"
        f"<td>{e(g.end)}</td><td>{g.renewals}</td></tr>"
        for g in t.generations
    )
    mark_rows = "".join(
        f"<tr><td>{wire_time(m.at)}</td><td>{'' if m.epoch is None else m.epoch}</td>"
        f"<td>{e(m.kind)}</td><td>{e(m.summary)}</td><td>"
        + "<br>".join(
            f"{e(v.kind)}: {_link(v.uri)}" + (f" <code>{e(v.digest)}</code>" if v.digest else "")
            for v in m.evidence
        )
        + "</td></tr>"
        for m in t.marks
    )
    h, h2 = f"h{level}", f"h{level + 1}"
    return (
        f"<section><{h}>Lease timeline of {e(f'{t.resource_type}/{t.resource_id}')}</{h}>"
        f"{render_svg(t, width=width)}"
        f"<{h2}>Generations</{h2}><table><tr><th>epoch</th><th>holder</th><th>execution key</th>"
        "<th>lease</th>"
        "<th>started</th><th>ended</th><th>began by</th><th>ended by</th><th>renewals</th></tr>"
        f"{gen_rows}</table>"
        f"<{h2}>Marks</{h2}><table><tr><th>time (UTC)</th><th>epoch</th><th>kind</th>"
        f"<th>what happened</th><th>evidence</th></tr>{mark_rows}</table></section>"
    )


def render_page(timelines: Sequence[Timeline], *, title: str, width: int = 1000) -> str:
    """Several timelines on one self-contained HTML page (``str``), each as
    :func:`render_html` shows one, under the page title ``title`` (plain text).

    Raises:
        ValidationError: ``width`` out of range (as :func:`render_svg`).
    """
    level = 2 if len(timelines) != 1 else 1
    head = f"<h1>{html.escape(title)}</h1>" if level == 2 else ""
    body = "".join(_section(t, width, level) for t in timelines)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
        f"</style></head><body>{head}{body}</body></html>\n"
    )


def render_html(timeline: Timeline, *, width: int = 1000) -> str:
    """A small self-contained HTML page (``str``): :func:`render_svg` inline, then a table
    of the generations and one of the marks (time, epoch, kind, what happened, evidence;
    ``http``, ``https`` and ``file`` evidence URIs as links, others as text).

    Raises:
        ValidationError: ``width`` out of range (as :func:`render_svg`).
    """
    t = timeline
    return render_page(
        [t], title=f"Lease timeline of {t.resource_type}/{t.resource_id}", width=width
    )
