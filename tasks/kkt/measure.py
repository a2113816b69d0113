"""K1 of spec 001 §3: how far a stack of nets is from an (ε, δ)-approximate KKT point of the
max-margin problem min ½‖θ‖² s.t. y_i N(x_i; θ) >= 1 (paper 001 Def 2.1 = spec D001-4).

Models (spec D001-1): the two-layer net with a frozen output layer N(x) = Σ_j u_j σ(w_j·x), only W
trained (``u`` given), and the linear predictor N(x) = w·x (``u=None``, W of shape (..., 1, d)).
Every tensor has arbitrary leading batch dims (nets, and the α grid of an unlearning sweep), which
broadcast: W (*B, n, d), u (*B, n), X (*B, m, d), y (*B, m), valid (*B, m) (the evaluation set idx:
S, or S∖{l}, S∖S_f). One call measures a whole sweep. float64 throughout (spec N3).

Steps (spec §3 K1): margins; if min q <= 0 the point is infeasible (ε = δ = +inf, feasible False,
never an error); rescale to min margin 1 (c = 1/q_min, 1-homogeneity); Gram matrix of the columns
g_i = y_i ∇_θN(x_i) in closed form with the tie rule σ'(z) = 1[z > tol·‖w_j‖‖x_i‖] (spec N1);
multipliers (``nnls`` default, ``dynamics``, ``inherited``); the residual built **explicitly** per
neuron (spec N3, never the expanded quadratic); ε, δ = max_i λ_i (q_i − 1), ε_rel = ε/‖cθ‖.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.kkt.multipliers import nnls as fista_nnls
from tasks.nets.losses import log_loss_terms

METHODS = ("nnls", "dynamics", "inherited")
TIE_TOL = 1e-9  # spec N1: σ'(z) = 1[z > tol·‖w_j‖‖x_i‖]


def preact(W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """z_ij = w_j·x_i: W (*B,n,d), X (*B,m,d) -> (*B,m,n)."""
    return X @ W.transpose(-1, -2)


def relu_grad(W: torch.Tensor, X: torch.Tensor, tol: float = TIE_TOL) -> torch.Tensor:
    """S_ij = σ'(w_j·x_i) with the spec's tie rule (N1): 1 iff z_ij > tol·‖x_i‖·max_k‖w_k‖, (*B,m,n).

    Exact KKT points on orthogonal data have z_ij = 0 exactly for inactive pairs; round-off makes
    them ±1e-17, which a bare ``z > 0`` turns into spurious active pairs (ε = 2.24 instead of 0).
    Departure from the spec's per-neuron scale ‖w_j‖: a neuron that GA zeroes (k-GA removing a
    whole class, fixture O) is round-off noise, whose ‖w_j‖ would make its noise look active; the
    net's largest neuron norm is the scale (still scale invariant, P001-11)."""
    Z = preact(W, X)
    scale = X.norm(dim=-1).unsqueeze(-1) * W.norm(dim=-1).amax(-1, keepdim=True).unsqueeze(-1)
    return (Z > tol * scale).to(W.dtype)


def outputs(W: torch.Tensor, u: torch.Tensor | None, X: torch.Tensor) -> torch.Tensor:
    """N(x_i; θ), (*B,m). Linear predictor when u is None (W (*B,1,d))."""
    Z = preact(W, X)
    if u is None:
        return Z[..., 0]
    return (torch.relu(Z) * u.unsqueeze(-2)).sum(-1)


def gram(W: torch.Tensor, u: torch.Tensor | None, X: torch.Tensor, y: torch.Tensor, S: torch.Tensor | None):
    """K_ik = y_i y_k ⟨x_i,x_k⟩ Σ_j u_j² S_ij S_kj (linear: y_i y_k ⟨x_i,x_k⟩), spec §3 step 3."""
    XX = X @ X.transpose(-1, -2)
    if u is not None:
        Su = S * u.unsqueeze(-2)
        XX = XX * (Su @ Su.transpose(-1, -2))
    return y.unsqueeze(-1) * y.unsqueeze(-2) * XX


def residual(W, u, X, y, S, lam):
    """r = θ − Σ_i λ_i y_i ∇_θN(x_i), per neuron r_j = w_j − u_j Σ_i λ_i y_i S_ij x_i (spec N3),
    same shape as W (broadcast)."""
    ly = (lam * y).unsqueeze(-1)  # (*B,m,1)
    if u is None:
        return W - (ly * X).sum(-2, keepdim=True)
    coef = S * ly  # (*B,m,n)
    return W - u.unsqueeze(-1) * (coef.transpose(-1, -2) @ X)


def _lstsq(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Least squares per matrix of the stack. On the CPU one LAPACK call (gelsd) per matrix: MKL's
    batched answer depends on the matrix's place in the batch (~1e-14 on 7x7 systems, issue 29 item 2),
    so a bundled net would get other multipliers than the same net alone."""
    if A.device.type != "cpu":
        return torch.linalg.lstsq(A, b).solution
    A2, b2 = A.reshape(-1, *A.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    sol = [torch.linalg.lstsq(A2[i:i + 1], b2[i:i + 1], driver="gelsd").solution for i in range(A2.shape[0])]
    return torch.cat(sol).reshape(*A.shape[:-2], A.shape[-1], b.shape[-1])


def _polish(K: torch.Tensor, q: torch.Tensor, lam: torch.Tensor, mask: torch.Tensor, rounds: int = 3):
    """Active-set refinement of a first-order NNLS solution: solve K_SS λ_S = q_S on the support S
    exactly (least squares, K may be singular: spec N5), drop negatives, repeat; keep a candidate
    only where it is feasible and does not raise the objective ½λᵀKλ − qᵀλ. (P,m,m), (P,m)."""
    def obj(l):
        return 0.5 * (l * (K @ l.unsqueeze(-1)).squeeze(-1)).sum(-1) - (q * l).sum(-1)

    best, best_obj = lam, obj(lam)
    sup = mask & (lam > 1e-12 * lam.amax(-1, keepdim=True).clamp_min(1e-300))
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    for _ in range(rounds):
        ss = sup.unsqueeze(-1) & sup.unsqueeze(-2)
        A = torch.where(ss, K, eye.expand_as(K))
        b = torch.where(sup, q, torch.zeros_like(q))
        cand = _lstsq(A, b.unsqueeze(-1))
        cand = torch.where(sup, cand.squeeze(-1), torch.zeros_like(q))
        ok = (cand >= 0).all(-1) & torch.isfinite(cand).all(-1)
        o = obj(cand.clamp_min(0))
        better = ok & (o <= best_obj + 1e-14 * best_obj.abs().clamp_min(1))
        best = torch.where(better.unsqueeze(-1), cand, best)
        best_obj = torch.where(better, o, best_obj)
        sup = sup & (cand > 0)
    return best


def nnls_multipliers(K: torch.Tensor, q: torch.Tensor, valid: torch.Tensor, iters: int = 5000) -> torch.Tensor:
    """λ = argmin_{λ>=0, λ=0 off valid} λᵀKλ − 2λᵀq (spec §3 step 4 ``nnls``), batched over any
    leading dims: accelerated projected gradient (``tasks.kkt.multipliers.nnls``) then an exact
    active-set polish. Equals scipy nnls(G, θ) on the explicit p × m gradient matrix (tests)."""
    shape = q.shape
    Kf, qf, vf = K.reshape(-1, *K.shape[-2:]), q.reshape(-1, shape[-1]), valid.reshape(-1, shape[-1])
    lam = fista_nnls(Kf, qf, vf, iters=iters, tol=1e-15)
    mm = vf.unsqueeze(-1) & vf.unsqueeze(-2)
    Kz = torch.where(mm, Kf, torch.zeros_like(Kf))
    lam = _polish(Kz, torch.where(vf, qf, torch.zeros_like(qf)), lam, vf)
    return lam.masked_fill(~vf, 0).reshape(shape)


@dataclasses.dataclass
class KKTMeasure:
    """K1's output (spec §3 step 6); every field has the batch shape *B (per point: *B, m)."""

    eps: torch.Tensor  # ‖θ − Σλ_i y_i ∇N(x_i)‖ at min margin 1 (+inf if infeasible)
    delta: torch.Tensor  # max_i λ_i (q_i − 1) (+inf if infeasible)
    eps_rel: torch.Tensor  # ε / ‖cθ‖ (scale free)
    lam: torch.Tensor  # (*B,m) multipliers of the rescaled net (0 off the evaluation set)
    q: torch.Tensor  # (*B,m) margins of the rescaled net (min 1 over the evaluation set)
    c: torch.Tensor  # rescaling factor 1/q_min
    q_min: torch.Tensor  # raw minimum margin over the evaluation set
    theta_norm: torch.Tensor  # ‖cθ‖
    n_support: torch.Tensor  # #{i : λ_i > 1e-8·max λ}
    active_frac: torch.Tensor  # (*B,m) (1/n) Σ_j S_ij over the n neurons with u_j ≠ 0 (linear: 1)
    feasible: torch.Tensor  # bool: min margin > 0 (primal feasibility reachable by rescaling)
    method: str


def kkt_measure(W: torch.Tensor, u: torch.Tensor | None, X: torch.Tensor, y: torch.Tensor,
                valid: torch.Tensor | None = None, method: str = "nnls", *, loss: str = "logistic",
                lam_inherit: torch.Tensor | None = None, c_inherit: torch.Tensor | None = None,
                tol: float = TIE_TOL, iters: int = 5000) -> KKTMeasure:
    """K1 (spec §3): (ε, δ) of θ w.r.t. the points ``valid`` (default all), batched over every
    leading dim. ``method``: ``nnls`` (the smallest ε Def 2.1 allows), ``dynamics`` (λ ∝ −ℓ'(q_raw)
    of ``loss``, one scale fitted), ``inherited`` (``lam_inherit`` · c_new / ``c_inherit``: the
    trained net's certificate, as the proofs of Thm 3.1 / 4.1 reuse it).

    Raises ValueError naming the argument on a bad method or missing inherited inputs."""
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; allowed: {', '.join(METHODS)}")
    if method == "inherited" and (lam_inherit is None or c_inherit is None):
        raise ValueError("method 'inherited' needs lam_inherit and c_inherit (the trained net's λ and c)")
    dt = torch.float64
    W, X, y = W.to(dt), X.to(dt), y.to(dt)
    u = None if u is None else u.to(dt)
    shape = torch.broadcast_shapes(W.shape[:-2], X.shape[:-2], y.shape[:-1])
    m = X.shape[-2]
    valid = torch.ones((*shape, m), dtype=torch.bool, device=X.device) if valid is None else valid.expand(*shape, m)
    q_raw = y * outputs(W, u, X)
    q_raw = q_raw.expand(*shape, m)
    q_min = q_raw.masked_fill(~valid, math.inf).amin(-1)
    feasible = (q_min > 0) & torch.isfinite(q_min) & torch.isfinite(W).flatten(-2).all(-1).expand(shape)
    c = torch.where(feasible, 1 / q_min.clamp_min(1e-300), torch.ones_like(q_min))
    Wc = W * c[..., None, None]
    q = torch.where(valid, q_raw * c.unsqueeze(-1), torch.zeros_like(q_raw))
    S = None if u is None else relu_grad(W, X, tol)  # σ' is scale-invariant
    K = gram(W, u, X, y, S).expand(*shape, m, m)
    if method == "nnls":
        lam = nnls_multipliers(K, q, valid, iters)
    elif method == "dynamics":
        g = torch.exp(log_loss_terms(q_raw, loss)[1] - log_loss_terms(q_raw, loss)[1].masked_fill(
            ~valid, -math.inf).amax(-1, keepdim=True)).masked_fill(~valid, 0)
        s = ((g * q).sum(-1) / (g * (K @ g.unsqueeze(-1)).squeeze(-1)).sum(-1).clamp_min(1e-300)).clamp_min(0)
        lam = s.unsqueeze(-1) * g
    else:
        lam = (lam_inherit.to(dt) * (c / c_inherit.to(dt)).unsqueeze(-1)).expand(*shape, m).masked_fill(~valid, 0)
    R = residual(Wc, u, X, y, S, lam)
    eps = R.flatten(-2).norm(dim=-1)
    delta = (lam * (q - 1)).masked_fill(~valid, -math.inf).amax(-1).clamp_min(0)
    theta_norm = Wc.flatten(-2).norm(dim=-1).expand(shape)
    inf = torch.full_like(eps, math.inf)
    eps, delta = torch.where(feasible, eps, inf), torch.where(feasible, delta, inf)
    n_sup = (lam > 1e-8 * lam.amax(-1, keepdim=True).clamp_min(1e-300)).sum(-1)
    # (1/n) Σ_j S_ij over the net's own n neurons (u_j ≠ 0): zero-padded neurons never count
    act = (torch.ones_like(q) if S is None else (S.sum(-1) / (u != 0).sum(-1, keepdim=True).clamp_min(1))
           .expand(*shape, m)).masked_fill(~valid, math.nan)
    return KKTMeasure(eps=eps, delta=delta, eps_rel=eps / theta_norm.clamp_min(1e-300), lam=lam, q=q, c=c,
                      q_min=q_min, theta_norm=theta_norm, n_support=n_sup, active_frac=act, feasible=feasible,
                      method=method)
