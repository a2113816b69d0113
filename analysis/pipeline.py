"""The cross-paper chain's figures and findings (issues 27, 39): for every stage that reads an ``unlearn``
stage's nets, its forgotten-point numbers beside its retained-point numbers, against α, one line per
unlearning method, mean and 95 % interval over the nets (upstream seeds: storage/stats.py; Student's t,
or Clopper-Pearson's for a proportion of nets such as "recovered", shown as [lo, hi]),
with the count of nets per point. Every other axis (the reader's own, e.g. an attack radius or the
attacker's norm prior, and the upstream stages' others, e.g. the data dimension) is a **setting**: never
averaged. The table has one row per setting, which it names, and a verdict judges that setting alone;
the figure has one panel row per setting.

- **References once.** ``identity`` and ``retrain`` do not depend on α (their nets are the trained and
  the retrained ones, whatever α the grid crosses them with): each is drawn as one horizontal line with
  its interval band and written as one row (α "—"), read at the first α.
- **Every reader accounted for.** A reader of an unlearn stage whose grid does not sweep ``unlearn_method`` or
  ``alpha`` takes them from the unlearn stage's parameters; one that cannot be drawn (an experiment
  without forgotten / retained numbers) is listed as not drawn, with why.
- **A verdict only in its regime.** Paper 004's KKT attack (``reconstruct``) assumes a net near a KKT
  point of the max-margin problem. Its rows carry a verdict on the forgotten point (recovered by
  distance, spec 004's ρ rule: the mean over the nets of the fraction of forgotten points recovered,
  with one forgotten point per net the fraction of nets, ≥ 50 %: "recovered"; ≤ 20 %: "not
  recovered"; else "unclear") only where the median ε1_rel of the nets it attacks (the unlearn stage's
  KKT fit of the trained nets at the same setting; the median and its n from storage/stats.py) is at
  most :data:`KKT_EPS_REL`; elsewhere "no verdict" and the median that refused it. A KKT attack's
  verdict on another method also needs its known positive at the same setting: the point recovered
  from the original nets (``identity``, ≥ 50 %); without one, "no verdict". The difference attack
  (``reconstruct_diff``) reads the update itself and needs neither. The
  other readers' numbers are new questions: measured values with intervals, judged nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import pathlib

import xarray as xr

from analysis.common import plt, save
from storage.query import groups, open_results, stage_scalars, usable
from storage.stats import NETS, aggregate, caption, estimate_text, yerr

# reader experiment -> the (forgotten, retained, label) pairs it reports apart; the first is drawn
PAIRS = {"reconstruct": (("recovered_forgotten", "recovered_retained", "recovered within ρ (fraction of points)"),
                         ("cos_forgotten", "cos_retained", "cosine of the best candidate (direction)")),
         "reconstruct_diff": (("recovered_forgotten", "recovered_retained", "recovered within ρ (fraction of points)"),
                              ("cos_forgotten", "cos_retained", "cosine of the best candidate (direction)"),
                              ("chance_cos_forgotten", "chance_cos_retained",
                               "chance: best cosine of another training point")),
         "single_step": (("med_delta_forgotten", "med_delta_retained", "||δ*|| of the minimal single step"),),
         "pgd": (("rta_forgotten", "rta_retained", "robust accuracy under PGD"),),
         "forge_net": (("logvol_forgotten", "logvol_retained", "log-volume of the ε-forging set"),)}
REFERENCES = ("identity", "retrain")  # nets that do not depend on α
KKT_ATTACKS = ("reconstruct",)  # readers whose premise is a net near a KKT point
KKT_EPS_REL = 0.05  # issue 39: the median ε1_rel of the attacked nets at or below which a KKT attack is judged
FIT = 2.0  # candidates whose KKT residual is within FIT x the nets' own ε1_rel explain the weights as the data do
RECOVERED, NOT_RECOVERED = 0.5, 0.2  # issue 39: the forgotten point recovered in >= 50 % / <= 20 % of the nets


def _identity(ds: xr.Dataset) -> dict:
    return json.loads(ds.attrs.get("kktlab_identity") or "{}")


def readers_of_unlearn(store, scalars: dict | None = None) -> tuple[list[tuple[str, str, xr.Dataset, xr.Dataset]],
                                                                      list[str]]:
    """(group, experiment, dataset, its unlearn group) of every group reading an ``unlearn`` group's nets,
    ``unlearn_method`` and ``alpha`` always among its dims; and the readers not drawn, each with why. ``scalars``:
    groups' :func:`storage.query.stage_scalars` a caller read already (``kktlab report``), by name."""
    read = dict(scalars or {})  # each group read once, however many stages read it
    out, skipped = [], []
    opened = {g: open_results(store, g) for g in groups(store)}
    kinds = {g: ds.attrs.get("kktlab_experiment") for g, ds in opened.items()}
    for g, ds in opened.items():
        up = _identity(ds).get("from")
        if not up or kinds.get(up) != "unlearn":
            continue
        pairs = PAIRS.get(kinds[g])
        if pairs is None:
            skipped.append(f"{g} ({kinds[g]}): not drawn: the experiment reports no forgotten / retained numbers")
            continue
        missing = [v for pair in pairs for v in pair[:2] if v not in ds]
        if missing:
            skipped.append(f"{g} ({kinds[g]}): not drawn: made before its variables {', '.join(missing)} existed "
                           "(rerun the stage)")
            continue
        unl = read[up] = read.get(up) or stage_scalars(store, up)
        mine = read.get(g) or stage_scalars(store, g)
        out.append((g, kinds[g], _with_method_alpha(mine, unl), _with_method_alpha(unl, unl)))
    return out, skipped


def _with_method_alpha(ds: xr.Dataset, unlearn: xr.Dataset) -> xr.Dataset:
    """``ds`` with ``unlearn_method`` and ``alpha`` as dims: an unlearn stage that does not sweep one holds it as a
    parameter."""
    params = _identity(unlearn).get("params", {})
    params.setdefault("unlearn_method", params.get("method"))  # a store made before issue 40's rename
    for dim in ("unlearn_method", "alpha"):
        if dim not in ds.dims:
            ds = ds.expand_dims({dim: [params[dim]]})
    return ds


def summary(ds: xr.Dataset, var: str) -> xr.Dataset:
    """:func:`storage.stats.aggregate` of ``var`` over the nets (seeds) per (unlearn_method, alpha) and per setting
    (every other axis kept: never pooled); usable cells only (done, not failed, not damaged, an ok
    status), finite values, the rest counted."""
    return aggregate(ds[var], (NETS,), usable=usable(ds), done=ds["done"]).compute()


def settings(agg: xr.Dataset) -> list[dict]:
    """Each setting of an aggregate (one value of every axis but unlearn_method and alpha), in coordinate order;
    one empty setting where there is no other axis."""
    dims = [d for d in agg.estimate.dims if d not in ("unlearn_method", "alpha")]
    return [dict(zip(dims, vals)) for vals in itertools.product(*(agg[d].values.tolist() for d in dims))]


def setting_label(setting: dict) -> str:
    """"radius=1, norm_prior=0" (the slice a row judged), "—" for none."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items()) or "—"


def regime(unlearn: xr.Dataset) -> xr.Dataset:
    """The median over the nets (with its n) of ``eps1_rel`` (the trained net's KKT residual
    ‖θ − Σλ_i y_i∇N‖/‖θ‖ as the unlearn stage fitted it; one value per net, read at the first method and
    α) per setting of the unlearn stage's other axes: :func:`storage.stats.aggregate`, usable cells only;
    estimate NaN where none."""
    first = unlearn.isel({"unlearn_method": 0, "alpha": 0})
    return aggregate(first["eps1_rel"], (NETS,), usable=usable(first), done=first["done"], stat="median").compute()


def _at(agg: xr.Dataset, setting: dict) -> xr.Dataset:
    """``agg`` at the part of ``setting`` it has axes for."""
    return agg.sel({k: v for k, v in setting.items() if k in agg.dims})


def verdict(exp: str, recovered: xr.Dataset, eps: xr.Dataset | None, positive: float | None = None) -> str:
    """The forgotten point's verdict for one (method, α, setting) entry of a KKT attack or the difference
    attack (``recovered``: the aggregate of ``recovered_forgotten`` there; ``eps``: :func:`regime` at the
    same setting; None: unknown, no verdict for a KKT attack), or "" for the other readers.
    ``positive``: for an entry of a KKT attack other than ``identity``, identity's mean at the same
    setting (the attack on the original nets: the known positive a "not recovered" needs; None: no
    identity entry: NaN, never judged)."""
    if exp not in ("reconstruct", "reconstruct_diff"):
        return ""
    eps_rel, n_eps = (float(eps.estimate), int(eps.n)) if eps is not None else (math.nan, 0)
    if exp in KKT_ATTACKS and not eps_rel <= KKT_EPS_REL:
        return (f"no verdict: nets outside the KKT regime (median ε1_rel {eps_rel:.2g} over {n_eps} nets "
                f"> {KKT_EPS_REL:g})")
    if exp in KKT_ATTACKS and positive is not None and math.isnan(positive):
        return "no verdict: no known positive (no identity entry: the attack on the original nets was not run)"
    if exp in KKT_ATTACKS and positive is not None and not positive >= RECOVERED:
        return (f"no verdict: no known positive (from the original nets, identity, the attack recovers the "
                f"point in {positive:.2f} of the nets)")
    n, est = int(recovered.n), float(recovered.estimate)
    if n == 0:
        return "no verdict: no usable net"
    word = "recovered" if est >= RECOVERED else "not recovered" if est <= NOT_RECOVERED else "unclear"
    return f"{word} (mean over {n} nets {est:.2f})"


def _entries(ds: xr.Dataset) -> list[tuple[str, float | None]]:
    """(method, α) of each row: the references once (α None: read at the first α), the others per α."""
    alphas = [float(a) for a in ds.alpha.values]
    return [(str(m), None) if str(m) in REFERENCES else (str(m), a)
            for m in ds.unlearn_method.values for a in (alphas[:1] if str(m) in REFERENCES else alphas)]


def _pick(s: xr.Dataset, method: str, alpha: float | None, first: float) -> xr.Dataset:
    return s.sel(unlearn_method=method, alpha=first if alpha is None else alpha)


def figure(g: str, exp: str, ds: xr.Dataset, out: pathlib.Path) -> pathlib.Path | None:
    """One panel per (setting, pair): the forgotten (solid) and retained (dashed) numbers against α, one
    colour per method; the references as a line and its band."""
    pairs = [p for p in PAIRS[exp] if not p[0].startswith("chance")]
    sums = [(summary(ds, f), summary(ds, r), label) for f, r, label in pairs]
    if all(int(f.n.sum()) == 0 and int(r.n.sum()) == 0 for f, r, _ in sums):
        return None
    rows = settings(sums[0][0])
    fig, axes = plt.subplots(len(rows), len(sums), figsize=(5.0 * len(sums), 3.4 * len(rows)), squeeze=False)
    alphas, first = ds.alpha.values.astype(float), float(ds.alpha.values[0])
    span = (alphas.min() - 0.1, alphas.max() + 0.1)
    for row, setting in zip(axes, rows):
        for ax, (f_all, r_all, label) in zip(row, sums):
            f, r = _at(f_all, setting), _at(r_all, setting)
            for i, method in enumerate(ds.unlearn_method.values):
                colour = f"C{i}"  # the project palette (analysis/kktlab.mplstyle)
                for s, style, what in ((f, "-", "forgotten"), (r, "--", "retained")):
                    if str(method) in REFERENCES:  # one line and its band: the same nets at every α
                        one = _pick(s, str(method), None, first)
                        ax.hlines(float(one.estimate), *span, colors=colour, linestyles=style,
                                  label=f"{method}: {what} (n={int(one.n)})")
                        ax.fill_between(span, float(one.lo), float(one.hi), color=colour, alpha=0.12, lw=0)
                        continue
                    one = s.sel(unlearn_method=method)
                    ax.errorbar(alphas, one.estimate.values, yerr=yerr(one), fmt="o" + style, color=colour,
                                capsize=3, ms=4, label=f"{method}: {what}")
            ax.set_xlabel("α (GA step as a fraction of λ_l)")
            ax.set_ylabel(label)
            where = "" if not setting else f" at {setting_label(setting)}"
            ax.set_title(f"{g} ({exp}){where}: forgotten vs retained points\n{caption([f, r])}", fontsize=8)
            ax.legend(fontsize=6, ncol=2)
            ax.grid(alpha=0.3)
    return save(fig, out / f"pipeline_{g}.png")


def unidentified(fit: xr.Dataset | None, setting: dict, eps: xr.Dataset | None) -> str:
    """Where the KKT attack did not recover the point from the original nets (identity) although its
    candidates fit those nets' KKT equations as well as their training points do (median over the nets
    of ``residual_exact_rel`` at most :data:`FIT` times the median ε1_rel), the words saying so: the
    attack converged to another solution, the weights do not determine the point (paper 004's
    non-uniqueness; configs/pipeline-small-identifiability.yaml); else "". ``fit``: that median
    (:func:`storage.stats.aggregate`), None where the group has no residual."""
    if eps is None or fit is None:
        return ""
    res = _at(fit, setting).sel(unlearn_method="identity").isel(alpha=0)
    r, e = float(res.estimate), float(eps.estimate)
    if not r <= FIT * e:
        return ""
    return (f"; its candidates fit the KKT equations as well as the training points (median residual {r:.2g}, "
            f"ε1_rel {e:.2g}): these weights do not determine the point")


def findings(g: str, exp: str, ds: xr.Dataset, eps: xr.Dataset | None = None) -> list[str]:
    """Markdown rows: stage, quantity, method, α ("—" for a reference), setting (the values of the other
    axes: the slice the row judged), forgotten mean ± half-width (n), retained mean ± half-width (n), the
    verdict (``reconstruct`` / ``reconstruct_diff``, on the first pair; ``eps``: :func:`regime` of the
    unlearn stage read)."""
    first = float(ds.alpha.values[0])

    def cell(s, mth, a):
        one = _pick(s, mth, a, first)
        left = "".join(f", {int(one[k])} {what}" for k, what in (("n_inf", "±inf"), ("n_nan", "NaN"),
                                                                  ("n_excluded", "not usable")) if int(one[k]))
        return f"{estimate_text(one)} (n={int(one.n)}{left})"

    fit = aggregate(ds["residual_exact_rel"], (NETS,), usable=usable(ds), done=ds["done"], stat="median") \
        if exp in KKT_ATTACKS and "residual_exact_rel" in ds else None
    rows = []
    for j, (fvar, rvar, _) in enumerate(PAIRS[exp]):
        f_all, r_all = summary(ds, fvar), summary(ds, rvar)
        for setting in settings(f_all):
            f, r = _at(f_all, setting), _at(r_all, setting)
            known = float(_pick(f, "identity", None, first).estimate) if "identity" in ds.unlearn_method.values else math.nan
            for mth, a in _entries(ds):
                positive = None if mth == "identity" else known
                at = _at(eps, setting) if eps is not None else None
                judged = verdict(exp, _pick(f, mth, a, first), at, positive) if j == 0 else ""
                if mth == "identity" and judged.startswith("not recovered") and exp in KKT_ATTACKS:
                    judged += unidentified(fit, setting, at)
                alpha = "—" if a is None else f"{a:g}"
                rows.append(f"| {g} | {fvar.removesuffix('_forgotten')} | {mth} | {alpha} | {setting_label(setting)} | "
                            f"{cell(f, mth, a)} | {cell(r, mth, a)} | {judged} |")
    return rows


def store_figures(store, out, scalars: dict | None = None) -> tuple[list[pathlib.Path], list[str]]:
    """The chain's figures in ``out`` and its findings table (markdown lines); nothing when no stage
    reads an ``unlearn`` stage. ``out`` None: the table alone (the served flow's UI artifact);
    ``scalars``: as :func:`readers_of_unlearn` takes them."""
    out = None if out is None else pathlib.Path(out)
    found, skipped = readers_of_unlearn(store, scalars)
    if not found and not skipped:
        return [], []
    paths, rows, what = [], [], []
    for g, exp, ds, unl in found:
        p = figure(g, exp, ds, out) if out is not None else None
        if p is not None:
            paths.append(p)
        eps = regime(unl)
        rows += findings(g, exp, ds, eps)
        kkt = "; ".join((f"{setting_label(st)}: " if st else "") + f"{float(_at(eps, st).estimate):.2g} "
                        f"(n = {int(_at(eps, st).n)})" for st in settings(eps))
        what += [f"{g} (reads {_identity(ds).get('from')}: nets at median ε1_rel {kkt}): "
                 f"{caption([summary(ds, v) for v in PAIRS[exp][0][:2]], 'per entry')}"]
    lines = ["## The chain: forgotten vs retained points", "",
             "Measured values, mean and 95 % interval over the nets (n nets per entry): ± Student's t, or "
             "[lo, hi] where each net's value is 0 or 1 (a proportion of nets: Clopper-Pearson). Every other "
             "axis is a setting, never averaged: one row per setting, named in its row, and a verdict judges "
             "that setting alone. identity and retrain do not depend on α: one row each per setting "
             "(α —). The KKT attack (reconstruct) is judged only on nets near a KKT point (median ε1_rel ≤ "
             f"{KKT_EPS_REL:g} over the nets) and, for GA and retrain, only where it recovers the point from the "
             f"original nets at the same setting (identity: the known positive); the forgotten point is "
             f"\"recovered\" within ρ in ≥ {RECOVERED:.0%} of the nets, "
             f"\"not recovered\" in ≤ {NOT_RECOVERED:.0%}; the other readers' numbers are judged nothing.", "",
             *[f"- {w}" for w in what], *[f"- {s}" for s in skipped], "",
             "| stage | quantity | method | α | setting | forgotten | retained | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""]
    lines += [f"![{p.stem}]({p.name})" for p in paths] + [""]
    return paths, lines


def figures(ds: xr.Dataset, out_dir, prefix: str = "") -> list[pathlib.Path]:
    """A ``forge_net`` group's own figure (the chain's figures are store-level: :func:`store_figures`);
    none apart from them."""
    return []
