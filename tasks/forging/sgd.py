"""Paper 000 (forging sets): SGD trajectories, the two-basin example of Fig 1 (F000-1, §2).

f(w; x) = α(w) g1 + (1 - α(w)) g2, g1 = ||w - μ||² + log(1 + exp(-a(x)ᵀw)),
g2 = ||w + μ||² + log(1 + exp(-a(x)ᵀw)), a(x) = A x, μ = c e1, α(w) = 1/(1 + exp(-5 w1)).
Not given in the paper (spec §6.11): c, A and x1..x19; defaults c = 2, A = 1,
x1..x19 ~ U(-1, 1) from numpy default_rng(seed) (the draw is returned so it can be stored).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import grad, vmap

__all__ = ["two_basin_loss", "sgd_trajectories", "figure1_trajectories"]


def two_basin_loss(w: torch.Tensor, x: torch.Tensor, c: float = 2.0, A: float = 1.0) -> torch.Tensor:
    """The §2 loss for n = d = 1 (scalars w, x); log(1 + e^{-u}) = softplus(-u) for stability."""
    log_term = torch.nn.functional.softplus(-(A * x) * w)
    g1 = (w - c) ** 2 + log_term
    g2 = (w + c) ** 2 + log_term
    alpha = torch.sigmoid(5.0 * w)
    return alpha * g1 + (1.0 - alpha) * g2


def sgd_trajectories(xs: torch.Tensor, w0: float, h: float, c: float = 2.0, A: float = 1.0,
                     progress=None) -> torch.Tensor:
    """Plain SGD (Eq 2) w_{k+1} = w_k - h ∇f(w_k; x_k) for T data sequences at once.

    xs (T, K) -> trajectories (T, K+1) with w_0..w_K (batched over T with vmap; the loop is over time).
    ``progress`` (optional): called as ``progress(updates done, K)`` before each update and at the end.
    """
    if h <= 0:
        raise ValueError(f"h (step size) must be > 0, got {h!r}")
    g = vmap(grad(lambda w, x: two_basin_loss(w, x, c, A)))
    w = torch.full((xs.shape[0],), float(w0), dtype=torch.float64)
    traj = [w]
    for k in range(xs.shape[1]):
        if progress is not None:
            progress(k, xs.shape[1])
        w = w - h * g(w, xs[:, k])
        traj.append(w)
    if progress is not None:
        progress(xs.shape[1], xs.shape[1])
    return torch.stack(traj, 1)


def figure1_trajectories(x0: float = -0.5, x0_forged: float = 0.2, w0: float = 1e-4, h: float = 0.3,
                         n_updates: int = 20, c: float = 2.0, A: float = 1.0, seed: int = 0,
                         data: str = "uniform", progress=None) -> dict[str, np.ndarray]:
    """Fig 1 (F000-1): original (x0) and forged (x̃0) trajectories sharing x1..x_{K-1}.

    ``data``: "uniform" (U(-1, 1), default_rng(seed)), "normal0.3", "normal1" or "zeros".
    Returns xs (the shared points), w_original, w_forged (K+1 each) and the gradients at w0.
    ``progress``: :func:`sgd_trajectories`'s (SGD updates done of K).
    """
    if n_updates < 1:
        raise ValueError(f"n_updates must be >= 1, got {n_updates!r}")
    rng = np.random.default_rng(seed)
    k = n_updates - 1
    draws = {"uniform": lambda: rng.uniform(-1, 1, k), "normal0.3": lambda: rng.normal(0, 0.3, k),
             "normal1": lambda: rng.normal(0, 1, k), "zeros": lambda: np.zeros(k)}
    if data not in draws:
        raise ValueError(f"data must be one of {sorted(draws)}, got {data!r}")
    rest = draws[data]()
    xs = torch.tensor(np.stack([np.r_[x0, rest], np.r_[x0_forged, rest]]), dtype=torch.float64)
    traj = sgd_trajectories(xs, w0, h, c, A, progress=progress)
    g0 = vmap(grad(lambda w, x: two_basin_loss(w, x, c, A)))(torch.full((2,), w0, dtype=torch.float64), xs[:, 0])
    return {"xs": rest, "w_original": traj[0].numpy(), "w_forged": traj[1].numpy(),
            "grad_original_w0": float(g0[0]), "grad_forged_w0": float(g0[1])}
