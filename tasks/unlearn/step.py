"""K2 of spec 001 §3: the gradient-ascent step of paper 001 (Eq. 3, D001-7/D001-8) in its λ-form,
batched over nets E, forget sets L and step fractions A:

    θ̂(α) = θ − α Σ_{r∈S_f} λ_r y_r ∇_θN(x_r; θ),   per neuron ŵ_j = w_j − α Σ_r λ_r y_r u_j S_rj x_r,

with every gradient taken at the input θ (its activation pattern, tie rule of spec N1). The
λ-form never divides by ℓ'(q_r) (spec N4); β_r = −λ_r/ℓ'(q_r) is only logged, as log β.
"""

from __future__ import annotations

import torch

from tasks.kkt.measure import TIE_TOL, relu_grad
from tasks.nets.losses import log_loss_terms


def ga_step(W: torch.Tensor, u: torch.Tensor | None, X: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
            forget: torch.Tensor, alphas: torch.Tensor, tol: float = TIE_TOL) -> torch.Tensor:
    """W (E,n,d) raw weights, u (E,n) or None (linear, W (E,1,d)), X (E,m,d), y (E,m), lam (E,m)
    multipliers at the scale of W (λ/c of K1), forget (E,L,m) bool, alphas (A,) -> (E,L,A,n,d)."""
    coef = (alphas.to(W.dtype)[None, None, :, None] * (lam * y)[:, None, None, :]
            * forget.to(W.dtype)[:, :, None, :])  # (E,L,A,m)
    Xb = X[:, None, None]  # (E,1,1,m,d)
    if u is None:
        return W[:, None, None] - (coef.unsqueeze(-1) * Xb).sum(-2, keepdim=True)
    S = relu_grad(W, X, tol)[:, None, None]  # (E,1,1,m,n)
    step = (S * coef.unsqueeze(-1)).transpose(-1, -2) @ Xb  # (E,L,A,n,d)
    return W[:, None, None] - u[:, None, None, :, None] * step


def log_beta(lam: torch.Tensor, q_raw: torch.Tensor, loss: str = "logistic") -> torch.Tensor:
    """log β_r = log λ_r − log|ℓ'(q_r)| (spec K2, N4): the step along ∇ℓ that equals the λ-form."""
    return torch.log(lam) - log_loss_terms(q_raw, loss)[1]
