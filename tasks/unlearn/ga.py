"""A_GA (paper 001 Eq. 3, spec D001-7): one gradient-ascent step on one forgotten point, sized by
its KKT multiplier; the fraction α of that step is swept (App. E: α ∈ [0, 1.5], α = 1 is A_GA)."""

from __future__ import annotations

import torch

from tasks.unlearn.step import ga_step


def ga(W, u, X, y, lam, forget: torch.Tensor, alphas: torch.Tensor, **kw) -> torch.Tensor:
    """θ − α λ_l y_l ∇_θN(x_l; θ); each forget set must hold exactly one point (else use k_ga), or
    none: a set past a net's own m in a bundle padded to a larger m (forget = -2), which leaves θ."""
    k = forget.sum(-1)
    if bool(((k != 1) & (k != 0)).any()):
        raise ValueError(f"k: method 'ga' forgets one point, got forget sets of size {sorted(set(k.flatten().tolist()))}; "
                         "use 'k_ga' or 'sequential_ga' for k > 1")
    return ga_step(W, u, X, y, lam, forget, alphas, kw.get("tol", 1e-9))
