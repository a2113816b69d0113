"""Acceptance rows of paper 003 (spec 003 §5.1 E1-E5) for whatever a store holds: fitted slopes
over d, ||∇f||/√(d/2), test error, monotonicity in C0, Fig 7's η, the 5/√d and 25/√m boundaries
with their fitted constants; and X3's row (§5.2), which compares several groups of one store per
test point (:func:`store_acceptance`). Criteria without data come back not judged."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import xarray as xr

from analysis.acceptance import Row, skipped
from analysis.lazy import _fixed, _mean, free_slope, kept, left_out, slices, threshold
from storage.query import fixed_params, groups, open_checked, usable


# E1's ||δ*||/||x|| and η slopes need |f| at the exit flat in d (Thm 3.1: |f| = O(1)). Measured on
# MNIST 0/1 (m = 256 and 1024, lr 0.5, C0 = 5 and 10, unit rows, README "E1 at CI size"): the
# ||δ*||/||x|| slope is -0.49..-0.51 over d = 100..784 but -0.03..-0.27 over d = 25..64 (flat), and
# sklearn digits stop at d = 64. So the two rows are judged only with >= 2 grid values d >= MIN_D
# (the fit stays over the whole grid, as spec §5.1 says; the d >= MIN_D fit is shown beside it).
MIN_D = 100


def _tag(base: dict) -> str:
    return f" ({', '.join(map(str, base.values()))})" if base else ""


def _slope_rows(ds: xr.Dataset, base: dict) -> list[Row]:
    variant = base.get("variant")
    sel = dict(_fixed(ds, C0=10.0, single_step_method="single_step_exact"), **base)
    acc_sel = dict(sel)
    if "m" in ds.dims:
        sel["m"] = int(ds["m"].max())
    sub = ds.sel(sel)
    tag = _tag(base)
    eta = "med_eta_rel" if variant == "raw" else "med_eta_star"
    rows = []
    for var, target, tol, name in (("med_gnorm", 0.5, 0.1, "||∇f|| slope in d"),
                                   ("med_delta_rel", -0.5, 0.1, "||δ*||/||x|| slope in d"),
                                   (eta, -1.0, 0.15, ("η/||x||" if variant == "raw" else "η") + " slope in d")):
        da = _mean(sub, var, ("d",))
        d = da["d"].values.astype(float)
        s = free_slope(d, da.values)
        measured = f"{s:+.3f} over d = {list(map(int, d))}"
        if var != "med_gnorm" and 2 <= int((d >= MIN_D).sum()) < len(d):  # the in-regime fit beside it
            measured += f" (d >= {MIN_D}: {free_slope(d[d >= MIN_D], da.values[d >= MIN_D]):+.3f})"
        if var != "med_gnorm" and int((d >= MIN_D).sum()) < 2:  # outside the regime of the claim: not judged
            rows.append(Row(name + tag, "E1", measured, f"{target:+.2f} ± {tol}", None,
                            f"skipped: needs d >= {MIN_D} (two or more such d); below it ||δ*||/||x|| is flat "
                            "in d on MNIST (README, E1 at CI size)",
                            value=s))
            continue
        rows.append(Row(name + tag, "E1", measured, f"{target:+.2f} ± {tol}",
                        None if math.isnan(s) else abs(s - target) <= tol, value=s))
    da = _mean(sub, "med_gnorm", ("d",))
    r = float(np.nanmedian(da.values / np.sqrt(da["d"].values / 2)))
    rows.append(Row("||∇f|| / √(d/2)" + tag, "E1", f"{r:.3f}", "in [0.9, 1.3]", None if math.isnan(r) else
                    0.9 <= r <= 1.3, value=r))
    acc = float(ds["test_acc"].where(kept(ds)).sel(acc_sel).min())
    rows.append(Row(f"test error < 1% (every usable cell at C0 = {acc_sel.get('C0', '-')})" + tag, "E1", f"min test acc {acc:.4f}", ">= 0.99",
                    None if math.isnan(acc) else acc >= 0.99, value=acc))
    return rows


def _monotone_rows(ds: xr.Dataset, base: dict) -> list[Row]:
    if "C0" not in ds.dims or ds.sizes["C0"] < 2:
        return [skipped("E2", "increase in C0 of ||∇f||, η, ||δ*||", "monotone at every d", "one C0 only")]
    sel = dict(_fixed(ds, single_step_method="single_step_exact"), **base)
    if "m" in ds.dims:
        sel["m"] = int(ds["m"].max())
    sub = ds.sel(sel)
    rows = []
    for var in ("med_gnorm", "med_eta_star", "med_delta_rel"):
        da = _mean(sub, var, ("C0",) + (("d",) if "d" in sub.dims else ())).transpose("C0", ...)
        mono = (np.diff(da.values, axis=0) > 0).all(0)
        frac = float(np.mean(mono))
        rows.append(Row(f"{var} increases with C0" + _tag(base), "E2",
                        f"monotone at {frac:.0%} of d", "100%", frac == 1.0, value=frac))
    return rows


def _fig7_row(ds: xr.Dataset) -> Row:
    if "variant" not in ds.dims or "raw" not in list(ds["variant"].values) or 784 not in list(ds["d"].values):
        return skipped("E3", "Fig 7: raw-variant median η at d = 784, m = 1e5, C0 = 10", "within 2x of 0.045",
                       "no raw d = 784 cells")
    sel = dict(_fixed(ds, m=100000, C0=10.0, single_step_method="single_step_exact", data="mnist"), variant="raw", d=784)
    eta = float(_mean(ds.sel(sel), "med_eta_star", ()))
    return Row("Fig 7: raw-variant median η", "E3", f"{eta:.4f} at {sel}", "within 2x of 0.045",
               None if math.isnan(eta) else 0.0225 <= eta <= 0.09, value=eta)


PLATEAU_HIGH, PLATEAU_LOW = 0.9, 0.1  # E4/E5: RTA ≈ 1 at the smallest budget / radius end, ≈ 0 at the other


def _pgd_rows(ds: xr.Dataset) -> list[Row]:
    """E4 / E5 per (variant, data) slice, never pooled across data sets (issue 28 item 7); each with its
    plateaus and E5's flatness in m, not only the constant (item 8). Nets adv_train returned untrained
    (train_status 1) are left out and counted in each row's note (item 9)."""
    rows = []
    for base in slices(ds) or [{}]:
        rows += _pgd_slice_rows(ds.sel(base) if base else ds, _tag(base))
    return rows


def _judged(ds: xr.Dataset, per: tuple[str, ...]) -> str:
    """The slice a row judged: its kept cells, what RTA is averaged over, and the nets left out."""
    over = [dim for dim in ds["done"].dims if dim not in per]
    gone = left_out(ds)
    return (f"judged: {int(kept(ds).sum())} cells, RTA averaged over {', '.join(over) or 'nothing'} per "
            f"({', '.join(per)})" + (f"; {gone} (train_status 1)" if gone else ""))


def _ends(da: xr.DataArray, axis: str, every: str, note: str) -> tuple[bool, str]:
    """Does the mean RTA ``da`` have a value at both ends of ``axis`` for every ``every`` (a plateau
    row judges nothing else), and the row's note: ``note``, after 'not judged: needs ...' where not."""
    if bool(np.isfinite(da.isel({axis: [0, -1]}).values).all()):
        return True, note
    return False, f"not judged: needs kept cells at the smallest and largest {axis} for every {every}; {note}"


def _pgd_slice_rows(ds: xr.Dataset, tag: str) -> list[Row]:
    if not bool(kept(ds).any()):
        why = f"not judged: needs trained nets; {left_out(ds) or 'no usable cells'}"
        return [skipped("E4", "R50(d) slope, constant and plateaus" + tag, "-0.5 ± 0.1; 5 in [3, 8]", why),
                skipped("E5", "V50(m)·√m, flat in m, plateaus" + tag, "in [15, 40]", why)]
    rows = []
    if "R" in ds.dims and ds.sizes["R"] > 1 and "d" in ds.dims and ds.sizes["d"] > 1:
        note = _judged(ds, ("d", "R"))
        da = _mean(ds, "rta", ("d", "R")).transpose("d", "R")
        d = da["d"].values.astype(float)
        r50 = np.array([threshold(da["R"].values, row) for row in da.values])
        s = free_slope(d, r50)
        ok = np.isfinite(r50)
        const = float(np.exp(np.mean(np.log(r50[ok] * np.sqrt(d[ok]))))) if ok.any() else float("nan")
        rows.append(Row("R50(d) slope in d (Fig 4 left)" + tag, "E4", f"{s:+.3f} from {int(ok.sum())} d", "-0.5 ± 0.1",
                        None if math.isnan(s) else abs(s + 0.5) <= 0.1, note, value=s))
        rows.append(Row("R50(d)·√d (the paper's 5)" + tag, "E4", f"{const:.2f}", "in [3, 8]",
                        None if math.isnan(const) else 3 <= const <= 8, note, value=const))
        lo, hi = float(da.isel(R=0).min()), float(da.isel(R=-1).max())
        full, why = _ends(da, "R", "d", note)
        rows.append(Row("RTA plateaus: ≈ 1 at the smallest R, ≈ 0 at the largest, every d" + tag, "E4",
                        f"min RTA {lo:.3f} at R = {float(da.R[0]):g}; max {hi:.3f} at R = {float(da.R[-1]):g}",
                        f">= {PLATEAU_HIGH}; <= {PLATEAU_LOW}",
                        lo >= PLATEAU_HIGH and hi <= PLATEAU_LOW if full else None, why, value=lo - hi))
    else:
        rows.append(skipped("E4", "R50(d) slope, constant and plateaus" + tag, "-0.5 ± 0.1; 5 in [3, 8]",
                            "needs a (d, R) grid"))
    if "V" in ds.dims and ds.sizes["V"] > 1 and "m" in ds.dims:
        note = _judged(ds, ("m", "V"))
        da = _mean(ds, "rta", ("m", "V")).transpose("m", "V")
        m = da["m"].values.astype(float)
        v50 = np.array([threshold(da["V"].values, 1 - row) for row in da.values])
        c = v50 * np.sqrt(m)
        ok = np.isfinite(c)
        const = float(np.exp(np.mean(np.log(c[ok])))) if ok.any() else float("nan")
        rows.append(Row("V50(m)·√m (the paper's 25; Fig 4 right)" + tag, "E5",
                        f"{const:.1f} (per m: {np.round(c, 1).tolist()})", "in [15, 40]",
                        None if math.isnan(const) else 15 <= const <= 40, note, value=const))
        spread = float(c[ok].max() / c[ok].min()) if ok.sum() >= 2 else float("nan")
        rows.append(Row("V50(m)·√m flat in m: every m in [15, 40]" + tag, "E5",
                        f"per m in [{np.nanmin(c):.1f}, {np.nanmax(c):.1f}] (max/min {spread:.2f}), "
                        f"{int(ok.sum())}/{len(m)} m with a crossing", "every m in [15, 40]",
                        None if not ok.any() else bool(ok.all() and ((c >= 15) & (c <= 40)).all()), note,
                        value=spread))
        lo, hi = float(da.isel(V=0).max()), float(da.isel(V=-1).min())
        full, why = _ends(da, "V", "m", note)
        rows.append(Row("RTA plateaus: ≈ 0 at the smallest V, ≈ 1 at the largest, every m" + tag, "E5",
                        f"max RTA {lo:.3f} at V = {float(da.V[0]):g}; min {hi:.3f} at V = {float(da.V[-1]):g}",
                        f"<= {PLATEAU_LOW}; >= {PLATEAU_HIGH}",
                        lo <= PLATEAU_LOW and hi >= PLATEAU_HIGH if full else None, why, value=hi - lo))
    else:
        rows.append(skipped("E5", "V50(m)·√m, flat in m, plateaus" + tag, "in [15, 40]", "needs an (m, V) grid"))
    return rows


def acceptance(ds: xr.Dataset) -> list[Row]:
    if "rta" in ds:
        return _pgd_rows(ds)
    if "med_delta_rel" not in ds:
        return []
    if "d" not in ds.dims or ds.sizes["d"] < 2:
        return [skipped("E1", "slopes in d", "±0.1 of the theorem's exponents", "needs several d")]
    rows = []
    for base in slices(ds):
        rows += _slope_rows(ds, base) + _monotone_rows(ds, base)
    return rows + [_fig7_row(ds)]


# --- X3 (spec 003 §5.2, "attack strength inside the ball"), compared across groups of one store ------
# Per test point, the exact single step's ||δ*|| against the best perturbation any attack of the store
# found on the same net and point: DeepFool's ||δ|| (a ``single_step`` group run with ``deepfool: true``)
# and, for every ``pgd`` group reading the same nets, the budget R of each PGD variant (T2, restarts, R)
# that flipped the point: ``ratio = ||δ*|| / min(||δ*||, ||δ_DeepFool||, R of a flipping PGD run)`` (>= 1;
# 1: nothing beat the single step). "For V < V* the single step is within ~1.2x of the best found" is
# read as: the median ratio over correctly classified test points of the nets with C0 = V√m below the
# Fig 4 transition C0* = 25 (spec §4: V* = 25/√m) is <= 1.2; the 90th percentile and the fraction of
# points within 1.2x are shown beside it. ``kktlab report`` calls :func:`store_acceptance`.
C0_STAR = 25.0
WITHIN = 1.2


def _source(ds: xr.Dataset) -> str | None:
    return json.loads(ds.attrs.get("kktlab_identity") or "{}").get("from")


def _lazy_mask(ds: xr.Dataset, up: dict) -> xr.DataArray:
    """Cells whose net lies inside the ball below the transition: C0 < C0* (C0 = V√m for adv nets);
    ``up`` the upstream stage's fixed parameters (C0, V, m when they are not axes)."""
    if "C0" in ds.coords or "C0" in up:
        return (ds["C0"] if "C0" in ds.coords else xr.DataArray(float(up["C0"]))) < C0_STAR
    if "V" in ds.coords or "V" in up:
        m = ds["m"] if "m" in ds.coords else up.get("m", 1000)
        return (ds["V"] if "V" in ds.coords else xr.DataArray(float(up["V"]))) * np.sqrt(m) < C0_STAR
    return xr.DataArray(True)


def ratios(flips: xr.Dataset, pgds: list[xr.Dataset], up: dict | None = None) -> xr.DataArray:
    """Per (net, test point) ``||δ*_single|| / best found``, NaN where not judged (misclassified
    point, cell not done, C0 >= C0*). ``flips`` a full single_step group with DeepFool, ``pgds`` the
    full pgd groups reading the same stage, ``up`` that stage's fixed parameters. Dims: the flips
    group's, less its own axes."""
    f = flips.where(usable(flips))
    if "single_step_method" in f.dims:
        f = (f.sel(single_step_method="single_step_exact") if "single_step_exact" in f["single_step_method"].values
             else f.isel(single_step_method=0))
    if "deepfool" in f.dims:
        f = f.sel(deepfool=True)
    single = f["delta_rel"] * f["x_norm"]
    best = np.minimum(single, f["delta_deepfool"].fillna(np.inf))
    for p in pgds:
        pu = p.where(usable(p))
        bound = xr.where(pu["robust"] == 0, pu["R_used"], np.inf)
        own = [dim for dim in bound.dims if dim not in single.dims]
        best = np.minimum(best, bound.min(own) if own else bound)
    keep = (f["correct"] == 1) & np.isfinite(single) & _lazy_mask(f, up or {})
    return (single / best).where(keep)


def x3_rows(flips: xr.Dataset, pgds: list[xr.Dataset], up: dict | None = None) -> list[Row]:
    crit = "X3: single step within ~1.2x of the best attack found (V < V*)"
    if "delta_deepfool" not in flips or not bool(np.isfinite(flips["delta_deepfool"]).any()):
        return [skipped("X3", crit, f"median ratio <= {WITHIN}", "single_step ran without deepfool: true")]
    r = ratios(flips, pgds, up)
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
    opened = {g: open_checked(store, g) for g in names}  # damaged cells left out by usable()
    kind = {g: ds.attrs.get("kktlab_experiment") for g, ds in opened.items()}
    rows = []
    for g, ds in opened.items():
        if kind[g] != "single_step" or "delta_deepfool" not in ds or not bool(np.isfinite(ds["delta_deepfool"]).any()):
            continue  # X3 needs DeepFool (deepfool: true); other single_step groups have nothing to compare
        src = _source(ds)
        pgds = [opened[p].load() for p in names if kind[p] == "pgd" and _source(opened[p]) == src]
        up = fixed_params(opened[src]) if src in opened else {}
        rows += [dataclasses.replace(r, criterion=f"{r.criterion} [{g}]") for r in x3_rows(ds.load(), pgds, up)]
    return rows

