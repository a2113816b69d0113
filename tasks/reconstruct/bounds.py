"""Split budgets of paper 004 (Thm 5, Lemma 14, Thm 8, Thm 9; spec §2.3, §3.4-3.6) on one net
θ = (W (k,d), b (k), v (k)) and one labelled set (X (n,d), y (n)) with multipliers λ (n).

ε*(θ, S) = min_{λ ≥ 0} ‖θ − J λ‖ by NNLS on the n × n Gram (closed form for two layers, spec §2.3;
``tasks.kkt.gram`` / ``tasks.kkt.nnls``) with Jᵀθ = 2 y_i Φ(x_i) by Euler's identity (h = 2).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks import kkt, nets
from tasks.reconstruct.constructions import admissible_range, phi, set_residual


def eps_star(W, b, v, X, y, iters: int = 5000):
    """(ε*, λ) for the raw (unnormalised) net: ε* = ‖θ − Σ λ_i y_i ∇Φ(x_i)‖ at the NNLS λ (spec §2.3)."""
    net = nets.TwoLayer(W[None], b[None], v[None])
    Q = kkt.gram(net, X[None], y[None])
    r = 2 * y[None] * phi(W, b, v, X)[None]
    lam = kkt.nnls(Q, r, torch.ones_like(r, dtype=torch.bool), iters=iters)[0]
    return set_residual(W, b, v, X, y, lam).norm(), lam


def gamma(X, nu) -> torch.Tensor:
    """γ(ν) = max_i |⟨x_i, ν⟩| (Thm 5 / 8 with the corrected |·|, ‖ν‖ = 1)."""
    return (X @ nu).abs().max()


def b5(W, b, v, X, lam, nu, *, printed: bool = False) -> torch.Tensor:
    """Thm 5 (corrected, spec §3.4): B5(i) = min_j |z_j(x_i)| / (γ |v_j| Σλ), (n,). ``printed``:
    the paper's statement without |v_j| (kept as a variant, X004-10)."""
    z = X @ W.T + b
    vj = torch.ones_like(v) if printed else v.abs()
    return (z.abs() / (gamma(X, nu) * vj * lam.sum())).amin(1)


def b8(W, b, v, X, lam, nu, eps) -> torch.Tensor:
    """Thm 8 Eq 7 (spec §3.5): B8(i) = min_{j∈[k]} |z_j(x_i)| / (ε + γ |v_j| Σλ), (n,)."""
    z = X @ W.T + b
    return (z.abs() / (eps + gamma(X, nu) * v.abs() * lam.sum())).amin(1)


def ranges(W, b, X, nu) -> torch.Tensor:
    """Exact admissible split range per point along ±ν: min(α_max, β_max), (n,)."""
    return torch.tensor([min(admissible_range(W, b, x, nu)) for x in X], dtype=X.dtype)


@dataclasses.dataclass
class Thm9:
    dphi: float  # measured |Φ(x_l + αν) − Φ(x_l)|
    dphi_bound: float  # Eq 9: α Σ_j |v_j| (ε + γ|v_j|Σλ)
    delta_before: float  # δ = max_i λ_i (y_i Φ(x_i) − p)
    delta_after: float  # δ' after the split, p fixed to the pre-split margin
    delta_bound: float  # δ + Δδ, Δδ = λ_l (α + β) Σ_j |v_j| (ε + γ|v_j|Σλ)


def thm9(W, b, v, X, y, lam, l: int, nu, alpha: float, beta: float, eps) -> Thm9:
    """Thm 9 (spec §3.6) for a split of x_l along ±ν by α, β ≤ B8(l), J = all k neurons. The margin
    p is the pre-split min_i y_i Φ(x_i); δ' is measured on the split set (z1: λ_l β/(α+β), z2: λ_l α/(α+β))."""
    g = gamma(X, nu)
    per = (v.abs() * (eps + g * v.abs() * lam.sum())).sum()
    q = y * phi(W, b, v, X)
    p = q.min()
    delta = float((lam * (q - p)).max())
    z1, z2 = X[l] + alpha * nu, X[l] - beta * nu
    qz = y[l] * phi(W, b, v, torch.stack([z1, z2]))
    lz = torch.stack([lam[l] * beta / (alpha + beta), lam[l] * alpha / (alpha + beta)])
    keep = torch.arange(X.shape[0]) != l
    after = torch.cat([lam[keep] * (q[keep] - p), lz * (qz - p)])
    dphi = float((phi(W, b, v, z1[None]) - phi(W, b, v, X[l:l + 1])).abs())
    return Thm9(dphi=dphi, dphi_bound=float(alpha * per), delta_before=delta, delta_after=float(after.max()),
                delta_bound=delta + float(lam[l] * (alpha + beta) * per))
