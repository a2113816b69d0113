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

from tasks.kkt.margins import margins
from tasks.nets import TwoLayer


def gram(net: TwoLayer, X, y) -> torch.Tensor:
    """Gram matrix Q of the margin gradients ∇_θ q_i (spec §2.11), (E,m,m)."""
    H = net.pre(X)
    act = (H > 0).to(X.dtype)
    S = act * net.v.unsqueeze(1)  # v_j 1[h_ij > 0]
    K = torch.bmm(S, S.transpose(1, 2)) * (torch.bmm(X, X.transpose(1, 2)) + 1)
    A = torch.relu(H)
    K = K + torch.bmm(A, A.transpose(1, 2))
    return y.unsqueeze(2) * y.unsqueeze(1) * K


PROGRESS_EVERY = 100  # FISTA iterations between two calls of ``nnls``'s ``progress``


def nnls(Q: torch.Tensor, r: torch.Tensor, mask: torch.Tensor, iters: int = 3000, tol: float = 1e-12,
         progress=None):
    """min_{λ>=0, λ=0 off mask} ½λᵀQλ - rᵀλ for a batch: Q (E,n,n), r (E,n). FISTA + restart.

    Every net keeps its own momentum and stops on its own: a net's λ is the same whatever other
    nets share the batch (no number depends on its bundle mates). A net whose Q or r is not finite
    (e.g. a Gram that overflowed at a margin near 0) gets λ = NaN: no fit, and no LAPACK failure that
    fails its bundle mates. ``progress`` (optional): called as ``progress(iterations done, iters)``
    every :data:`PROGRESS_EVERY` iterations and at the end (all nets converged: ``iters`` at once)."""
    mm = mask.unsqueeze(1) & mask.unsqueeze(2)
    Q = torch.where(mm, Q, torch.zeros_like(Q))
    r = torch.where(mask, r, torch.zeros_like(r))
    finite = torch.isfinite(Q).flatten(1).all(1) & torch.isfinite(r).all(1)
    Q = torch.where(finite[:, None, None], Q, torch.zeros_like(Q))
    r = torch.where(finite[:, None], r, torch.zeros_like(r))
    L = torch.linalg.eigvalsh(Q).amax(-1).clamp_min(1e-300)  # Lipschitz constant
    lam = torch.zeros_like(r)
    z = lam.clone()
    t = torch.ones(r.shape[0], dtype=r.dtype, device=r.device)
    active = torch.ones(r.shape[0], dtype=torch.bool, device=r.device)
    for it in range(iters):
        if progress is not None and it % PROGRESS_EVERY == 0:
            progress(it, iters)
        grad = torch.bmm(Q, z.unsqueeze(-1)).squeeze(-1) - r
        new = (z - grad / L.unsqueeze(-1)).clamp_min(0).masked_fill(~mask, 0)
        new = torch.where(active.unsqueeze(-1), new, lam)  # converged nets stay where they stopped
        t_new = (1 + torch.sqrt(1 + 4 * t * t)) / 2
        restart = ((new - lam) * (z - new)).sum(-1) > 0  # gradient-based adaptive restart
        mom = torch.where(restart, torch.zeros_like(t), (t - 1) / t_new).unsqueeze(-1)
        step = (new - lam).abs().amax(-1)
        z = torch.where(active.unsqueeze(-1), new + mom * (new - lam), new)
        lam, t = new, torch.where(restart, torch.ones_like(t), t_new)
        active = active & (step > tol * lam.abs().amax(-1).clamp_min(1))
        if not bool(active.any()):
            break
    if progress is not None:
        progress(iters, iters)
    return lam.masked_fill(~finite[:, None], math.nan)


@dataclasses.dataclass
class KKTFit:
    lam: torch.Tensor  # (E,m) multipliers of the normalised net
    eps: torch.Tensor  # (E,) stationarity residual / ||θ̂||
    delta: torch.Tensor  # (E,) complementary slackness Σ λ_i (q̂_i - 1)
    sum_lam_ratio: torch.Tensor  # (E,) Σλ / (||θ̂||²/2), 1 at an exact KKT point
    eps_proj: torch.Tensor  # (E,) ε with W projected on span{x_i} (spec §2.11); <= eps, = eps when the data span R^d

    def select(self, e: int) -> "KKTFit":
        """Net e's fit (0-dim tensors, lam (m,))."""
        return KKTFit(*(getattr(self, f.name)[e] for f in dataclasses.fields(self)))


def kkt_fit(net: TwoLayer, X, y, valid: torch.Tensor, iters: int = 3000, progress=None) -> KKTFit:
    """Fit λ and measure the KKT residuals of θ̂ = θ/√q_min (spec §2.11), batched over E;
    ``progress``: :func:`nnls`'s."""
    q = margins(net, X, y)
    q_min = q.masked_fill(~valid, math.inf).min(1).values
    s = 1 / torch.sqrt(q_min.clamp_min(torch.finfo(q.dtype).tiny))
    hat = net.scaled(s)
    q_hat = q / q_min.unsqueeze(1)
    Q = gram(hat, X, y)
    r = 2 * q_hat
    lam = nnls(Q, r, valid, iters=iters, progress=progress)
    th2 = hat.sq_norm()
    fit2 = -2 * (r * lam).sum(1) + (lam * torch.bmm(Q, lam.unsqueeze(-1)).squeeze(-1)).sum(1)
    eps = torch.sqrt((th2 + fit2).clamp_min(0)) / torch.sqrt(th2)
    th2_proj = span_projected(hat, X, valid).sq_norm()  # Q and r are unchanged by the projection
    eps_proj = torch.sqrt((th2_proj + fit2).clamp_min(0)) / torch.sqrt(th2_proj)
    delta = (lam * (q_hat - 1).masked_fill(~valid, 0)).sum(1)
    return KKTFit(lam=lam, eps=eps, delta=delta, sum_lam_ratio=lam.sum(1) / (th2 / 2), eps_proj=eps_proj)


def span_projected(net: TwoLayer, X: torch.Tensor, valid: torch.Tensor) -> TwoLayer:
    """The net with each w_j projected on span{x_i : valid} (spec 002 §2.11; for m < d the part of
    W(0) orthogonal to the data never moves under GD, §2.4), per net.

    P = V_r V_rᵀ from the SVD of the net's data, rank r counted above σ_max · max(m, d) · eps at
    the net's true (m, d), so zero padding never changes it. When the data span every feature
    they use (m >= d, full rank) P is the identity on them and W is returned as it is (exactly).
    Margins are unchanged: w_j·x_i = (P w_j)·x_i for every x_i in the span.
    """
    Xv = X * valid.unsqueeze(-1).to(X.dtype)
    used = (Xv != 0).any(1)  # (E,d) features the data use (zero-padded ones are not)
    _, S, Vh = torch.linalg.svd(Xv, full_matrices=False)  # S (E,r), Vh (E,r,d)
    size = torch.maximum(valid.sum(1), used.sum(1)).to(X.dtype)
    keep = S > S[:, :1] * size.unsqueeze(1) * torch.finfo(X.dtype).eps
    V = Vh * keep.unsqueeze(-1).to(X.dtype)
    W_proj = torch.bmm(torch.bmm(net.W, V.transpose(1, 2)), V)
    full = keep.sum(1) == used.sum(1)  # span = every used feature: P is the identity there
    W_proj = torch.where(full[:, None, None], net.W * used.unsqueeze(1).to(X.dtype), W_proj)
    return TwoLayer(W_proj, net.b, net.v)
