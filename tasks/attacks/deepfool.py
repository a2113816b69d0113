"""DeepFool-style iterative linearisation for a binary scalar output (Moosavi-Dezfooli et al. 2016,
binary case), on stacked nets: spec 003 X3's "stronger attack" beside the single step and PGD.

``x_{k+1} = x_k - f(x_k) ∇f(x_k)/||∇f(x_k)||²`` until the sign differs from sign f(x_0); the
perturbation returned is ``(1 + overshoot)(x_K - x_0)``.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.nets.lazy import input_grad
from tasks.nets.two_layer import TwoLayer


@dataclasses.dataclass
class DeepFoolResult:
    """``delta`` (E,n,d) the perturbations, ``norm`` (E,n) their l2 norms (inf where ``max_iter`` did
    not flip), ``iters`` (E,n) linearisations used."""

    delta: torch.Tensor
    norm: torch.Tensor
    iters: torch.Tensor


def deepfool(net: TwoLayer, X: torch.Tensor, *, max_iter: int = 50, overshoot: float = 0.02) -> DeepFoolResult:
    """X (E,n,d). Examples with f(x) = 0 get delta 0."""
    s = torch.sign(net(X))
    xk = X.clone()
    done = s == 0
    iters = torch.zeros(X.shape[:2], dtype=torch.long, device=X.device)
    for _ in range(max_iter):
        f, g = input_grad(net, xk)
        done |= s * f < 0
        if bool(done.all()):
            break
        step = -(f / g.pow(2).sum(-1).clamp_min(torch.finfo(X.dtype).tiny)).unsqueeze(-1) * g
        xk = torch.where(done.unsqueeze(-1), xk, xk + step)
        iters += (~done).long()
    f = net(X + (1 + overshoot) * (xk - X))
    flipped = (s * f < 0) | (s == 0)
    delta = (1 + overshoot) * (xk - X)
    norm = torch.where(flipped, delta.norm(dim=-1), torch.full_like(f, float("inf")))
    return DeepFoolResult(delta, norm, iters)
