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

    def finite(self) -> torch.Tensor:
        """(E,) bool: every parameter of net e is finite (a diverged net is not)."""
        return (torch.isfinite(self.W).all(2).all(1) & torch.isfinite(self.b).all(1)
                & torch.isfinite(self.v).all(1))

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


def robust_net(X: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None,
               d: torch.Tensor | None = None) -> tuple[TwoLayer, torch.Tensor]:
    """The √d-robust nets of Theorem 3.1 (spec 002 §2.10), one per dataset of a stack:
    X (E,m,d), y (E,m), ``mask`` (E,m) the real samples, ``d`` (E,) each net's true dimension
    (default X.shape[2]; zero-padded features are never used).

    ``v_j = y_j``, ``w_j = 2 x_j / (d(1-ρ))``, ``b_j = -(1+ρ)/(1-ρ)``; width m, one neuron per
    sample (padded samples give all-zero neurons); ``ρ = max_{i≠j} |<x_i,x_j>| / d``. Returns the
    nets and ρ (E,); Theorem 3.1 holds only where 0 <= ρ < 1 (the caller checks).
    """
    E, m, d_pad = X.shape
    mask = torch.ones(E, m, dtype=torch.bool, device=X.device) if mask is None else mask
    d = torch.full((E,), float(d_pad), dtype=X.dtype, device=X.device) if d is None else d.to(X.device, X.dtype)
    pair = mask.unsqueeze(1) & mask.unsqueeze(2) & ~torch.eye(m, dtype=torch.bool, device=X.device)
    G = torch.bmm(X, X.transpose(1, 2)).abs().masked_fill(~pair, 0)
    rho = G.amax((1, 2)) / d
    keep = mask.to(X.dtype)
    W = 2 * X * (keep / (d * (1 - rho)).unsqueeze(1)).unsqueeze(-1)  # (E,m,d)
    b = (-(1 + rho) / (1 - rho)).unsqueeze(1) * keep
    return TwoLayer(W, b, y.to(X.dtype) * keep), rho
