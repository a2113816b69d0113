"""Acceptance rows of paper 004 (spec §5, P004-13 … P004-17) from a ``reconstruct`` group.

P004-16 needs an image group (F004-2, configs/paper-004-f2-cifar.yaml) with shifts 0, 0.5, 5;
P004-17 a group with shift 0.5 (its per-cell ``avg_frac``, tasks/reconstruct/score.py::knn_averages)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from analysis.acceptance import Row, skipped
from analysis.reconstruct import per_radius
from storage.stats import aggregate, caption


def per_net(ds: xr.Dataset) -> list[xr.Dataset]:
    """One slice per attacked net: the cells of one value of every dim but radius, restart and
    shift (P004-13 / P004-15 compare runs on the same weights, never across nets; issue 28 item 8)."""
    dims = [d for d in ds["done"].dims if d not in ("radius", "restart", "shift")]
    sizes = [ds.sizes[d] for d in dims]
    return [ds.isel(dict(zip(dims, idx))) for idx in np.ndindex(*sizes)] if dims else [ds]


PREMISE_EPS = 0.5  # ε*/‖θ‖ of the attacked net's training set above which F004-1's shape predictions are not judged
ATTACK_IDS = ("P004-13", "P004-14", "P004-15")


def premise(ds: xr.Dataset) -> tuple[xr.Dataset, str, int]:
    """F004-1's attack predictions (P004-13..15) are about nets trained towards a KKT point of their whole
    training set (spec 004 §5, P004-10/11): nets an unlearn stage changed (a forgotten point) and nets whose
    training set sits at ε*/‖θ‖ (``train_eps``) above :data:`PREMISE_EPS` are left out of them (their cells
    marked not done in the slice returned). Returns (slice, note naming what was left out, nets judged)."""
    inner = [d for d in ("radius", "restart", "shift") if d in ds["done"].dims]
    any_ = lambda a: a.any(inner) if inner else a  # noqa: E731
    nets = any_(ds["done"].astype(bool))
    forgot = any_(np.isfinite(ds["recovered_forgotten"])) if "recovered_forgotten" in ds else xr.zeros_like(nets)
    loose = ((ds["train_eps"].where(ds["done"].astype(bool)).median(inner) if inner else ds["train_eps"]) > PREMISE_EPS
             if "train_eps" in ds else xr.zeros_like(nets))
    keep = ~forgot.astype(bool) & ~loose.astype(bool)
    total, judged = int(nets.size), int((keep & nets).sum())
    left = []
    if int(forgot.sum()):
        left.append(f"{int(forgot.sum())} from an unlearn stage")
    if int((loose & ~forgot.astype(bool)).sum()):
        left.append(f"{int((loose & ~forgot.astype(bool)).sum())} with ε*/‖θ‖ > {PREMISE_EPS:g}")
    note = f"judged {judged} of {total} nets (left out, outside F004-1's premise: {', '.join(left)})" if left else ""
    return ds.assign(done=ds["done"].astype(bool) & keep), note, judged


def acceptance(ds: xr.Dataset) -> list[Row]:
    judged_ds, left_out, judged = premise(ds)
    rows = _attack_rows(judged_ds)
    if left_out:
        rows = [r if r.spec_id not in ATTACK_IDS else
                skipped(r.spec_id, r.criterion, r.threshold, left_out) if not judged else
                Row(r.criterion, r.spec_id, r.measured, r.threshold, r.passed, f"{r.note}; {left_out}", r.value)
                for r in rows]
    return rows + [_ssim_row(ds), _averages_row(ds)]


def _attack_rows(ds: xr.Dataset) -> list[Row]:
    """P004-13, P004-14, P004-15 on the nets of ``ds`` marked done."""
    scores = per_radius(ds, "score5")
    rows: list[Row] = []
    nets = [np.concatenate(list(o.values())) for o in map(lambda n: per_radius(n, "objective"), per_net(ds)) if o]
    nets = [o for o in nets if o.size >= 2 and np.all(o > 0)]
    if nets:
        ratio = max(float(o.max() / o.min()) for o in nets)
        rows.append(Row("objective nearly equal across radii and seeds", "P004-13", f"max/min = {ratio:.4g}",
                        "<= 1.01", ratio <= 1.01, f"worst of {len(nets)} nets, each over its radii x restarts "
                        f"({sum(o.size for o in nets)} runs); absolute value reported, not gated", ratio))
    else:
        rows.append(skipped("P004-13", "objective nearly equal across radii and seeds", "<= 1.01"))
    med = {r: float(np.median(v)) for r, v in scores.items() if v.size}
    if med and 10.0 in med and any(0.5 <= r <= 2 for r in med):
        best = min(med, key=med.get)
        ok = 0.5 <= best <= 2 and med[10.0] >= 2 * med[best] and med[10.0] >= 0.9
        rows.append(Row("median score smallest at r in [0.5, 2]; at r = 10 >= 2x min and >= 0.9", "P004-14",
                        f"argmin r = {best:g} ({med[best]:.3g}); r=10: {med[10.0]:.3g}", "see criterion", ok,
                        _recovered_note(ds), value=med[10.0] / med[best]))
    else:
        rows.append(skipped("P004-14", "median score smallest near r = 1, large at r = 10", "see criterion",
                            "needs radii 10 and one in [0.5, 2]"))
    if "restart" in ds.dims and ds.sizes["restart"] >= 2 and med:
        worst, n_nets = None, 0
        for net in per_net(ds):
            sc_net, ob_net = per_radius(net, "score5"), per_radius(net, "objective")
            n_nets += bool(sc_net)
            for r in sc_net:
                sc, ob = sc_net[r], ob_net.get(r, np.array([]))
                if sc.size >= 2 and ob.size >= 2 and ob.mean() > 0:
                    q = float(sc.std() / (10 * ob.std() / ob.mean())) if ob.std() > 0 else np.inf
                    worst = q if worst is None else min(worst, q)
        if worst is not None:
            rows.append(Row("score std across runs >= 10x relative objective std", "P004-15",
                            f"min over nets and radii of ratio/threshold = {worst:.3g}", ">= 1", worst >= 1,
                            f"per net ({n_nets}) and radius, across its restarts", value=worst))
    if len(rows) < 3:
        rows.append(skipped("P004-15", "score std across runs >= 10x relative objective std", ">= 1",
                            "needs >= 2 restarts per radius"))
    return rows


def _recovered_note(ds: xr.Dataset) -> str:
    """P004-14's "at the best radius expect some candidates <= 0.3 from a training point; if not,
    report": per radius, the runs with a recovered training point and the points recovered in all."""
    rec = per_radius(ds, "n_recovered") if "n_recovered" in ds else {}
    if not rec:
        return ""
    parts = [f"r={r:g}: {int((v > 0).sum())}/{v.size} runs, {int(v.sum())} points" for r, v in sorted(rec.items())]
    return "recovered (a candidate within rho): " + "; ".join(parts)


def _averages_row(ds: xr.Dataset) -> Row:
    """P004-17: at u = 0.5 the majority of the 10 best candidates are closer (unit-normalised) to the
    mean of their K = 2..10 nearest training points than to the nearest one; judged on the median
    over usable cells of the per-cell fraction (``avg_frac``)."""
    from storage.query import usable

    crit, thr = "u=0.5: 10 best candidates closer to a K-nearest mean (K=2..10) than to the nearest", "median > 0.5"
    if "avg_frac" not in ds or "shift" not in ds.dims or 0.5 not in set(map(float, ds["shift"].values)):
        return skipped("P004-17", crit, thr, "needs a group with shift 0.5 (F004-2)")
    vals = np.asarray(ds.avg_frac.where(usable(ds)).sel(shift=0.5).values, dtype=float).ravel()
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return skipped("P004-17", crit, thr, "no usable cell at shift 0.5")
    med = float(np.median(vals))
    return Row(crit, "P004-17", f"median fraction {med:.3g} over {vals.size} runs", thr, med > 0.5,
               "unit-normalised distances, shift taken off", value=med)


def _ssim_row(ds: xr.Dataset) -> Row:
    """P004-16 from the per-cell ssim10 / ssim_max of an image (CIFAR) group with shifts 0, 0.5, 5."""
    from storage.query import usable

    crit, thr = "mean SSIM of 10 best: u=0 > u=0.5 > u=5; at u=5 max SSIM < 0.4", "ordered, < 0.4"
    if "ssim10" not in ds or "shift" not in ds.dims or not {0.0, 0.5, 5.0} <= set(map(float, ds["shift"].values)):
        return skipped("P004-16", crit, thr, "needs an image (CIFAR, F004-2) group with shifts 0, 0.5, 5")
    ok = usable(ds)
    # the mean per shift over the nets, each net's restarts (and other axes) averaged first: storage/stats.py
    agg = aggregate(ds.ssim10, [d for d in ds.ssim10.dims if d != "shift"], usable=ok, done=ds["done"])
    m = {u: float(agg.estimate.sel(shift=u)) for u in (0.0, 0.5, 5.0)}
    top5 = float(ds.ssim_max.where(ok).sel(shift=5.0).max())
    if not all(np.isfinite(list(m.values()))):
        return skipped("P004-16", crit, thr, "no SSIM stored (not image data)")
    passed = m[0.0] > m[0.5] > m[5.0] and top5 < 0.4
    return Row(crit, "P004-16", f"{m[0.0]:.3g} / {m[0.5]:.3g} / {m[5.0]:.3g}; u=5 max {top5:.3g}", thr, passed,
               caption(agg.sel(shift=[0.0, 0.5, 5.0]), "per shift"), value=m[0.0])
