"""The cross-paper chain's figures and findings (issue 27): for every stage that reads an ``unlearn``
stage's nets, its forgotten-point number beside its retained-point number, against α, one line per
unlearning method (identity and retrain are the references), mean and Student's t 95 % interval over
the nets (upstream seeds; every other axis, e.g. an attack radius, averaged within each net first:
storage/stats.py), with the count of nets per point and the axes averaged named. These are new questions, so the
table reports measured values with intervals and judges nothing."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import xarray as xr

from analysis.common import plt, save
from storage.query import groups, open_results, stage_scalars, usable
from storage.stats import aggregate, caption, half_width, yerr

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
            out.append((g, kinds[g], stage_scalars(store, g)))  # with its damaged cells marked  # (a group made before these variables is left out)
    return out


def summary(ds: xr.Dataset, var: str) -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``var`` per (method, alpha): each net (seed) first averaged over
    every other axis, then the mean and Student's t interval over the nets; usable cells only (done,
    not failed, not damaged, an ok status), finite values, the rest counted."""
    other = [d for d in ds[var].dims if d not in ("method", "alpha")]
    return aggregate(ds[var], other, usable=usable(ds), done=ds["done"]).compute()


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
            one = s.sel({"method": method})  # sel(method=...) is xarray's fill method
            ax.errorbar(alphas, one.estimate.values, yerr=yerr(one), fmt="o" + style, color=colour, capsize=3, ms=4,
                        label=f"{method}: {what}")
    ax.set_xlabel("α (GA step as a fraction of λ_l)")
    ax.set_ylabel(label)
    ax.set_title(f"{g} ({exp}): forgotten vs retained points\n{caption([f, r])}", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    return save(fig, out / f"pipeline_{g}.png")


def findings(g: str, exp: str, ds: xr.Dataset) -> list[str]:
    """Markdown rows: method, α, forgotten mean ± half-width (n), retained mean ± half-width (n)."""
    fvar, rvar, _ = PAIRS[exp]
    if "method" not in ds.dims or "alpha" not in ds.dims:
        return []
    f, r = summary(ds, fvar), summary(ds, rvar)
    def cell(s, mth, a):
        one = s.sel({"method": mth, "alpha": a})
        left = "".join(f", {int(one[k])} {what}" for k, what in (("n_inf", "±inf"), ("n_nan", "NaN"),
                                                                  ("n_excluded", "not usable")) if int(one[k]))
        return f"{float(one.estimate):.4g} ± {float(half_width(one)):.2g} (n={int(one.n)}{left})"

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
    paths, rows, what = [], [], []
    for g, exp, ds in found:
        p = figure(g, exp, ds, out)
        if p is not None:
            paths.append(p)
        rows += findings(g, exp, ds)
        if "method" in ds.dims and "alpha" in ds.dims:
            what += [f"{g}: {caption([summary(ds, v) for v in PAIRS[exp][:2]], 'per entry')}"]
    lines = ["## The chain: forgotten vs retained points", "",
             "Measured values, mean ± Student's t 95 % interval over the nets (n nets per entry, each net "
             "first averaged over the axes named below); new questions, so nothing is judged pass/fail.", "",
             *[f"- {w}" for w in what], "",
             "| stage | method | α | forgotten | retained |", "| --- | --- | --- | --- | --- |", *rows, ""]
    lines += [f"![{p.stem}]({p.name})" for p in paths] + [""]
    return paths, lines


def figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    """A ``forge_net`` group's own figure (the chain's figures are store-level: :func:`store_figures`);
    none apart from them."""
    return []
