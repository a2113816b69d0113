"""Shared figure finishing (issue 31 item 5): every figure in the project style
(``analysis/kktlab.mplstyle``: two-column-paper sizes, 8 pt type, the Okabe-Ito colour-blind-safe
palette), written as PNG (300 dpi) and SVG beside it, never empty, its legends where they hide no
data and bounded quantities (accuracies, fractions) on axes that stay within their range.

A figure with no finite data is not written: :func:`save` records ``(file name, why)`` in
:data:`NOT_DRAWN` instead (the report lists it); :data:`CAPTIONS` keeps each written figure's
title text for the report's captions. :func:`take_records` hands both over and clears them."""

from __future__ import annotations

import pathlib
import textwrap

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = pathlib.Path(__file__).with_name("kktlab.mplstyle")
plt.style.use(STYLE)
COLUMN_IN, PAGE_IN = 3.4, 7.0  # one panel: one column; several: the full width of a two-column paper
# axes whose label names a quantity in [0, 1]: never drawn beyond it by more than FRACTION_PAD
FRACTION_LABELS = ("accuracy", "|I| / m")
FRACTION_PAD = 0.01
REFERENCE = "reference"  # the gid of a theory line (e.g. sqrt(d)): alone, it does not make a figure
NOT_DRAWN: list[tuple[str, str]] = []
CAPTIONS: dict[str, str] = {}


def take_records() -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(figures not drawn as (file name, why), {file name: title text}) since the last call."""
    out = list(NOT_DRAWN), dict(CAPTIONS)
    NOT_DRAWN.clear()
    CAPTIONS.clear()
    return out


def finish(fig, ax, path: pathlib.Path, title: str, fontsize: float | None = None) -> pathlib.Path:
    """Title, legend (where there are labelled artists) and grid on ``ax``; :func:`save`."""
    ax.set_title(title, fontsize=fontsize)
    if ax.get_legend_handles_labels()[1]:
        ax.legend()
    ax.grid(True)
    return save(fig, path)


def save(fig, path: pathlib.Path) -> pathlib.Path:
    """Size ``fig`` for the paper, lay it out, write ``path`` (PNG) and its ``.svg`` twin, close it.
    A figure without finite data is not written (see :data:`NOT_DRAWN`); ``path`` is returned
    either way, so callers keep their lists: the report keeps the files that exist."""
    path = pathlib.Path(path)
    titles = _titles(fig)
    if not _has_data(fig):
        why = "all values ±inf" if _all_inf(fig) else "no finite data to draw"
        NOT_DRAWN.append((path.name, why + (f" ({titles.splitlines()[0]})" if titles else "")))
        plt.close(fig)
        return path
    _fit_width(fig)
    for ax in _data_axes(fig):
        _wrap_title(fig, ax)  # to the width; the y label again once the title's height is known
        _clamp_fraction(ax)
    fig.tight_layout()
    for ax in _data_axes(fig):
        _wrap_title(fig, ax)
    fig.tight_layout()
    for ax in _data_axes(fig):
        _legend_off_the_data(fig, ax)
    fig.savefig(path)
    fig.savefig(path.with_suffix(".svg"))
    CAPTIONS[path.name] = titles
    plt.close(fig)
    return path


def _data_axes(fig) -> list:
    return [ax for ax in fig.axes if not hasattr(ax, "_colorbar")]


def _titles(fig) -> str:
    sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return "\n".join(t for t in [sup] + [ax.get_title() for ax in _data_axes(fig)] if t)


def _finite(a) -> bool:
    a = np.ma.filled(np.ma.asarray(a, dtype=float), np.nan)
    return a.size > 0 and bool(np.isfinite(a).any())


def _all_inf(fig) -> bool:
    """Whether the data lines of ``fig`` (no finite value: :func:`_has_data`) hold ±inf values."""
    return any(ln.get_transform() == ax.transData and ln.get_gid() != REFERENCE
               and np.isinf(np.ma.filled(np.ma.asarray(ln.get_ydata(), dtype=float), np.nan)).any()
               for ax in _data_axes(fig) for ln in ax.lines)


def _has_data(fig) -> bool:
    """Whether any axes holds a data line, marker, bar, band or image with a finite value (reference
    lines such as ``axvline`` do not count: they are drawn in axes coordinates; nor do theory lines
    marked ``gid=REFERENCE``)."""
    for ax in _data_axes(fig):
        if any(ln.get_transform() == ax.transData and ln.get_gid() != REFERENCE and _finite(ln.get_ydata())
               and _finite(ln.get_xdata()) for ln in ax.lines):
            return True
        if any(_finite(c.get_offsets()) if len(c.get_offsets()) else any(_finite(p.vertices) for p in c.get_paths())
               for c in ax.collections):
            return True
        if any(_finite(im.get_array()) for im in ax.images):
            return True
        if any(getattr(p, "get_height", lambda: 0)() not in (0, None) and np.isfinite(p.get_height())
               for p in ax.patches):
            return True
    return False


def _fit_width(fig) -> None:
    """One column (3.4 in) or, for a figure of several panels, the page (7 in); the aspect kept,
    with room for a title of several lines."""
    w, h = fig.get_size_inches()
    target = PAGE_IN if len(_data_axes(fig)) > 1 else COLUMN_IN
    fig.set_size_inches(target, max(h * target / w, 0.8 * target if target == COLUMN_IN else 0.5 * target))


def _wrap_title(fig, ax) -> None:
    """Title lines wrapped to the axes' width, the y label to its height (the figure got smaller)."""
    w, h = fig.get_size_inches()
    pos = ax.get_position()
    for text, room_in in ((ax.title, pos.width * w + 0.5), (ax.yaxis.label, pos.height * h + 0.3)):
        chars = max(16, int(room_in * 72 / (0.55 * text.get_fontsize())))
        if "$" not in text.get_text():  # mathtext must stay on one line
            text.set_text("\n".join(textwrap.fill(line, chars) for line in text.get_text().split("\n")))


def _clamp_fraction(ax) -> None:
    """An accuracy or fraction axis runs at most FRACTION_PAD past 0 and 1 (autoscaling with error
    bars drew one to 1.04); within the data's range otherwise."""
    label = ax.get_ylabel()
    if ax.get_yscale() != "linear" or not any(k in label for k in FRACTION_LABELS):
        return
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, -FRACTION_PAD), min(hi, 1 + FRACTION_PAD))


def _drawn_paths(ax):
    """Display-space paths of everything data-like in ``ax`` (lines, markers, bands, texts)."""
    for ln in ax.lines:
        yield ln.get_transform().transform_path(ln.get_path())
    for c in ax.collections:
        if len(c.get_offsets()) and c.get_offset_transform() is not None:
            pts = c.get_offset_transform().transform(np.ma.filled(np.ma.asarray(c.get_offsets(), float), np.nan))
            yield matplotlib.path.Path(pts[np.isfinite(pts).all(axis=1)])
        else:
            for p in c.get_paths():
                yield c.get_transform().transform_path(p)
    for im in ax.images:
        yield matplotlib.path.Path.unit_rectangle().transformed(ax.transAxes)


def _overlaps(ax, box, renderer) -> bool:
    if any(len(p.vertices) and p.intersects_bbox(box, filled=False) for p in _drawn_paths(ax)):
        return True
    return any(t.get_window_extent(renderer).overlaps(box) for t in ax.texts if t.get_visible())


def _legend_off_the_data(fig, ax) -> None:
    """Where ``loc="best"`` still covers a line, marker, band, image or annotation, move the legend
    below the axes (under the x label); ``bbox_inches="tight"`` keeps it in the file."""
    leg = ax.get_legend()
    if leg is None:
        return
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    if not _overlaps(ax, leg.get_window_extent(renderer), renderer):
        return
    handles, labels = ax.get_legend_handles_labels()
    leg.remove()
    below = ax.transAxes.inverted().transform(ax.get_tightbbox(renderer).p0)[1] - 0.02
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, below), ncol=2 if len(labels) > 3 else 1,
              framealpha=1.0)
