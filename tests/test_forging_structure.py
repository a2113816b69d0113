"""Paper 000: nullity of M0 (T000-9/10), batch forging (T000-11) and Fig 1 (F000-1).

Spec IDs: P000-9, P000-11, P000-12, P000-15, F000-1.
"""

import math

import numpy as np
import pytest
import torch
from torch.func import vmap

from tasks.forging.models import (batch_forging_mismatch, batch_mixed_hessian, estimate_lipschitz, make_model,
                                  make_target, mixed_hessian, nullity, whole_batch_mismatch)
from tasks.forging.sgd import figure1_trajectories, sgd_trajectories


def _linreg_loss(w, x):
    return 0.5 * (x[:-1] @ w - x[-1]) ** 2


@pytest.mark.parametrize("d", [2, 5, 10, 50])
def test_P000_9_linreg_nullity_is_one(d):
    """P000-9 (App H): r = 1 for 1000 random (w, x, y), kernel ∥ (x, 2wᵀx - y) (cos >= 1 - 1e-10);
    when y = wᵀx the matrix is x[wᵀ, -1], rank 1, r = d."""
    gen = torch.Generator().manual_seed(d)
    w = torch.randn(1000, d, dtype=torch.float64, generator=gen)
    X = torch.randn(1000, d + 1, dtype=torch.float64, generator=gen)
    M = vmap(lambda w_, x_: mixed_hessian(_linreg_loss, w_, x_))(w, X)  # (1000, d, d+1)
    rs = [nullity(m)[0] for m in M]
    assert set(rs) == {1}
    _, _, Vh = torch.linalg.svd(M)
    kern = Vh[:, -1]
    ref = torch.cat([X[:, :-1], (2 * (X[:, :-1] * w).sum(1) - X[:, -1])[:, None]], 1)
    cos = (kern * ref).sum(1).abs() / ref.norm(dim=1)
    assert cos.min() >= 1 - 1e-10
    x0 = X[0].clone()
    x0[-1] = x0[:-1] @ w[0]
    r0, s0 = nullity(mixed_hessian(_linreg_loss, w[0], x0))
    assert r0 == d and int((s0 > 1e-10 * s0.max()).sum()) == 1


def test_P000_11_rank_facts_one_layer():
    """P000-11 (§4.3): r >= d - n when d >= n (n = #params); analytic nets are full rank typically
    (r reported at two tolerances, r <= d for the data dim D = d + 1)."""
    gen = torch.Generator().manual_seed(0)
    for name, d, width in [("tanh1", 8, 1), ("softplus1", 3, 4), ("relu1", 4, 3)]:
        model = make_model(name, d, width, gen)
        xs = make_target(model, 1.0, gen)
        M = mixed_hessian(model.loss, model.w, xs)
        assert M.shape == (model.n_params, d + 1)
        r, s = nullity(M)
        r_loose, _ = nullity(M, rtol=1e-6)
        assert max(0, d + 1 - model.n_params) <= r <= r_loose <= d + 1
        if name == "softplus1":
            assert r == 0  # n(d+1) >= d+1 and analytic: generic full column rank (reported)
        if name == "relu1":
            assert r >= 1  # homogeneity direction (P000-10)
    L = estimate_lipschitz(model.loss, model.w, xs, 1.0, 64, torch.Generator().manual_seed(1))
    assert L > 0 and math.isfinite(L)


def test_P000_12_batch_nullity_and_whole_batch():
    """P000-12 (§5): nullity of the n × md block row is in [md - n, md - 1] when md >= n; replacing
    all B points equals the m = B forging set (identical membership on 1e4 random batches)."""
    gen = torch.Generator().manual_seed(0)
    model = make_model("linreg", 2, 0, gen)  # n = 2 parameters, D = 3
    xs = make_target(model, 1.0, gen)
    for m, B in [(1, 4), (2, 4), (3, 4)]:
        M = batch_mixed_hessian(model.loss, model.w, xs.expand(m, 3) + 0.1 * torch.randn(m, 3, dtype=torch.float64,
                                                                                         generator=gen), B)
        r, _ = nullity(M)
        md, n = 3 * m, model.n_params
        assert M.shape == (n, md) and md - n <= r <= md - 1
    B = 4
    Xt = xs + torch.randn(10_000, B, 3, dtype=torch.float64, generator=gen)
    eps = 0.5
    a = batch_forging_mismatch(model, xs, Xt, B) <= eps
    b = whole_batch_mismatch(model, xs.expand(B, 3), Xt) <= eps
    assert torch.equal(a, b) and 0 < int(a.sum()) < 10_000


def test_P000_15_figure1_numbers():
    """P000-15 / F000-1: gradients at w0, w1 to 1e-5, opposite basins after 20 updates (c = 2, A = 1,
    x1..x19 ~ U(-1, 1) from default_rng(0)); with x_k = 0 the endpoints are ∓2.00162."""
    r = figure1_trajectories()
    assert r["grad_original_w0"] == pytest.approx(0.248206, abs=1e-6)
    assert r["grad_forged_w0"] == pytest.approx(-0.101799, abs=1e-6)
    assert r["w_original"][1] == pytest.approx(-0.07436, abs=1e-5)
    assert r["w_forged"][1] == pytest.approx(0.03064, abs=1e-5)
    assert r["w_original"][-1] == pytest.approx(-2.00700, abs=1e-5) and r["w_original"][-1] < -1.5
    assert r["w_forged"][-1] == pytest.approx(1.91953, abs=1e-5) and r["w_forged"][-1] > 1.5
    assert len(r["w_original"]) == 21 and np.allclose(r["xs"], np.random.default_rng(0).uniform(-1, 1, 19))
    assert abs(r["grad_original_w0"] - r["grad_forged_w0"]) == pytest.approx(0.350, abs=1e-3)
    z = figure1_trajectories(data="zeros")
    assert z["w_original"][-1] == pytest.approx(-2.00162, abs=1e-5) and z["w_forged"][-1] == pytest.approx(2.00162, abs=1e-5)


def test_F000_1_robust_over_seeds():
    """F000-1 robustness (spec §4): opposite basins for 200/200 seeds with x_k ~ U(-1, 1) and N(0, 0.3²)."""
    for draw in (lambda g: g.uniform(-1, 1, 19), lambda g: g.normal(0, 0.3, 19)):
        rest = np.stack([draw(np.random.default_rng(s)) for s in range(200)])
        xs = np.concatenate([np.r_[[-0.5] * 200, [0.2] * 200][:, None], np.r_[rest, rest]], 1)
        traj = sgd_trajectories(torch.tensor(xs), 1e-4, 0.3)  # all 400 runs in one batched call
        assert int((torch.sign(traj[:200, -1]) != torch.sign(traj[200:, -1])).sum()) == 200
    one = figure1_trajectories(seed=199, data="normal0.3")  # same maths through the public entry point
    assert one["w_original"][-1] == pytest.approx(float(traj[199, -1])) and one["w_forged"][-1] == pytest.approx(
        float(traj[399, -1]))


def test_structure_bad_inputs():
    with pytest.raises(ValueError, match="float64"):
        nullity(torch.ones(2, 3, dtype=torch.float32))
    with pytest.raises(ValueError, match="B must"):
        batch_mixed_hessian(_linreg_loss, torch.ones(2, dtype=torch.float64), torch.ones(3, 3, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="h"):
        figure1_trajectories(h=0.0)
    with pytest.raises(ValueError, match="model"):
        make_model("cnn", 2, 1, torch.Generator())
    with pytest.raises(ValueError, match="A must"):
        make_target(make_model("linreg", 2, 0, torch.Generator()), 0.0, torch.Generator())
