"""Paper 004 P004-10 / P004-11 from the stored trajectory of the ``train`` stage (``log_points``): at
the spec's CI size (n = 50 on S^63, width 100, float64 full-batch GD to loss 1e-7) the logged
ε*/‖θ‖ falls, Euler's ratio ends in [0.8, 1.05], logging leaves the nets bit-identical, the rows come
back from a checkpoint, and the default (log_points 0) keeps the store layout exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from flows import experiments

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EXP = experiments.get("train")
CELL = {k: p.default for k, p in EXP.params.items()} | dict(
    d=64, m=50, width=100, data="unit_sphere", labels="sign_x1", init_scale=0.01, loss="logistic", lr0=0.01,
    lr_factor=1.1, lr_period=100, target_loss=1e-7, max_iters=100000)
POINTS = 21


def spearman(a, b) -> float:
    ra = torch.tensor(a).argsort().argsort().double()
    rb = torch.tensor(b).argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def test_default_log_points_keeps_the_train_layout_exactly():
    from storage import schema

    cells = [dict(CELL, seed=s) for s in (0, 1)]
    ds = schema.template(EXP, {"seed": [0, 1]}, EXP.extra_dims(cells))
    assert not [v for v in ds.data_vars if str(v).startswith("traj_")] and "log_step" not in ds.dims
    assert set(ds.attrs[schema.VARIABLES]) == {"status", "iters", "log10_loss", "train_acc", "m_used", "d_used",
                                               "width_used", "nets_stored", "wall_s", "W", "b", "v", "X", "y",
                                               "data_index", "data_checksum", "eps_rel", "n_margin",
                                               "batch_rng_state", "done", "failed",
                                               "cell_hash", schema.FINISHED, schema.HOST}
    logged = schema.template(EXP, {"seed": [0]}, EXP.extra_dims([dict(CELL, log_points=POINTS)]))
    assert logged.traj_eps_rel.dims == ("seed", "log_step") and logged.sizes["log_step"] == POINTS


def test_log_points_needs_full_batch():
    with pytest.raises(ConfigError) as err:
        EXP.check(dict(CELL, log_points=5, batch_size=10))
    assert err.value.field == "log_points"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from flows.experiments import train as texp

    ck = str(tmp_path_factory.mktemp("traj") / "bundle.pt")
    plain = EXP.run_bundle([CELL], "cpu")[0]
    cells = [dict(CELL, log_points=POINTS)]
    logged = texp.train_logged(cells, "cpu", ck, [None], checkpoint_every_s=0.0)[0]
    resumed = texp.train_logged(cells, "cpu", ck, [None])[0]  # the converged state and its rows, from the file
    return plain, logged, resumed, torch.load(ck, weights_only=True)


@pytest.mark.slow
def test_P004_10_logged_training_reaches_1e7_and_leaves_the_net_unchanged(runs):
    plain, logged, _, _ = runs
    assert logged["status"] == 1 and logged["log10_loss"] <= -7 and logged["train_acc"] == 1.0
    assert logged["iters"] == plain["iters"]
    for k in ("W", "b", "v"):
        np.testing.assert_array_equal(logged[k], plain[k])  # logging stops GD, never changes it
    assert not [k for k in plain if k.startswith("traj_")]
    it = logged["traj_iter"]
    last = int(np.isfinite(it).sum()) - 1
    assert it[last] == logged["iters"] and np.all(np.diff(it[: last + 1]) > 0) and np.all(np.isnan(it[last + 1:]))
    assert logged["traj_log10_loss"][last] == pytest.approx(logged["log10_loss"], abs=1e-9)


@pytest.mark.slow
def test_P004_11_stored_eps_rel_falls_and_euler_ratio_at_the_end(runs):
    _, logged, _, _ = runs
    ok = np.isfinite(logged["traj_iter"])
    assert ok.sum() >= 10
    rho = spearman(logged["traj_iter"][ok].tolist(), logged["traj_eps_rel"][ok].tolist())
    assert rho < -0.8, rho
    assert 0.8 <= logged["traj_euler"][ok][-1] <= 1.05
    assert logged["traj_eps_rel"][ok][-1] < 0.2 < logged["traj_eps_rel"][ok][0]
    assert logged["traj_margin"][ok][-1] > 0 and math.isclose(
        logged["traj_theta_norm"][ok][-1] ** 2, float((logged["W"] ** 2).sum() + (logged["b"] ** 2).sum()
                                                      + (logged["v"] ** 2).sum()), rel_tol=1e-12)


@pytest.mark.slow
def test_trajectory_rows_come_back_from_the_checkpoint(runs):
    _, logged, resumed, payload = runs
    assert {"extra_eps_rel", "extra_iter"} <= set(payload)
    for k in [k for k in logged if k.startswith("traj_")] + ["W", "iters", "status"]:
        np.testing.assert_array_equal(np.asarray(resumed[k]), np.asarray(logged[k]))
