"""Paper 000 figures from a ``forging`` store (F000-3/4/5/6 package validation figures); the
paper's Fig 1 (F000-1) is the ``forging_sgd`` experiment, drawn by analysis/forging_sgd.py.

F000-3: log mu vs log eps, one line per d, solid exact curve where stored, dashed bounds ((16),
(17)-paper, (17)-corrected), slope fitted at report time over the smallest third of eps (at least 2
points) printed in the legend beside the predicted exponent. Everything is drawn from the dataset;
no numbers are hard-coded. One panel per value of every grid axis but eps, the line axis and seed
(nothing is silently sliced or pooled).

An estimator's point is storage/stats.py's: the mean over its runs (``seed``: the estimator's random
numbers, the replicates) with the Student's t 95 % interval over them where a point has >= 2 runs;
a point of one run (no seed axis) shows ± 1.96 × the estimator's own standard error
(``log_volume_stderr``, its normal approximation over its own samples), and the caption says which.
An estimate its estimator flagged unreliable is stored as NaN (status 3, ``reliable`` = 0, raw value
in ``log_volume_unreliable``, which is never read here); estimates are drawn from usable cells only
(status 0, the declared ``ok_values``; not failed, not damaged): the caption counts the others.
"""

from __future__ import annotations

import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import finish  # noqa: E402
from storage.query import fixed_params, usable  # noqa: E402
from storage.stats import NETS, aggregate, caption  # noqa: E402

# the acceptance rows (analysis/acceptance_000.py) the volume panels draw: the report says under each how this
# store compares with the paper (kktlab/report.py)
CLAIMS = {"forging_volume": ("P000-2", "P000-5", "P000-13")}
from tasks.cells.forging import PROBABILITY_DOMAINS  # noqa: E402
from tasks.forging.slopes import fit_log_slope  # noqa: E402

_PANEL_DIMS = ("model", "estimator", "A", "domain", "label", "width", "m")  # panel order; then any other axis
Z95 = 1.959963984540054  # the normal 97.5 % quantile: the estimator's own interval of a single run


def _over_runs(da: xr.DataArray, mask: xr.DataArray, done: xr.DataArray) -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``da`` over the runs (seeds) of the cells in ``mask``."""
    return aggregate(da, [NETS], usable=mask, done=done)


def _small_eps_slope(eps: np.ndarray, logv: np.ndarray) -> float:
    ok = np.isfinite(logv)
    if ok.sum() < 2:
        return float("nan")
    e, v = eps[ok], logv[ok]
    k = max(2, len(e) // 3)
    order = np.argsort(e)[:k]
    return fit_log_slope(e[order], v[order])[0]


def _line_dim(ds: xr.Dataset) -> str | None:
    """One line per d (F000-3/4); with d fixed and m on the grid, one line per m (F000-6)."""
    return "d" if "d" in ds.dims else "m" if "m" in ds.dims else None


VOLUME_BOUNDS = (("log_bound_eq16", "--", "Prop 2/4 (16)/(24)"), ("log_bound_eq17_paper", ":", "(17)/(25) paper (erratum)"),
                 ("log_bound_eq17_corrected", "-.", "(17)/(25) corrected"), ("log_bound_thm2", "v:", "Thm 2 (heuristic)"))
PROBABILITY_BOUNDS = (("log_probability_bound_cor1_eq30", "--", "Cor 1 (30)"),
                      ("log_probability_bound_cor1_eq31_corrected", "-.", "Cor 1 (31) corrected"),
                      ("log_probability_bound_thm3", "^:", "Thm 3 (heuristic)"))
NAIVE_MC_SAMPLES = 1_000_000  # F000-5 marks where naive MC with this many samples expects no hit


def _domain(ds: xr.Dataset, sel: dict) -> str:
    """The panel's domain: its grid coordinate, else the config's fixed parameter (store identity)."""
    if "domain" in sel:
        return str(sel["domain"])
    return str(fixed_params(ds).get("domain", "slab"))


def _volume_panel(ds: xr.Dataset, sel: dict, out: pathlib.Path, note: str) -> pathlib.Path:
    """log mu (F000-3/4/6) or, for the cylinder / Gaussian laws, log P(forge) (F000-5) vs log eps."""
    probability = _domain(ds, sel) in PROBABILITY_DOMAINS
    var, bounds = ("log_probability", PROBABILITY_BOUNDS) if probability else ("log_volume", VOLUME_BOUNDS)
    sub = ds.sel(sel) if sel else ds
    line = _line_dim(ds)
    eps = np.asarray(ds["eps"].values, dtype=float)
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    values = ds[line].values if line else [None]
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(values)))
    drawn: set[str] = set()
    inset_points, aggs, own_se = [], [], 0
    for color, value in zip(colors, values):
        one = (sub.sel({line: value}) if line else sub).transpose("eps", ...)
        ok = usable(one).load()  # estimates: usable cells only; exact values and bounds: every valued cell
        valued = one.done.astype(bool)
        for gone in ("failed", "damaged"):
            valued = valued & ~one[gone].astype(bool) if gone in one else valued
        mean = lambda v, mask=valued: _over_runs(one[v], mask, one.done).estimate.values  # noqa: E731
        est = _over_runs(one[var], ok, one.done)
        aggs.append(est)
        lv, n = est.estimate.values, est.n.values
        se = _over_runs(one["log_volume_stderr"], ok, one.done).estimate.values
        slope = _small_eps_slope(eps, lv)
        inset_points.append((slope, *(float(np.nanmean(mean(v))) for v in ("tube_exponent", "thm2_exponent"))))
        pred = np.nanmean(mean("predicted_exponent"))
        tag = (f"{line}={value}: " if line else "") + f"slope {slope:.2f} (pred. {pred:.2g})"
        exact = mean("log_volume_exact") if not probability else np.full(len(eps), np.nan)
        if np.isfinite(exact).any():
            ax.plot(np.log10(eps), exact / np.log(10), "-", color=color, lw=1.2)
        if np.nanmax(np.nan_to_num(se, nan=0.0)) > 0 or not np.isfinite(exact).any():
            single = n == 1  # one run: the estimator's own normal-approximation interval
            own_se += int((single & np.isfinite(lv) & (np.nan_to_num(se) > 0)).sum())
            half = np.where(single, Z95 * np.nan_to_num(se), 0.0)
            lo, hi = np.where(single, lv - half, est.lo.values), np.where(single, lv + half, est.hi.values)
            keep = np.isfinite(lv)
            yerr = np.nan_to_num(np.stack([lv - lo, hi - lv])[:, keep]) / np.log(10)
            ax.errorbar(np.log10(eps[keep]), lv[keep] / np.log(10), yerr=yerr, fmt="o", ms=3, capsize=2, color=color,
                        label=tag)
        else:
            ax.plot([], [], "-", color=color, label=tag + " [exact]")
        for bvar, style, _ in bounds:
            b = mean(bvar) if bvar in one else np.full(len(eps), np.nan)
            if np.isfinite(b).any():
                ax.plot(np.log10(eps), b / np.log(10), style, color=color, lw=0.8, alpha=0.8)
                drawn.add(style)
    for _, style, lab in bounds:
        if style in drawn:
            ax.plot([], [], style, color="gray", label=lab)
    ax.set_xlabel(r"$\log_{10}\varepsilon$")
    if _domain(ds, sel) == "ball":
        slope_inset(ax, inset_points)
    if probability:
        ax.axhline(np.log10(3.0 / NAIVE_MC_SAMPLES), color="red", lw=0.8, ls=":",
                   label=f"below: naive MC with {NAIVE_MC_SAMPLES:.0e} samples likely sees no hit")
        ax.set_ylabel(r"$\log_{10} P(\mathrm{forge})$")
        title = f"Forging probability, {_domain(ds, sel)} law (package validation, F000-5)"
    else:
        ax.set_ylabel(r"$\log_{10}\mu(S_\varepsilon)$")
        title = ("Batch forging volume, B fixed (package validation, F000-6)" if line == "m"
                 else "Forging-set volume (package validation, F000-3/4)")
    return finish(fig, ax, out, title + ("\n" + note if note else "") + "\n" + points_caption(aggs, own_se))


def points_caption(aggs: list[xr.Dataset], own_se: int) -> str:
    """What an estimator's point and bar are: the stats layer's caption over the runs, and how many
    points of a single run show the estimator's own ± 1.96 SE instead."""
    many = any(int(a.n.max()) >= 2 for a in aggs if a.n.size)
    text = caption(aggs, "per point").replace("over nets (seeds;", "over runs (seeds;") if many else \
        caption(aggs, "per point").replace("1 net per point: no interval", "1 run per point")
    if own_se:
        text += f"; {own_se} points of 1 run: ± 1.96 × the estimator's own SE (its normal approximation)"
    return text


def slope_inset(ax, points: list[tuple[float, float, float]]):
    """F000-4 inset: fitted small-eps slope vs D - r (circles) and vs (D - r)/2 (triangles), r = nullity
    of M0 at x* stored per cell (D = m(d + 1)); the diagonal is slope = exponent. Returns the inset Axes."""
    ins = ax.inset_axes([0.66, 0.07, 0.31, 0.31])
    pts = np.array([p for p in points if np.isfinite(p).all()], dtype=float).reshape(-1, 3)
    if len(pts):
        ins.plot(pts[:, 1], pts[:, 0], "o", ms=3, color="C0", label="vs D - r")
        ins.plot(pts[:, 2], pts[:, 0], "^", ms=3, color="C3", label="vs (D - r)/2")
        hi = float(np.nanmax(pts)) + 0.5
        ins.plot([0, hi], [0, hi], "-", color="gray", lw=0.6)
    ins.set_xlabel("exponent (r at x*)", fontsize=6)
    ins.set_ylabel("fitted slope", fontsize=6)
    ins.tick_params(labelsize=5)
    ins.legend(fontsize=5, loc="upper left")
    return ins


def figures(ds: xr.Dataset, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """One F000-3/4 (F000-5 for the cylinder / Gaussian laws, F000-6 for m lines) panel per combination of the
    grid axes but eps, seed and the one drawn as lines (d, or m when d is fixed): model, estimator, A, domain,
    label, width, m first, then any other (R, model_seed, ...)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if "eps" not in ds.dims or "log_volume" not in ds:
        return []
    n, tot = int(ds.done.sum()), int(ds.done.size)
    # every axis but eps, the line axis and the runs (seed) is a panel: never sliced or pooled silently
    rest = [dim for dim in ds.done.dims if dim not in ("eps", _line_dim(ds), NETS)]
    panel_dims = [dim for dim in _PANEL_DIMS if dim in rest] + [dim for dim in rest if dim not in _PANEL_DIMS]
    paths = []
    for combo in itertools.product(*(ds[p].values for p in panel_dims)):
        sel = dict(zip(panel_dims, combo))
        note = ", ".join(f"{k}={v}" for k, v in sel.items())
        if n < tot:
            note += f" ({n}/{tot} cells done)"
        if "reliable" in ds:  # flagged estimates are NaN in log_volume (status 3): say how many are left out
            flagged = ds["reliable"].where(ds.done).sel(sel) if sel else ds["reliable"].where(ds.done)
            n_bad = int((flagged == 0).sum())
            if n_bad:
                note += f" ({n_bad} estimates flagged unreliable left out)"
        name = "_".join(f"{k}-{v}" for k, v in sel.items()) or "all"
        paths.append(_volume_panel(ds, sel, out_dir / f"{prefix}forging_volume_{name}.png", note))
    return paths
