"""KKT diagnostics of the max-margin problem (paper 002 Eq. (2), Eqs. (9)-(10); spec §2.11, §3).

``min ½||θ||² s.t. y_i N_θ(x_i) >= 1``. For a trained stack we measure how close θ is to a KKT
point: normalise θ̂ = θ/√q_min (min margin 1), fit multipliers λ >= 0 by non-negative least
squares on the Gram matrix of the margin gradients (never forming the k(d+2) x n Jacobian),

    Q_il = y_i y_l [ Σ_j v_j² 1[h_ij>0] 1[h_lj>0] (x_i·x_l + 1) + Σ_j σ(h_ij) σ(h_lj) ],
    r_i  = θ̂·∇q̂_i = 2 q̂_i,     residual² = ||θ̂||² - 2 rᵀλ + λᵀQλ,

and report ε = residual/||θ̂||, δ = Σ λ_i (q̂_i - 1). The NNLS is solved batched over E by
accelerated projected gradient (FISTA with restart) in float64.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.models import TwoLayer


def margins(net: TwoLayer, X, y) -> torch.Tensor:
    """q_i = y_i N(x_i), (E,m)."""
    return y * net(X)


def normalized_margin(net: TwoLayer, q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """γ = min_i q_i / ||θ||² (Lyu-Li normalized margin for 2-homogeneous nets), (E,)."""
    return q.masked_fill(~valid, math.inf).min(1).values / net.sq_norm()


def gram(net: TwoLayer, X, y) -> torch.Tensor:
    """Gram matrix Q of the margin gradients ∇_θ q_i (spec §2.11), (E,m,m)."""
    H = net.pre(X)
    act = (H > 0).to(X.dtype)
    S = act * net.v.unsqueeze(1)  # v_j 1[h_ij > 0]
    K = torch.bmm(S, S.transpose(1, 2)) * (torch.bmm(X, X.transpose(1, 2)) + 1)
    A = torch.relu(H)
    K = K + torch.bmm(A, A.transpose(1, 2))
    return y.unsqueeze(2) * y.unsqueeze(1) * K


def nnls(Q: torch.Tensor, r: torch.Tensor, mask: torch.Tensor, iters: int = 3000, tol: float = 1e-12):
    """min_{λ>=0, λ=0 off mask} ½λᵀQλ - rᵀλ for a batch: Q (E,n,n), r (E,n). FISTA + restart."""
    mm = mask.unsqueeze(1) & mask.unsqueeze(2)
    Q = torch.where(mm, Q, torch.zeros_like(Q))
    r = torch.where(mask, r, torch.zeros_like(r))
    L = torch.linalg.eigvalsh(Q).amax(-1).clamp_min(1e-300)  # Lipschitz constant
    lam = torch.zeros_like(r)
    z, t = lam.clone(), 1.0
    for _ in range(iters):
        grad = torch.bmm(Q, z.unsqueeze(-1)).squeeze(-1) - r
        new = (z - grad / L.unsqueeze(-1)).clamp_min(0).masked_fill(~mask, 0)
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        restart = ((new - lam) * (z - new)).sum(-1) > 0  # gradient-based adaptive restart
        mom = torch.where(restart, 0.0, (t - 1) / t_new).unsqueeze(-1)
        z = new + mom * (new - lam)
        step = (new - lam).abs().amax(-1)
        lam, t = new, (1.0 if bool(restart.all()) else t_new)
        if bool((step <= tol * lam.abs().amax(-1).clamp_min(1)).all()):
            break
    return lam


@dataclasses.dataclass
class KKTFit:
    lam: torch.Tensor  # (E,m) multipliers of the normalised net
    eps: torch.Tensor  # (E,) stationarity residual / ||θ̂||
    delta: torch.Tensor  # (E,) complementary slackness Σ λ_i (q̂_i - 1)
    sum_lam_ratio: torch.Tensor  # (E,) Σλ / (||θ̂||²/2), 1 at an exact KKT point


def kkt_fit(net: TwoLayer, X, y, valid: torch.Tensor, iters: int = 3000) -> KKTFit:
    """Fit λ and measure the KKT residuals of θ̂ = θ/√q_min (spec §2.11), batched over E."""
    q = margins(net, X, y)
    q_min = q.masked_fill(~valid, math.inf).min(1).values
    s = 1 / torch.sqrt(q_min.clamp_min(torch.finfo(q.dtype).tiny))
    hat = net.scaled(s)
    q_hat = q / q_min.unsqueeze(1)
    Q = gram(hat, X, y)
    r = 2 * q_hat
    lam = nnls(Q, r, valid, iters=iters)
    th2 = hat.sq_norm()
    res2 = th2 - 2 * (r * lam).sum(1) + (lam * torch.bmm(Q, lam.unsqueeze(-1)).squeeze(-1)).sum(1)
    eps = torch.sqrt(res2.clamp_min(0)) / torch.sqrt(th2)
    delta = (lam * (q_hat - 1).masked_fill(~valid, 0)).sum(1)
    return KKTFit(lam=lam, eps=eps, delta=delta, sum_lam_ratio=lam.sum(1) / (th2 / 2))


def balance_error(net: TwoLayer) -> torch.Tensor:
    """Σ_j |v_j² - ||w_j||² - b_j²| / ||θ||², (E,): 0 at a KKT point (spec §2.3; gradient flow
    conserves each neuron's v_j² - ||w_j||² - b_j², §2.4)."""
    return (net.v.pow(2) - net.W.pow(2).sum(-1) - net.b.pow(2)).abs().sum(1) / net.sq_norm()


@dataclasses.dataclass
class TheoryCheck:
    """Theorem 4.1 / Appendix C constants and the two flip inequalities (spec §3)."""

    p: torch.Tensor
    c_bal: torch.Tensor
    c_prime: torch.Tensor
    eta1: torch.Tensor
    eta2: torch.Tensor
    z_norm: torch.Tensor
    max_pos: torch.Tensor  # max_{i∈I+} N̂(x_i - z), Theorem 4.1 says <= -1
    min_neg: torch.Tensor  # min_{i∈I-} N̂(x_i + z), Theorem 4.1 says >= 1


def theory_check(net: TwoLayer, X, y, I: torch.Tensor) -> TheoryCheck:
    """Evaluate Thm 4.1's explicit z = (η1+η2) Σ_{l∈I} y_l x_l on the normalised net θ̂.

    p = max_{i≠j∈I} |<x_i,x_j>|, c = min(|I+|,|I-|)/|I|, c' = |I|(p+1)/(d+1),
    η1 = (p+1)/(d-mp), η2 = 2(cc'+1)(d+1)/(mc(d-mp))   (App. C, Lemmas C.6-C.8, Cor 4.1 on I).
    """
    E, m, d = X.shape
    Idt = I.to(X.dtype)
    G = torch.bmm(X, X.transpose(1, 2)).abs() * Idt.unsqueeze(1) * Idt.unsqueeze(2)
    G = G - torch.diag_embed(torch.diagonal(G, dim1=1, dim2=2))
    p = G.amax((1, 2))
    n = Idt.sum(1)
    c_bal = torch.minimum(((y > 0) & I).sum(1), ((y < 0) & I).sum(1)).to(X.dtype) / n
    c_prime = n * (p + 1) / (d + 1)
    gap = d - n * p
    eta1 = (p + 1) / gap
    eta2 = 2 * (c_bal * c_prime + 1) * (d + 1) / (n * c_bal * gap)
    z = (eta1 + eta2).unsqueeze(-1) * torch.einsum("en,end->ed", y * Idt, X)
    q = margins(net, X, y)
    q_min = q.masked_fill(~I, math.inf).min(1).values
    hat = net.scaled(1 / torch.sqrt(q_min))
    out_minus = hat(X - z.unsqueeze(1))
    out_plus = hat(X + z.unsqueeze(1))
    max_pos = out_minus.masked_fill(~(I & (y > 0)), -math.inf).amax(1)
    min_neg = out_plus.masked_fill(~(I & (y < 0)), math.inf).amin(1)
    return TheoryCheck(p, c_bal, c_prime, eta1, eta2, z.norm(dim=1), max_pos, min_neg)
