"""Two-layer ReLU networks as stacked parameters (paper 002, Sec. 2).

``N_θ(x) = Σ_j v_j σ(w_j·x + b_j)`` with no output bias (homogeneous of degree 2, Thm 2.1).
A stack of E networks is a :class:`TwoLayer` holding ``W (E,k,d)``, ``b (E,k)``, ``v (E,k)``.
Padded (all-zero) neurons and padded (zero) input features are exact fixed points of
gradient descent, so cells of different widths / dims can share one stack.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass
class TwoLayer:
    """E stacked two-layer ReLU nets."""

    W: torch.Tensor  # (E, k, d)
    b: torch.Tensor  # (E, k)
    v: torch.Tensor  # (E, k)

    @property
    def E(self) -> int:
        return self.W.shape[0]

    def pre(self, X: torch.Tensor) -> torch.Tensor:
        """Pre-activations ``H = X W^T + b``: X (E,n,d) -> (E,n,k)."""
        return torch.baddbmm(self.b.unsqueeze(1), X, self.W.transpose(1, 2))

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """Outputs N(X): X (E,n,d) -> (E,n)."""
        return torch.bmm(torch.relu(self.pre(X)), self.v.unsqueeze(-1)).squeeze(-1)

    def sq_norm(self) -> torch.Tensor:
        """``||θ||²`` per net, (E,)."""
        return self.W.pow(2).sum((1, 2)) + self.b.pow(2).sum(1) + self.v.pow(2).sum(1)

    def clone(self) -> "TwoLayer":
        return TwoLayer(self.W.clone(), self.b.clone(), self.v.clone())

    def select(self, idx) -> "TwoLayer":
        return TwoLayer(self.W[idx], self.b[idx], self.v[idx])

    def scaled(self, s: torch.Tensor) -> "TwoLayer":
        """Multiply all parameters of net e by s[e] (outputs scale by s², homogeneity)."""
        return TwoLayer(self.W * s[:, None, None], self.b * s[:, None], self.v * s[:, None])


def init_two_layer(
    d: int, k: int, generator: torch.Generator, *, init_scale: float = 1.0,
    d_pad: int | None = None, k_pad: int | None = None, dtype=torch.float64, device="cpu",
) -> TwoLayer:
    """One net with PyTorch ``nn.Linear`` default init (spec 002 §2.1 / A5), times ``init_scale``.

    ``W, b ~ U(±1/√d)``, ``v ~ U(±1/√k)``; drawn at the true (d, k) on the CPU from
    ``generator`` (so padding and device never change the draw), then zero-padded to
    (k_pad, d_pad). Returns a stack with E = 1.
    """
    d_pad, k_pad = d_pad or d, k_pad or k
    bw, bv = 1 / math.sqrt(d), 1 / math.sqrt(k)
    W = (torch.rand(k, d, generator=generator, dtype=torch.float64) * 2 - 1) * bw
    b = (torch.rand(k, generator=generator, dtype=torch.float64) * 2 - 1) * bw
    v = (torch.rand(k, generator=generator, dtype=torch.float64) * 2 - 1) * bv
    Wp = torch.zeros(1, k_pad, d_pad, dtype=torch.float64)
    bp = torch.zeros(1, k_pad, dtype=torch.float64)
    vp = torch.zeros(1, k_pad, dtype=torch.float64)
    Wp[0, :k, :d], bp[0, :k], vp[0, :k] = W, b, v
    net = TwoLayer(Wp, bp, vp).scaled(torch.tensor([float(init_scale)], dtype=torch.float64))
    return TwoLayer(*(t.to(device=device, dtype=dtype) for t in (net.W, net.b, net.v)))


def stack(nets: list[TwoLayer]) -> TwoLayer:
    """Concatenate stacks along the ensemble axis."""
    return TwoLayer(
        torch.cat([n.W for n in nets]), torch.cat([n.b for n in nets]), torch.cat([n.v for n in nets])
    )


def robust_net(X: torch.Tensor, y: torch.Tensor, rho: float | None = None) -> tuple[TwoLayer, float]:
    """The √d-robust net of Theorem 3.1 (spec 002 §2.10) for one dataset X (m,d), y (m,).

    ``v_j = y_j``, ``w_j = 2 x_j / (d(1-ρ))``, ``b_j = -(1+ρ)/(1-ρ)``; width m. ρ defaults to
    ``max_{i≠j} |<x_i,x_j>| / d``. Returns the net (E = 1) and ρ.
    """
    m, d = X.shape
    if rho is None:
        G = X @ X.T
        G.fill_diagonal_(0)
        rho = float(G.abs().max()) / d if m > 1 else 0.0
    if not 0 <= rho < 1:
        raise ValueError(f"rho must be in [0, 1) for Theorem 3.1, got {rho}")
    W = (2 * X / (d * (1 - rho))).unsqueeze(0)
    b = torch.full((1, m), -(1 + rho) / (1 - rho), dtype=X.dtype, device=X.device)
    return TwoLayer(W, b, y.to(X.dtype).unsqueeze(0).clone()), rho
