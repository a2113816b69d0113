"""Paper 000: the ``forging`` experiment definition and its figures (F000-1, F000-3, F000-5, F000-6).

Uses the registry of flows/experiments directly (no Prefect/Dask); synthetic stores are built
from ``run_bundle`` outputs with xarray.
"""

import numpy as np
import pytest
import xarray as xr

from flows.experiments import EXPERIMENTS
from core.errors import ConfigError
from tasks.cells.forging import forging_cell

import flows.experiments.forging  # noqa: F401  (registers 'forging')


def _cell(**over):
    exp = EXPERIMENTS["forging"]
    cell = {k: p.default for k, p in exp.params.items()}
    cell.update(over)
    return cell


def test_experiment_registered_with_documented_params_and_vars():
    exp = EXPERIMENTS["forging"]
    assert "F000-3" in exp.spec_ids
    for name in ("model", "d", "eps", "R", "seed", "estimator", "A", "n_samples", "width"):
        assert exp.params[name].doc
    assert set(exp.params["estimator"].choices) >= {"exact", "naive_mc", "subset_simulation"}
    for name in ("log_volume", "log_volume_stderr", "log_bound", "log_ball_volume", "log_probability",
                 "n_gradient_evals", "nullity", "predicted_exponent"):
        assert exp.variables[name].units and exp.variables[name].description


@pytest.mark.parametrize("over,field", [
    (dict(model="relu1", estimator="exact"), "estimator"),
    (dict(domain="ball", estimator="exact"), "estimator"),
    (dict(d=1), "d"),
    (dict(m=2, domain="slab", estimator="naive_mc"), "domain"),
    (dict(m=3, B=2, domain="ball", estimator="naive_mc"), "B"),
    (dict(B=4, domain="slab", estimator="naive_mc"), "domain"),
    (dict(domain="cylinder", estimator="exact"), "estimator"),
    (dict(domain="cylinder", d=1, estimator="naive_mc"), "d"),
    (dict(estimator="subset_simulation", n_samples=1234), "n_samples"),
    (dict(estimator="subset_simulation", n_repeats=5), "n_repeats"),
])
def test_check_rejects_impossible_combinations(over, field):
    with pytest.raises(ConfigError) as err:
        EXPERIMENTS["forging"].check(_cell(**over))
    assert err.value.field == field


def test_run_bundle_returns_every_variable():
    """F000-3 cells: exact, naive MC and subset simulation agree (P000-2/P000-13 at CI size)."""
    exp = EXPERIMENTS["forging"]
    cells = [_cell(d=3, eps=0.3, estimator=e, label="integrated", n_samples=n)
             for e, n in (("exact", 10), ("naive_mc", 100_000), ("subset_simulation", 1000))]
    for c in cells:
        exp.check(c)
    out = exp.run_bundle(cells, "cpu")
    assert len(out) == 3 and all(set(o) == set(exp.variables) for o in out)
    exact = out[0]["log_volume"]
    assert exact == out[0]["log_volume_exact"] and out[0]["n_gradient_evals"] == 0
    for o in out[1:]:
        assert abs(o["log_volume"] - exact) < 3 * o["log_volume_stderr"] and o["n_gradient_evals"] > 0
        assert o["log_volume"] <= o["log_bound"]
    assert out[0]["nullity"] == 1 and out[0]["predicted_exponent"] == 3


def test_one_replaced_point_of_a_batch_is_the_single_point_set_at_B_eps():
    """F000-6 at m = 1: replacing one of B points changes the batch gradient by 1/B of the point's
    change (Eq 41), so with the same draws S̃_eps(m = 1, B = 4) has the volume of S_{4 eps}."""
    common = dict(model="linreg", d=2, domain="ball", estimator="naive_mc", n_samples=20_000, seed=3)
    batch = forging_cell(eps=0.05, m=1, B=4, **common)
    single = forging_cell(eps=0.2, m=1, B=1, **common)
    assert batch["n_hits"] == single["n_hits"] > 100
    assert batch["log_volume"] == pytest.approx(single["log_volume"], abs=1e-12)
    assert batch["nullity"] == single["nullity"]


def _synthetic_store():
    exp = EXPERIMENTS["forging"]
    d_vals, eps_vals = [2, 3], [1e-3, 1e-2, 1e-1, 1.0]
    cells = [_cell(d=d, eps=e) for d in d_vals for e in eps_vals]
    res = exp.run_bundle(cells, "cpu")
    data = {v: (("d", "eps"), np.array([r[v] for r in res]).reshape(len(d_vals), len(eps_vals)))
            for v in exp.variables}
    ds = xr.Dataset(data, coords={"d": d_vals, "eps": eps_vals})
    ds["done"] = (("d", "eps"), np.ones((2, 4), dtype=bool))
    return ds


def test_F000_3_figures_from_store(tmp_path):
    """F000-3: figures() draws log mu vs log eps per d from a store (with a partially done grid too)."""
    from analysis.forging import _small_eps_slope, figures

    ds = _synthetic_store()
    paths = figures(ds, tmp_path)
    assert paths and all(p.exists() and p.stat().st_size > 5000 for p in paths)
    slope = _small_eps_slope(ds.eps.values, ds.log_volume.sel(d=3).values)
    assert slope == pytest.approx(3.0, abs=0.05)  # the fitted slope printed in the legend
    ds2 = ds.copy()
    ds2["done"] = ds2.done.where(ds2.eps < 0.5, False)
    assert figures(ds2, tmp_path / "partial")


def test_F000_6_batch_figure_draws_one_line_per_m(tmp_path):
    """F000-6: with d fixed and m on the grid, one panel per estimator with a line per m; the
    measured slope is at least the T000-11 exponent (mD - r)/2 (conservative, spec §6 item 3)."""
    from analysis.forging import _line_dim, _small_eps_slope, figures

    exp = EXPERIMENTS["forging"]
    m_vals, eps_vals = [1, 2], [0.03, 0.1, 0.3]
    cells = [_cell(d=2, m=m, B=2, domain="ball", eps=e, estimator="naive_mc", n_samples=40_000)
             for m in m_vals for e in eps_vals]
    res = exp.run_bundle(cells, "cpu")
    data = {v: (("m", "eps"), np.array([r[v] for r in res]).reshape(2, 3)) for v in exp.variables}
    ds = xr.Dataset(data, coords={"m": m_vals, "eps": eps_vals})
    ds["done"] = (("m", "eps"), np.ones((2, 3), dtype=bool))
    assert _line_dim(ds) == "m"
    paths = [p for p in figures(ds, tmp_path) if "forging_volume" in p.name]
    assert len(paths) == 1 and "m-" not in paths[0].name and paths[0].stat().st_size > 5000
    for m in m_vals:
        one = ds.sel(m=m)
        assert _small_eps_slope(ds.eps.values, one.log_volume.values) >= float(one.predicted_exponent[0]) - 0.2


def test_F000_5_P000_14_probability_cells_and_figure(tmp_path):
    """F000-5 / P000-14: P(forge) for (z, t) uniform on B_2 × [-4, 4] stays below Cor 1 (within 3 SE
    of the estimate), log_volume = log P + log vol(V); under N(0, I) nested sampling and naive MC
    agree; the report draws probability panels with the bounds."""
    from analysis.forging import figures

    exp = EXPERIMENTS["forging"]
    cells = [_cell(d=3, eps=e, domain=dom, R=2.0, R2=4.0, estimator=est, n_samples=n, lipschitz_pairs=32)
             for dom in ("cylinder", "gaussian") for e in (0.1, 0.3)
             for est, n in (("naive_mc", 200_000), ("nested_sampling", 500))]
    for c in cells:
        exp.check(c)
    res = exp.run_bundle(cells, "cpu")
    for c, r in zip(cells, res):
        assert np.isfinite(r["log_probability"]) and r["log_volume_stderr"] < 0.5, (c, r)
        if c["domain"] == "cylinder":
            assert r["log_probability"] - 3 * r["log_volume_stderr"] <= r["log_probability_bound"]
            assert r["log_probability_bound"] == min(r["log_probability_bound_cor1_eq30"],
                                                     r["log_probability_bound_cor1_eq31_corrected"])
            assert r["log_volume"] == pytest.approx(r["log_probability"] + r["log_ball_volume"])
        else:
            assert np.isnan(r["log_volume"]) and np.isnan(r["log_probability_bound"])
    for i in range(0, len(res), 2):  # naive MC vs nested sampling, same cell
        a, b = res[i], res[i + 1]
        assert abs(a["log_probability"] - b["log_probability"]) < 3 * np.hypot(a["log_volume_stderr"],
                                                                                b["log_volume_stderr"])
    shape = (2, 2, 2)
    data = {v: (("domain", "eps", "estimator"), np.array([r[v] for r in res]).reshape(shape)) for v in exp.variables}
    ds = xr.Dataset(data, coords={"domain": ["cylinder", "gaussian"], "eps": [0.1, 0.3],
                                  "estimator": ["naive_mc", "nested_sampling"]})
    ds["done"] = (("domain", "eps", "estimator"), np.ones(shape, dtype=bool))
    paths = [p for p in figures(ds, tmp_path) if "forging_volume" in p.name]
    assert len(paths) == 4 and all(p.stat().st_size > 5000 for p in paths)


def test_F000_1_forging_sgd_experiment_stores_trajectories_and_draws_them(tmp_path):
    """F000-1 / P000-15 as the ``forging_sgd`` experiment: both trajectories are stored along the
    extra dim ``step`` (shared points along ``point``), and the report draws Fig 1 from the stored
    numbers: the plotted lines are the stored w_k, the PNG has content, a second report redraws it."""
    import matplotlib.pyplot as plt

    import flows.experiments.forging_sgd  # noqa: F401  (registers 'forging_sgd')
    from analysis.forging_sgd import draw_trajectories, figures

    exp = EXPERIMENTS["forging_sgd"]
    cells = [dict({k: p.default for k, p in exp.params.items()}, data=d) for d in ("uniform", "zeros")]
    res = exp.run_bundle(cells, "cpu")
    sizes = exp.extra_dims(cells)
    assert sizes == {"step": 21, "point": 19}
    u = res[0]
    assert u["grad_original_w0"] == pytest.approx(0.248206, abs=1e-6) and u["opposite_basins"] == 1
    assert u["w_original"][1] == pytest.approx(-0.07436, abs=1e-5) and u["w_forged"][1] == pytest.approx(0.03064, abs=1e-5)
    assert u["w_final_original"] == pytest.approx(-2.00700, abs=1e-5) and u["w_final_forged"] == pytest.approx(1.91953, abs=1e-5)
    assert res[1]["w_final_forged"] == pytest.approx(2.00162, abs=1e-5)
    data = {}
    for v, var in exp.variables.items():
        data[v] = (("data", *var.dims), np.stack([np.asarray(r[v]) for r in res]))
    ds = xr.Dataset(data, coords={"data": ["uniform", "zeros"]})
    ds["done"] = (("data",), np.ones(2, dtype=bool))
    fig, ax = plt.subplots()
    draw_trajectories(ax, ds.w_original.sel(data="uniform").values, ds.w_forged.sel(data="uniform").values, 2.0,
                      -0.5, 0.2)
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), u["w_original"])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), u["w_forged"])
    assert [tuple(ln.get_ydata()) for ln in ax.lines[2:]] == [(2.0, 2.0), (-2.0, -2.0)]
    plt.close(fig)
    paths = figures(ds, tmp_path)
    assert len(paths) == 2 and all(_png_has_content(p) for p in paths)
    stamp = paths[0].stat().st_mtime_ns
    paths[0].write_bytes(b"stale")
    again = figures(ds, tmp_path)
    assert again[0] == paths[0] and _png_has_content(again[0]) and again[0].stat().st_mtime_ns >= stamp


@pytest.mark.parametrize("domain", ["cylinder", "gaussian"])
def test_P000_14_thm3_bound_stored_and_above_estimate(domain):
    """P000-14 / F000-5: the Thm 3 bound (T000-8) is computed in the cell for both laws (cylinder:
    D2 = V, L_g = 0; Gaussian: D2 = B_rho(0), exact chi² tail) where eps < 1/(2L), and it is >= the
    estimated probability; with eps >= 1/(2L) it is NaN (hypothesis fails)."""
    from tasks.forging import bounds as fb

    exp = EXPERIMENTS["forging"]
    cell = _cell(d=2, eps=0.03, domain=domain, R=2.0, R2=4.0, estimator="naive_mc", n_samples=50_000)
    exp.check(cell)
    r = exp.run_bundle([cell], "cpu")[0]
    L, nul = r["lipschitz_estimate"], int(r["nullity"])
    assert L > 0 and 0.03 < 1 / (2 * L) and nul == 1  # linreg: M affine in x, r = 1 (App H)
    assert np.isfinite(r["log_probability_bound_thm3"])
    assert r["log_probability"] <= r["log_probability_bound_thm3"]
    if domain == "cylinder":
        expect = fb.thm3_probability(3, L, 1, 1, 2 * np.hypot(2.0, 4.0), 0.03).log_value
        assert r["log_probability_bound_thm3"] == pytest.approx(expect) and np.isnan(r["thm3_radius"])
    else:
        assert r["thm3_radius"] > 0
        b, _ = fb.thm3_gaussian(3, L, 1, 1, 0.03, [r["thm3_radius"]])
        assert r["log_probability_bound_thm3"] == pytest.approx(b.log_value)
    big = exp.run_bundle([dict(cell, eps=1.0 / L)], "cpu")[0]
    assert np.isnan(big["log_probability_bound_thm3"])


def test_remark5_stored_on_the_ball_domain():
    """T000-7 Remark 5 beside Thm 2 on the ball domain (heuristic; same exponent (D - r)/2)."""
    r = forging_cell(model="linreg", d=2, eps=0.01, domain="ball", estimator="naive_mc", n_samples=2000)
    assert np.isfinite(r["log_bound_thm2"]) and np.isfinite(r["log_bound_remark5"])


_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
PAPER_CONFIGS = sorted(p.name for p in (_ROOT / "configs").glob("paper-000-*.yaml") if p.name != "paper-000-ci.yaml")


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_use_2000_points_per_subset_level(name):
    """Spec 000 §6.5: N >= 2000 points per subset-simulation level in every paper-000 config."""
    from flows.config import load
    from tasks.forging.estimators import LEVELLED

    cfg = load(_ROOT / "configs" / name)
    if cfg.experiment != "forging":
        return
    small = [c for c in cfg.cells() if c.get("estimator") in LEVELLED and c["n_samples"] < 2000]
    assert not small, f"{len(small)} levelled cells with n_samples < 2000"


@pytest.mark.parametrize("name", ["paper-000-ci.yaml", "quickstart-forging.yaml"])
def test_ci_size_configs_say_why_they_use_fewer_points(name):
    assert "§6.5" in (_ROOT / "configs" / name).read_text()


def _png_has_content(path) -> bool:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return img.ndim == 3 and float((img[..., :3] < 0.9).any(-1).mean()) > 0.01


@pytest.mark.slow
def test_F000_4_slope_inset_from_stored_nullity(tmp_path):
    """F000-4 inset: the fitted small-eps slope per d against D - r and (D - r)/2, r = the stored
    nullity at x*; linreg on the ball D2 = B_R(x*): r = 1, D - r = d (P000-8: slope ≈ D - r)."""
    import matplotlib.pyplot as plt

    from analysis.forging import _small_eps_slope, figures, slope_inset

    exp = EXPERIMENTS["forging"]
    d_vals, eps_vals = [2, 3], [0.01, 0.03, 0.1]
    cells = [_cell(d=d, eps=e, domain="ball", estimator="naive_mc", n_samples=30_000, lipschitz_pairs=16)
             for d in d_vals for e in eps_vals]
    res = exp.run_bundle(cells, "cpu")
    data = {v: (("d", "eps"), np.array([r[v] for r in res]).reshape(2, 3)) for v in exp.variables}
    ds = xr.Dataset(data, coords={"d": d_vals, "eps": eps_vals})
    ds["done"] = (("d", "eps"), np.ones((2, 3), dtype=bool))
    ds.attrs["kktlab_identity"] = '{"params": {"domain": "ball"}}'
    points = []
    for d in d_vals:
        one = ds.sel(d=d)
        assert set(one.nullity.values) == {1.0} and set(one.tube_exponent.values) == {float(d)}
        points.append((_small_eps_slope(ds.eps.values, one.log_volume.values), float(d), d / 2))
    assert all(p[0] >= p[2] for p in points)  # P000-8: slope >= (D - r)/2
    fig, ax = plt.subplots()
    ins = slope_inset(ax, points)
    np.testing.assert_allclose(ins.lines[0].get_xydata(), [[p[1], p[0]] for p in points])
    np.testing.assert_allclose(ins.lines[1].get_xydata(), [[p[2], p[0]] for p in points])
    plt.close(fig)
    paths = [p for p in figures(ds, tmp_path) if "forging_volume" in p.name]
    assert len(paths) == 1 and _png_has_content(paths[0])
