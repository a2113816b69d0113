"""K3 of spec 001 §3: retained-set reference points θ̃ for Def 2.2's τ = 1 − cossim(θ̂, θ̃)
(paper 001 Def 2.2, spec D001-6), batched over every leading dim.

- the unlearned net itself (τ = 0: the quantity of Fig. 1);
- the proof's "fixed" net (§4.1, App. C.2): w̃_j = ŵ_j + |u_j| λ_l S_lj Δ_j,
  Δ_j = c Σ_{k≠l} sign(⟨x_k, w_j⟩) x_k, c = min(ε_d/(2mn), 0.01);
- the retrained net (``tasks.unlearn.retrain``);
- linear predictors: the hard-margin SVM without bias of the retained set (:func:`svm_retain`).
"""

from __future__ import annotations

import torch

from tasks.kkt.measure import TIE_TOL, gram, nnls_multipliers, relu_grad


def cossim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """⟨a, b⟩/(‖a‖‖b‖) over the last two dims (a net's θ = vec W), broadcast over the rest."""
    num = (a * b).flatten(-2).sum(-1)
    return num / (a.flatten(-2).norm(dim=-1) * b.flatten(-2).norm(dim=-1)).clamp_min(1e-300)


def tau(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """τ = 1 − cossim(a, b) (Def 2.2)."""
    return 1 - cossim(a, b)


def svm_retain(X: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hard-margin SVM without bias of the points ``valid`` (spec K3 linear bullet):
    w* = Σ λ_i y_i x_i, λ = argmax_{λ>=0} Σλ_i − ½λᵀKλ, K_ik = y_i y_k ⟨x_i, x_k⟩.

    How it is solved to 1e-10: the dual is the NNLS-type QP min ½λᵀKλ − 1ᵀλ, λ >= 0, solved by
    ``tasks.kkt.measure.nnls_multipliers`` (accelerated projected gradient, then an exact
    active-set solve K_SS λ_S = 1 on the support by LAPACK least squares, kept only if feasible
    and not worse), batched. At that λ the margins of the support points are 1 to round-off
    (tests: against quadprog through qpsolvers, and KKT residual of w* <= 1e-10).
    X (*B,m,d), y (*B,m), valid (*B,m) -> (w* (*B,1,d), λ (*B,m))."""
    shape = torch.broadcast_shapes(X.shape[:-1], y.shape, valid.shape)
    K = gram(None, None, X, y, None).expand(*shape, shape[-1])
    lam = nnls_multipliers(K, valid.to(X.dtype).expand(shape).clone(), valid.expand(shape))
    w = ((lam * y).unsqueeze(-1) * X).sum(-2, keepdim=True)
    return w, lam


def fixed_net(W_hat: torch.Tensor, u: torch.Tensor, X: torch.Tensor, W: torch.Tensor, lam_S: torch.Tensor,
              retain: torch.Tensor, eps_d: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The proof's corrected net θ̃ of Thm 4.1 (App. C.2, spec K3), at the scale of W_hat:
    w̃_j = ŵ_j + |u_j| (Σ_{r∈S_f} λ_r S_rj) Δ_j, Δ_j = c Σ_{k∈retain} sign(⟨x_k, w_j⟩) x_k,
    c = min(ε_d/(2mn), 0.01) (the k-point version of App. C.3 sums the forgotten points' terms).
    W_hat (*B,n,d) unlearned, W (*B,n,d) trained (its signs), u (*B,n), X (*B,m,d), lam_S (*B,n)
    Σ_r λ_r S_rj at the scale of W_hat, retain (*B,m) bool, eps_d, m, n (*B,) -> (*B,n,d)."""
    c = (eps_d / (2 * m * n)).clamp_max(0.01)
    sgn = torch.sign(X @ W.transpose(-1, -2)) * retain.unsqueeze(-1).to(X.dtype)  # (*B,m,n)
    delta = sgn.transpose(-1, -2) @ X  # Δ_j / c, (*B,n,d)
    coef = (u.abs() * lam_S * c.unsqueeze(-1)).unsqueeze(-1)
    return W_hat + coef * delta


def forgotten_pattern(W: torch.Tensor, X: torch.Tensor, weights: torch.Tensor, tol: float = TIE_TOL) -> torch.Tensor:
    """Σ_r weights_r S_rj over the points (weights: λ_r on the forget set, 0 elsewhere) with the
    trained net's activation pattern S: W (E,n,d), X (E,m,d), weights (E,L,m) -> (E,L,n)."""
    S = relu_grad(W, X, tol)  # (E,m,n)
    return (weights.to(W.dtype).unsqueeze(-1) * S.unsqueeze(1)).sum(-2)
