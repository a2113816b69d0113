"""Lazy SGD of paper 003 §5.1 (spec 003 §2.6): plain SGD on the logistic loss of a two-layer ReLU
net with a fixed top layer, stopped when the iterate leaves the lazy ball
``||W - W0||_{2,∞} <= C0/√m``, with one snapshot per C0 of a grid from **one** trajectory.

Stacked: E models on a leading axis, each with its own W0, top layer, bias and minibatch order
(its own ``torch.Generator``); they share the training set X (n,d), y (n) and the width m.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.nets.lazy import deviation_C0, logistic_dloss
from tasks.train.minibatch import batch_plan, epoch_order


@dataclasses.dataclass
class LazyRun:
    """Snapshots of E trajectories at nC radii. ``U`` (E,nC,m,d) and ``b`` (E,nC,m): the last
    iterate inside ``B_{2,∞}(W0, C0_j/√m)`` (spec 003 §6 #3); ``steps`` (E,nC): SGD steps taken to
    reach it; ``exited`` (E,nC): the next step left the ball (False: ``max_steps`` was reached
    inside it)."""

    U: torch.Tensor
    b: torch.Tensor
    steps: torch.Tensor
    exited: torch.Tensor


def lazy_sgd(W0: torch.Tensor, v: torch.Tensor, b0: torch.Tensor, X: torch.Tensor, y: torch.Tensor,
             C0s: list[float], generators: list[torch.Generator], *, lr: float = 0.1, batch_size: int = 64,
             max_steps: int = 200_000, train_bias: bool = True, reduction: str = "mean", progress=None) -> LazyRun:
    """Train E nets W = W0 + U from U = 0 (spec 003 §2.6 pseudo-code).

    W0 (E,m,d), v (E,m) = a/√m fixed, b0 (E,m) (zeros and ``train_bias=False`` for the bias-free
    variant), X (n,d), y (n) in {-1,+1}; ``C0s`` ascending radii (in C0 units); ``generators`` one
    per model: a fresh permutation of the n samples per epoch, floor(n/B) minibatches of B each
    (the last partial batch is dropped). The exit is checked after every step: the first time
    ``√m ||U_new||_{2,∞} > C0_j`` the current (inside) iterate is the snapshot for C0_j. A model
    stops updating once every radius has its snapshot; the loop stops when all have. Pre-activations
    are ``X W0^T + X U^T + b``, so U stays out of the rounding noise of W0 (spec 003 §2.2).

    ``progress`` (optional): called as ``progress(steps done, max_steps, loss)`` after every step (the
    host reads the exit test there anyway); ``loss()`` gives the natural log of the worst model's
    minibatch loss (a device read: the caller calls it only when it wants it).
    """
    E, m, d = W0.shape
    n, B = X.shape[0], batch_size
    per_epoch, scale = batch_plan(n, B, reduction)
    C0 = torch.tensor(sorted(C0s), dtype=W0.dtype, device=W0.device)
    nC = len(C0)
    U = torch.zeros_like(W0)
    b = b0.clone()
    snapU = torch.zeros(E, nC, m, d, dtype=W0.dtype, device=W0.device)
    snapb = torch.zeros(E, nC, m, dtype=W0.dtype, device=W0.device)
    steps = torch.full((E, nC), max_steps, dtype=torch.long)
    taken = torch.zeros(E, nC, dtype=torch.bool, device=W0.device)
    perm = None
    for t in range(max_steps):
        pos = t % per_epoch
        if pos == 0:
            perm = epoch_order(generators, n, X.device)  # (E,n)
        idx = perm[:, pos * B:(pos + 1) * B]  # (E,B)
        xb, yb = X[idx], y[idx]  # (E,B,d), (E,B)
        P = torch.bmm(xb, W0.transpose(1, 2)) + torch.bmm(xb, U.transpose(1, 2)) + b.unsqueeze(1)  # (E,B,m)
        act = (P > 0).to(X.dtype)
        f = torch.bmm(torch.relu(P), v.unsqueeze(-1)).squeeze(-1)  # (E,B)
        c = logistic_dloss(yb * f) * yb * scale  # d loss / d f
        M = c.unsqueeze(-1) * act * v.unsqueeze(1)  # (E,B,m)
        U_new = U - lr * torch.bmm(M.transpose(1, 2), xb)
        b_new = b - lr * M.sum(1) if train_bias else b
        dev = deviation_C0(U_new)  # (E,)
        new = (dev.unsqueeze(1) > C0.unsqueeze(0)) & ~taken  # (E,nC)
        if bool(new.any()):
            snapU = torch.where(new[:, :, None, None], U.unsqueeze(1), snapU)
            snapb = torch.where(new[:, :, None], b.unsqueeze(1), snapb)
            steps = torch.where(new.cpu(), torch.full_like(steps, t), steps)
            taken |= new
        live = ~taken.all(1)
        if progress is not None:
            progress(t + 1, max_steps, lambda f=f, yb=yb: float(torch.log(mean_logistic_loss(f, yb).max())))
        if not bool(live.any()):
            break
        U = torch.where(live[:, None, None], U_new, U)
        b = torch.where(live[:, None], b_new, b)
    left = ~taken
    snapU = torch.where(left[:, :, None, None], U.unsqueeze(1), snapU)
    snapb = torch.where(left[:, :, None], b.unsqueeze(1), snapb)
    return LazyRun(snapU, snapb, steps, taken.cpu())


def mean_logistic_loss(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``mean_i softplus(-y_i f_i)`` over the last axis (spec 003 §2.4)."""
    return torch.nn.functional.softplus(-y * f).mean(-1)


def exit_radius(m: int, C0: float) -> float:
    """``V = C0/√m`` (spec 003 §2.3)."""
    return C0 / math.sqrt(m)
