"""The lease timeline of a resource (issue 17): its generations as bands along time, with
renewals, takeovers after expiry, transfers and handoffs, fenced writes rejected and
outcomes with their evidence, as one caller may see them.

The stable API (also what the live page ``/ui`` embeds)::

    from prefect_baton.timeline import build_timeline, render_svg, render_html

    tl = build_timeline(baton, "file", "report.py")   # a Timeline (pydantic model)
    svg = render_svg(tl, width=1000)                   # self-contained SVG text
    page = render_html(tl)                             # SVG + tables, one HTML page
    many = render_page([tl, tl2], title="busiest")     # several on one page
    write_timeline(tl, Path("timeline.svg"))           # .svg/.html/.png, by the extension

Everything is read through the public client (:class:`~prefect_baton.Baton`), so it works on
every arm and respects organization isolation and roles.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from prefect_baton.errors import ValidationError
from prefect_baton.timeline import _build, _model, _render
from prefect_baton.timeline._build import *  # noqa: F403 (each module's __all__)
from prefect_baton.timeline._model import *  # noqa: F403
from prefect_baton.timeline._render import *  # noqa: F403

__all__ = ["FORMATS", "check_timeline_path", "render_png", "timeline_format", "write_timeline"]
__all__ += _build.__all__
__all__ += _model.__all__
__all__ += _render.__all__

FORMATS = (".svg", ".html", ".png")
"""The file extensions :func:`write_timeline` writes (``.png`` needs the ``png`` extra)."""


def timeline_format(path: Path) -> str:
    """The format of a timeline file named ``path``: ``.svg``, ``.html`` or ``.png``
    (any case).

    Raises:
        ValidationError: any other extension.
    """
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValidationError(
            f"unsupported timeline file {path.name!r}: the extension must be .svg, .html or .png"
        )
    return suffix


def check_timeline_path(path: Path) -> str:
    """Check that a timeline can be written to ``path`` (``Path``) before it is drawn: not an
    existing directory, a supported extension (:func:`timeline_format`) and an existing
    parent directory (missing directories are not created). Returns the format, ``.svg``,
    ``.html`` or ``.png``.

    Raises:
        ValidationError: ``path`` is an existing directory (the message says so, whatever
            its name), another extension, or the parent directory is missing or is not a
            directory (the message names the path).
    """
    if path.is_dir():
        raise ValidationError(
            f"cannot write timeline file '{path}': it is a directory; name a file in it, "
            f"e.g. '{path / 'timeline.svg'}'"
        )
    fmt = timeline_format(path)
    parent = path.parent
    if not parent.is_dir():
        reason = "does not exist" if not parent.exists() else "is not a directory"
        raise ValidationError(
            f"cannot write timeline file '{path}': its directory '{parent}' {reason}"
        )
    return fmt


def render_png(timeline: _model.Timeline, *, width: int = 1000) -> bytes:
    """:func:`render_svg` rasterised to PNG (``bytes``) by resvg (the ``resvg-py`` package,
    a self-contained wheel: no system library), with the system's fonts.

    Raises:
        ValidationError: ``resvg-py`` is not installed (``pip install 'prefect-baton[png]'``),
            or a bad ``width``.
    """
    svg = _render.render_svg(timeline, width=width)
    try:
        import resvg_py
    except ImportError:
        raise ValidationError(
            "PNG output needs the optional resvg-py package: pip install 'prefect-baton[png]' "
            "(or write .svg or .html)"
        ) from None
    return bytes(resvg_py.svg_to_bytes(svg_string=svg, background="#ffffff"))


def write_timeline(timeline: _model.Timeline, path: Path, *, width: int = 1000) -> Path:
    """Write ``timeline`` to ``path`` as SVG, HTML or PNG, by its extension, into an
    existing directory (missing directories are not created); returns the path written.
    The file is replaced atomically: a reader, or a crash, sees the old file or the whole
    new one, and a failed write leaves no partial or temporary file.

    Raises:
        ValidationError: an existing directory as ``path``, an extension other than
            ``.svg`` / ``.html`` / ``.png`` or a missing parent directory
            (:func:`check_timeline_path`), ``.png`` without
            ``resvg-py`` (:func:`render_png`), a bad ``width``, or a file that cannot be
            written (the message names the path and the system's reason, e.g.
            ``Permission denied``).
    """
    fmt = check_timeline_path(path)
    data = (
        render_png(timeline, width=width)
        if fmt == ".png"
        else (
            _render.render_svg(timeline, width=width)
            if fmt == ".svg"
            else _render.render_html(timeline, width=width)
        ).encode("utf-8")
    )
    try:
        _replace_atomically(path, data)
    except OSError as exc:
        raise ValidationError(
            f"cannot write timeline file '{path}': {exc.strerror or exc}"
        ) from None
    return path


def _replace_atomically(path: Path, data: bytes) -> None:
    """Make ``data`` the content of ``path`` at once: written to a new temporary file in
    the same directory (created with the mode a new file gets, or an existing file's
    mode), flushed to disk, then renamed over ``path`` (:func:`os.replace`, atomic within
    one file system). A crash leaves the old file or the new one, never a part; on a
    failure the temporary file is removed. A symbolic link at ``path`` is followed (the
    file it names is replaced), as writing through it would.

    Raises:
        OSError: the directory cannot be written, ``path`` is a directory, the disk is
            full, ...
    """
    target = Path(os.path.realpath(path))
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = None  # a new file: 0o666 less the umask (os.open applies it)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
