"""``train`` (paper 004's nets: W, b and v trained) on MNIST (issue 39): the rows are drawn and prepared
as ``train_kkt``'s, the store keeps indices and the file's checksum (never a copy of the data), the
nets contract rebuilds the rows from them, and a bad real-data config stops naming its field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from flows import experiments

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CELL = {"data": "mnist", "class_neg": 0, "class_pos": 1, "preprocess": "unit", "d": 16, "m": 4, "width": 8,
        "loss": "logistic", "lr0": 0.05, "lr_factor": 1.2, "lr_period": 50, "target_loss": 1e-3,
        "max_iters": 400, "init_scale": 0.01}


@pytest.fixture(scope="module")
def trained():
    exp = experiments.get("train")
    cell = {k: p.default for k, p in exp.params.items()} | CELL
    return exp, cell, exp.run_bundle([cell], "cpu")[0]


def test_mnist_rows_are_train_kkt_s_and_only_their_indices_are_stored(trained):
    from flows.experiments import train_kkt

    exp, cell, res = trained

    rows = train_kkt.data_rows(dict(cell, data_seed=-1))
    assert np.array_equal(res["data_index"], rows["data_index"]) and res["data_checksum"] == rows["data_checksum"]
    assert res["X"].shape[0] == 0  # never a copy of the data set
    X, y = train_kkt.prepared(cell, rows["data_index"], rows["data_checksum"])
    assert torch.allclose(X.norm(dim=1), torch.ones(4, dtype=torch.float64))  # preprocess: unit rows
    assert sorted(y.tolist()) == [-1.0, -1.0, 1.0, 1.0] and np.array_equal(res["y"][:4], y.numpy())
    rebuilt = exp.rebuild(cell, lambda name: res[name])
    assert np.array_equal(rebuilt["X"], X.numpy())
    W, b, v = (torch.from_numpy(np.asarray(res[k])) for k in ("W", "b", "v"))
    f = torch.relu(X @ W.T + b) @ v
    assert bool((y * f > 0).all()) and res["train_acc"] == 1.0  # trained on exactly these rows
    assert 0.0 <= res["eps_rel"] < 1.0 and 1 <= res["n_margin"] <= 4  # its distance from a KKT point, stored


@pytest.mark.parametrize("change, field", [({"d": 20}, "d"), ({"class_pos": 0}, "class_pos")])
def test_a_bad_mnist_cell_is_refused_naming_its_field(change, field):
    exp = experiments.get("train")
    cell = {k: p.default for k, p in exp.params.items()} | CELL | change
    with pytest.raises(ConfigError) as err:
        exp.check(cell)
    assert err.value.field == field
