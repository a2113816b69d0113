"""The chain's findings table (analysis/pipeline.py, issue 39) on hand-made groups: identity and retrain
(nets that do not depend on α) are one row each; the KKT attack's verdict on the forgotten point is
given only for nets near a KKT point (median ε1_rel ≤ 0.05) where the attack recovers it from the
original nets (the known positive), and says how many nets it judged; the
difference attack is judged whatever the nets' residual; a reader of an unlearn stage that does not
sweep α takes it from the unlearn stage's parameters; every other axis is a setting, one row each, never
pooled (a verdict names the slice it judged), and the regime is read at the same setting."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import xarray as xr

from analysis import pipeline

SEEDS = [0, 1, 2]


def _group(values: dict, methods=("identity", "ga", "retrain"), alphas=(0.5, 1.0), **other) -> xr.Dataset:
    """A reader group over (seed, unlearn_method, alpha, *other): per variable a function (method, alpha, seed,
    **other) -> value."""
    dims = {"seed": SEEDS, "unlearn_method": list(methods), "alpha": list(alphas), **{k: list(v) for k, v in other.items()}}
    shape = tuple(len(v) for v in dims.values())
    data = {k: (tuple(dims), np.array([f(*at[1:3], at[0], **dict(zip(other, at[3:])))
                                       for at in itertools.product(*dims.values())]).reshape(shape))
            for k, f in values.items()}
    data.update(done=(tuple(dims), np.ones(shape, bool)), failed=(tuple(dims), np.zeros(shape, bool)))
    return xr.Dataset(data, coords=dims)


def _eps(value: float) -> xr.Dataset:
    """The regime of nets whose ε1_rel is ``value`` each."""
    return pipeline.regime(_group({"eps1_rel": lambda m, a, s: value}))


def _recon(forgotten_after_ga: float) -> xr.Dataset:
    rec = lambda m, a, s, **_: forgotten_after_ga if m == "ga" else 1.0  # noqa: E731
    return _group({"recovered_forgotten": rec, "recovered_retained": lambda m, a, s, **_: 1.0,
                   "cos_forgotten": lambda m, a, s, **_: 0.9, "cos_retained": lambda m, a, s, **_: 0.8})


def _rows(rows: list[str], quantity: str, method: str) -> list[list[str]]:
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    return [c for c in cells if c[1] == quantity and c[2] == method]


def test_references_are_one_row_each_and_ga_one_per_alpha():
    rows = pipeline.findings("recon", "reconstruct", _recon(0.0), _eps(0.01))
    for ref in ("identity", "retrain"):
        (row,) = _rows(rows, "recovered", ref)
        assert row[3] == "—", row
    assert [r[3] for r in _rows(rows, "recovered", "ga")] == ["0.5", "1"]


def test_the_kkt_attack_is_judged_only_near_a_kkt_point():
    inside = pipeline.findings("recon", "reconstruct", _recon(0.0), _eps(0.01))
    (ident,) = _rows(inside, "recovered", "identity")
    assert ident[7] == "recovered (mean over 3 nets 1.00)", ident
    assert {r[7] for r in _rows(inside, "recovered", "ga")} == {"not recovered (mean over 3 nets 0.00)"}
    assert _rows(inside, "cos", "ga")[0][7] == ""  # one verdict per entry: on the recovery by distance
    unclear = pipeline.findings("recon", "reconstruct", _recon(1 / 3), _eps(0.01))
    assert {r[7] for r in _rows(unclear, "recovered", "ga")} == {"unclear (mean over 3 nets 0.33)"}
    outside = pipeline.findings("recon", "reconstruct", _recon(0.0), _eps(0.37))
    assert {r[7] for r in _rows(outside, "recovered", "ga") + _rows(outside, "recovered", "identity")} == {
        "no verdict: nets outside the KKT regime (median ε1_rel 0.37 over 3 nets > 0.05)"}


def test_not_recovered_after_ga_needs_the_known_positive():
    ds = _recon(0.0)
    ds["recovered_forgotten"] = ds.recovered_forgotten * 0  # the attack finds the point nowhere, identity included
    rows = pipeline.findings("recon", "reconstruct", ds, _eps(0.01))
    assert _rows(rows, "recovered", "identity")[0][7] == "not recovered (mean over 3 nets 0.00)"
    assert {r[7] for r in _rows(rows, "recovered", "ga") + _rows(rows, "recovered", "retrain")} == {
        "no verdict: no known positive (from the original nets, identity, the attack recovers the point in 0.00 "
        "of the nets)"}


def test_the_difference_attack_is_judged_whatever_the_residual():
    ds = _recon(1.0).assign(chance_cos_forgotten=lambda d: d.cos_forgotten * 0 + 0.2,
                            chance_cos_retained=lambda d: d.cos_forgotten * 0 + 0.2)
    rows = pipeline.findings("diff", "reconstruct_diff", ds, _eps(0.37))
    assert {r[7] for r in _rows(rows, "recovered", "ga")} == {"recovered (mean over 3 nets 1.00)"}
    assert [r[5].split(" ±")[0] for r in _rows(rows, "chance_cos", "ga")] == ["0.2"] * 2  # the chance baseline beside


def test_the_regime_is_the_median_over_nets_of_the_trained_nets_residual():
    unl = _group({"eps1_rel": lambda m, a, s: [0.01, 0.02, 0.4][s]})
    assert (float(pipeline.regime(unl).estimate), int(pipeline.regime(unl).n)) == (pytest.approx(0.02), 3)
    unl["done"][{"seed": 1}] = False  # a net not done is not counted
    assert (float(pipeline.regime(unl).estimate), int(pipeline.regime(unl).n)) == (pytest.approx((0.01 + 0.4) / 2), 2)


def test_a_reader_of_a_stage_without_an_alpha_axis_takes_it_from_the_stage():
    unl = _group({"eps1_rel": lambda m, a, s: 0.01}, alphas=(1.0,)).isel(alpha=0, drop=True)
    unl.attrs["kktlab_identity"] = json.dumps({"params": {"alpha": 1.0, "forget": 0}})
    reader = _recon(0.0).isel(alpha=[1]).isel(alpha=0, drop=True)
    ds = pipeline._with_method_alpha(reader, unl)
    assert list(ds.alpha.values) == [1.0]
    rows = pipeline.findings("recon", "reconstruct", ds, pipeline.regime(pipeline._with_method_alpha(unl, unl)))
    assert [r[3] for r in _rows(rows, "recovered", "ga")] == ["1"]


def test_settings_are_rows_never_pooled_and_each_verdict_names_its_slice():
    """An attack axis (the attacker's norm prior) and an upstream axis (the data dimension d): the prior
    recovers the point from the original nets only at norm_prior 1, and only the d = 10 nets are near a
    KKT point; pooled, identity's mean 0.5 would read "recovered" at every setting."""
    known = lambda m, a, s, d, norm_prior: 1.0 if m == "ga" or norm_prior == 1.0 else 0.0  # noqa: E731
    ds = _group({"recovered_forgotten": lambda m, a, s, **k: 0.0 if m == "ga" else known(m, a, s, **k),
                 "recovered_retained": lambda m, a, s, **_: 1.0, "cos_forgotten": lambda m, a, s, **_: 0.9,
                 "cos_retained": lambda m, a, s, **_: 0.8}, d=[10, 20], norm_prior=[0.0, 1.0])
    eps = pipeline.regime(_group({"eps1_rel": lambda m, a, s, d: 0.01 if d == 10 else 0.3}, d=[10, 20]))
    rows = pipeline.findings("recon", "reconstruct", ds, eps)
    ga = {(r[3], r[4]): r[7] for r in _rows(rows, "recovered", "ga")}
    assert set(ga) == {(a, f"d={d}, norm_prior={p}") for a in ("0.5", "1") for d in (10, 20) for p in (0, 1)}
    assert ga[("1", "d=10, norm_prior=1")] == "not recovered (mean over 3 nets 0.00)"
    assert ga[("1", "d=10, norm_prior=0")].startswith("no verdict: no known positive")
    assert {v for (a, st), v in ga.items() if st.startswith("d=20")} == {
        "no verdict: nets outside the KKT regime (median ε1_rel 0.3 over 3 nets > 0.05)"}
    ident = {r[4]: r[7] for r in _rows(rows, "recovered", "identity")}
    assert ident["d=10, norm_prior=1"] == "recovered (mean over 3 nets 1.00)"
    assert ident["d=10, norm_prior=0"] == "not recovered (mean over 3 nets 0.00)"


@pytest.mark.parametrize("residual, said", [(0.0036, True), (0.15, False)])
def test_a_point_the_weights_do_not_determine_is_named_so(residual, said):
    """Not recovered from the original nets although the candidates fit their KKT equations as well as the
    training points (residual_exact_rel within 2x the nets' ε1_rel: pipeline-small's nets): the identity
    row says the weights do not determine the point; candidates that fit worse: a plain "not recovered"."""
    ds = _recon(0.0)
    ds["recovered_forgotten"] = ds.recovered_forgotten * 0
    ds["residual_exact_rel"] = ds.recovered_forgotten * 0 + residual
    (ident,) = _rows(pipeline.findings("recon", "reconstruct", ds, _eps(0.0037)), "recovered", "identity")
    assert ident[7].startswith("not recovered (mean over 3 nets 0.00)")
    assert ("these weights do not determine the point" in ident[7]) is said, ident[7]


def test_without_an_identity_entry_the_kkt_attack_judges_nothing_after_unlearning():
    """No attack on the original nets, no known positive: GA's and retrain's rows give no verdict (the
    difference attack, which needs none, is still judged)."""
    ds = _recon(0.0).sel(unlearn_method=["ga", "retrain"])
    rows = pipeline.findings("recon", "reconstruct", ds, _eps(0.01))
    assert {r[7] for r in _rows(rows, "recovered", "ga") + _rows(rows, "recovered", "retrain")} == {
        "no verdict: no known positive (no identity entry: the attack on the original nets was not run)"}
    diff = pipeline.findings("diff", "reconstruct_diff", ds.assign(
        chance_cos_forgotten=ds.cos_forgotten, chance_cos_retained=ds.cos_retained), _eps(0.01))
    assert {r[7] for r in _rows(diff, "recovered", "ga")} == {"not recovered (mean over 3 nets 0.00)"}
