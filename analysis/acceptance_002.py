"""Spec 002 §4 acceptance criteria R1-R5, judged on a ``nonrobust`` store as the spec states them.

R1 looks at every done run (it is the criterion that says whether training worked); R2-R5 at
the usable cells of the figures (done and converged; see analysis/nonrobust.py). Means and stds
are over seeds with ddof=1 (spec A9)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import xarray as xr

from analysis.acceptance import Row, skipped
from analysis.nonrobust import lines, ok_statuses
from storage.query import fixed_params, usable
from tasks.train import STATUS_NAMES

ACC_TOL = 1e-12  # train_acc is a ratio of counts; "100 %" allows only rounding
R3_FULL_ALPHA, R3_MOST_ALPHA, R3_MOST = 0.5, 0.8, 0.92  # spec §4 R3 / Fig. 2(a)
ALPHA_TOL = 0.02  # alpha = log m / log d is off by rounding m = round(d^alpha) when m is on the grid
R5_MAX_CV = 0.25  # spec §4 R5 gives no number ("small relative to the mean"); this is ours


def _grid_or_param(ds: xr.Dataset, name: str):
    """A grid coordinate (broadcast over the cells) or the config's fixed value, else None."""
    if name in ds.dims:
        return ds[name].astype(float)
    value = fixed_params(ds).get(name)
    return None if value is None else float(value)


def _alpha(ds: xr.Dataset) -> xr.DataArray:
    """alpha of every cell: the grid's / config's alpha where m = round(d^alpha) (m = 0), else
    log m / log d from the stored sample size."""
    if "m" not in ds.dims and fixed_params(ds).get("m", 0) == 0 and _grid_or_param(ds, "alpha") is not None:
        return xr.zeros_like(ds.done, dtype=float) + _grid_or_param(ds, "alpha")
    return np.log(ds["m_used"].astype(float)) / np.log(xr.zeros_like(ds.done, dtype=float) + _grid_or_param(ds, "d"))


MARGIN = "margin_direction"  # R2 / R3 are about the margin direction z (spec 002 §4); E11's random directions are not


def per_net(ds: xr.Dataset) -> xr.Dataset:
    """One cell per trained net: a reading stage's own axes (attack, slack) repeat its train stage's
    numbers, so R1 counts nets, not nets x attacks (issue 28 item 5)."""
    return ds.isel({a: 0 for a in ("attack", "slack") if a in ds.dims})


def margin_slice(ds: xr.Dataset) -> tuple[xr.Dataset | None, str]:
    """The cells attacked along the margin direction (and a note saying so), or None with the reason
    when the group attacks along other directions only."""
    if "attack" in ds.dims:
        if MARGIN not in list(ds["attack"].values):
            return None, f"not judged: needs attack={MARGIN} cells (spec E11 expects other directions far larger)"
        return ds.sel(attack=MARGIN), f"attack={MARGIN} cells only"
    attack = fixed_params(ds).get("attack", MARGIN)
    if attack != MARGIN:
        return None, f"not judged: this group attacks along {attack} (R2/R3 are about {MARGIN})"
    return ds, ""


def r1(ds: xr.Dataset) -> Row:
    crit, thr = "all runs reach loss < target with 100 % training accuracy", "every done run"
    ds = per_net(ds)
    target = _grid_or_param(ds, "target_loss")
    done = ds.done.values.astype(bool)
    if not done.any() or target is None or "log10_loss" not in ds:
        return skipped("R1", crit, thr)
    log10_target = np.log10(target) + xr.zeros_like(ds.done, dtype=float)
    loss = ds["log10_loss"].values.astype(float)[done]
    acc = ds["train_acc"].values.astype(float)[done]
    ok = (loss < log10_target.values[done]) & (acc >= 1 - ACC_TOL)
    status = ds["status"].values[done] if "status" in ds else None
    ok_codes = ok_statuses(ds)
    causes = "" if status is None else ", ".join(
        f"{int((status == c).sum())} {name}" for c, name in STATUS_NAMES.items() if c not in ok_codes and (status == c).any())
    pending = int((~done).sum())
    note = "; ".join(p for p in (f"not reached: {causes}" if causes else "",
                                 f"{pending} cells pending" if pending else "") if p)
    measured = (f"{int(ok.sum())}/{ok.size} runs; worst log10 loss {np.nanmax(loss):.1f}, "
                f"min acc {np.nanmin(acc):.4f}")
    return Row(crit, "R1", measured, f"{thr}: log10 loss < {np.log10(target):.0f}, acc = 1",
               bool(ok.all()), note, float(ok.mean()))


def r2(ds: xr.Dataset) -> Row:
    crit, thr = "c* < sqrt(d) for every (alpha, d, seed)", "max c*/sqrt(d) < 1"
    d = _grid_or_param(ds, "d")
    if "c_star" not in ds or d is None:
        return skipped("R2", crit, thr)
    ds, where = margin_slice(ds)
    if ds is None:
        return skipped("R2", crit, thr, where)
    ratio_all = ds["c_star"].astype(float) / np.sqrt(xr.zeros_like(ds.done, dtype=float) + d)
    mask = usable(ds, ok_statuses(ds)).values
    ratio = ratio_all.values[mask]
    left_out = int(ds.done.values.sum() - mask.sum())
    if ratio.size == 0:
        return skipped("R2", crit, thr, "no converged cell")
    n_inf = int(np.isinf(ratio).sum())
    worst = float(np.max(ratio))
    measured = f"max {worst:.3g} over {ratio.size} runs" + (f" ({n_inf} with c* = inf)" if n_inf else "")
    note = "; ".join(p for p in (where, f"{left_out} non-converged runs left out" if left_out else "") if p)
    return Row(crit, "R2", measured, thr, bool(worst < 1), note, worst)


def r3(ds: xr.Dataset) -> list[Row]:
    rows = []
    specs = (("|I|/m = 1 for alpha = 0.5", lambda a: np.abs(a - R3_FULL_ALPHA) <= ALPHA_TOL,
              1.0, "min |I|/m = 1 in every converged run"),
             ("|I|/m >= 0.92 for alpha >= 0.8", lambda a: a >= R3_MOST_ALPHA - ALPHA_TOL, R3_MOST,
              f"min |I|/m >= {R3_MOST} in every converged run"))
    if "margin_frac" not in ds:
        return [skipped("R3", c, t) for c, _, _, t in specs]
    ds, where = margin_slice(ds)  # the margin set does not depend on the attack: one cell per (net, slack)
    if ds is None:
        return [skipped("R3", c, t, where) for c, _, _, t in specs]
    alpha = _alpha(ds).values
    mask = usable(ds, ok_statuses(ds)).values
    frac = ds["margin_frac"].values.astype(float)
    for crit, which, bound, thr in specs:
        sel = mask & which(alpha)
        if not sel.any():
            rows.append(skipped("R3", crit, thr))
            continue
        low = float(np.min(frac[sel]))
        rows.append(Row(crit, "R3", f"min {low:.4f} over {int(sel.sum())} runs", thr,
                        bool(low >= bound - ACC_TOL), where, low))
    return rows


def r4(ds: xr.Dataset) -> Row:
    crit, thr = "c* curves of different widths overlap within seed std", "max |mean_a - mean_b| / (std_a + std_b) <= 1"
    if "width" not in ds.dims or ds.sizes["width"] < 2 or "c_star" not in ds:
        return skipped("R4", crit, thr, "width is not a grid axis with >= 2 values")
    by_point: dict = {}
    for line in lines(ds, "c_star"):
        key = tuple((k, v) for k, v in line.sel.items() if k != "width")
        for i, x in enumerate(line.x):
            if line.n[i] >= 2:
                by_point.setdefault(key + (("d", x),), []).append((line.sel["width"], line.mean[i], line.std[i]))
    worst, where = -math.inf, ""
    for point, per_width in by_point.items():
        for (wa, ma, sa), (wb, mb, sb) in itertools.combinations(per_width, 2):
            gap = abs(ma - mb) / (sa + sb) if sa + sb > 0 else (0.0 if ma == mb else math.inf)
            if gap > worst:
                worst, where = gap, ", ".join(f"{k}={v}" for k, v in point) + f", widths {wa} vs {wb}"
    if worst == -math.inf:
        return skipped("R4", crit, thr, "no point with two widths of >= 2 usable seeds each")
    return Row(crit, "R4", f"max {worst:.3g} ({where})", thr, bool(worst <= 1), "", worst)


def r5(ds: xr.Dataset) -> Row:
    crit = "std across seeds small relative to the mean (c*)"
    thr = f"max std/mean < {R5_MAX_CV} (spec gives no number; ours)"
    if "c_star" not in ds or "seed" not in ds.dims:
        return skipped("R5", crit, thr, "seed is not a grid axis")
    cvs = [(line.std[i] / line.mean[i], f"{line.label}, d={x}") for line in lines(ds, "c_star")
           for i, x in enumerate(line.x) if line.n[i] >= 2 and line.mean[i] > 0]
    if not cvs:
        return skipped("R5", crit, thr, "no point with >= 2 usable seeds")
    worst, where = max(cvs)
    return Row(crit, "R5", f"max {worst:.3g} ({where}) over {len(cvs)} points", thr, bool(worst < R5_MAX_CV), "",
               float(worst))


def acceptance(ds: xr.Dataset) -> list:
    return [r1(ds), r2(ds), *r3(ds), r4(ds), r5(ds)]
