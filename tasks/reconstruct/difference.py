"""The second threat model of the unlearning chain (Bertran et al., NeurIPS 2024, "Reconstruction
Attacks on Machine Unlearning"): an attacker who holds the net before AND after the deletion reads
the deleted point off the update itself. No optimisation: one SVD per net, batched over nets.

For one GA step (paper 001 Eq. 3, spec 001 K2) the update of a two-layer ReLU net
N(x) = Σ_j v_j σ(w_j·x + b_j) is

    θ̂ − θ = −α λ_l y_l ∇_θN(x_l; θ):   Δw_j = c_j x_l,  Δb_j = c_j,  c_j = −α λ_l y_l v_j σ'(w_j·x_l + b_j),

so the stacked first-layer update D = [ΔW | Δb] (n, d+1) is rank one with right singular vector
r ∝ (x_l, 1) (Δb = 0 where the bias is not trained: r ∝ (x_l, 0)). Hence:

- with a trained bias, x_l = r[:d] / r[d] exactly (sign and scale: the b-block is the scale);
- without one (paper 001's nets), only ±x_l/‖x_l‖ is identified. The sign is fixed from the
  activation pattern the step was taken at: the rows of D that moved are the neurons active at x_l
  under θ (c_j ≠ 0 iff σ'_j = 1), so of ±u the one whose active neurons under θ carry the update's
  row mass Σ_j ‖D_j‖ is x_l's (all of it for one GA step, none for the other sign; for an update
  that moves every neuron, e.g. retraining, the side that carries more). The scale is the
  attacker's norm prior: ‖x‖ = ``radius`` (the data's norm).

For k points (k-GA) or any other update (retraining, whose difference is not rank one) the top
right singular vectors are the candidates, each read by the same rule.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.kkt.measure import TIE_TOL


@dataclasses.dataclass
class DiffResult:
    """x (E,k,d) the candidates (NaN where the update has no k-th direction: unchanged nets, rank < k);
    sv (E,k) the update's top singular values; changed (E,) bool, ‖D‖ > tol·‖[W, b]‖; exact_scale
    (E,k) bool, sign and scale read from the bias block (else sign from the pattern, norm prior);
    pattern_agree (E,k) the fraction of the update's row mass on the neurons active at x under θ (1 for
    one GA step);
    rank1 (E,) σ_1²/Σσ², how much of the update one direction holds (1 for one GA step)."""

    x: torch.Tensor
    sv: torch.Tensor
    changed: torch.Tensor
    exact_scale: torch.Tensor
    pattern_agree: torch.Tensor
    rank1: torch.Tensor


def update_candidates(W0: torch.Tensor, b0: torch.Tensor, W1: torch.Tensor, b1: torch.Tensor,
                      radius: torch.Tensor, k: int = 1, tol: float = 1e-12, tie_tol: float = TIE_TOL,
                      bias: torch.Tensor | None = None) -> DiffResult:
    """W0, W1 (E,n,d) the first layer before / after the deletion, b0, b1 (E,n) the biases, radius (E,)
    the attacker's norm prior ‖x‖, ``bias`` (E,) bool whose bias was trained (None: where b moved);
    ``k`` directions per net; ``tol`` the relative update below which a net counts as unchanged and a
    singular value (relative to the first) as absent; ``tie_tol`` the σ' tie rule (spec 001 N1)."""
    E, n, d = W0.shape
    D = torch.cat([W1 - W0, (b1 - b0).unsqueeze(-1)], -1)  # (E,n,d+1)
    size = torch.cat([W0, b0.unsqueeze(-1)], -1).flatten(1).norm(dim=1)
    dnorm = D.flatten(1).norm(dim=1)
    changed = dnorm > tol * size.clamp_min(torch.finfo(W0.dtype).tiny)
    _, S, Vh = torch.linalg.svd(torch.where(changed[:, None, None], D, torch.zeros_like(D)), full_matrices=False)
    r = min(k, S.shape[1])
    R = Vh[:, :r]  # (E,r,d+1) right singular vectors, unit, sign arbitrary
    present = changed[:, None] & (S[:, :r] > tol * S[:, :1])
    trained_b = (b1 - b0).abs().amax(-1) > 0 if bias is None else bias
    last = R[..., d]
    exact = trained_b[:, None] & present & (last.abs() > tol ** 0.5)
    x_bias = R[..., :d] / torch.where(exact, last, torch.ones_like(last)).unsqueeze(-1)
    u = torch.nn.functional.normalize(R[..., :d], dim=-1)
    mass = D.norm(dim=-1)  # (E,n) how far each neuron moved
    mass = mass / mass.sum(-1, keepdim=True).clamp_min(torch.finfo(W0.dtype).tiny)
    agree = []
    for s in (1.0, -1.0):
        xs = s * radius[:, None, None] * u  # (E,r,d)
        z = xs @ W0.transpose(-1, -2) + b0[:, None, :]  # (E,r,n) pre-activations under θ
        scale = xs.norm(dim=-1, keepdim=True) * W0.norm(dim=-1).amax(-1)[:, None, None]
        active = z > tie_tol * scale
        agree.append((active.to(W0.dtype) * mass[:, None, :]).sum(-1))  # (E,r) the update's mass on active neurons
    sign = torch.where(agree[0] >= agree[1], 1.0, -1.0).to(W0.dtype)
    x_prior = (sign * radius[:, None]).unsqueeze(-1) * u
    x = torch.where(exact.unsqueeze(-1), x_bias, x_prior)
    x = torch.where(present.unsqueeze(-1), x, torch.full_like(x, float("nan")))
    pad = k - r  # more directions asked for than the update has
    if pad:
        x = torch.cat([x, x.new_full((E, pad, d), float("nan"))], 1)
    sv = torch.cat([torch.where(changed[:, None], S[:, :r], torch.zeros_like(S[:, :r])), S.new_zeros(E, pad)], 1)
    exact = torch.cat([exact, exact.new_zeros(E, pad)], 1)
    agree_best = torch.where(present, torch.maximum(agree[0], agree[1]), torch.full_like(agree[0], float("nan")))
    agree_best = torch.cat([agree_best, agree_best.new_full((E, pad), float("nan"))], 1)
    tot = S.pow(2).sum(-1)
    rank1 = torch.where(changed, S[:, 0].pow(2) / tot.clamp_min(torch.finfo(W0.dtype).tiny),
                        torch.full_like(tot, float("nan")))
    return DiffResult(x, sv, changed, exact, agree_best, rank1)
