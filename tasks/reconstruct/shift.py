"""The shift defence of paper 004 App D (spec §3.8, X004-6): train on x + u for a secret u.

The paper's shortcut: b ↦ b − W u (first layer), so Φ(θ'; x + u) = Φ(θ; x). It is NOT the net that
retraining on x + u gives (GD is not invariant under the shear (W, b) ↦ (W, b − W u)), and θ' is
not a KKT point of the shifted set: with the same λ, R_{θ'}(S + u) − R_θ(S) = (−(b − R_b) uᵀ, −W u, 0)
(W-, b-, v-blocks). Batched over a leading axis E.
"""

from __future__ import annotations

import torch


def bias_transform(W, b, u) -> torch.Tensor:
    """b' = b − W u: W (E,k,d), b (E,k), u (E,d) → (E,k) (App D)."""
    return b - torch.einsum("ekd,ed->ek", W, u)


def shifted_init(W0, b0, u):
    """The init of the X004-6 retraining variant: (W(0), b(0) − W(0) u), same seed."""
    return W0, bias_transform(W0, b0, u)


def residual_shift_delta(W, b, Rb, u):
    """The predicted change of the residual of the shifted set under the bias-transformed net
    (P004-9): (ΔR_W = −(b − R_b) uᵀ (E,k,d), ΔR_b = −W u (E,k), ΔR_v = 0)."""
    return -(b - Rb).unsqueeze(-1) * u.unsqueeze(1), -torch.einsum("ekd,ed->ek", W, u)
