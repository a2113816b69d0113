"""Spec 001 §6 acceptance rows judged on an ``unlearn`` store: P001-4 (Figure 1's shape), P001-7
(linear rate, Thm 3.1 part 2, fitted C), P001-10 (D_MG test accuracy after unlearning). Means are
storage/stats.py's: over the nets (seed dim) of usable, feasible cells, each net's other cells
averaged first, finite values only; criteria without data say so."""

from __future__ import annotations

import itertools

import numpy as np
import xarray as xr

from analysis.acceptance import Row, skipped
from analysis.unlearn import _keep
from storage.query import fixed_params
from storage.stats import NETS, aggregate, caption

P4 = "argmin of the mean ε(α) in [0.8, 1.2]; ε(1) < ε(0) and ε(1) < ε(1.5) for >= 80 % of nets"
P7 = "1 − cos(ŵ(1), w*) decreases with d; C = (1 − cos)/(√ε_d + √ε_1 + √δ_1) <= 10"
P10 = "test acc of θ̂(1) >= test acc of θ − 0.02 (a = 0.1, d >= 2000, mean over seeds)"


def _param(ds, name, default=None):
    return fixed_params(ds).get(name, default)


def _ga_lines(ds):
    """Combinations of the non-alpha, non-seed dims where the method is GA-like with k = 1."""
    others = [d for d in ds.dims if d not in ("alpha", "seed")]
    for combo in itertools.product(*(list(ds[d].values) for d in others)):
        sel = dict(zip(others, combo))
        method, k = sel.get("unlearn_method", _param(ds, "unlearn_method", "ga")), sel.get("k", _param(ds, "k", 1))
        if method in ("ga", "k_ga") and int(k) == 1:
            yield sel


def p001_4(ds: xr.Dataset) -> list[Row]:
    if "alpha" not in ds.dims or not {0.0, 1.0, 1.5} <= set(np.round(ds.alpha.values, 12)) or \
            _param(ds, "model", "two_layer") == "linear" or "model" in ds.dims:
        return [skipped("P001-4", "Fig. 1 shape", P4, "needs a two-layer alpha sweep with 0, 1 and 1.5")]
    rows = []
    every_l = _param(ds, "forget", -1) == -2 and "forget" not in ds.dims
    readings = [("eps_mean", "mean over l" if every_l else "")]
    if every_l and "eps_app_e" in ds and bool(np.isfinite(ds["eps_app_e"]).any()):
        readings.append(("eps_app_e", "App. E: one random l per net"))  # issue 28 item 11: both readings
    for sel, (var, reading) in itertools.product(list(_ga_lines(ds)), readings):
        e, keep, done = (x.sel(sel) if sel else x for x in (ds[var], _keep(ds), ds["done"]))
        mean = aggregate(e, [NETS], usable=keep, done=done).estimate  # over the nets' usable, finite ε
        if not np.isfinite(mean).any():
            continue
        a_star = float(mean.idxmin("alpha"))
        f0, f15 = (_share_of_nets(e, keep, 1.0, a) for a in (0.0, 1.5))
        ok = 0.8 <= a_star <= 1.2 and float(f0.estimate) >= 0.8 and float(f15.estimate) >= 0.8
        label = ", ".join([f"{k}={v}" for k, v in sel.items()] + ([reading] if reading else []))
        epochs = _upstream_param(ds, "epochs")
        n = f"n={int(f0.n)}" + (f"/{e.sizes[NETS]} nets" if NETS in e.dims and int(f0.n) < e.sizes[NETS] else "")
        rows.append(Row(f"Fig. 1 shape ({label})" if label else "Fig. 1 shape", "P001-4",
                        f"α*={a_star:.2f}, ε(1)<ε(0) {float(f0.estimate):.0%}, ε(1)<ε(1.5) {float(f15.estimate):.0%}, "
                        f"{n}", P4, ok,
                        f"{var}: " + ("ε at App. E's one random forgotten l per net" if var == "eps_app_e" else
                                      "ε averaged over the forgotten l" if every_l else "ε of the forgotten set")
                        + (f"; nets trained {epochs} epochs" if epochs else ""), a_star))
    return rows or [skipped("P001-4", "Fig. 1 shape", P4, "no GA cells with k = 1")]


def _share_of_nets(e: xr.DataArray, keep: xr.DataArray, a: float, b: float) -> xr.Dataset:
    """storage/stats.py's share of the nets with ε(a) < ε(b), over the nets whose two cells are usable
    and finite (a net without both is left out and counted, never counted as failing or passing)."""
    both = keep.sel(alpha=a) & keep.sel(alpha=b) & np.isfinite(e.sel(alpha=a)) & np.isfinite(e.sel(alpha=b))
    return aggregate((e.sel(alpha=a) < e.sel(alpha=b)).astype(float), [NETS], usable=both)


def p001_7(ds: xr.Dataset) -> list[Row]:
    if "tau_svm" not in ds or not bool(np.isfinite(ds["tau_svm"]).any()) or "d" not in ds.dims or \
            "alpha" not in ds.dims or 1.0 not in ds.alpha.values:
        return [skipped("P001-7", "linear rate in d", P7, "needs linear cells over several d with α = 1")]
    keep = _keep(ds).sel(alpha=1.0)
    tau = ds["tau_svm"].sel(alpha=1.0).where(keep)
    rate = (np.sqrt(ds["eps_d"]) + np.sqrt(ds["eps1"]) + np.sqrt(ds["delta1"])).sel(alpha=1.0).where(keep)
    by_d = aggregate(ds["tau_svm"].sel(alpha=1.0), [d for d in tau.dims if d != "d"], usable=keep).estimate
    decreasing = bool((np.diff(by_d.values) <= 0).all())
    C = float((tau / rate).median())
    return [Row("1 − cos to retained SVM vs d (linear)", "P001-7",
                "by d: " + ", ".join(f"{int(d)}: {v:.2g}" for d, v in zip(by_d.d.values, by_d.values)) + f"; C={C:.3g}",
                P7, decreasing and C <= 10, "C is the median ratio over cells (Thm 3.1 leaves it unspecified)", C)]


TRAIN_KKT_MU_A = 0.1  # train_kkt's default mu_a (flows/experiments/train_kkt.py), where its stage leaves it out


def _upstream_param(ds: xr.Dataset, name: str):
    """``name`` as the stage this group reads set it (the chain config kept in the group), else None."""
    import json

    import yaml

    up = json.loads(ds.attrs.get("kktlab_identity") or "{}").get("from")
    try:
        raw = yaml.safe_load(ds.attrs.get("config") or "") or {}
    except yaml.YAMLError:
        return None
    for stage in raw.get("stages", []) if isinstance(raw, dict) else []:
        if isinstance(stage, dict) and stage.get("name") == up:
            if name in (stage.get("grid") or {}):
                return list(stage["grid"][name])
            return (stage.get("params") or {}).get(name, TRAIN_KKT_MU_A if name == "mu_a" else None)
    return None


def p001_10(ds: xr.Dataset) -> list[Row]:
    """Judged only in the regime P001-10 names (a = 0.1, d >= 2000): per cell from the grid, the stored
    true size ``d_used`` or the train stage's parameters; a group outside it is not judged (issue 28
    item 6: a d = 500 group used to pass with "d not a grid axis")."""
    crit = "D_MG test accuracy"
    if "test_acc_after" not in ds or not bool(np.isfinite(ds["test_acc_after"]).any()) or \
            "alpha" not in ds.dims or 1.0 not in ds.alpha.values:
        return [skipped("P001-10", crit, P10, "needs D_MG cells with test_points and α = 1")]
    keep = _keep(ds).sel(alpha=1.0)
    if "mu_a" in ds.dims:
        keep = keep & (abs(ds["mu_a"] - 0.1) < 1e-12)
    else:
        a = _upstream_param(ds, "mu_a")
        if a is None or (isinstance(a, list) and 0.1 not in a) or (not isinstance(a, list) and abs(a - 0.1) > 1e-12):
            return [skipped("P001-10", crit, P10, f"not judged: a = {a} (needs cells with a = 0.1)")]
    if "d" in ds.dims:
        keep = keep & (ds["d"] >= 2000)
    elif "d_used" in ds:
        keep = keep & (ds["d_used"].sel(alpha=1.0) >= 2000)
    else:
        d = _upstream_param(ds, "d")
        if d is None or max(d if isinstance(d, list) else [d]) < 2000:
            return [skipped("P001-10", crit, P10, f"not judged: d = {d} (needs d >= 2000)")]
    n = int(keep.sum())
    if n == 0:
        return [skipped("P001-10", crit, P10, "not judged: no usable cell with a = 0.1 and d >= 2000")]
    # means over the nets, each net's judged cells (several d, ...) averaged first: storage/stats.py
    before, after, signs = (aggregate(ds[v].sel(alpha=1.0), list(keep.dims), usable=keep)
                            for v in ("test_acc_before", "test_acc_after", "sign_id_after"))
    b, a, sign = float(before.estimate), float(after.estimate), float(signs.estimate)
    return [Row("D_MG test accuracy after GA", "P001-10", f"before {b:.4f}, after {a:.4f}, Lemma D.7 signs {sign:.3f}",
                P10, a >= b - 0.02, f"{n} cells with a = 0.1, d >= 2000; {caption(after, 'per mean')}", a - b)]


def acceptance(ds: xr.Dataset) -> list[Row]:
    return p001_4(ds) + p001_7(ds) + p001_10(ds)
