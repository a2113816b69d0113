"""Paper 004 F004-3 (spec §4; no figure in the paper) from a ``kkt_constructions`` group: (a) the
residual change vs operation count of splits and merges, (b) Thm 4's far-set distance and residual
vs τ, (c) the split budgets B8 / B5 vs the exact admissible range per training point (bound ≤ range:
below the diagonal), (e) App C's γ(U_d) vs σ_d and σ_d/√n. Every usable cell is drawn (one line or
one set of points per net); cells left out are counted in the notes. Acceptance rows P004-2/3, P004-4,
P004-6, P004-7 from the per-cell numbers."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.acceptance import Row, skipped  # noqa: E402
from analysis.common import save  # noqa: E402
from storage.query import usable  # noqa: E402

TINY = 1e-300


def _cells(ds: xr.Dataset, var: str) -> np.ndarray:
    """The usable cells' values of ``var``: (cells, *its extra dims)."""
    ok = usable(ds).values.ravel()
    grid = usable(ds).dims
    a = ds[var].transpose(*grid, ...).values
    return a.reshape(ok.size, *a.shape[len(grid):])[ok]


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    return []  # every panel needs per-operation / per-sample arrays: sample_figures


def sample_figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    if "op_residual" not in ds or not bool(usable(ds).any()):
        return []
    fig, ax = plt.subplots(2, 2, figsize=(9, 7))
    a, b, c, e = ax.ravel()
    for r in _cells(ds, "op_residual"):
        ok = np.isfinite(r)
        a.semilogy(np.arange(1, ok.sum() + 1), np.maximum(r[ok], TINY), ".-", lw=0.6, ms=3)
    a.axhline(1e-12, color="gray", ls="--", lw=0.8, label="1e-12 (P004-2/3)")
    a.set(xlabel="operation (splits, then merges)", ylabel="||R(S_t) - R(S_0)|| / ||theta||",
          title="(a) split / merge residual change")
    a.legend(fontsize=7)
    taus, dist, res = _cells(ds, "far_tau"), _cells(ds, "far_dist"), _cells(ds, "far_residual")
    drawn = False
    for t, dd, rr in zip(taus, dist, res):
        if np.all(np.isfinite(dd)):
            b.loglog(t, dd, "o-", ms=3, lw=0.6, color="C0")
            b.loglog(t, np.maximum(rr, TINY), "x--", ms=3, lw=0.6, color="C3")
            drawn = True
    if drawn:
        b.loglog(taus[0], taus[0], color="gray", lw=0.8)
    b.set(xlabel="tau", ylabel="d(S, S_tau) (o), residual change (x)",
          title="(b) Thm 4 far sets (exactified, n < d)" if drawn else "(b) no cell with n < d")
    b8, ex = _cells(ds, "b8").ravel(), _cells(ds, "exact_range").ravel()
    b5, ex5 = _cells(ds, "b5").ravel(), _cells(ds, "exact_range_b5").ravel()
    for x, y, lab in ((ex, b8, "B8 (trained net)"), (ex5, b5, "B5 (exact W-block)")):
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        c.loglog(x[ok], y[ok], ".", ms=3, label=lab)
    lim = [np.nanmin(np.r_[ex[ex > 0], 1e-12]), np.nanmax(np.r_[ex5[np.isfinite(ex5)], ex[np.isfinite(ex)], 1.0])]
    c.loglog(lim, lim, color="gray", lw=0.8, label="bound = exact")
    c.set(xlabel="exact admissible range along U_d", ylabel="bound", title="(c) split budgets vs exact range")
    c.legend(fontsize=7)
    sd, g, sn = _cells(ds, "sigma_d"), _cells(ds, "gamma_ud"), _cells(ds, "sigma_d_sqrt_n")
    i = np.arange(sd.size)
    e.bar(i - 0.25, sd, 0.25, label="sigma_d")
    e.bar(i, g, 0.25, label="gamma(U_d) = max |<x_i, U_d>|")
    e.bar(i + 0.25, sn, 0.25, label="sigma_d / sqrt(n)")
    e.set(xlabel="net (usable cell)", ylabel="l2 norm", title="(e) App C: gamma(U_d) <= sigma_d")
    e.legend(fontsize=7)
    for x in ax.ravel():
        x.grid(alpha=0.3)
        x.title.set_fontsize(9)
    fig.suptitle("F004-3: constructions on trained nets", fontsize=10)
    return [save(fig, pathlib.Path(out_dir) / f"{prefix}F004-3_constructions.png")]


def notes(ds: xr.Dataset) -> list[str]:
    ok = usable(ds)
    left = int((ds["done"].astype(bool) & ~ok).sum())
    return [f"{int(ok.sum())} nets drawn (one line / point set each); {left} done cells left out (failed)"]


def acceptance(ds: xr.Dataset) -> list[Row]:
    """P004-2/3, P004-4, P004-6, P004-7 on every usable cell (the spec's tolerances)."""
    if "merge_split_max" not in ds or not bool(usable(ds).any()):
        return [skipped(i, c, t, "no usable cell") for i, c, t in (
            ("P004-2", "split/merge keep the residual", "<= 1e-12"), ("P004-4", "Thm 4 far sets", "all"),
            ("P004-6", "Thm 15: gamma(U_d) <= sigma_d", "all"), ("P004-7", "B8, B5 <= exact range", "100 %"))]
    ms = _cells(ds, "merge_split_max")
    rows = [Row("split/merge: max ||Delta R|| / ||theta|| over all operations", "P004-2",
                f"{np.nanmax(ms):.3g} over {ms.size} nets", "<= 1e-12", bool(np.nanmax(ms) <= 1e-12),
                "P004-3 too: splits and merges along U_d", float(np.nanmax(ms)))]
    far = _cells(ds, "far_ok")
    far = far[far >= 0]
    rows.append(Row("Thm 4: d(S, S_tau) > tau, Delta R and |Phi| change <= 1e-10, patterns kept", "P004-4",
                    f"{int(far.sum())}/{far.size} nets", "all", bool(far.all()) if far.size else None,
                    "exactified nets; tau in {1, 10, 100, 1e4}" if far.size else "needs n < d", float(far.size)))
    sd, g = _cells(ds, "sigma_d"), _cells(ds, "gamma_ud")
    sq = _cells(ds, "thm15_sumsq_err")
    ok15 = (g <= sd * (1 + 1e-12) + 1e-12) & (sq <= 1e-10 * np.maximum(sd ** 2, 1e-12))
    rows.append(Row("Thm 15: max_i |<x_i, U_d>| <= sigma_d, sum of squares = sigma_d^2", "P004-6",
                    f"{int(ok15.sum())}/{ok15.size} nets", "all", bool(ok15.all()), "", float(ok15.mean())))
    fr = np.minimum.reduce([_cells(ds, k) for k in ("b8_ok_frac", "b8_keep_frac", "b5_ok_frac")])
    rows.append(Row("B8 and B5 <= exact range, splits at 0.99 B8 keep the pattern (every point)", "P004-7",
                    f"min fraction {np.nanmin(fr):.3g}", "1", bool(np.nanmin(fr) == 1.0),
                    f"printed B5 exceeds the range at {int(_cells(ds, 'b5_printed_violations').sum())} points "
                    "(recorded, X004-10)", float(np.nanmin(fr))))
    return rows
