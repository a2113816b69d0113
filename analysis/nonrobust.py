"""Paper 002 figures from a ``nonrobust`` store: Fig. 1 (c* vs d, with sqrt(d)) and Fig. 2
(|I|/m and m - |I| vs d). One line per value of every other grid axis; mean ± sample std
(ddof=1, spec A9) over seeds."""

from __future__ import annotations

import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import finish  # noqa: E402


def _lines(ds: xr.Dataset, var: str, x: str = "d"):
    """Yield (label, x values, mean, std) for every combination of the non-x, non-seed dims."""
    da = ds[var].where(ds.done).astype(float)
    others = [dim for dim in ds.done.dims if dim not in (x, "seed")]
    for combo in itertools.product(*(ds[o].values for o in others)):
        sel = da.sel(dict(zip(others, combo)))
        mean = sel.mean("seed", skipna=True) if "seed" in sel.dims else sel
        std = sel.std("seed", ddof=1, skipna=True) if "seed" in sel.dims and sel.sizes["seed"] > 1 else mean * 0
        label = ", ".join(f"{o}={v}" for o, v in zip(others, combo)) or var
        yield label, ds[x].values, mean.values, std.values


def _plot(ds, var, ylabel, title, path, sqrt_line=False, x="d"):
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, xs, mean, std in _lines(ds, var, x):
        ok = np.isfinite(mean)
        if ok.any():
            ax.errorbar(xs[ok], mean[ok], yerr=np.nan_to_num(std[ok]), marker="o", ms=3, capsize=2, label=label)
    if sqrt_line:
        xs = np.asarray(ds[x].values, dtype=float)
        ax.plot(xs, np.sqrt(xs), "k--", lw=1, label=r"$\sqrt{d}$")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    return finish(fig, ax, path, title, fontsize=10)


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    if "d" not in ds.dims:
        return []
    n = int(ds.done.sum())
    tot = int(ds.done.size)
    note = f" ({n}/{tot} cells done)" if n < tot else ""
    return [
        _plot(ds, "c_star", "minimal universal perturbation c*", "Paper 002 Fig. 1: c* vs d" + note,
              out_dir / f"{prefix}fig1_c_star.png", sqrt_line=True),
        _plot(ds, "margin_frac", "|I| / m (10% slack)", "Paper 002 Fig. 2a: samples on the margin" + note,
              out_dir / f"{prefix}fig2a_margin_frac.png"),
        _plot(ds, "n_off_margin", "m - |I|", "Paper 002 Fig. 2b: samples not on the margin" + note,
              out_dir / f"{prefix}fig2b_off_margin.png"),
    ]
