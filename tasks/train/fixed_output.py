"""Full-batch GD with weight decay for nets with a frozen output layer (paper 001 §2.1, App. E;
spec 001 D001-1, D001-2, F001-1), batched over a stack of E nets, float64.

N(x) = Σ_j u_j σ(w_j·x), u_j = ±1/√n frozen, no biases; or the linear predictor N(x) = w·x
(``u=None``, W (E,1,d)). L(W) = (1/m) Σ_i ℓ(y_i N(x_i)), logistic or exponential ℓ; the step is
PyTorch SGD's with weight decay and no momentum: W ← W − lr (∇L + wd W). σ'(0) = 0 as autograd's.
Gradients in closed form (two matmuls per step); ℓ' from log space (spec N4).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.nets.losses import log_loss_terms, mean_log_loss


@dataclasses.dataclass
class FixedOutputRun:
    W: torch.Tensor  # (E,n,d) trained weights
    log_loss: torch.Tensor  # (E,) natural log of the final mean training loss
    q_min: torch.Tensor  # (E,) smallest training margin
    first_below: torch.Tensor  # (E,) first epoch with L < log(2)/m (Thm 2.1's check; -1 never)


def init_weights(n: int, d: int, g: torch.Generator, init_scale: float) -> torch.Tensor:
    """PyTorch nn.Linear default U(−1/√d, 1/√d) times ``init_scale`` (App. E: std / 10^5), (n,d)."""
    return (torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1) / math.sqrt(d) * init_scale


def output_signs(n: int, g: torch.Generator) -> torch.Tensor:
    """u_j uniform in {−1/√n, +1/√n} (Eq. 1), (n,)."""
    return (torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1) / math.sqrt(n)


def _margins(W, u, X, y):
    Z = X @ W.transpose(-1, -2)  # (E,m,n)
    N = Z[..., 0] if u is None else (torch.relu(Z) * u.unsqueeze(-2)).sum(-1)
    return y * N, Z


def train_fixed_output(W0: torch.Tensor, u: torch.Tensor | None, X: torch.Tensor, y: torch.Tensor,
                       mask: torch.Tensor, *, lr: float, wd: float, epochs: int, loss: str = "logistic",
                       progress=None) -> FixedOutputRun:
    """Train every net of the stack for ``epochs`` full-batch steps on its ``mask``ed points
    (E,m). Padded samples and zero-padded features/neurons stay exact zeros of the gradient.

    ``progress`` (optional): called as ``progress(epochs done, epochs, loss)`` every 100 epochs (where
    the Thm 2.1 check runs; the host never waits for the device there) and at the end; ``loss()``
    gives the natural log of the worst net's mean loss (a device read: the caller calls it only
    when it wants it)."""
    W = W0.clone()
    n_pts = mask.sum(-1).clamp_min(1).to(W.dtype)
    first = torch.full((W.shape[0],), -1, dtype=torch.int64, device=W.device)
    for t in range(epochs):
        q, Z = _margins(W, u, X, y)
        log_dl = log_loss_terms(q, loss)[1]
        if t % 100 == 0 or t == epochs - 1:
            log_l = mean_log_loss(q, mask, loss)
            below = (log_l < torch.log(math.log(2) / n_pts)) & (first < 0)
            first = torch.where(below, torch.full_like(first, t), first)
            if progress is not None:
                progress(t, epochs, lambda log_l=log_l: worst(log_l))
        coef = (torch.exp(log_dl) * y * mask).masked_fill(~mask, 0) / n_pts.unsqueeze(-1)  # |ℓ'| y_i / m
        if u is None:
            grad = -(coef.unsqueeze(-1) * X).sum(-2, keepdim=True)
        else:
            G = (Z > 0).to(W.dtype) * coef.unsqueeze(-1) * u.unsqueeze(-2)  # (E,m,n)
            grad = -(G.transpose(-1, -2) @ X)
        W = W - lr * (grad + wd * W)
    q, _ = _margins(W, u, X, y)
    log_l = mean_log_loss(q, mask, loss)
    if progress is not None:
        progress(epochs, epochs, lambda: worst(log_l))
    return FixedOutputRun(W=W, log_loss=log_l, q_min=q.masked_fill(~mask, math.inf).amin(-1), first_below=first)


def worst(log_loss: torch.Tensor) -> float:
    """The largest finite entry (the worst net's log loss), NaN if none (a device read)."""
    fin = log_loss[torch.isfinite(log_loss)]
    return float(fin.max()) if fin.numel() else math.nan
