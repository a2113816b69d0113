"""Paper 004 F004-2's three-layer MLP kernel (``tasks/reconstruct/mlp3.py``; spec §2.1, §2.4): P004-1's
Euler identity with h = 3, the residual of the stacked problem row by row, Haim's objective with the
surrogate differentiable in the candidates."""

from __future__ import annotations

import pytest
import torch

from tasks.reconstruct import mlp3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stack(B=3, d=6, k1=7, k2=5, l=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    y = torch.ones(B, l, dtype=torch.float64)
    y[:, : l // 2] = -1
    return (r(B, k1, d), r(B, k1), r(B, k2, k1), r(B, k2)), r(B, l, d), y, torch.rand(B, l, generator=g,
                                                                                     dtype=torch.float64)


def test_P004_1_euler_identity_h3():
    """‖θ‖² − ⟨θ, R⟩ = 3 Σ_i λ_i y_i Φ(x_i) for any λ (exact ReLU), relative 1e-12; Φ(cθ) = c³Φ(θ)."""
    theta, X, y, lam = stack()
    R = mlp3.residual(*theta, X, y, lam, create_graph=False)
    lhs = sum(t.pow(2).flatten(1).sum(1) for t in theta) - sum((t * r).flatten(1).sum(1) for t, r in zip(theta, R))
    rhs = 3 * (lam * y * mlp3.phi(*theta, X)).sum(1)
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=0)
    c = 1.7
    torch.testing.assert_close(mlp3.phi(*(c * t for t in theta), X), c ** 3 * mlp3.phi(*theta, X), rtol=1e-12, atol=0)


def test_stacked_rows_equal_rows_alone():
    theta, X, y, lam = stack()
    alpha, lam_min = torch.full((3,), 300.0, dtype=torch.float64), torch.full((3,), 0.1, dtype=torch.float64)
    together = mlp3.haim(*theta, X, y, lam, alpha=alpha, lam_min=lam_min)
    for e in range(3):
        alone = mlp3.haim(*(t[e:e + 1] for t in theta), X[e:e + 1], y[e:e + 1], lam[e:e + 1], alpha=alpha[:1],
                          lam_min=lam_min[:1])
        torch.testing.assert_close(together[e:e + 1], alone, rtol=1e-13, atol=0)


def test_haim_objective_has_candidate_gradients_and_surrogate_tends_to_exact():
    theta, X, y, lam = stack()
    Xg = X.clone().requires_grad_(True)
    zero = torch.zeros(3, dtype=torch.float64)
    obj = mlp3.haim(*theta, Xg, y, lam, alpha=torch.full((3,), 300.0, dtype=torch.float64), lam_min=zero)
    (gx,) = torch.autograd.grad(obj.sum(), Xg)
    assert bool(torch.isfinite(gx).all()) and float(gx.abs().max()) > 0
    obj = mlp3.haim(*theta, X, y, lam, alpha=torch.full((3,), 1e7, dtype=torch.float64), lam_min=zero)
    exact = mlp3.residual_norm2(mlp3.residual(*theta, X, y, lam, scale=1 / X.shape[1], create_graph=False))
    torch.testing.assert_close(obj.detach(), exact, rtol=1e-5, atol=0)  # sigmoid(1e7 z) ≈ step
