"""The two-cluster Gaussian mixture D_MG of paper 001 §6 (Thm 6.1; spec 001 D001-10, A6).

μ_− = −μ_+, μ_i uniform in {μ_+, μ_−}, x_i = μ_i + ζ_i, ζ_i ~ N(0, I_d/d), y_i = +1 iff μ_i = μ_+.
‖μ_+‖ by preset (spec A6, the paper is inconsistent): ``sec6``: d^(−a) (§6), ``appD``: d^(a − 1/4)
(App. D.1); the direction of μ_+ is uniform on the sphere. Fresh test points come from the same μ_+.
"""

from __future__ import annotations

import math

import torch

SCALINGS = ("sec6", "appD")


def mu_norm(d: int, a: float, scaling: str) -> float:
    if scaling not in SCALINGS:
        raise ValueError(f"mu_scaling: unknown {scaling!r}; allowed: {', '.join(SCALINGS)}")
    return d ** (-a) if scaling == "sec6" else d ** (a - 0.25)


def mixture_mean(d: int, a: float, scaling: str, g: torch.Generator) -> torch.Tensor:
    """μ_+ (d,): a uniform direction times ‖μ_+‖ of the preset."""
    z = torch.randn(d, generator=g, dtype=torch.float64)
    return z / z.norm() * mu_norm(d, a, scaling)


def mixture_points(count: int, mu: torch.Tensor, g: torch.Generator, balanced_retry: bool = True):
    """``count`` points of D_MG around ±mu: (X (count,d), y (count,)); both classes present when
    ``balanced_retry`` and count >= 2 (labels redrawn, as the training labels of spec A3)."""
    d = mu.shape[0]
    while True:
        y = torch.randint(0, 2, (count,), generator=g).to(torch.float64) * 2 - 1
        if not balanced_retry or count < 2 or ((y > 0).any() and (y < 0).any()):
            break
    X = y.unsqueeze(1) * mu + torch.randn(count, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    return X, y
