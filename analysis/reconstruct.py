"""Paper 004 Fig 2a (F004-1) from a ``reconstruct`` group: score (mean distance of the 5 best
candidates to the training set) vs init radius r as box plots on a log axis (spec §4: a box of the
runs per radius), the final objective beside it (the paper: 330-332 for every run). Over the boxes,
storage/stats.py's mean over the nets (``seed``) with its Student's t 95 % interval, each net's
restarts averaged first; the caption gives n and what was averaged.

One figure per value of every grid axis but radius, seed and restart (an upstream unlearning method
and α, an attack setting, ...): runs of different nets or settings are never pooled into one box.
F004-1 is unshifted: a group with a ``shift`` axis is drawn at shift 0 and says so. Cells that
diverged, failed or are damaged are left out and counted."""

from __future__ import annotations

import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import save  # noqa: E402
from storage.query import usable  # noqa: E402
from storage.stats import NETS, aggregate, caption, yerr  # noqa: E402


def per_radius(ds: xr.Dataset, var: str) -> dict[float, np.ndarray]:
    """The usable cells' values of ``var`` per init radius (shift 0 only where shift is an axis)."""
    ok = usable(ds)
    sub = ds[var].where(ok)
    if "shift" in sub.dims:
        sub = sub.sel(shift=0.0) if 0.0 in sub["shift"].values else sub.isel(shift=0)
    if "radius" not in sub.dims:
        return {}
    out = {}
    for r in sub.radius.values:
        vals = np.asarray(sub.sel(radius=r).values, dtype=float).ravel()
        out[float(r)] = vals[np.isfinite(vals)]
    return out


WITHIN = ("restart",)  # repeats of the attack on one net: averaged within each net for the mean
# the acceptance rows (analysis/acceptance_004.py) a figure draws: the report says under it how this store
# compares with the paper (kktlab/report.py)
CLAIMS = {"F004-1_score_vs_radius": ("P004-13", "P004-14", "P004-15")}


def _unshifted(ds: xr.Dataset) -> tuple[xr.Dataset, str]:
    """The group at shift 0 (F004-1 has no secret shift) and a note saying so where it has others."""
    if "shift" not in ds.dims:
        return ds, ""
    shift = 0.0 if 0.0 in ds["shift"].values else float(ds["shift"].values[0])
    return ds.sel(shift=shift), f"shift = {shift:g} only (of {ds.sizes['shift']})"


def summary(ds: xr.Dataset, var: str) -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``var`` per radius: each net's runs (restarts) averaged
    first, then the mean and Student's t interval over the nets; usable cells only."""
    over = [d for d in ds[var].dims if d != "radius"]
    return aggregate(ds[var], over, usable=usable(ds), done=ds["done"]).transpose("radius")


def facets(ds: xr.Dataset) -> list[dict]:
    """One selection per value of every grid axis but radius, the nets and their restarts."""
    dims = [d for d in ds["done"].dims if d not in ("radius", NETS, *WITHIN)]
    return [dict(zip(dims, v)) for v in itertools.product(*(list(ds[d].values) for d in dims))]


def _panel(ax, ds: xr.Dataset, var: str, label: str) -> xr.Dataset | None:
    runs, agg = per_radius(ds, var), summary(ds, var)
    radii = sorted(runs)
    ax.boxplot([runs[r] for r in radii], positions=radii, widths=[r * 0.25 for r in radii], manage_ticks=False)
    x = np.asarray(agg.radius.values, dtype=float)
    ax.errorbar(x, agg.estimate.values, yerr=yerr(agg), fmt="D", ms=3, capsize=2, color="C3",
                label="mean over nets ± t 95 %")
    ax.set_xscale("log")
    ax.set_xlabel("init radius r")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    return agg


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    if "radius" not in ds.dims or "score5" not in ds:
        return []
    base, shifted = _unshifted(ds)
    paths = []
    for sel in facets(base):
        one = base.sel(sel) if sel else base
        if not per_radius(one, "score5") or not any(v.size for v in per_radius(one, "score5").values()):
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
        s = _panel(a1, one, "score5", "mean distance of the 5 best candidates")
        a1.axhline(1.0, color="gray", ls="--", lw=0.8, label="origin (distance 1)")
        a1.legend(fontsize=7)
        _panel(a2, one, "objective", "final KKT objective")  # the same cells: the caption holds for both
        where = ", ".join([f"{k}={v}" for k, v in sel.items()] + ([shifted] if shifted else []))
        a1.set_title("F004-1 (Fig 2a): score vs init radius" + (f" ({where})" if where else ""), fontsize=9)
        a2.set_title("objective per radius (paper: 330-332 for all)", fontsize=9)
        boxes = "/".join(str(n) for n in sorted({v.size for v in per_radius(one, "score5").values()}))
        fig.suptitle(f"boxes: every usable run ({boxes} per radius);\ndiamonds: {caption(s)}", fontsize=7)
        name = "_".join(f"{k}-{v}" for k, v in sel.items() if base.sizes[k] > 1)  # a one-value axis: no split
        paths.append(save(fig, pathlib.Path(out_dir) / f"{prefix}F004-1_score_vs_radius{'_' + name if name else ''}.png"))
    return paths


def notes(ds: xr.Dataset) -> list[str]:
    """Markdown lines: the runs in each radius box of each figure, the cells left out."""
    if "radius" not in ds.dims or "score5" not in ds:
        return []
    base, shifted = _unshifted(ds)
    out = []
    for sel in facets(base):
        scores = per_radius(base.sel(sel) if sel else base, "score5")
        where = " (" + ", ".join(f"{k}={v}" for k, v in sel.items()) + ")" if sel else ""
        out.append(f"cells per radius box{where}: " + ", ".join(f"r={r:g}: {len(v)}" for r, v in sorted(scores.items())))
    left = int((ds["done"].astype(bool) & ~usable(ds)).sum())
    return out[:-1] + [f"{out[-1]}; {left} done cells left out (diverged, failed or damaged)"
                       + (f"; {shifted}" if shifted else "")]
