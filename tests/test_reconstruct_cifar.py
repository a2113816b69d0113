"""Paper 004 F004-2 plumbing at toy size: CIFAR-10 vehicles vs animals through the train stage
(indices + file checksum stored), the attack on it with a secret shift, SSIM per candidate; a
missing CIFAR file stops the config naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from core.errors import ConfigError
from flows import config, experiments
from storage import datasets

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CFG = "configs/paper-004-f2-cifar.yaml"


def test_F004_2_missing_cifar_file_names_the_field(monkeypatch, tmp_path):
    monkeypatch.setenv("KKTLAB_DATA", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        config.parse(yaml.safe_load(open(CFG)))
    assert err.value.field == "stages[0].data" and "cifar10_batch1_test1000.npz" in str(err.value)


@pytest.fixture(scope="module")
def cifar_net():
    exp = experiments.get("train")
    cell = {k: p.default for k, p in exp.params.items()} | {
        "data": "cifar_vehicles", "d": 3072, "m": 20, "width": 16, "loss": "logistic", "lr0": 0.01,
        "lr_factor": 1.2, "lr_period": 50, "target_loss": 1e-4, "max_iters": 20000, "init_scale": 0.01}
    res = exp.run_bundle([cell], "cpu")[0]
    return cell, dict(res, X=datasets.cifar_rows(res["data_index"], res["data_checksum"]).numpy(), X_stored=res["X"])


def test_F004_2_train_stores_cifar_indices_and_checksum(cifar_net):
    from storage import datasets

    _, res = cifar_net
    X, y, idx, _, digest = datasets.cifar_vehicles_animals(10)
    assert res["status"] == 1 and res["train_acc"] == 1.0
    np.testing.assert_array_equal(res["data_index"], idx.numpy())
    assert res["data_checksum"] == int(digest[:15], 16)
    assert res["X_stored"].size == 0  # never a copy of the data set
    np.testing.assert_array_equal(res["X"], X.numpy())  # rebuilt from the indices, checksum checked
    with pytest.raises(datasets.DataError, match="not .* of the data these nets were trained on"):
        datasets.cifar_rows(res["data_index"], res["data_checksum"] ^ 1)
    assert res["y"].tolist() == [1.0] * 10 + [-1.0] * 10


@pytest.mark.parametrize("shift,lr", [(0.0, 1e-4), (5.0, 1e-7)])
def test_F004_2_attack_on_shifted_cifar_net_scores_ssim(cifar_net, shift, lr):
    """(lr_x 1e-4 diverges at u = 5·1: the bias transform makes b' = b − W u large, X004-6)"""
    from flows.experiments import reconstruct as rexp
    from storage.nets import Nets

    _, res = cifar_net
    t = lambda a: torch.from_numpy(np.asarray(a))[None]  # noqa: E731
    nets = Nets(t(res["W"]), t(res["b"]), t(res["v"]), t(res["X"]), t(res["y"]), torch.ones(1, 20, dtype=torch.bool),
                torch.tensor([3072]), torch.tensor([20]), torch.tensor([16]), t(res["batch_rng_state"]), [{}], [""])
    cell = {k: p.default for k, p in rexp.P.items()} | {"init": "gauss", "radius": 0.05, "n_candidates": 8,
                                                          "steps": 20, "lr_x": lr, "lr_lam": 0.05 * lr / 1e-4, "shift": shift}
    out = rexp.run_bundle([cell], "cpu", inputs=nets)[0]
    assert out["status"] == 1 and out["ssim"].shape == (8,) and np.isfinite(out["ssim"]).all()
    assert np.all(out["ssim"] <= 1) and np.all(out["ssim"] >= -1)
    assert out["train_eps"] >= 0
    # candidates start near the origin (the unshifted domain): with u = 5·1 they are ~277 from the data
    assert (out["score5"] > 200) == (shift == 5.0)


@pytest.mark.parametrize("ssim10,ssim_max,verdict", [
    ([[0.5, 0.6], [0.3, 0.2], [0.01, 0.02]], 0.2, "pass"),
    ([[0.5, 0.6], [0.3, 0.2], [0.01, 0.02]], 0.45, "FAIL"),  # a u = 5 candidate at SSIM >= 0.4
    ([[0.2, 0.2], [0.3, 0.4], [0.01, 0.02]], 0.2, "FAIL"),  # not ordered
], ids=["ordered", "u5-too-similar", "not-ordered"])
def test_P004_16_acceptance_row(ssim10, ssim_max, verdict):
    import xarray as xr

    from analysis.acceptance_004 import acceptance

    dims, ones = ("shift", "restart"), np.ones((3, 2))
    ds = xr.Dataset({"done": (dims, ones.astype(bool)), "status": (dims, ones.astype(np.int8)),
                     "ssim10": (dims, ssim10), "ssim_max": (dims, np.full((3, 2), ssim_max)),
                     "score5": (dims, ones), "objective": (dims, ones)},
                    coords={"shift": [0.0, 0.5, 5.0], "restart": [0, 1]})
    ds.status.attrs["ok_values"] = [1]
    row = next(r for r in acceptance(ds) if r.spec_id == "P004-16")
    assert row.verdict == verdict and abs(row.value - float(np.mean(ssim10[0]))) <= 1e-12


def test_stored_cifar_net_holds_indices_and_load_nets_rebuilds_its_data(cifar_net, tmp_path):
    """Issue 13 item 4: the train stage stores a CIFAR net's training set as indices plus a checksum
    (X is fill in the store, never a copy); train's rebuild gives the rows back, checksum checked."""
    from flows import experiments
    from flows.sweep import open_store
    from storage.nets import load_nets_at
    from storage.query import open_results

    cell, res = cifar_net
    cfg = config.parse({"name": "cifar", "stages": [{"name": "nets", "experiment": "train",
                                                     "grid": {"seed": [cell["seed"]]},
                                                     "params": {k: v for k, v in cell.items() if k != "seed"}}]})
    store = str(tmp_path / "c.zarr")
    st = open_store(cfg.stages[0], store, "cpu")
    assert st.write_cell((0,), {k: v for k, v in res.items() if k in cfg.stages[0].exp.variables
                                and k != "X"} | {"X": res["X_stored"]})
    ds = open_results(store, "nets")
    assert bool(np.isnan(ds.X.values).all()) and (ds.data_index.values[0] >= 0).all()
    assert "kktlab.load_nets" in load_nets_at(store, "nets", [(0,)]).problems[0]  # only train can resolve them
    nets = load_nets_at(store, "nets", [(0,)], experiments.get("train").rebuild)
    assert nets.problems == [""]
    np.testing.assert_array_equal(nets.X[0].numpy(), res["X"])
