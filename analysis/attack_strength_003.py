"""X3 of paper 003 (spec 003 §5.2, "attack strength inside the ball"): per test point, the exact
single step's ||δ*|| against the best perturbation any attack of the store found on the same net and
point: DeepFool's ||δ|| (a ``single_step`` group run with ``deepfool: true``) and, for every ``pgd``
group reading the same nets, the budget R of each PGD variant (T2, restarts) that flipped the point.

``ratio = ||δ*_single|| / min(||δ*_single||, ||δ_DeepFool||, R of a flipping PGD run)`` (>= 1; 1: no
attack beat the single step). Acceptance (spec §5.2 X3): "for V < V* the single step is within
~1.2x of the best found", read as the median ratio over correctly classified test points of the
nets with C0 = V√m below the Fig 4 transition C0* = 25 (spec §4: V* = 25/√m) being <= 1.2; the
90th percentile and the fraction of points within 1.2x are reported beside it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import xarray as xr

from analysis.acceptance import Row, skipped
from storage.query import fixed_params, groups, open_results, usable

C0_STAR = 25.0  # Fig 4 right's transition in C0 units (spec §4); V* = C0*/√m
WITHIN = 1.2


def _source(ds: xr.Dataset) -> str | None:
    return json.loads(ds.attrs.get("kktlab_identity") or "{}").get("from")


def _lazy_mask(ds: xr.Dataset) -> xr.DataArray:
    """Cells whose net lies inside the ball below the transition: C0 < C0* (C0 = V√m for adv nets)."""
    if "C0" in ds.coords:
        return ds["C0"] < C0_STAR
    if "V" in ds.coords:
        m = ds["m"] if "m" in ds.coords else fixed_params(ds).get("m")
        if m is not None:
            return ds["V"] * np.sqrt(m) < C0_STAR
    return xr.DataArray(True)


def ratios(flips: xr.Dataset, pgds: list[xr.Dataset]) -> xr.DataArray:
    """Per (net, test point) ``||δ*_single|| / best found``, NaN where not judged (misclassified
    point, cell not done, C0 >= C0*). ``flips`` a full single_step group with DeepFool, ``pgds`` the
    full pgd groups reading the same stage. Dims: the flips group's, less its own axes."""
    f = flips.where(usable(flips))
    if "method" in f.dims:
        f = f.sel(method="single_step_exact") if "single_step_exact" in f["method"].values else f.isel(method=0)
    if "deepfool" in f.dims:
        f = f.sel(deepfool=True)
    single = f["delta_rel"] * f["x_norm"]
    best = np.minimum(single, f["delta_deepfool"].fillna(np.inf))
    for p in pgds:
        pu = p.where(usable(p))
        bound = xr.where(pu["robust"] == 0, pu["R_used"], np.inf)
        own = [dim for dim in bound.dims if dim not in single.dims]
        best = np.minimum(best, bound.min(own) if own else bound)
    keep = (f["correct"] == 1) & np.isfinite(single) & _lazy_mask(f)
    return (single / best).where(keep)


def x3_rows(flips: xr.Dataset, pgds: list[xr.Dataset]) -> list[Row]:
    crit = "X3: single step within ~1.2x of the best attack found (V < V*)"
    if "delta_deepfool" not in flips or not bool(np.isfinite(flips["delta_deepfool"]).any()):
        return [skipped("X3", crit, f"median ratio <= {WITHIN}", "single_step ran without deepfool: true")]
    r = ratios(flips, pgds)
    x = r.values[np.isfinite(r.values)]
    if not len(x):
        return [skipped("X3", crit, f"median ratio <= {WITHIN}", "no correctly classified point of a net with "
                        f"C0 < {C0_STAR:g}")]
    med, p90, frac = float(np.median(x)), float(np.quantile(x, 0.9)), float(np.mean(x <= WITHIN))
    per = ""
    if "C0" in r.dims:
        per = "; per C0: " + ", ".join(f"{float(c):g}: {float(r.sel(C0=c).median()):.3f}" for c in r["C0"].values
                                       if bool(np.isfinite(r.sel(C0=c)).any()))
    return [Row(crit, "X3", f"median {med:.3f}, p90 {p90:.3f}, {frac:.0%} of {len(x)} points within {WITHIN}x"
                f" (vs DeepFool + {len(pgds)} PGD group(s)){per}", f"median ratio <= {WITHIN}", med <= WITHIN,
                note="ratio = ||δ*|| / min(||δ*||, ||δ_DeepFool||, R of a PGD run that flipped the point)",
                value=med)]


def store_acceptance(store) -> list[Row]:
    """X3 rows for every single_step group with DeepFool, against the pgd groups reading its nets."""
    names = groups(store)
    opened = {g: open_results(store, g) for g in names}
    kind = {g: ds.attrs.get("kktlab_experiment") for g, ds in opened.items()}
    rows = []
    for g, ds in opened.items():
        if kind[g] != "single_step" or "delta_deepfool" not in ds or not bool(np.isfinite(ds["delta_deepfool"]).any()):
            continue  # X3 needs DeepFool (deepfool: true); other single_step groups have nothing to compare
        src = _source(ds)
        pgds = [opened[p].load() for p in names if kind[p] == "pgd" and _source(opened[p]) == src]
        rows += [dataclasses.replace(r, criterion=f"{r.criterion} [{g}]") for r in x3_rows(ds.load(), pgds)]
    return rows

