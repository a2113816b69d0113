"""One statistics layer (issue 40): every aggregate that ``kktlab show``, ``kktlab table``, the report's
tables and the figures' error bars print comes from :func:`aggregate`.

    agg = aggregate(ds["rta"], over=("seed", "R"), usable=usable(ds))
    agg.estimate, agg.lo, agg.hi, agg.n, agg.n_inf, agg.n_nan, agg.n_excluded; caption(agg)

**Per net first, then over nets.** The nets are the values of the ``seed`` axis (:data:`NETS`): one
trained network per seed, the independent replicates. Every other axis named in ``over`` (an attack
radius, a restart, a test point) is averaged *within* each net first, so a net counts once however
many radii it was attacked at; the estimate and its interval are then taken over the nets, and ``n``
is the number of nets with a finite value (3 nets x 2 radii is n = 3, never 6). An axis not in
``over`` is kept (a row, a line, a facet). Without a seed axis averaged, each value is one net: n = 1,
no interval.

**Intervals** (:data:`INTERVALS`), at ``level`` (default 95 %):

- ``"t"`` (the default for ``stat="mean"``): Student's t at the real n,
  mean ± t_{(1+level)/2, n-1} · s / √n; none (NaN) where n < 2. Never 1.96·sem: at n = 3 that covers
  ~80 %, not 95 % (tests/test_stats.py measures it). **Except for a proportion of nets**: where every
  net's value is 0 or 1 (e.g. "the forgotten point recovered", one point per net) the mean is k/n of
  independent Bernoulli trials, and Student's t is no interval for it (0 of 3 nets: "0 ± 0"; 1 of 5
  at p = 0.05 covers ~23 %). There the interval is the exact binomial (Clopper-Pearson) one,
  [Beta_{(1-level)/2}(k, n-k+1), Beta_{(1+level)/2}(k+1, n-k)], from n = 1 (0 of 3: [0, 0.71]); its
  coverage is at least ``level`` for every p (tests/test_stats.py measures both).
- ``"bca"``: ``scipy.stats.bootstrap`` (BCa, 9999 resamples, a fixed seed so a table is reproducible),
  on request (for large n and skewed per-net values; at n < 10 it undercovers, so it is not the
  default); none where n < 3 or the values are all equal.
- for ``stat="median"``: the distribution-free order-statistic interval (x_(k), x_(n+1-k)) with the
  largest k whose binomial coverage is >= level; none where n < 6 (no such k exists).
- ``std``, ``sem``, ``min``, ``max``, ``count``: no interval (NaN), the interval named "none".

Bounds are clipped to the variable's declared domain only: the CF attributes ``valid_min`` /
``valid_max`` of the DataArray (from the declaration, ``Var(domain=...)``), or ``domain=`` given by
the caller who knows it (ε >= 0); nothing else is clipped.

**One inf/NaN policy.** Only finite values enter an estimate. Each ±inf and NaN value of a usable
cell is counted (``n_inf``, ``n_nan``: values, not nets) and shown beside the estimate by every
caller, never dropped silently in one place and propagated in another: ``show`` and ``table`` print
the same number for the same cells (chain-small's c_star was 23.86 in one and inf in the other).
Cells that are not usable (not done, failed, damaged, or a status outside the declared ``ok`` values:
:func:`storage.query.usable`) are left out and counted in ``n_excluded``; cells outside the selection
(``member``: a ``--where``, another group of a ``--by`` variable) are not counted at all.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr
from scipy import stats as sps

NETS = "seed"  # the axis whose values are independent nets (replicates)
STATS = ("mean", "median", "std", "sem", "min", "max", "count")
INTERVALS = ("t", "bca")
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0
FIELDS = ("estimate", "lo", "hi", "n", "n_inf", "n_nan", "n_excluded")


def interval_name(stat: str = "mean", interval: str = "t", level: float = 0.95) -> str:
    """The name a caption or a table gives the interval, e.g. "Student's t 95 %"."""
    pct = f"{100 * level:g} %"
    if stat == "mean":
        return f"Student's t {pct}" if interval == "t" else f"bootstrap BCa {pct}"
    if stat == "median":
        return f"bootstrap BCa {pct}" if interval == "bca" else f"order-statistic {pct}"
    return "none"


def domain_of(da: xr.DataArray) -> tuple[float | None, float | None]:
    """The declared domain (valid_min, valid_max) of a variable, None where unbounded or undeclared."""
    rng = da.attrs.get("valid_range")
    lo, hi = (rng if rng is not None and len(rng) == 2 else (None, None))
    lo = da.attrs.get("valid_min", lo)
    hi = da.attrs.get("valid_max", hi)
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def aggregate(da: xr.DataArray, over: Sequence[str] = (NETS,), *, usable: xr.DataArray | None = None,
              member: xr.DataArray | None = None, done: xr.DataArray | None = None, stat: str = "mean", interval: str = "t", level: float = 0.95,
              domain: tuple[float | None, float | None] | None = None, nets: str = NETS) -> xr.Dataset:
    """``stat`` of ``da`` over the axes ``over`` (those ``da`` has), per net first then over nets (see
    the module docstring), on the cells where ``usable`` and ``member`` (boolean, broadcast against
    ``da``) hold; ``done``: the cells that hold a result (a cell not done yet is pending, neither used
    nor counted as excluded). A Dataset over the kept axes with :data:`FIELDS`: ``estimate``, ``lo`` / ``hi``
    (the interval; NaN where there is none), ``n`` (nets whose value entered), ``n_inf`` / ``n_nan``
    (non-finite values of usable cells, left out), ``n_excluded`` (cells left out as not usable).
    Its attrs: ``stat``, ``interval`` (the name), ``level``, ``over_nets`` (whether the interval is over
    nets), ``within`` (the axes averaged within each net), ``kept`` (the axes kept)."""
    if stat not in STATS:
        raise ValueError(f"stat {stat!r} is not one of {', '.join(STATS)}")
    if interval not in INTERVALS:
        raise ValueError(f"interval {interval!r} is not one of {', '.join(INTERVALS)}")
    x = da.astype(float) if da.dtype.kind in "iub" else da
    if member is not None:
        x = x.broadcast_like(member)
    over = [d for d in dict.fromkeys(over) if d in x.dims]
    within = [d for d in over if d != nets]
    over_nets = nets in over
    ok = xr.ones_like(x, dtype=bool)
    if member is not None:
        ok = ok & member.astype(bool)
    if usable is not None:
        left = ok & ~usable.astype(bool)
        n_excluded = (left & done.astype(bool) if done is not None else left).sum(over).astype(int)
        ok = ok & usable.astype(bool)
    else:
        n_excluded = xr.zeros_like(x, dtype=int).sum(over)
    vals = x.where(ok)
    n_inf = np.isinf(vals).sum(over).astype(int)
    n_nan = (ok & np.isnan(x)).sum(over).astype(int)
    finite = vals.where(np.isfinite(vals))
    per_net = finite.mean(within, skipna=True) if within else finite
    binary = None  # where the interval is Clopper-Pearson's (a proportion of nets: _over_nets)
    if over_nets:
        est, lo, hi, n, binary = _over_nets(per_net, nets, stat, interval, level)
    else:  # each value one net: its (within-averaged) value, no interval
        n = per_net.notnull().astype(int)
        est = n.astype(float) if stat == "count" else xr.full_like(per_net, np.nan) if stat in ("std", "sem") \
            else per_net
        lo = hi = xr.full_like(per_net, np.nan)
    dmin, dmax = domain if domain is not None else domain_of(da)
    if dmin is not None:
        lo, hi = lo.clip(min=dmin), hi.clip(min=dmin)
    if dmax is not None:
        lo, hi = lo.clip(max=dmax), hi.clip(max=dmax)
    if dmin is not None or dmax is not None:  # a mean of cosines of 1 rounds to 1 + 2e-16, past the clipped
        lo = xr.where(lo.notnull(), np.fmin(lo, est), lo)  # interval: it still holds its estimate
        hi = xr.where(hi.notnull(), np.fmax(hi, est), hi)
    out = xr.Dataset({"estimate": est, "lo": lo, "hi": hi, "n": n, "n_inf": n_inf, "n_nan": n_nan,
                      "n_excluded": n_excluded})
    kept = [d for d in x.dims if d not in over]
    out = out.transpose(*kept) if kept else out
    name = interval_name(stat, interval, level) if over_nets else "none"
    if binary is not None and bool(binary.any()):
        exact = f"Clopper-Pearson {100 * level:g} %"
        name = exact if bool(binary.where(n > 0, True).all()) else f"{name} ({exact} where each net's value is 0 or 1)"
    return out.assign_attrs(stat=stat, interval=name,
                            level=level, over_nets=over_nets, within=within, kept=kept, nets=nets)


def _over_nets(per_net: xr.DataArray, nets: str, stat: str, interval: str, level: float):
    n = per_net.notnull().sum(nets).astype(int)
    nan = xr.full_like(n, np.nan, dtype=float)
    mean = per_net.mean(nets, skipna=True)
    sd = per_net.std(nets, ddof=1, skipna=True).where(n > 1)
    lo = hi = nan
    binary = None
    if stat == "mean":
        est = mean
        if interval == "t":
            q = xr.apply_ufunc(lambda k: sps.t.ppf(0.5 + level / 2, np.where(k > 1, k - 1, np.nan)), n)
            half = q * sd / np.sqrt(n.where(n > 1))
            lo, hi = est - half, est + half
            binary = proportions(per_net, nets, n)
            if bool(binary.any()):  # (est stays the mean: k / n)
                k = per_net.sum(nets, skipna=True)
                cp_lo, cp_hi = clopper_pearson(k, n, level)
                lo, hi = cp_lo.where(binary, lo), cp_hi.where(binary, hi)
        else:
            lo, hi = _per_group(per_net, nets, lambda v: _bca(v, np.mean, level))
    elif stat == "median":
        est = per_net.median(nets, skipna=True)
        lo, hi = _per_group(per_net, nets, (lambda v: _bca(v, np.median, level)) if interval == "bca"
                            else (lambda v: _order_statistic(v, level)))
    elif stat == "std":
        est = sd
    elif stat == "sem":
        est = sd / np.sqrt(n.where(n > 1))
    elif stat == "min":
        est = per_net.min(nets, skipna=True)
    elif stat == "max":
        est = per_net.max(nets, skipna=True)
    else:  # count
        est = n.astype(float)
    return est, lo, hi, n, binary


def proportions(per_net: xr.DataArray, nets: str, n: xr.DataArray) -> xr.DataArray:
    """Where every net's (finite) value is 0 or 1, and there is one: a proportion of nets."""
    return ((per_net == 0) | (per_net == 1) | per_net.isnull()).all(nets) & (n > 0)


def clopper_pearson(k, n, level: float):
    """The exact binomial interval of k successes in n trials: (lo, hi), lo 0 at k = 0, hi 1 at k = n."""
    a = (1 - level) / 2
    lo = xr.apply_ufunc(lambda kk, nn: np.where(kk > 0, sps.beta.ppf(a, np.maximum(kk, 1e-300), nn - kk + 1), 0.0),
                        k, n)
    hi = xr.apply_ufunc(lambda kk, nn: np.where(kk < nn, sps.beta.ppf(1 - a, kk + 1, np.maximum(nn - kk, 1e-300)),
                                                1.0), k, n)
    return lo, hi


def _per_group(per_net: xr.DataArray, nets: str, fn) -> tuple[xr.DataArray, xr.DataArray]:
    """(lo, hi) of ``fn`` (1-D finite values -> (lo, hi)) along ``nets``, each kept-axes group apart."""
    def both(v):
        v = v[np.isfinite(v)]
        return fn(v)

    lo, hi = xr.apply_ufunc(both, per_net, input_core_dims=[[nets]], output_core_dims=[[], []], vectorize=True)
    return lo, hi


def _bca(v: np.ndarray, statistic, level: float) -> tuple[float, float]:
    if v.size < 3 or np.all(v == v[0]):
        return np.nan, np.nan
    res = sps.bootstrap((v,), statistic, confidence_level=level, n_resamples=BOOTSTRAP_RESAMPLES, method="BCa",
                        random_state=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _order_statistic(v: np.ndarray, level: float) -> tuple[float, float]:
    """(x_(k), x_(n+1-k)): P(x_(k) <= median <= x_(n+1-k)) = 1 - 2 P(Bin(n, 1/2) <= k-1) >= level."""
    n = v.size
    ks = np.arange(1, n // 2 + 1)
    good = ks[1 - 2 * sps.binom.cdf(ks - 1, n, 0.5) >= level] if n else ks
    if not good.size:
        return np.nan, np.nan
    k = int(good.max())
    s = np.sort(v)
    return float(s[k - 1]), float(s[n - k])


def half_width(agg: xr.Dataset) -> xr.DataArray:
    """The larger distance from the estimate to an interval bound (symmetric for Student's t, which
    clipping to a domain may make asymmetric): for a table's "± h". NaN where there is no interval."""
    return np.maximum(agg.hi - agg.estimate, agg.estimate - agg.lo)


def estimate_text(one: xr.Dataset) -> str:
    """One entry of an aggregate as a table cell: "0.5 ± 0.12" for a symmetric interval (Student's t),
    "0 [0, 0.71]" for an asymmetric one (Clopper-Pearson, or clipped to the domain): never a "± h"
    that reads below 0 or above 1."""
    est, lo, hi = float(one.estimate), float(one.lo), float(one.hi)
    if np.isnan(lo) or np.isnan(hi) or abs((hi - est) - (est - lo)) <= 1e-9 * max(1.0, abs(est)):
        return f"{est:.4g} ± {float(half_width(one)):.2g}"
    return f"{est:.4g} [{lo:.2g}, {hi:.2g}]"


def yerr(agg: xr.Dataset) -> np.ndarray:
    """Matplotlib's ``yerr`` (2, N) for ``errorbar`` of a 1-D ``agg``: the distances to lo and hi (0
    where there is no interval; the point itself is drawn)."""
    est = np.asarray(agg.estimate, dtype=float)
    return np.nan_to_num(np.stack([est - np.asarray(agg.lo, float), np.asarray(agg.hi, float) - est]))


def caption(agg: xr.Dataset | Sequence[xr.Dataset], what: str = "per point") -> str:
    """What a figure or a table averaged, in words: "mean ± Student's t 95 % interval over nets (seeds;
    n = 2/3 per point), R averaged within each net; left out: 1 inf, 2 not usable", or
    "1 net per point: no interval"."""
    aggs = [agg] if isinstance(agg, xr.Dataset) else list(agg)
    if not aggs:
        return ""
    a0 = aggs[0]
    counts = sorted({int(v) for a in aggs for v in np.ravel(a.n.values) if int(v) > 0})
    within = a0.attrs.get("within") or []
    stat = a0.attrs.get("stat", "mean")
    if not a0.attrs.get("over_nets") or not counts or counts[-1] < 2:
        text = f"1 net per point: no interval (n = {'/'.join(map(str, counts)) or 0})"
    else:
        names = list(dict.fromkeys(a.attrs.get("interval", "none") for a in aggs))
        if len(names) > 1 and all(n.startswith(("Student", "Clopper")) for n in names):  # t, with some proportions
            level = a0.attrs.get("level", 0.95)
            t, cp = interval_name("mean", "t", level), f"Clopper-Pearson {100 * level:g} %"
            names = [f"{t} ({cp} where each net's value is 0 or 1)"]
        name = " / ".join(names)
        mark = "±" if name.startswith("Student") else "with"  # an exact binomial interval is not symmetric
        interval = f" {mark} {name} interval" if name != "none" else ""
        text = (f"{stat}{interval} over nets ({a0.attrs.get('nets', NETS)}s; "
                f"n = {'/'.join(map(str, counts))} {what})")
    if within:
        text += f", {', '.join(within)} averaged within each net"
    left = {k: sum(int(a[k].sum()) for a in aggs) for k in ("n_inf", "n_nan", "n_excluded")}
    gone = [f"{v} {label}" for (k, label) in (("n_inf", "±inf"), ("n_nan", "NaN"), ("n_excluded", "not usable"))
            if (v := left[k])]
    if gone:
        text += f"; left out: {', '.join(gone)}"
    return text
