"""Paper 003 as stages, end to end through the real CLI (real Prefect server, Dask LocalCluster,
Zarr): lazy_train on sklearn digits and a small MNIST slice -> single_step, adv_train -> pgd.
The stored nets are read back and the stored single steps recomputed from them; snapshots of one
trajectory (spec 003 §2.6) and the lazy ball are checked on the stored nets; config errors name
their field before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from core.errors import ConfigError
from flows import config

LAZY = {"variant": "unit", "m": 64, "lr": 0.5, "max_steps": 3000, "n_train": 256, "n_test": 64}
GRID = {"data": ["digits", "mnist"], "d": [25, 49], "C0": [3.0, 6.0], "seed": [0]}
ADV = {"data": "digits", "d": 36, "m": 48, "T1_max": 3, "T2": 8, "beta": 0.05}
RUNNER = {"workers": 2, "bundle_size": 8}


def lazy_chain(**over) -> dict:
    raw = {"name": "lazy003", "runner": dict(RUNNER), "stages": [
        {"name": "lazy", "experiment": "lazy_train", "grid": dict(GRID), "params": dict(LAZY)},
        {"name": "flips", "experiment": "single_step", "from": "lazy", "grid": {"single_step_method": ["single_step_exact"]}},
        {"name": "adv", "experiment": "adv_train", "grid": {"V": [0.1, 2.0], "R": [0.1], "seed": [0]},
         "params": dict(ADV)},
        {"name": "robust", "experiment": "pgd", "from": "adv", "grid": {"restarts": [1]}, "params": {"T2": 16}},
    ]}
    for key, value in over.items():  # "s0.params.d": 50
        parts = key.split(".")
        target = raw["stages"][int(parts[0][1:])]
        for p in parts[1:-1]:
            target = target[p]
        target[parts[-1]] = value
    return raw


BAD = [
    ("E1 d not a square", {"s0.grid.d": [50]}, "stages[0].d", "not a square"),
    ("d too large for digits", {"s0.grid.d": [100], "s0.grid.data": ["digits"]}, "stages[0].d", "larger than"),
    ("unknown attack", {"s1.grid.single_step_method": ["fgsm"]}, "stages[1].grid.single_step_method", "single_step_exact"),
    ("negative budget", {"s3.params.R": -0.1}, "stages[3].params.R", ">= 0"),
    ("negative training budget", {"s2.grid.R": [-0.3]}, "stages[2].grid.R", ">= 0"),
    ("width beyond memory", {"s0.params.m": 10**6, "s0.grid.d": [784], "s0.grid.data": ["mnist"]},
     "params.m, grid.d", "GiB"),  # 48.6 GiB per cell (float64, d = 784, m = 1e6)
]


@pytest.mark.parametrize("label,over,field,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_the_field_before_any_work(label, over, field, hint):
    with pytest.raises(ConfigError) as err:
        for stage in config.parse(lazy_chain(**over)).stages:
            config.check_fits(stage)  # what `kktlab run` does before any work
    assert err.value.field.replace(".grid.d", ".d") == field.replace(".grid.d", ".d"), str(err.value)
    assert hint in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def ran(run_chain):
    return run_chain(lazy_chain(), "lazy003")


@pytest.mark.slow
def test_the_dry_run_predicts_the_bundles_each_stage_ran(ran, capsys):
    """``kktlab run --dry-run`` cuts a reading stage's cells per upstream bundle, as the run releases
    them (flows/chain.py ``_release``), not per upstream cell (issue 45: 18 predicted, 9 run)."""
    from kktlab.plan import print_plan

    stats = json.loads((ran / "stats.json").read_text())
    print_plan([config.load(ran / "chain.yaml")], [str(ran / "none.zarr")])
    lines = capsys.readouterr().out.splitlines()
    for s in stats:
        line = next(ln for ln in lines if ln.strip().startswith(f"{s['group']} ("))
        assert f"~{s['bundles']} bundles" in line, (s, line)


@pytest.mark.slow
def test_E1_chain_end_to_end_dims_and_lazy_ball(ran):
    from storage.query import open_results

    stats = json.loads((ran / "stats.json").read_text())
    assert [s["group"] for s in stats] == ["lazy", "flips", "adv", "robust"]
    assert [s["written"] for s in stats] == [8, 8, 2, 2] and all(s["failed"] == 0 for s in stats)
    lazy = open_results(ran / "chain.zarr", "lazy").load()
    flips = open_results(ran / "chain.zarr", "flips").load()
    assert set(flips.delta_rel.dims) == {"data", "d", "C0", "seed", "single_step_method", "point"}
    assert dict(lazy.test_index.sizes)["test_sample"] == 64 and dict(lazy.W.sizes)["hidden"] == 64
    assert not {"X", "y", "X_test", "y_test", "W0"} & set(lazy.data_vars)  # indices + checksums, seeds: no copies
    assert (lazy.C0_reached <= lazy.C0).all() and bool(lazy.exited.all())
    assert (lazy.steps.sel(C0=3.0) < lazy.steps.sel(C0=6.0)).all()  # one trajectory, later snapshot
    assert float(lazy.test_acc.sel(data="digits", C0=6.0).min()) >= 0.9
    assert float(lazy.test_acc.sel(data="mnist", C0=6.0).min()) >= 0.95
    d = flips.delta_rel.values
    assert np.isfinite(d).all() and (d > 0).all() and (d < 1).all()  # unit inputs: ||delta*|| < ||x||
    ratio = flips.t_ratio.values
    assert 0.8 < float(np.median(ratio)) < 1.5  # t* ~ t_lin: the net is nearly linear along the ray (spec §2.7)


@pytest.mark.slow
def test_stored_single_steps_recompute_from_the_stored_nets(ran):
    from kktlab import load_nets
    from storage.query import open_results
    from tasks.attacks import single_step_exact
    from tasks.nets import TwoLayer

    flips = open_results(ran / "chain.zarr", "flips").load()
    n = load_nets(ran / "chain.zarr", "lazy", data="mnist", d=49)
    r = single_step_exact(TwoLayer(n.W, n.b, n.v), n.extra["X_test"])
    for e, cell in enumerate(n.cells):
        coords = {k: v for k, v in cell.items() if k in flips.eta_star.dims}  # cells also hold fixed params
        stored = flips.eta_star.sel({**coords, "single_step_method": "single_step_exact"}).values
        np.testing.assert_allclose(r.t_star[e].numpy(), stored, rtol=1e-12, atol=0)
    assert (n.extra["W0"].shape == n.W.shape) and n.extra["X_test"].shape[1] == 64


@pytest.mark.slow
def test_E4_adv_train_then_pgd_wider_ball_is_more_robust(ran):
    from storage.query import open_results

    adv = open_results(ran / "chain.zarr", "adv").load()
    rob = open_results(ran / "chain.zarr", "robust").load()
    assert set(rob.rta.dims) == {"V", "R", "seed", "restarts"}
    assert (rob.R_used == 0.1).all() and (rob.max_delta <= 0.1 * (1 + 1e-9)).all()
    assert (rob.rta <= rob.clean_acc + 1e-12).all()
    assert float(rob.rta.sel(V=2.0).min()) > float(rob.rta.sel(V=0.1).max()) + 0.3  # measured 0.94 vs 0.36
    assert (adv.C0_reached <= adv.C0 * (1 + 1e-9)).all()
    assert math.isclose(float(adv.C0.sel(V=2.0).item()), 2.0 * math.sqrt(48), rel_tol=1e-12)
    assert dict(adv.rta_train_hist.sizes)["epoch"] == 3


CONFIGS = ["paper-003-e1e2", "paper-003-e4", "paper-003-e5", "paper-003-x1", "paper-003-x3-x6", "quickstart-lazy"]


@pytest.mark.parametrize("name", CONFIGS)
def test_E1_to_E5_X1_X3_X6_configs_parse(name):
    import pathlib

    from flows import stages

    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml"
    raw, text = config.read_yaml(path)
    chain = stages.parse_chain(raw, text)
    assert chain.stages[0].experiment in ("lazy_train", "adv_train") and chain.n_cells >= 12


@pytest.mark.slow
def test_report_draws_paper003_figures_and_acceptance_rows(ran, tmp_path):
    from analysis import acceptance_003, lazy
    from kktlab.report import report
    from storage.query import load_scalars, open_results

    paths = report(ran / "chain.zarr", tmp_path)
    names = {p.name for p in paths}
    assert {"flips_fig3-6_mnist_med_delta_rel.png", "flips_fig3-6_digits_med_gnorm.png", "robust_rta_vs_R.png",
            "flips_fig7_delta_rel.png", "flips_fig7_eta_star.png"} <= names
    rows = acceptance_003.acceptance(load_scalars(open_results(ran / "chain.zarr", "flips")))
    assert {r.spec_id for r in rows} == {"E1", "E2", "E3"}
    e2 = [r for r in rows if r.criterion.startswith("med_gnorm increases")]
    assert len(e2) == 2 and all(0.0 <= r.value <= 1.0 for r in e2)  # one row per data set, never pooled
    hist = lazy.histograms(open_results(ran / "chain.zarr", "flips").load(), tmp_path, "h_", sel={"data": "mnist"})
    assert len(hist) == 3 and all(p.stat().st_size > 0 for p in hist)


def _synthetic_pgd(dims: dict, rta) -> "xr.Dataset":
    import xarray as xr

    shape = tuple(len(v) for v in dims.values())
    grid = np.meshgrid(*dims.values(), indexing="ij")
    values = rta(*grid)
    return xr.Dataset({"rta": (tuple(dims), values), "done": (tuple(dims), np.ones(shape, dtype=bool))},
                      coords=dims)


def test_E4_E5_acceptance_recovers_planted_boundaries():
    """RTA planted as a step at R = 5/√d (E4) and at V = 25/√m (E5): the rows fit 5 and 25 back."""
    from analysis import acceptance_003

    R = np.round(np.arange(0.05, 1.0001, 0.05), 2)
    d = np.array([k * k for k in range(5, 29)])
    e4 = _synthetic_pgd({"d": d, "R": R, "seed": [0, 1]}, lambda d, R, s: (R < 5 / np.sqrt(d)).astype(float))
    slope, const, plateaus = [r for r in acceptance_003.acceptance(e4) if r.spec_id == "E4"]
    assert slope.passed and abs(slope.value + 0.5) < 0.1
    assert const.passed and 4.0 < const.value < 6.0 and plateaus.passed
    V = np.round(np.arange(0.05, 1.0001, 0.05), 2)
    m = np.array([1000, 2000, 5000, 10000])
    e5 = _synthetic_pgd({"m": m, "V": V, "seed": [0]}, lambda m, V, s: (V > 25 / np.sqrt(m)).astype(float))
    row, flat, plateaus = [r for r in acceptance_003.acceptance(e5) if r.spec_id == "E5"]
    assert row.passed and 20 < row.value < 30 and flat.passed and plateaus.passed


@pytest.mark.slow
@pytest.mark.parametrize("data", ["digits", "mnist"])
def test_data_and_init_rebuilt_from_indices_and_seed_are_what_training_used(ran, data):
    """Issue 13 item 4: lazy_train keeps row indices + file checksums and the seed, never copies;
    the rebuilt rows equal the rows training read, and the rebuilt W0 gives back the stored
    √m ||W - W0||_{2,∞} (C0_reached) to round-off, so it is the init training started from."""
    from flows.experiments import lazy_train
    from kktlab import load_nets
    from storage.query import open_results

    lazy = open_results(ran / "chain.zarr", "lazy").load()
    n = load_nets(ran / "chain.zarr", "lazy", data=data, d=25)
    X, y, Xt, yt, _ = lazy_train.load_data(n.cells[0])
    for e in range(len(n.cells)):
        np.testing.assert_array_equal(n.X[e].numpy(), X.numpy())
        np.testing.assert_array_equal(n.y[e].numpy(), y.numpy())
        np.testing.assert_array_equal(n.extra["X_test"][e].numpy(), Xt.numpy())
        C0 = math.sqrt(n.W.shape[1]) * (n.W[e] - n.extra["W0"][e]).norm(dim=1).max()
        stored = lazy.C0_reached.sel(data=data, d=25, C0=n.cells[e]["C0"], seed=0)
        assert abs(float(C0) - float(stored)) < 1e-12


@pytest.mark.slow
def test_indices_need_the_producer_and_a_changed_file_is_refused(ran):
    from flows.experiments import lazy_train
    from storage.nets import load_nets_at
    from storage.query import load_nets
    from core.errors import StoreError

    with pytest.raises(StoreError, match="kktlab.load_nets"):
        load_nets(ran / "chain.zarr", "lazy", data="digits")

    def changed(cell, read):  # the data file's checksum no longer matches the stored one
        return lazy_train.rebuild(cell, lambda name: read(name) ^ 1 if name == "data_checksum" else read(name))

    n = load_nets_at(ran / "chain.zarr", "lazy", [(0, 0, 0, 0)], changed)
    assert "cannot be rebuilt" in n.problems[0] and "not" in n.problems[0]
