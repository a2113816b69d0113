"""Paper 004 F004-3 as a chain through the real CLI (real Prefect server, Dask LocalCluster, Zarr):
``train`` (with its logged ε*/‖θ‖ trajectory) → ``kkt_constructions`` on the spec's small nets
(n = 20, d = 10 and d = 30, width 50); the stored construction checks equal a recomputation from the
stored nets, the acceptance rows P004-2/4/6/7 pass, and the report draws the F004-3 panels."""

from __future__ import annotations

import json

import numpy as np
import pytest

TRAIN = {"data": "unit_sphere", "labels": "sign_x1", "m": 20, "width": 50, "loss": "logistic", "lr0": 0.05,
         "lr_factor": 1.2, "lr_period": 50, "target_loss": 1.0e-6, "max_iters": 20000, "log_points": 11}
RAW = {"name": "f3", "runner": {"workers": 2, "bundle_size": 4}, "stages": [
    {"name": "nets", "experiment": "train", "grid": {"d": [10, 30], "seed": [0]}, "params": TRAIN},
    {"name": "constructions", "experiment": "kkt_constructions", "from": "nets", "grid": {"n_ops": [4]}},
]}


@pytest.fixture(scope="module")
def ran(run_chain):
    return run_chain(RAW, "f3")


def test_F004_3_config_parses_and_names_the_spec_id():
    import pathlib

    from flows import config

    path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "paper-004-f3.yaml"
    raw, text = config.read_yaml(path)
    assert "F004-3" in text
    stages = config.parse(raw).stages
    assert [s.exp.name for s in stages] == ["train", "kkt_constructions"]


@pytest.mark.slow
def test_F004_3_chain_stores_the_construction_checks(ran):
    from storage.query import open_results

    stats = json.loads((ran / "stats.json").read_text())
    assert [(s["group"], s["written"], s["failed"]) for s in stats] == [("nets", 2, 0), ("constructions", 2, 0)]
    ds = open_results(ran / "chain.zarr", "constructions").load()
    assert ds.done.dims == ("d", "seed", "n_ops") and bool(ds.done.all())
    assert ds.op_residual.dims[-1] == "op" and ds.sizes["op"] == 8 and ds.sizes["tau"] == 4
    assert float(ds.merge_split_max.max()) <= 1e-12  # P004-2/3 at round-off
    assert int(ds.far_ok.sel(d=10).item()) == -1 and int(ds.far_ok.sel(d=30).item()) == 1  # Thm 4 needs n < d
    assert bool((ds.far_dist.sel(d=30) > ds.far_tau.sel(d=30)).all())
    assert float(ds.b8_ok_frac.min()) == 1.0 and float(ds.b8_keep_frac.min()) == 1.0
    assert float(ds.sigma_d.sel(d=30).item()) == 0 and float(ds.sigma_d.sel(d=10).item()) > 0
    nets = open_results(ran / "chain.zarr", "nets").load()  # the trajectory came through the CLI too
    it = nets.traj_iter.sel(d=30, seed=0).values
    last = int(np.isfinite(it).sum()) - 1
    assert it[last] == int(nets.iters.sel(d=30, seed=0)) and nets.traj_eps_rel.dims[-1] == "log_step"
    eps = nets.traj_eps_rel.sel(d=30, seed=0).values
    assert eps[last] < eps[0]


@pytest.mark.slow
def test_F004_3_stored_checks_equal_a_recomputation(ran):
    from storage.query import load_nets, open_results
    from tasks.cells import kkt_constructions as cell_fn

    import torch

    ds = open_results(ran / "chain.zarr", "constructions").load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as on a worker (deploy/dask.py): MKL's threaded dgemm splits the sums otherwise
    try:
        again_by_d = {}
        for d in (10, 30):
            n = load_nets(ran / "chain.zarr", "nets", d=d)
            again_by_d[d] = cell_fn.run(n.W, n.b, n.v, n.X, n.y, n.d, n.m, n.width, [4])[0]
    finally:
        torch.set_num_threads(threads)
    for d, again in again_by_d.items():
        sel = ds.sel(d=d, seed=0, n_ops=4)
        for k in ("b8", "exact_range", "op_residual", "far_dist", "sigma_d", "gamma_ud", "eps_rel"):
            np.testing.assert_allclose(np.atleast_1d(np.asarray(again[k], dtype=float)),
                                       np.atleast_1d(sel[k].values)[: np.size(again[k])],
                                       rtol=1e-12, atol=1e-300, err_msg=k)


@pytest.mark.slow
def test_F004_3_report_draws_the_panels_and_the_rows_pass(ran, tmp_path):
    from kktlab.report import acceptance_rows, report
    from storage.query import stage_scalars

    paths = report(ran / "chain.zarr", tmp_path)
    assert any(p.name == "constructions_F004-3_constructions.png" for p in paths)
    rows = acceptance_rows(stage_scalars(ran / "chain.zarr", "constructions"))
    assert [r.spec_id for r in rows] == ["P004-2", "P004-4", "P004-6", "P004-7"]
    assert all(r.passed for r in rows), [(r.spec_id, r.measured) for r in rows]
    assert "P004-7" in (tmp_path / "index.md").read_text()
