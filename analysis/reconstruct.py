"""Paper 004 Fig 2a (F004-1) from a ``reconstruct`` group: score (mean distance of the 5 best
candidates to the training set) vs init radius r as box plots on a log axis, the final objective
beside it (the paper: 330-332 for every run). Every usable cell of a radius (all nets, restarts,
settings) is one sample of its box; cells that diverged are left out and counted."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import save  # noqa: E402
from storage.query import usable  # noqa: E402


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


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    scores, objs = per_radius(ds, "score5"), per_radius(ds, "objective")
    if not scores:
        return []
    radii = sorted(scores)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    w = [r * 0.25 for r in radii]
    a1.boxplot([scores[r] for r in radii], positions=radii, widths=w, manage_ticks=False)
    a1.set_xscale("log")
    a1.set_xlabel("init radius r")
    a1.set_ylabel("mean distance of the 5 best candidates")
    a1.axhline(1.0, color="gray", ls="--", lw=0.8, label="origin (distance 1)")
    a1.legend(fontsize=7)
    a1.set_title("F004-1 (Fig 2a): score vs init radius", fontsize=9)
    a2.boxplot([objs[r] for r in radii], positions=radii, widths=w, manage_ticks=False)
    a2.set_xscale("log")
    a2.set_xlabel("init radius r")
    a2.set_ylabel("final KKT objective")
    a2.set_title("objective per radius (paper: 330-332 for all)", fontsize=9)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return [save(fig, pathlib.Path(out_dir) / f"{prefix}F004-1_score_vs_radius.png")]


def notes(ds: xr.Dataset) -> list[str]:
    scores = per_radius(ds, "score5")
    if not scores:
        return []
    left = int((ds["done"].astype(bool) & ~usable(ds)).sum())
    counts = ", ".join(f"r={r:g}: {len(v)}" for r, v in sorted(scores.items()))
    return [f"cells per radius box: {counts}; {left} done cells left out (diverged or failed)"]
