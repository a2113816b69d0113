"""The cross-paper chain's figures and findings (issue 27): for every stage that reads an ``unlearn``
stage's nets, its forgotten-point number beside its retained-point number, against α, one line per
unlearning method (identity and retrain are the references), mean and 95 % interval over the nets
(upstream seeds and any other axis), with the count per point. These are new questions, so the
table reports measured values with intervals and judges nothing."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import xarray as xr

from analysis.common import plt, save
from storage.query import groups, open_results

# reader experiment -> (forgotten, retained, axis label) of the numbers it reports apart
PAIRS = {"reconstruct": ("cos_forgotten", "cos_retained", "cosine of the best candidate (direction)"),
         "single_step": ("med_delta_forgotten", "med_delta_retained", "||δ*|| of the minimal single step"),
         "pgd": ("rta_forgotten", "rta_retained", "robust accuracy under PGD"),
         "forge_net": ("logvol_forgotten", "logvol_retained", "log-volume of the ε-forging set")}


def _identity(ds: xr.Dataset) -> dict:
    return json.loads(ds.attrs.get("kktlab_identity") or "{}")


def readers_of_unlearn(store) -> list[tuple[str, str, xr.Dataset]]:
    """(group, experiment, dataset) of every group reading an ``unlearn`` group's nets."""
    out = []
    names = groups(store)
    kinds = {g: open_results(store, g).attrs.get("kktlab_experiment") for g in names}
    for g in names:
        ds = open_results(store, g)
        up = _identity(ds).get("from")
        if up and kinds.get(up) == "unlearn" and kinds[g] in PAIRS and all(v in ds for v in PAIRS[kinds[g]][:2]):
            out.append((g, kinds[g], ds))  # (a group made before these variables is left out)
    return out


def summary(ds: xr.Dataset, var: str) -> xr.Dataset:
    """Mean, 95 % half-width (1.96 sem) and count of ``var`` per (method, alpha) over every other
    axis, usable cells only (done, not failed) and finite values."""
    keep = ds["done"] & ~ds["failed"] if "failed" in ds else ds["done"]
    if "status" in ds and ds["status"].attrs.get("ok_values"):  # e.g. reconstruct: diverged attacks out
        keep = keep & ds["status"].isin(list(ds["status"].attrs["ok_values"]))
    x = ds[var].where(keep)
    x = x.where(np.isfinite(x))
    other = [d for d in x.dims if d not in ("method", "alpha")]
    n = x.notnull().sum(other)
    mean = x.mean(other)
    half = 1.96 * x.std(other, ddof=1) / np.sqrt(n.where(n > 1))
    return xr.Dataset({"mean": mean, "half": half, "n": n}).compute()


def figure(g: str, exp: str, ds: xr.Dataset, out: pathlib.Path) -> pathlib.Path | None:
    fvar, rvar, label = PAIRS[exp]
    if "method" not in ds.dims or "alpha" not in ds.dims:
        return None
    f, r = summary(ds, fvar), summary(ds, rvar)
    if int(f.n.sum()) == 0 and int(r.n.sum()) == 0:
        return None
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    alphas = ds.alpha.values
    for i, method in enumerate(ds.method.values):
        colour = f"C{i}"  # the project palette (analysis/kktlab.mplstyle)
        for s, style, what in ((f, "-", "forgotten"), (r, "--", "retained")):
            m = s["mean"].sel({"method": method}).values  # sel(method=...) is xarray's fill method
            h = s["half"].sel({"method": method}).values
            ax.errorbar(alphas, m, yerr=np.nan_to_num(h), fmt="o" + style, color=colour, capsize=3, ms=4,
                        label=f"{method}: {what}")
    counts = sorted({int(v) for v in np.ravel(f.n.values)} | {int(v) for v in np.ravel(r.n.values)})
    ax.set_xlabel("α (GA step as a fraction of λ_l)")
    ax.set_ylabel(label)
    ax.set_title(f"{g} ({exp}): forgotten vs retained points\nmean ± 95 % interval, {'/'.join(map(str, counts))} "
                 "values per point", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    return save(fig, out / f"pipeline_{g}.png")


def findings(g: str, exp: str, ds: xr.Dataset) -> list[str]:
    """Markdown rows: method, α, forgotten mean ± half-width (n), retained mean ± half-width (n)."""
    fvar, rvar, _ = PAIRS[exp]
    if "method" not in ds.dims or "alpha" not in ds.dims:
        return []
    f, r = summary(ds, fvar), summary(ds, rvar)
    at = lambda s, k, mth, a: s[k].sel({"method": mth, "alpha": a})  # noqa: E731
    cell = lambda s, mth, a: (f"{float(at(s, 'mean', mth, a)):.4g} ± {float(at(s, 'half', mth, a)):.2g} "  # noqa: E731
                              f"(n={int(at(s, 'n', mth, a))})")
    rows = [f"| {g} | {mth} | {a:g} | {cell(f, mth, a)} | {cell(r, mth, a)} |"
            for mth in ds.method.values for a in ds.alpha.values]
    return rows


def store_figures(store, out) -> tuple[list[pathlib.Path], list[str]]:
    """The chain's figures and its findings table (markdown lines); nothing when no stage reads an
    ``unlearn`` stage."""
    out = pathlib.Path(out)
    found = readers_of_unlearn(store)
    if not found:
        return [], []
    paths, rows = [], []
    for g, exp, ds in found:
        p = figure(g, exp, ds, out)
        if p is not None:
            paths.append(p)
        rows += findings(g, exp, ds)
    lines = ["## The chain: forgotten vs retained points", "",
             "Measured values, mean ± 95 % interval (1.96 sem) over the nets, n values per entry; new "
             "questions, so nothing is judged pass/fail.", "",
             "| stage | method | α | forgotten | retained |", "| --- | --- | --- | --- | --- |", *rows, ""]
    lines += [f"![{p.stem}]({p.name})" for p in paths] + [""]
    return paths, lines


def figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    """A ``forge_net`` group's own figure (the chain's figures are store-level: :func:`store_figures`);
    none apart from them."""
    return []
