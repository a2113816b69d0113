"""Paper 001's central wiring in the fast suite (issue 28 item 14): the unlearn *cell* (what a sweep
runs, not only the kernels) sizes the GA step by the forgotten point's multiplier exactly as Def 2.2
and spec P001-2 say, and P001-4's shape holds at the spec's CI size through the experiments'
``run_bundle`` — no Prefect, no Dask, seconds on a CPU core."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flows import experiments
from tasks.cells.unlearn import unlearn
from tasks.unlearn.fixtures import fixture_o

CELL = dict(unlearn_method="ga", k=1, forget_seed=0, model="two_layer", loss="logistic", tie_tol=1e-9, ref_retrain=False,
            init_scale=1e-5, retrain_lr=1.0, retrain_wd=0.0, retrain_epochs=1, test_points=0, mu_a=0.1,
            mu_scaling="sec6", store_nets=False)


def _cell_run(W, b, v, X, y, alphas, forget=-2, key=None):
    """The unlearn cell on one net per α (the net repeated), as a bundle of the sweep runs it."""
    E, (M, D), N = len(alphas), X.shape, W.shape[0]
    rep = lambda t: t[None].expand(E, *t.shape).clone()  # noqa: E731
    cells = [dict(CELL, alpha=float(a), forget=forget) for a in alphas]
    return unlearn(rep(W), rep(b), rep(v), rep(X), rep(y), torch.ones(E, M, dtype=torch.bool), torch.full((E,), D),
                   torch.full((E,), M), torch.full((E,), N), torch.zeros(E, 8, dtype=torch.uint8),
                   [key or f"alpha={a}" for a in alphas], cells, train_bias=torch.zeros(E, dtype=torch.bool))


def test_the_cell_sizes_the_ga_step_by_the_multiplier_on_fixture_o():
    """Spec P001-2 through the cell: on fixture O (m = 10, d = 64, n = 64, λ_i = n/n_{y_i} = 2) one GA
    step of fraction α leaves ε(θ̂, S∖l) = |1 − α|·√2 for every l: exactly 0 at α = 1. A step off by
    any factor (the multiplier's scale, the 1/c normalisation) moves the zero away from α = 1."""
    M, D, N = 10, 64, 64
    W, u, X, y = fixture_o(M, D, N, torch.Generator().manual_seed(0))
    alphas = [0.0, 0.5, 0.9, 1.0, 1.1, 1.5]
    out = _cell_run(W, torch.zeros(N, dtype=torch.float64), u, X, y, alphas)
    for a, res in zip(alphas, out):
        want = abs(1 - a) * math.sqrt(2)
        assert res["eps"] == pytest.approx(want, abs=1e-9), a  # Def 2.2: the max over l
        assert res["eps_mean"] == pytest.approx(want, abs=1e-9), a
    assert out[alphas.index(1.0)]["eps"] <= 1e-10


@pytest.fixture(scope="module")
def trained():
    """Spec P001-4's CI size: 5 nets, m = 10, d = 200, n = 64, trained by ``train_kkt``'s run_bundle
    (quickstart-unlearning's schedule: 2000 epochs, lr 1, wd 1e-5, init scale 1e-5)."""
    torch.set_num_threads(1)
    exp = experiments.get("train_kkt")
    base = {k: p.default for k, p in exp.params.items()}
    cells = [dict(base, d=200, m=10, width=64, epochs=2000, lr=1.0, wd=1e-5, init_scale=1e-5, seed=s) for s in range(5)]
    return [{k: torch.from_numpy(np.asarray(r[k], dtype=np.float64)) for k in ("W", "b", "v", "X", "y")}
            for r in exp.run_bundle(cells, "cpu")]


def test_P001_4_shape_through_the_cells(trained):
    """Spec P001-4 (F001-1) at CI size through the cells a sweep runs: the mean over nets of ε(α)
    (mean over the forgotten l) is smallest at α* ∈ [0.8, 1.2], and ε(1) < ε(0), ε(1) < ε(1.5) for
    ≥ 80 % of nets. Measured here: α* = 1.0 (orientation runs in the spec: 1.00)."""
    alphas = [0.0, 0.5, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5]
    eps = np.array([[r["eps_mean"] for r in _cell_run(n["W"], n["b"], n["v"], n["X"], n["y"], alphas)]
                    for n in trained])  # (nets, α)
    assert np.isfinite(eps).all()
    assert 0.8 <= alphas[int(eps.mean(0).argmin())] <= 1.2
    i0, i1, i15 = alphas.index(0.0), alphas.index(1.0), alphas.index(1.5)
    assert (eps[:, i1] < eps[:, i0]).mean() >= 0.8 and (eps[:, i1] < eps[:, i15]).mean() >= 0.8


def test_app_e_reading_is_the_one_random_l_protocol(trained):
    """Issue 28 item 11: with every l forgotten (forget = -2) the cell also reports ε at the l App. E's
    protocol (forget = -1) draws for the net, equal to what a forget = -1 cell of the same net gives."""
    n = trained[0]
    alphas = [0.0, 1.0]
    every = _cell_run(n["W"], n["b"], n["v"], n["X"], n["y"], alphas, forget=-2, key="seed=0")
    one = _cell_run(n["W"], n["b"], n["v"], n["X"], n["y"], alphas, forget=-1, key="seed=0")
    for a, b in zip(every, one):
        assert b["eps_app_e"] == b["eps"] and a["eps_app_e"] == pytest.approx(b["eps"], rel=1e-9, abs=1e-12)
        assert a["eps_app_e"] in set(np.asarray(a["eps_l"]).tolist())
    assert math.isnan(_cell_run(n["W"], n["b"], n["v"], n["X"], n["y"], [1.0], forget=3)[0]["eps_app_e"])
