"""Figures of paper 003 from a store (spec 003 §4): Figs 2/3/5/6 from a ``single_step`` group
(per-cell medians over test points, mean over seeds with its Student's t 95 % interval as error bars,
each seed first averaged over the axes the title names: storage/stats.py; the
G-shape fit and G-init curves of §3.6 in green), Fig 4 left/right from a ``pgd`` group (RTA vs R
with error bars over seeds where the store has no Fig 4 grid), Fig 7 histograms from the
per-sample variables (:func:`histograms`, given the full group: the report passes scalars only)."""

from __future__ import annotations

import pathlib

import numpy as np
import xarray as xr

from analysis.common import REFERENCE, finish, plt
from storage.query import fixed_params, usable
from storage.stats import aggregate, caption, yerr

# the acceptance rows (analysis/acceptance_003.py) a figure draws: the report says under it how this store
# compares with the paper (kktlab/report.py)
CLAIMS = {"fig2": ("E1",), "fig5": ("E1",), "fig3": ("E2",), "fig6": ("E2",), "fig4_left": ("E4",),
          "fig4_right": ("E5",), "fig7": ("E3",)}

SLOPE = {"med_delta_rel": -0.5, "med_gnorm": 0.5, "med_eta_star": -1.0, "med_eta_rel": -1.0}
LABEL = {"med_delta_rel": "||δ*||/||x||", "med_gnorm": "||∇f(x)||", "med_eta_star": "|η*|", "med_eta_rel": "|η*|/||x||"}


UNTRAINED = "adversarial training returned the init"


def untrained(ds: xr.Dataset) -> xr.DataArray:
    """Cells whose adv_train net is its init W0 (issue 28 item 9): ``train_status`` 1, the adv_train
    group's own or a reading stage's copy (``storage.query.stage_scalars`` merges it in). Groups made
    before that variable (absent, or the fill -1 in cells of a resumed one) say the same by
    ``best_epoch == 0``. All False for nets of other trainers."""
    mask = xr.zeros_like(ds["done"], dtype=bool)
    if "best_epoch" in ds:
        mask = ds["best_epoch"] == 0
    if "train_status" in ds:
        mask = xr.where(ds["train_status"] >= 0, ds["train_status"] == 1, mask)
    return mask.broadcast_like(ds["done"])


def kept(ds: xr.Dataset) -> xr.DataArray:
    """Cells that figures and rows use: usable (``storage.query.usable``) and not :func:`untrained`."""
    return usable(ds) & ~untrained(ds)


def _nets(ds: xr.Dataset, mask: xr.DataArray) -> int:
    """Distinct nets among the cells of ``mask``: by ``upstream_hash`` (a reading stage's cells that
    read one net count once) where every such cell has one, else the cells."""
    m = np.asarray(mask.broadcast_like(ds["done"]).values, dtype=bool)
    if "upstream_hash" in ds:
        h = np.asarray(ds["upstream_hash"].broadcast_like(ds["done"]).values)[m]
        if (h >= 0).all():
            return len(np.unique(h))
    return int(m.sum())


def left_out(ds: xr.Dataset) -> str:
    """'2 of 12 nets left out: adversarial training returned the init' over the usable cells of
    ``ds``; '' where the nets are not adv_train's (no ``train_status`` / ``best_epoch``)."""
    if "train_status" not in ds and "best_epoch" not in ds:
        return ""
    ok = usable(ds)
    return f"{_nets(ds, ok & untrained(ds))} of {_nets(ds, ok)} nets left out: {UNTRAINED}"


def _mean(ds: xr.Dataset, var: str, keep: tuple[str, ...]) -> xr.DataArray:
    """``var`` on :func:`kept` cells, averaged over every dim but ``keep`` (:func:`_spread`'s estimate:
    per net first, then over nets; finite values only)."""
    return _spread(ds, var, keep).estimate


def _spread(ds: xr.Dataset, var: str, keep: tuple[str, ...]) -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``var`` on :func:`kept` cells over every dim but ``keep``:
    each net (seed) first averaged over the other dims (restarts, ...), then the mean and Student's t
    95 % interval over the seeds, n the seeds per point (no interval where n < 2)."""
    return aggregate(ds[var], [d for d in ds[var].dims if d not in keep], usable=kept(ds), done=ds["done"])


def _bars(ax, x, agg: xr.Dataset, fmt: str, label: str, log: bool = False):
    """One line of the 1-D ``agg`` with its interval as error bars (none where there is no interval)."""
    if log:  # both axes log; a bar reaching 0 or below is clipped at the axis' floor
        ax.set_xscale("log")
        ax.set_yscale("log")
    return ax.errorbar(np.asarray(x, dtype=float), np.asarray(agg.estimate, dtype=float), yerr=yerr(agg), fmt=fmt,
                       capsize=2, ms=3, label=label)


WITHIN_NET = ("restarts", "restart", "point", "points")  # axes that are repeats on one net, never a line


def _combos(agg: xr.Dataset, dims: list[str]) -> list[dict]:
    import itertools

    return [dict(zip(dims, vals)) for vals in itertools.product(*(list(agg[d].values) for d in dims))]


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating, int, np.integer)) else str(v)


def g_shape(d: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """c of ``y = c d^α`` at fixed α: ``exp(mean(log y - α log d))`` (spec §3.6 G-shape)."""
    ok = np.isfinite(y) & (y > 0)
    return float(np.exp(np.mean(np.log(y[ok]) - alpha * np.log(d[ok])))) if ok.any() else float("nan")


def free_slope(d: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(y) & (y > 0)
    return float(np.polyfit(np.log(d[ok]), np.log(y[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")


def _g_init(var: str, d: np.ndarray):
    """Parameter-free references at init (spec §3.5): (label, values) pairs."""
    if var == "med_gnorm":
        return [("init √(d/2)", np.sqrt(d / 2)), ("B.7 √d/4", np.sqrt(d) / 4)]
    if var == "med_delta_rel":
        return [("init √(2/(πd))", np.sqrt(2 / (np.pi * d)))]
    if var == "med_eta_star":
        return [("init 1.128/d", 1.128 / d)]
    return []


def _panels(ds: xr.Dataset, out: pathlib.Path, prefix: str, by: str, fixed: dict, tag: str) -> list[pathlib.Path]:
    """One figure per quantity: x = d, one line per value of ``by``, at ``fixed`` coordinates."""
    sub = ds.sel(fixed) if fixed else ds
    paths = []
    raw = fixed.get("variant") == "raw"
    for var in ("med_delta_rel", "med_gnorm", "med_eta_rel" if raw else "med_eta_star"):
        agg = _spread(sub, var, ("d", by))
        da = agg.estimate
        d = da["d"].values.astype(float)
        fig, ax = plt.subplots(figsize=(4.2, 3.4))
        for val in da[by].values:
            _bars(ax, d, agg.sel({by: val}).transpose("d"), "o-", f"{by} = {val:g}", log=True)
        top = da.sel({by: da[by].values.max()}).values
        c = g_shape(d, top, SLOPE[var])
        ax.loglog(d, c * d ** SLOPE[var], "g--", label=f"G-shape {c:.3g} d^{SLOPE[var]:g}")
        for lab, y in _g_init(var, d):
            ax.loglog(d, y, "g:", label=lab, gid=REFERENCE)
        if var == "med_eta_star" and "med_t_thm" in sub:  # G-plugin: the theorem's step 2|f|/((1-ρ)||∇f||²)
            plug = _mean(sub, "med_t_thm", ("d", by)).sel({by: da[by].values.max()}).values
            ax.loglog(d, plug, "g-.", label="G-plugin (median t_thm)")
        ax.set_xlabel("d")
        ax.set_ylabel(f"{LABEL[var]} (median over {points_of(ds, sub)} points)")
        paths.append(finish(fig, ax, out / f"{prefix}{tag}_{var}.png", f"{tag}: {LABEL[var]} vs d\n{caption(agg)}"))
    return paths


def points_of(ds: xr.Dataset, sub: xr.Dataset) -> str:
    """The points a single_step slice's medians are over: its ``points`` coordinate, else the group's
    ``points`` parameter from its identity ("train": "training"; the default "test"); both values on the
    grid and none selected: "training and test" (issue 40: read from what ran, not from a description)."""
    if "points" in sub.coords:
        values = {str(v) for v in np.atleast_1d(sub["points"].values)}
    else:
        values = {str(fixed_params(ds).get("points", "test"))}
    return "training" if values == {"train"} else "test" if values == {"test"} else "training and test"


def _fixed(ds: xr.Dataset, **want) -> dict:
    """Coordinates to select: the wanted value where the dim has it, else its first value."""
    out = {}
    for dim, value in want.items():
        if dim in ds.dims:
            vals = list(ds[dim].values)
            out[dim] = value if value in vals else vals[0]
    return out


def slices(ds: xr.Dataset) -> list[dict]:
    """One selection per (variant, data) the group holds (figures and rows never pool them)."""
    import itertools

    dims = [dim for dim in ("variant", "data") if dim in ds.dims]
    return [dict(zip(dims, vals)) for vals in itertools.product(*(list(ds[dim].values) for dim in dims))]


def single_step_figures(ds: xr.Dataset, out: pathlib.Path, prefix: str) -> list[pathlib.Path]:
    if "d" not in ds.dims or ds.sizes["d"] < 2:
        return []
    paths = []
    for base in slices(ds):
        v = base.get("variant")
        name = {"raw": ("fig2", "fig3"), "unit": ("fig5", "fig6")}.get(v, ("fig2-5", "fig3-6"))
        if "data" in base:
            name = tuple(f"{n}_{base['data']}" for n in name)
        fixed = dict(base, **_fixed(ds, single_step_method="single_step_exact"))
        if "m" in ds.dims:
            paths += _panels(ds, out, prefix, "m", dict(fixed, **_fixed(ds, C0=10.0)), name[0])
        if "C0" in ds.dims and ds.sizes["C0"] > 1:
            paths += _panels(ds, out, prefix, "C0", dict(fixed, **_fixed(ds, m=int(ds["m"].max()) if "m" in ds.dims
                                                                            else None)), name[1])
    return paths


def threshold(x: np.ndarray, rta: np.ndarray, level: float = 0.5) -> float:
    """First x where ``rta`` falls through ``level`` (linear interpolation); NaN if it never does."""
    for i in range(1, len(x)):
        if rta[i - 1] >= level > rta[i]:
            return float(x[i - 1] + (rta[i - 1] - level) * (x[i] - x[i - 1]) / (rta[i - 1] - rta[i]))
    return float("nan")


def _settings(ds: xr.Dataset, var: str, axes: tuple[str, ...]) -> list[str]:
    """The axes of ``var`` besides ``axes``, the nets and the within-net repeats that have several
    values: each value a figure of its own (never averaged into one, issue 40)."""
    return [x for x in ds[var].dims if x not in axes + ("seed",) + WITHIN_NET and ds.sizes[x] > 1]


def _suffix(at: dict) -> str:
    return "".join(f"_{k}{_fmt(v)}" for k, v in at.items())


def _heatmap(ds: xr.Dataset, axes: tuple[str, str], path: pathlib.Path, title: str, xs, ref) -> list[tuple]:
    """(fig, ax, path, title) of Fig 4's RTA over the grid ``axes`` (x, y), one figure per setting of
    the other axes (file ``<path stem>_<axis><value>...``), each net first averaged over its repeats;
    the caption says over what (storage/stats.caption)."""
    settings = _settings(ds, "rta", axes)
    agg = _spread(ds, "rta", (*axes, *settings))
    out = []
    for at in _combos(agg, settings):
        one = agg.sel(at) if at else agg
        da = one.estimate
        fig, ax = plt.subplots(figsize=(4.6, 3.8))
        x = xs(da[axes[0]].values.astype(float))
        im = ax.pcolormesh(x, da[axes[1]].values, da.transpose(axes[1], axes[0]).values, vmin=0, vmax=1,
                           shading="nearest")
        ref(ax, x, da[axes[0]].values.astype(float))
        fig.colorbar(im, ax=ax, label=ds["rta"].attrs.get("long_name", "robust test accuracy").split(":")[0])
        where = ", ".join(f"{k} = {_fmt(v)}" for k, v in at.items())
        out.append((fig, ax, path.with_name(path.stem + _suffix(at) + path.suffix),
                    f"{title}{' (' + where + ')' if where else ''}\n{caption(one)}"))
    return out


def pgd_figures(ds: xr.Dataset, out: pathlib.Path, prefix: str) -> list[pathlib.Path]:
    """Fig 4 left / right (or RTA vs R); nets adv_train returned untrained are left out, the title counts them."""
    paths = []
    gone = left_out(ds)
    gone = f"\n{gone}" if gone else ""

    def left_ref(ax, k, d):
        ax.plot(k, 5 / k, "g--", label="5/√d", gid=REFERENCE)
        ax.set_xlabel("√d")
        ax.set_ylabel("||δ||")

    def right_ref(ax, m, _):
        ax.plot(m, 25 / np.sqrt(m), "g--", label="25/√m", gid=REFERENCE)
        ax.set_xscale("log")
        ax.set_xlabel("m")
        ax.set_ylabel("V")

    if "R" in ds.dims and "d" in ds.dims:  # Fig 4 left
        for fig, ax, path, title in _heatmap(ds, ("d", "R"), out / f"{prefix}fig4_left.png",
                                             "Fig 4 left: RTA over (d, ||δ||)", np.sqrt, left_ref):
            paths.append(finish(fig, ax, path, title + gone))
    if "V" in ds.dims and "m" in ds.dims:  # Fig 4 right
        for fig, ax, path, title in _heatmap(ds, ("m", "V"), out / f"{prefix}fig4_right.png",
                                             "Fig 4 right: RTA over (m, V)", lambda m: m, right_ref):
            paths.append(finish(fig, ax, path, title + gone))
    if "R" in ds.dims and not paths:  # RTA against R (CI-size stores)
        # one line per value of every axis but R, the seeds and the within-net axes (restarts, points):
        # a chain's unlearning methods and α are never pooled into one line (issue 40)
        lines = _settings(ds, "rta", ("R",))
        agg = _spread(ds, "rta", ("R", *lines))
        fig, ax = plt.subplots(figsize=(4.2, 3.4))
        for at in _combos(agg, lines):
            label = ", ".join(f"{k} = {_fmt(v)}" for k, v in at.items())
            _bars(ax, agg["R"].values, agg.sel(at).transpose("R"), "o-", label)
        ax.set_xlabel("||δ||")
        what = ds["rta"].attrs.get("long_name", "robust test accuracy").split(":")[0]  # training points: points: train
        ax.set_ylabel(what)
        paths.append(finish(fig, ax, out / f"{prefix}rta_vs_R.png", f"{what} vs budget\n{caption(agg)}" + gone))
    return paths


def histograms(ds: xr.Dataset, out: pathlib.Path, prefix: str = "", sel: dict | None = None) -> list[pathlib.Path]:
    """Fig 7 (spec §4, E3): histograms of ||δ*||, ||∇f|| and |η*| over test points and seeds of the
    full ``single_step`` group ``ds`` at ``sel`` (default d = 784, m = 1e5, C0 = 10 where present)."""
    sel = sel if sel is not None else _fixed(ds, d=784, m=100000, C0=10.0, variant="raw", data="mnist")
    sub = ds.sel(sel)
    paths = []
    for var, lab in (("delta_rel", "||δ*||/||x||"), ("gnorm", "||∇f(x)||"), ("eta_star", "|η*|")):
        x = sub[var].values.ravel()
        x = x[np.isfinite(x)]
        fig, ax = plt.subplots(figsize=(4.0, 3.2))
        ax.hist(x, bins=40, label=f"median {np.median(x):.3g}" if len(x) else "")
        ax.set_xlabel(lab)
        paths.append(finish(fig, ax, out / f"{prefix}fig7_{var}.png", f"Fig 7: {lab} ({len(x)} points)"))
    return paths


def sample_figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    """Figures from the per-sample variables of the full group (``kktlab report`` calls it with
    the group as stored): Fig 7 for a ``single_step`` group."""
    if "delta_rel" not in ds or "point" not in ds.dims:
        return []
    full = ds.where(usable(ds))
    return histograms(full, pathlib.Path(out_dir), prefix)


def figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    if "med_delta_rel" in ds:
        return single_step_figures(ds, out, prefix)
    if "rta" in ds:
        return pgd_figures(ds, out, prefix)
    return []


def notes(ds: xr.Dataset) -> list[str]:
    n = int(kept(ds).sum())
    seeds = ds.sizes.get("seed", 1)
    gone = left_out(ds)
    return [f"each point averages up to {seeds} seed(s) (per-cell medians over test points); {n} usable cells"
            + (f"; {gone} (train_status 1)" if gone else ""), ""]


