"""Paper 001 figures from an ``unlearn`` store (spec 001 §5): F001-1 ε(α) of the unlearned net on the
retained set (mean over nets with its Student's t 95 % interval as a band, storage/stats.py, clipped
at 0 where the quantity cannot be negative), the δ and ε_rel panels, the measured ε
(Def 2.2: max over the forgotten l) against the Thm 4.1 / 3.1 ε bound with the precondition status in
the legend (spec A8: a bound is not a prediction where its preconditions fail); F001-3 cossim to the
retained SVM (linear); F001-5 1 − cossim to the retrained net; F001-6 D_MG test accuracy.

One line per combination of the grid dims other than ``alpha`` and ``seed``. Only usable cells
(done, not failed) whose unlearned nets are feasible (min margin > 0) enter a point; each legend
says how many nets a point averages."""

from __future__ import annotations

import itertools
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from analysis.common import NOT_DRAWN, finish  # noqa: E402
from storage.query import usable  # noqa: E402
from storage.stats import aggregate, caption, domain_of, yerr  # noqa: E402

OVER = "seed"
# the acceptance rows (analysis/acceptance_001.py) a figure draws: the report says under it how this store
# compares with the paper (kktlab/report.py)
CLAIMS = {"F001-1_eps": ("P001-4",), "F001-3": ("P001-7",), "F001-6_test_acc": ("P001-10",)}
# Non-negative by definition (spec 001 Def 2.2: ε, δ are maxima of norms and of non-negative slack), for
# stores made before the declaration carried domain=(0, None) (valid_min): their bands stop at 0.
NON_NEGATIVE = ("eps", "eps_mean", "delta", "delta_mean", "eps_rel", "eps_d", "delta_rel")


def _keep(ds: xr.Dataset) -> xr.DataArray:
    mask = usable(ds)
    return mask & (ds["feasible"] == 1) if "feasible" in ds else mask


def curves(ds: xr.Dataset, var: str):
    """[(label, alpha, aggregate)] of ``var`` against alpha, one per other-dims combination: the mean
    over nets with its Student's t interval (:func:`storage.stats.aggregate`, usable and feasible
    cells only), clipped to the variable's declared domain."""
    if "alpha" not in ds.dims or var not in ds:
        return []
    domain = domain_of(ds[var])
    if domain == (None, None) and var in NON_NEGATIVE:
        domain = (0.0, None)
    agg = aggregate(ds[var], [OVER], usable=_keep(ds), done=ds["done"], domain=domain)
    others = [d for d in agg.estimate.dims if d != "alpha"]
    out = []
    for combo in itertools.product(*(list(ds[d].values) for d in others)):
        sel = dict(zip(others, combo))
        sub = (agg.sel(sel) if sel else agg).transpose("alpha")
        if not sub.n.any():
            continue
        label = ", ".join(f"{k}={v}" for k, v in sel.items()) or var
        out.append((label, ds["alpha"].values, sub))
    return out


def _panel(ds, var, ylabel, path, title, band=True) -> pathlib.Path | None:
    cs = curves(ds, var)
    if not cs:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    total = ds.sizes.get(OVER, 1)
    for label, x, agg in cs:
        n = agg.n.values
        (line,) = ax.plot(x, agg.estimate.values, marker="o", ms=3, label=f"{label} (n={int(n.min())}-{int(n.max())}/{total})")
        if band:
            ax.fill_between(x, agg.lo.values, agg.hi.values, color=line.get_color(), alpha=0.2)
    title = f"{title}\n{caption([agg for _, _, agg in cs], 'per point')}" if band else title
    ax.axvline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("α (step as a fraction of λ_l)")
    ax.set_ylabel(ylabel)
    return finish(fig, ax, path, title)


def _bound_panel(ds, path, fid: str = "F001-1") -> pathlib.Path | None:
    cs, bs = curves(ds, "eps"), curves(ds, "bound_eps")
    if not cs:
        return None
    bound = ds["bound_eps"].where(_keep(ds)) if "bound_eps" in ds else None
    if bound is not None and not bool(np.isfinite(bound).any()) and bool(np.isinf(bound).any()):
        # e.g. two-layer nets far from the theorems' regime: nothing to compare ε with (the measured ε is
        # its own figure); a figure of the measured curve under this title would claim a comparison
        NOT_DRAWN.append((pathlib.Path(path).name, "all values ±inf (the Thm 4.1/3.1 bound on ε is +inf in "
                                                   "every usable cell: vacuous; the measured ε is drawn alone)"))
        return path
    met = _keep(ds) & (ds["preconditions_met"] == 1)
    status = "preconditions met" if bool(met.any()) and bool(met.sum() == _keep(ds).sum()) else \
        "preconditions NOT met (not a prediction, spec A8)"
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    bounds = {b[0]: b for b in bs}
    drawn = False
    for label, x, agg in cs:  # the measured curve always; the bound where it is finite
        (line,) = ax.plot(x, agg.estimate.values, marker="o", ms=3, label=f"measured ε, {label}")
        b = bounds.get(label)
        at1 = np.isclose(b[1], 1.0) if b is not None else np.zeros(0, bool)
        bound = b[2].estimate.values if b is not None else np.zeros(0)
        if at1.any() and np.isfinite(bound[at1]).any():  # the theorems bound the GA step (α = 1) only
            ax.plot(b[1][at1], bound[at1], ls="none", marker="*", ms=10, color=line.get_color(),
                    label=f"bound ε at α = 1, {label}")
            drawn = True
    if not drawn:  # finite bounds only away from α = 1
        status += "\nno finite bound at α = 1: only the measured ε is drawn"
    ax.set_yscale("log")
    ax.set_xlabel("α")
    ax.set_ylabel("ε (max over forgotten l)")
    return finish(fig, ax, path, f"{fid}: measured ε vs Thm 4.1/3.1 bound\n{status}", fontsize=8)


def _rate_panel(ds, path) -> pathlib.Path | None:
    """F001-3: 1 − cossim(ŵ(1), w*) vs d, the mean over nets of each net's mean over l with its Student's
    t interval (storage/stats.py), beside the Thm 3.1 rate √ε_d + √ε_1 + √δ_1 (averaged alike) times
    the fitted C (the median ratio; the theorem leaves C unspecified)."""
    if "d" not in ds.dims or "alpha" not in ds.dims or 1.0 not in ds.alpha.values or \
            not bool(np.isfinite(ds["tau_svm"]).any()):
        return None
    keep = _keep(ds).sel(alpha=1.0)
    tau = ds["tau_svm"].sel(alpha=1.0).where(keep)
    rate = (np.sqrt(ds["eps_d"]) + np.sqrt(ds["eps1"]) + np.sqrt(ds["delta1"])).sel(alpha=1.0).where(keep)
    C = float((tau / rate).median())
    other = [x for x in tau.dims if x != "d"]
    done = ds["done"].sel(alpha=1.0)
    agg = aggregate(ds["tau_svm"].sel(alpha=1.0), other, usable=keep, done=done).transpose("d")
    bound = aggregate(rate, other, usable=keep, done=done).estimate.transpose("d")
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.errorbar(ds.d.values, agg.estimate.values, yerr=yerr(agg), marker="o", capsize=2,
                label="measured 1 − cos(ŵ(1), w*)")
    ax.plot(ds.d.values, C * bound.values, ls="--", label=f"C·(√ε_d + √ε_1 + √δ_1), C = {C:.2g}")
    ax.set_xlabel("d")
    ax.set_ylabel("1 − cossim to the retained SVM")
    return finish(fig, ax, path, f"F001-3 / P001-7: linear GA vs the retained SVM, rate in d\n{caption(agg)}")


def spec_figure(ds: xr.Dataset) -> str:
    """The spec figure an unlearn group's ε(α) panels draw (spec 001 §5): F001-4 for k-GA (a ``k``
    axis or a k_ga / sequential_ga method), F001-6 for D_MG nets (a test accuracy after unlearning),
    else F001-1."""
    methods = {str(m) for m in ds["unlearn_method"].values} if "unlearn_method" in ds.coords else set()
    if "k" in ds.dims or methods & {"k_ga", "sequential_ga"}:
        return "F001-4"
    if "test_acc_after" in ds and bool(np.isfinite(ds["test_acc_after"]).any()):
        return "F001-6"
    return "F001-1"


def figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    fid = spec_figure(ds)
    paths = [
        _panel(ds, "eps_mean", "ε on S∖{l} (mean over l)", out / f"{prefix}{fid}_eps.png",
               f"{fid}: KKT ε of the unlearned net vs α"),
        _panel(ds, "delta_mean", "δ on S∖{l}", out / f"{prefix}{fid}_delta.png", f"{fid}: δ vs α"),
        _panel(ds, "eps_rel_mean", "ε / ‖θ̂‖", out / f"{prefix}{fid}_eps_rel.png", f"{fid}: ε_rel vs α"),
        _bound_panel(ds, out / f"{prefix}{fid}_bound.png", fid),
    ]
    if "cos_svm" in ds and bool(np.isfinite(ds["cos_svm"]).any()):
        paths.append(_panel(ds, "cos_svm", "cossim(ŵ(α), w*)", out / f"{prefix}F001-3_cos_svm.png",
                            "F001-3: cosine to the retained SVM (linear)"))
        paths.append(_rate_panel(ds, out / f"{prefix}F001-3_rate.png"))
    if "tau_retrain" in ds and bool(np.isfinite(ds["tau_retrain"]).any()):
        paths.append(_panel(ds, "tau_retrain", "1 − cossim(θ̂(α), θ_retrain)", out / f"{prefix}F001-5_retrain.png",
                            "F001-5: distance to the retrained net"))
    if "test_acc_after" in ds and bool(np.isfinite(ds["test_acc_after"]).any()):
        paths.append(_panel(ds, "test_acc_after", "test accuracy of θ̂(α)", out / f"{prefix}F001-6_test_acc.png",
                            "F001-6: D_MG test accuracy after unlearning"))
    return [p for p in paths if p is not None]


def notes(ds: xr.Dataset) -> list[str]:
    keep, done = int(_keep(ds).sum()), int(ds["done"].sum())
    seeds = ds.sizes.get(OVER, 1)
    met = int((_keep(ds) & (ds["preconditions_met"] == 1)).sum()) if "preconditions_met" in ds else 0
    return [f"each point averages up to {seeds} nets; {done - keep} done cells left out (failed or "
            f"infeasible); theorems' preconditions met in {met}/{keep} cells "
            f"(median ε_d = {float(ds['eps_d'].where(_keep(ds)).median()):.3g})"]
