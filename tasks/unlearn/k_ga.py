"""A_{k-GA} (paper 001 §5, spec D001-8): all k gradients at the same θ, one simultaneous step
θ − α Σ_{r∈S_f} λ_r y_r ∇_θN(x_r; θ) (Thm B.1 / C.1)."""

from __future__ import annotations

from tasks.unlearn.step import ga_step


def k_ga(W, u, X, y, lam, forget, alphas, **kw):
    return ga_step(W, u, X, y, lam, forget, alphas, kw.get("tol", 1e-9))
