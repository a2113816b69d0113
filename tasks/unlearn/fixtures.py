"""Exact KKT fixtures of spec 001 §6 ("fixture O"), shared by tests and benchmarks."""

from __future__ import annotations

import math

import torch

from tasks.data.synthetic import orthonormal as orthonormal_rows


def fixture_o(m: int, d: int, n: int, g: torch.Generator, linear: bool = False):
    """Fixture O (spec §6): orthonormal x_i, y alternating ±1, u_j alternating ±1/√n and the exact
    KKT point w_j = |u_j| (n/n_{s_j}) Σ_{i: y_i = s_j} x_i, s_j = sign(u_j) (margins 1,
    λ_i = n/n_{y_i}). Linear: w = Σ_i y_i x_i/‖x_i‖². Returns (W (n,d) or (1,d), u (n,) or None, X, y)."""
    X = orthonormal_rows(m, d, g)
    y = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(m)], dtype=torch.float64)
    if linear:
        return (y.unsqueeze(1) * X / X.pow(2).sum(1, keepdim=True)).sum(0, keepdim=True), None, X, y
    s = torch.tensor([1.0 if j % 2 == 0 else -1.0 for j in range(n)], dtype=torch.float64)
    u = s / math.sqrt(n)
    n_s = {1.0: float((s > 0).sum()), -1.0: float((s < 0).sum())}
    W = torch.stack([abs(u[j]) * (n / n_s[float(s[j])]) * X[y == s[j]].sum(0) for j in range(n)])
    return W, u, X, y
