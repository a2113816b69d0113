"""The KKT stationarity residual of a two-layer net at a candidate set, and the attack objectives
(paper 004 Eq 5 / Eq 6, spec §2.2, §2.4, X004-2, X004-11).

Net Φ(θ; x) = Σ_j v_j [w_j·x + b_j]_+ (spec §2.1, first-layer bias, no output bias). For candidates
x'_i with labels y'_i and multipliers λ_i, with c_i = s λ_i y'_i (s = 1/l in Haim et al.'s code,
s = 1 in the paper), the residual R = θ − Σ_i c_i ∇_θΦ(θ; x'_i) has the closed form (Lemma 11's
layout, never a double backward):

    R_v = v − Σ_i c_i [z_i]_+ ,   R_b = v ⊙ (−Σ_i c_i σ'_i) + b ,   R_W = W − v ⊙ Σ_i c_i σ'_i x'_iᵀ

with σ'_ij = 1[z_ij > 0] (exact step, σ'(0) := 0, X004-1) or, in the attacked copy, the surrogate
sigmoid(α z_ij) (X004-2): forward exact ReLU, backward sigmoid(α z). All tensors carry a leading
batch axis B (nets × hyper-parameter settings × restarts).
"""

from __future__ import annotations

import torch


def _relu_surrogate(Z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Value relu(Z), derivative sigmoid(α Z) (X004-2): softplus_α + (relu − softplus_α).detach()."""
    a = alpha.view(-1, *([1] * (Z.dim() - 1)))
    soft = torch.logaddexp(a * Z, torch.zeros_like(Z)) / a  # d/dZ = sigmoid(α Z)
    return soft + (torch.relu(Z) - soft).detach()


def residual(W, b, v, Xc, yc, lam, *, scale: float = 1.0, alpha: torch.Tensor | None = None):
    """R = θ − Σ_i s λ_i y'_i ∇_θΦ(θ; x'_i) per block: W (B,k,d), b (B,k), v (B,k), Xc (B,l,d),
    yc, lam (B,l). ``alpha`` (B,) switches on the surrogate derivative (None: exact step).
    Returns (R_W (B,k,d), R_b (B,k), R_v (B,k))."""
    Z = torch.baddbmm(b.unsqueeze(1), Xc, W.transpose(1, 2))  # (B,l,k)
    if alpha is None:
        S, A = (Z > 0).to(Z.dtype), torch.relu(Z)
    else:
        S = torch.sigmoid(alpha.view(-1, 1, 1) * Z)
        A = _relu_surrogate(Z, alpha)
    c = scale * lam * yc  # (B,l)
    CS = c.unsqueeze(-1) * S  # (B,l,k)
    Rv = v - torch.einsum("bl,blk->bk", c, A)
    Rb = b - v * CS.sum(1)
    RW = W - v.unsqueeze(-1) * torch.bmm(CS.transpose(1, 2), Xc)
    return RW, Rb, Rv


def residual_norm2(R, blocks: torch.Tensor | None = None) -> torch.Tensor:
    """‖R‖² summed over the blocks (= Haim's per-tensor sum of squares), (B,). ``blocks`` (B,3) bool:
    which of W, b, v each row's net trained; stationarity holds over the trained parameters only, so a
    frozen block's residual is left out (spec 004 §2.4 with frozen layers: paper 001's nets train W)."""
    RW, Rb, Rv = R
    parts = torch.stack([RW.pow(2).sum((1, 2)), Rb.pow(2).sum(1), Rv.pow(2).sum(1)], 1)  # (B,3)
    return (parts if blocks is None else parts * blocks.to(parts.dtype)).sum(1)


def haim(W, b, v, Xc, yc, lam, *, alpha, lam_min, box: bool, feature_mask=None, blocks=None):
    """Haim et al.'s practical objective (spec §2.4, the default): Σ_T ‖R_T‖² with λ scaled by 1/l
    (over the trained blocks T), + 5 Σ relu(λ_min − λ_i)² + (if ``box``) Σ relu(x' − 1)² + relu(−1 − x')²; (B,)."""
    l = Xc.shape[1]
    out = residual_norm2(residual(W, b, v, Xc, yc, lam, scale=1.0 / l, alpha=alpha), blocks)
    out = out + 5 * torch.relu(lam_min.unsqueeze(1) - lam).pow(2).sum(1)
    return out + _box_penalty(Xc, feature_mask) if box else out


def _box_penalty(Xc, feature_mask=None):
    """Σ of squared excursions of the candidates outside [−1, 1] (the optional domain box), (B,)."""
    pen = torch.relu(Xc - 1).pow(2) + torch.relu(-1 - Xc).pow(2)
    if feature_mask is not None:
        pen = pen * feature_mask.unsqueeze(1)
    return pen.sum((1, 2))


def paper(W, b, v, Xc, yc, lam, *, alpha, lam_min, box: bool, feature_mask=None, blocks=None):
    """Paper 004 Eq 5 with γ1 = γ2 = 1: ‖R‖ (unsquared, λ unscaled, trained blocks) + Σ max(−λ_i, 0);
    ``lam_min`` shifts the hinge to max(λ_min − λ_i, 0) (spec X004-9: γ's and λ_min unstated); (B,)."""
    out = residual_norm2(residual(W, b, v, Xc, yc, lam, scale=1.0, alpha=alpha), blocks).clamp_min(1e-300).sqrt()
    out = out + torch.relu(lam_min.unsqueeze(1) - lam).sum(1)
    return out + _box_penalty(Xc, feature_mask) if box else out


OBJECTIVES = {"haim": haim, "paper": paper}
SCALES = {"haim": lambda l: 1.0 / l, "paper": lambda l: 1.0}


def objective(name: str, *args, **kw) -> torch.Tensor:
    """The registered objective ``name`` (haim | paper), (B,)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; allowed: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](*args, **kw)
