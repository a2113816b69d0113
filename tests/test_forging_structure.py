"""Paper 000: nullity of M0 (T000-9/10), batch forging (T000-11) and Fig 1 (F000-1).

Spec IDs: P000-9, P000-11, P000-12, P000-15, F000-1.
"""

import math

import numpy as np
import pytest
import torch
from torch.func import vmap

from tasks.forging.models import (SquaredLossModel, batch_forging_mismatch, batch_mixed_hessian, estimate_lipschitz, make_model,
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


def _random_features(act_name: str, d: int, n: int, gen: torch.Generator) -> SquaredLossModel:
    """One-hidden-layer net with a frozen random first layer W0 (n, d): only v ∈ R^n is trained, so the
    model has n parameters for D = d + 1 inputs (fewer parameters than inputs when n <= d)."""
    act = {"tanh": torch.tanh, "softplus": torch.nn.functional.softplus, "relu": lambda u: u * (u > 0).double()}
    W0 = torch.randn(n, d, dtype=torch.float64, generator=gen) / math.sqrt(d)
    v = torch.randn(n, dtype=torch.float64, generator=gen)
    return SquaredLossModel(f"rf_{act_name}", lambda w, z: w @ act[act_name](W0 @ z), v, d)


def _single_neuron(d: int, gen: torch.Generator) -> SquaredLossModel:
    """φ(w; z) = tanh(wᵀz): n = d parameters, D = d + 1 inputs."""
    return SquaredLossModel("neuron_tanh", lambda w, z: torch.tanh(w @ z),
                            torch.randn(d, dtype=torch.float64, generator=gen), d)


FEW_PARAMS = [("linreg", 2, 0), ("linreg", 9, 0), ("rf_tanh", 8, 3), ("rf_tanh", 5, 1), ("rf_softplus", 8, 3),
              ("rf_softplus", 12, 5), ("rf_relu", 8, 3), ("neuron_tanh", 6, 0)]


@pytest.mark.parametrize("name,d,n_hidden", FEW_PARAMS)
def test_P000_11_rank_facts_fewer_params_than_inputs(name, d, n_hidden):
    """P000-11 / T000-9 (§4.3, Eq 36): with n parameters and D = d + 1 data dims, D >= n gives
    D - n <= r <= D - 1 at a random x*. Every model here has n < D, so the lower bound is >= 1."""
    gen = torch.Generator().manual_seed(d * 31 + n_hidden)
    if name == "linreg":
        model = make_model("linreg", d, 0, gen)
    elif name == "neuron_tanh":
        model = _single_neuron(d, gen)
    else:
        model = _random_features(name.split("_")[1], d, n_hidden, gen)
    xs = make_target(model, 1.0, gen)
    M = mixed_hessian(model.loss, model.w, xs)
    n, D = model.n_params, d + 1
    assert M.shape == (n, D)
    lower = D - n
    assert lower >= 1  # the prediction is not vacuous for this model
    r, _ = nullity(M)
    r_loose, _ = nullity(M, rtol=1e-6)
    assert lower <= r <= r_loose <= D - 1
    if name.startswith(("rf_tanh", "rf_softplus")) or name in ("linreg", "neuron_tanh"):
        assert r == lower  # analytic, generic: rank n exactly (linreg: App H, r = 1)


@pytest.mark.parametrize("name,d,width", [("tanh1", 8, 1), ("softplus1", 3, 4), ("relu1", 4, 3)])
def test_P000_11_rank_facts_one_layer_more_params(name, d, width):
    """P000-11 (§4.3, Eq 38-39), the other regime: one-layer nets with n = width (d + 1) >= D, so
    0 <= r <= D - 1; analytic nets are generically full rank (softplus: r = 0 here, reported by
    the spec, not a theorem); ReLU keeps the homogeneity direction, r >= 1 (P000-10)."""
    gen = torch.Generator().manual_seed(0)
    model = make_model(name, d, width, gen)
    xs = make_target(model, 1.0, gen)
    M = mixed_hessian(model.loss, model.w, xs)
    assert M.shape == (model.n_params, d + 1) and model.n_params >= d + 1
    r, _ = nullity(M)
    r_loose, _ = nullity(M, rtol=1e-6)
    assert 0 <= r <= r_loose <= d
    if name == "softplus1":
        assert r == 0
    if name == "relu1":
        assert r >= 1
    L = estimate_lipschitz(model.loss, model.w, xs, 1.0, 64, torch.Generator().manual_seed(1))
    assert L > 0 and math.isfinite(L)


@pytest.mark.parametrize("m,B", [(1, 4), (2, 4), (3, 4)])
def test_P000_12_batch_nullity(m, B):
    """P000-12 (§5): nullity of the n × md block row is in [md - n, md - 1] when md >= n."""
    gen = torch.Generator().manual_seed(m)
    model = make_model("linreg", 2, 0, gen)  # n = 2 parameters, D = 3
    xs = make_target(model, 1.0, gen)
    M = batch_mixed_hessian(model.loss, model.w, xs.expand(m, 3) + 0.1 * torch.randn(m, 3, dtype=torch.float64,
                                                                                     generator=gen), B)
    r, _ = nullity(M)
    md, n = 3 * m, model.n_params
    assert M.shape == (n, md) and md - n <= r <= md - 1


def test_P000_12_whole_batch():
    """P000-12 (§5): replacing all B points equals the m = B forging set (identical membership on
    1e4 random batches)."""
    gen = torch.Generator().manual_seed(0)
    model = make_model("linreg", 2, 0, gen)
    xs = make_target(model, 1.0, gen)
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
