"""The bound functions of spec 001 §4 (paper 001 Thm 3.1, B.1, 4.1, C.1, Lemmas B.1-B.3, C.3, C.4)
and the data-assumption statistics of Assumption 2.3 (spec D001-9). Plain floats: one cell at a
time. Each bound returns its values, whether its preconditions hold and which fail (spec S2, A8);
where a theorem's statement and its proof disagree (spec T001-3, T001-4, A7) both are returned.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass
class Bound:
    eps: float  # ε bound (proof-supported form)
    delta_stated: float
    delta_proof: float
    tau_stated: float
    tau_proof: float
    eps_stated: float
    preconditions_met: bool
    violated: tuple[str, ...]


def data_stats(X: torch.Tensor, valid: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """ψ̂ = max_i |‖x_i‖² − 1|, φ̂ = max_{i≠j} |⟨x_i, x_j⟩|, the smallest admissible ε_d = 4mφ̂
    (linear) and 4mnφ̂ (two-layer) (spec D001-9), batched: X (*B,m,d), valid (*B,m)."""
    G = X @ X.transpose(-1, -2)
    m = valid.sum(-1).to(X.dtype)
    psi = (torch.diagonal(G, dim1=-2, dim2=-1) - 1).abs().masked_fill(~valid, 0).amax(-1)
    off = valid.unsqueeze(-1) & valid.unsqueeze(-2) & ~torch.eye(X.shape[-2], dtype=torch.bool)
    phi = G.abs().masked_fill(~off, 0).flatten(-2).amax(-1)
    return {"psi": psi, "phi": phi, "eps_d_linear": 4 * m * phi, "eps_d_two_layer": 4 * m * n * phi}


def lemma_b3(eps: float, delta: float, gamma: float, lam_max: float) -> tuple[float, float]:
    """Lemma B.3 (spec D001-5): an (ε, δ, γ)-approx KKT θ rescaled by 1/(1−γ) is
    (ε/(1−γ), λ_max γ/(1−γ) + δ/(1−γ))-approx KKT (Def 2.1)."""
    return eps / (1 - gamma), lam_max * gamma / (1 - gamma) + delta / (1 - gamma)


PRECONDITIONS = ("0 < eps1 <= 0.5", "0 < delta1 <= 0.5", "0 < eps1 <= 1.0", "0 < delta1 <= 1.0", "eps_d < 0.1",
                 "0 < eps_d <= 0.01", "psi <= 0.1", "phi <= eps_d/(4m)", "phi <= eps_d/(4mn)",
                 "output layer frozen")  # bit i of ``violated``; the last: set for nets with v trained (cells/unlearn_full.py)


def _pre(eps1, delta1, eps_d, psi, phi, m, n, linear):
    v = []
    top = 0.5 if linear else 1.0
    if not (0 < eps1 <= top):
        v.append(f"0 < eps1 <= {top}")
    if not (0 < delta1 <= top):
        v.append(f"0 < delta1 <= {top}")
    if linear and not eps_d < 0.1:
        v.append("eps_d < 0.1")
    if not linear and not (0 < eps_d <= 0.01):
        v.append("0 < eps_d <= 0.01")
    if not psi <= 0.1:
        v.append("psi <= 0.1")
    if not phi <= eps_d / (4 * m * (1 if linear else n)) * (1 + 1e-12):  # ε_d = 4mnφ̂ is admissible
        v.append("phi <= eps_d/(4m)" if linear else "phi <= eps_d/(4mn)")
    return tuple(v)


def bounds(kind: str, m: int, n: int, k: int, eps1: float, delta1: float, eps_d: float, psi: float,
           phi: float) -> Bound:
    """``kind``: ``linear`` (Thm 3.1, k = 1; Thm B.1, k > 1) or ``two_layer`` (Thm 4.1, k = 1;
    Thm C.1, k > 1). Inputs: m, n (width; 1 for linear), k forgotten points, ε_1, δ_1 of the
    trained θ on S (K1), ε_d, ψ, φ (data_stats). The linear τ = C(√ε_d + √ε_1 + √δ_1) has no
    constant (B.1.2): tau_* is NaN there (fit C: P001-7)."""
    if kind not in ("linear", "two_layer"):
        raise ValueError(f"kind: unknown {kind!r}; allowed: 'linear', 'two_layer'")
    linear = kind == "linear"
    viol = _pre(eps1, delta1, eps_d, psi, phi, m, n, linear)
    if linear:
        den = m / k - eps_d
        if den <= 0:
            return Bound(math.inf, math.inf, math.inf, math.nan, math.nan, math.inf, not viol, viol)
        eps = eps1 + eps1 * eps_d / den
        d_stated = delta1 + delta1 * eps_d / den + 7.2 * eps_d / m
        d_proof = delta1 + delta1 * eps_d / den + 7.2 * k * eps_d / m  # Thm B.1's proof (spec T001-2)
        return Bound(eps, d_stated, d_proof, math.nan, math.nan, eps, not viol, viol)
    if k == 1:  # Thm 4.1 (spec T001-3)
        eps_stated = eps1 + 9 * eps_d * eps1 / (m - 9 * eps_d) + 23 * eps_d / math.sqrt(m)
        d_stated = delta1 + 9 * eps_d * delta1 / (m - 9 * eps_d) + 22.6 * eps_d / m
        tau_stated = 82 * eps_d / m
        den = m - 9 * eps_d
    else:  # Thm C.1 as stated (k − 9ε_d) and as proved (m/k − 9ε_d) (spec T001-4)
        eps_stated = eps1 + 9 * eps_d * eps1 / (k - 9 * eps_d) + 23 * k * eps_d / math.sqrt(m)
        d_stated = delta1 + 9 * eps_d * delta1 / (k - 9 * eps_d) + 22.6 * k * eps_d / m
        tau_stated = 82 * k * eps_d / (m - k)
        den = m / k - 9 * eps_d
    gamma = 9 * k * eps_d / (m * n)
    if den <= 0 or gamma >= 1:  # far outside the regime: the proof's algebra gives no bound
        eps = d_proof = math.inf
    else:
        eps = eps1 + 9 * eps_d * eps1 / den + 23 * k * eps_d / math.sqrt(m)
        d_proof = delta1 * (1 + 9 * eps_d / den) + (184 * k * eps_d / m + 183.6 * k * eps_d / m) / (1 - gamma)
    tau_proof = 2 * 22 * k * eps_d / (math.sqrt(m) * math.sqrt(0.3 * (m - k)))
    return Bound(eps, d_stated, d_proof, tau_stated, tau_proof, eps_stated, not viol, viol)


def multiplier_lemmas(kind: str, lam: torch.Tensor, act_mass: torch.Tensor, sq_norms: torch.Tensor,
                      n: int, eps1: float, delta1: float, eps_d: float) -> dict[str, bool]:
    """Lemmas B.1/B.2 (linear) and C.3/C.4 (two-layer) on one certificate (spec P001-8): lam (m,)
    multipliers, act_mass (m,) Σ_j u_j² λ_i σ'_ij (two-layer), sq_norms (m,) ‖x_i‖²."""
    if kind == "linear":
        lo = (1 - 0.6 * eps_d - 1.1 * eps1) / sq_norms
        hi = (1 + 1.2 * eps_d + 2.15 * eps1 + 2.2 * delta1) / sq_norms
        return {"lemma_B1": bool(lam.max() <= 2.4), "lemma_B2": bool(((lam >= lo) & (lam <= hi)).all())}
    return {"lemma_C3": bool(lam.max() <= n * (5 + 10.5 * eps1 + 4.8 * delta1) and act_mass.max() <= 20.4),
            "lemma_C4": bool(act_mass.min() >= 0.9 - 4.64 * eps_d / n - 1.92 * eps1)}
