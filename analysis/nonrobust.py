"""Paper 002 figures from a ``nonrobust`` store: Fig. 1 (c* vs d, with sqrt(d)) and Fig. 2
(|I|/m and m - |I| vs d). One line per value of every other grid axis; mean ± sample std
(ddof=1, spec A9) over the nets (seeds), both from storage/stats.py's one statistics layer, whose
counts (nets used, ±inf left out, cells not usable) the caption gives.

Only usable cells enter a point: done and trained to the target (status 1 converged); dead,
max-iteration, diverged and pending nets are left out and counted. An infinite c* of a converged
net means "no flip below the search cap": it is left out of the mean too and counted apart, so
one such seed never drops a whole (alpha, d) point. Each point says how many seeds it averages
(legend n=lo-hi/N, and "n/N" beside every point that lacks seeds)."""

from __future__ import annotations

import dataclasses
import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import REFERENCE, finish  # noqa: E402
from storage.query import usable  # noqa: E402
from storage.stats import NETS, aggregate, caption  # noqa: E402
from tasks.train import CONVERGED, STATUS_NAMES  # noqa: E402

LEGACY_OK = (CONVERGED,)  # stores made before the status variable carried its ok_values


def ok_statuses(ds: xr.Dataset) -> tuple[int, ...]:
    """The statuses a figure uses: the store's declaration (``ok_values`` of ``status``)."""
    return tuple(int(v) for v in ds["status"].attrs.get("ok_values", LEGACY_OK)) if "status" in ds else LEGACY_OK


@dataclasses.dataclass
class Line:
    """One plotted line: per x value the mean and std (ddof=1) over the usable seeds with a finite
    value, how many seeds that is (``n``), how many usable seeds had an infinite value (``n_inf``,
    left out) and how many seeds the grid has (``total``)."""

    label: str
    sel: dict
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    n: np.ndarray
    n_inf: np.ndarray
    total: int

    @property
    def n_label(self) -> str:
        lo, hi = int(self.n.min()), int(self.n.max())
        return f"n={lo}/{self.total}" if lo == hi else f"n={lo}-{hi}/{self.total}"


def spread(ds: xr.Dataset, var: str, stat: str = "mean") -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``var`` over the nets (seeds) on the usable cells (an ok
    status), every other grid axis kept: ``stat`` "mean" (the plotted point) or "std" (its bar)."""
    over = [NETS] if NETS in ds[var].dims else []
    return aggregate(ds[var].load(), over, usable=usable(ds, ok_statuses(ds)).load(), done=ds.done, stat=stat)


def lines(ds: xr.Dataset, var: str, x: str = "d") -> list[Line]:
    """The lines of a figure of ``var`` against ``x``, one per combination of the other grid dims:
    per x value the mean and the sample std of the nets (:func:`spread`), n, n_inf."""
    mean, std = spread(ds, var), spread(ds, var, "std")
    others = [dim for dim in ds.done.dims if dim not in (x, NETS)]
    total = ds.sizes.get(NETS, 1)
    out = []
    for combo in itertools.product(*(ds[o].values for o in others)):
        sel = dict(zip(others, combo))
        m, s = (a.sel(sel).transpose(x) if sel else a.transpose(x) for a in (mean, std))
        label = ", ".join(f"{o}={v}" for o, v in sel.items()) or var
        out.append(Line(label, sel, np.asarray(ds[x].values), m.estimate.values, s.estimate.values,
                        m.n.values.astype(int), m.n_inf.values.astype(int), total))
    return out


def exclusions(ds: xr.Dataset, var: str = "c_star") -> dict[str, int]:
    """Cells left out of the figures, by reason: pending, each non-converged status, ``var`` = inf."""
    done = ds.done.values.astype(bool)
    out = {"pending": int((~done).sum())}
    ok = ok_statuses(ds)
    if "failed" in ds:
        failed = ds.failed.values.astype(bool)
        out["failed"] = int((done & failed).sum())
        done = done & ~failed
    if "status" in ds:
        status = ds["status"].values
        for code, name in STATUS_NAMES.items():
            if code not in ok:
                out[name] = int((done & (status == code)).sum())
    if var in ds:
        out[f"{var}=inf"] = int((usable(ds, ok).values & np.isinf(ds[var].values.astype(float))).sum())
    return {k: v for k, v in out.items() if v}


def note(ds: xr.Dataset, var: str = "c_star", sep: str = "; ") -> str:
    """'20/24 cells used (converged, finite c_star); left out: 1 dead, 1 max_iters, 1 c_star=inf'."""
    ex = exclusions(ds, var)
    used = int(usable(ds, ok_statuses(ds)).sum()) - ex.get(f"{var}=inf", 0)
    tail = sep + "left out: " + ", ".join(f"{v} {k}" for k, v in ex.items()) if ex else ""
    return f"{used}/{ds.done.size} cells used (converged, finite {var}){tail}"


def draw(ds: xr.Dataset, var: str, ylabel: str, sqrt_line: bool = False, x: str = "d"):
    """The axes of one figure, not yet saved: returns (fig, ax, lines drawn)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    drawn = lines(ds, var, x)
    for line in drawn:
        ok = np.isfinite(line.mean)
        if not ok.any():
            continue
        xs = np.asarray(line.x, dtype=float)
        cont = ax.errorbar(xs[ok], line.mean[ok], yerr=np.nan_to_num(line.std[ok]), marker="o", ms=3, capsize=2,
                           label=f"{line.label} ({line.n_label})")
        for xv, yv, n, k in zip(xs[ok], line.mean[ok], line.n[ok], line.n_inf[ok]):
            if n < line.total:
                text = f"{n}/{line.total}" + (f" ({k} inf)" if k else "")
                ax.annotate(text, (xv, yv), textcoords="offset points", xytext=(4, 4), fontsize=6,
                            color=cont.lines[0].get_color())
    if sqrt_line:
        xs = np.asarray(ds[x].values, dtype=float)
        ax.plot(xs, np.sqrt(xs), "k--", lw=1, label=r"$\sqrt{d}$", gid=REFERENCE)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    return fig, ax, drawn


FIGURES = (  # (variable, y label, title, file stem, sqrt(d) line)
    ("c_star", "minimal universal perturbation c*", "Paper 002 Fig. 1: c* vs d", "fig1_c_star", True),
    ("margin_frac", "|I| / m (10% slack)", "Paper 002 Fig. 2a: samples on the margin", "fig2a_margin_frac", False),
    ("n_off_margin", "m - |I|", "Paper 002 Fig. 2b: samples not on the margin", "fig2b_off_margin", False),
)
# the acceptance rows (analysis/acceptance_002.py) each figure draws: the report says under it how this store
# compares with the paper (kktlab/report.py)
CLAIMS = {"fig1_c_star": ("R2", "R4", "R5"), "fig2a_margin_frac": ("R3",), "fig2b_off_margin": ("R3",)}


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    if "d" not in ds.dims:
        return []
    paths = []
    for var, ylabel, title, stem, sqrt_line in FIGURES:
        fig, ax, _ = draw(ds, var, ylabel, sqrt_line)
        sub = f"\n{bars(ds, var)}\n{note(ds, var, sep=chr(10))}"
        paths.append(finish(fig, ax, out_dir / f"{prefix}{stem}.png", title + sub, fontsize=8))
    return paths


def bars(ds: xr.Dataset, var: str) -> str:
    """What a figure's points and bars are: 'mean ± std over nets (seeds; n = 3/4 per point); left out:
    1 ±inf, 3 not usable; the sample std (ddof = 1, spec A9), not an interval'."""
    agg = spread(ds, var, "std")
    if not agg.attrs["over_nets"]:
        return caption(agg)
    return f"mean ± {caption(agg)}; the sample std (ddof = 1, spec A9), not an interval"


def notes(ds: xr.Dataset) -> list[str]:
    """Markdown for the report: seeds behind every Fig. 1 point and the cells left out."""
    if "d" not in ds.dims:
        return []
    out = [note(ds) + ".", "", "| line | d | seeds used | c* = inf (left out) | c* mean ± std |", "|---|---|---|---|---|"]
    for line in lines(ds, "c_star"):
        for xv, m, s, n, k in zip(line.x, line.mean, line.std, line.n, line.n_inf):
            out.append(f"| {line.label} | {xv} | {n}/{line.total} | {k} | {m:.4g} ± {s:.2g} |")
    return out + [""]
