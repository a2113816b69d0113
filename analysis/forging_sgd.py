"""Paper 000 Fig 1 (F000-1) from a ``forging_sgd`` store: w_k vs k, original run red, forged run
green, dashed lines at the basin centres ±c. Drawn from the stored trajectories only (nothing is
recomputed) and redrawn on every report."""

from __future__ import annotations

import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import finish  # noqa: E402
from storage.query import fixed_params  # noqa: E402

DEFAULTS = {"c": 2.0, "x0": -0.5, "x0_forged": 0.2}  # the experiment's defaults (flows/experiments/forging_sgd.py)


def _param(ds: xr.Dataset, sel: dict, name: str) -> float:
    if name in sel:
        return sel[name]
    return fixed_params(ds).get(name, DEFAULTS[name])


def draw_trajectories(ax, w_original: np.ndarray, w_forged: np.ndarray, c: float, x0: float, x0_forged: float):
    """Fig 1 on ``ax`` (NaN padding past K dropped); returns ``ax`` (lines: original, forged, +c, -c)."""
    wo, wf = (np.asarray(w, dtype=float) for w in (w_original, w_forged))
    wo, wf = wo[np.isfinite(wo)], wf[np.isfinite(wf)]
    ax.plot(np.arange(len(wo)), wo, "o-", color="red", ms=3, label=f"original ($x_0$={x0:g})")
    ax.plot(np.arange(len(wf)), wf, "o-", color="green", ms=3, label=rf"forged ($\tilde x_0$={x0_forged:g})")
    for s in (c, -c):
        ax.axhline(s, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("SGD step k")
    ax.set_ylabel(r"$w_k$")
    return ax


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """One Fig 1 panel per done cell of the grid (always redrawn)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = [d for d in ds.done.dims]
    paths = []
    for combo in itertools.product(*(ds[g].values for g in grid)):
        sel = {g: (v.item() if hasattr(v, "item") else v) for g, v in zip(grid, combo)}
        one = ds.sel(sel) if sel else ds
        if not bool(one.done):
            continue
        fig, ax = plt.subplots(figsize=(6.0, 4.0))
        draw_trajectories(ax, one.w_original.values, one.w_forged.values, _param(ds, sel, "c"),
                          _param(ds, sel, "x0"), _param(ds, sel, "x0_forged"))
        name = "_".join(f"{k}-{v}" for k, v in sel.items()) or "all"
        note = ", ".join(f"{k}={v}" for k, v in sel.items())
        paths.append(finish(fig, ax, out_dir / f"{prefix}paper000_fig1_{name}.png",
                            "Paper 000 Fig 1 (F000-1): forging at step 0 sends SGD to the other basin"
                            + (f"\n{note}" if note else "")))
    return paths
