"""Haim et al.'s three-layer MLP (paper 004 F004-2, spec §2.1: d → k1 → k2 → 1, ReLU, first-layer bias
only, so Φ is degree-3 homogeneous in θ) and its KKT residual / attack objective, stacked over a
leading axis B (nets × settings × restarts), float64. A kernel only: the ``train`` stage has no
depth option yet and the stored nets carry no second layer (README, paper 004 "Not done").

    Φ(θ; x) = v · relu(W2 relu(W1 x + b1)),   θ = (W1 (k1,d), b1 (k1), W2 (k2,k1), v (k2))
    R(S, λ) = θ − ∇_θ Σ_i c_i Φ(θ; x'_i),     c_i = s λ_i y'_i  (s = 1/l: Haim, s = 1: the paper)

∇_θ by autograd with ``create_graph=True`` (Haim's double backward: no closed form as for two layers,
X004-11), so ∂R/∂x' and ∂R/∂λ flow; ``alpha`` switches on the surrogate derivative sigmoid(α z) of both
ReLUs in the attacked copy (X004-2). Euler's identity (h = 3): ‖θ‖² − ⟨θ, R⟩ = 3 Σ c_i Φ(x'_i) (P004-1).
"""

from __future__ import annotations

import torch



def relu_surrogate(Z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Value relu(Z), derivative sigmoid(α Z) (X004-2), with a second derivative that stays finite
    (softplus, linear past α z = 20: the double backward of logaddexp gives NaN there)."""
    a = alpha.view(-1, *([1] * (Z.dim() - 1)))
    soft = torch.nn.functional.softplus(a * Z) / a
    return soft + (torch.relu(Z) - soft).detach()


def phi(W1, b1, W2, v, X, alpha: torch.Tensor | None = None) -> torch.Tensor:
    """Φ for a stack: W1 (B,k1,d), b1 (B,k1), W2 (B,k2,k1), v (B,k2), X (B,l,d) → (B,l)."""
    act = torch.relu if alpha is None else (lambda Z: relu_surrogate(Z, alpha))  # noqa: E731
    H1 = act(torch.baddbmm(b1.unsqueeze(1), X, W1.transpose(1, 2)))  # (B,l,k1)
    H2 = act(torch.bmm(H1, W2.transpose(1, 2)))  # (B,l,k2)
    return torch.bmm(H2, v.unsqueeze(-1)).squeeze(-1)


def residual(W1, b1, W2, v, Xc, yc, lam, *, scale: float = 1.0, alpha: torch.Tensor | None = None,
             create_graph: bool = True) -> tuple[torch.Tensor, ...]:
    """R = θ − ∇_θ Σ_i s λ_i y'_i Φ(θ; x'_i) per tensor (R_W1, R_b1, R_W2, R_v), each with the leading B.
    Rows never mix (the sum over rows of per-row terms has per-row gradients)."""
    params = [t.detach().requires_grad_(True) for t in (W1, b1, W2, v)]
    total = (scale * lam * yc * phi(*params, Xc, alpha=alpha)).sum()
    grads = torch.autograd.grad(total, params, create_graph=create_graph)
    return tuple(p.detach() - g for p, g in zip(params, grads))


def residual_norm2(R) -> torch.Tensor:
    """Σ_T ‖R_T‖² per row (Haim's per-tensor sum of squares), (B,)."""
    return sum(r.pow(2).flatten(1).sum(1) for r in R)


def haim(W1, b1, W2, v, Xc, yc, lam, *, alpha, lam_min, box: bool = False) -> torch.Tensor:
    """Haim et al.'s objective for the MLP (spec §2.4): Σ_T ‖R_T‖² with λ/l, + 5 Σ relu(λ_min − λ)²
    (+ the domain box [−1, 1] if ``box``), (B,)."""
    l = Xc.shape[1]
    out = residual_norm2(residual(W1, b1, W2, v, Xc, yc, lam, scale=1.0 / l, alpha=alpha))
    out = out + 5 * torch.relu(lam_min.unsqueeze(1) - lam).pow(2).sum(1)
    if box:
        out = out + (torch.relu(Xc - 1).pow(2) + torch.relu(-1 - Xc).pow(2)).sum((1, 2))
    return out
