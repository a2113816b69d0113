"""Projected adversarial training, Algorithm 1 of paper 003 (App. A), with the spec's corrections
(spec 003 §2.9, §6 #14-#19): PGD on the running iterate with normalised l2 steps against
``W_{t-1}``, SGD on the adversarial points, projection of U = W - W0 onto ``B_{2,∞}(0, V)`` after
every step (or once per epoch), stop when the robust training accuracy stops increasing
(patience), return the best-RTA iterate.

Stacked over E models, each with its own (V, R), W0, top layer and minibatch order; shared data.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.attacks.pgd import pgd_l2
from tasks.nets.lazy import logistic_dloss, project_ball
from tasks.nets.two_layer import TwoLayer
from tasks.train.minibatch import batch_plan, epoch_order


@dataclasses.dataclass
class AdvRun:
    """``U`` (E,m,d) the best-RTA iterate's deviation; ``rta_train`` (E,) its robust train accuracy;
    ``best_epoch`` (E,) which iterate (0 = W0); ``epochs`` (E,) PGD rounds run; ``hist`` (E,T1_max)
    robust train accuracy of W_{t-1} per round (NaN after the stop)."""

    U: torch.Tensor
    rta_train: torch.Tensor
    best_epoch: torch.Tensor
    epochs: torch.Tensor
    hist: torch.Tensor


def projected_adv_train(W0: torch.Tensor, v: torch.Tensor, b: torch.Tensor, X: torch.Tensor, y: torch.Tensor,
                        V: torch.Tensor, R: torch.Tensor, generators: list[torch.Generator], *, T1_max: int = 50,
                        T2: int = 100, beta: float = 0.01, batch_size: int = 64, reduction: str = "sum",
                        projection: str = "step", patience: int = 1, chunk: int = 4096, pgd_step: str = "normalised",
                        progress=None) -> AdvRun:
    """W0 (E,m,d), v (E,m) = a/√m, b (E,m) fixed (zeros: §5.2 has no bias), X (n,d), y (n); V, R (E,).

    Round t: PGD-``T2`` (step ``2.5R/T2``) on all training points against ``W_{t-1}``, its robust
    accuracy recorded; a model stops after ``patience`` rounds without an increase (spec 003 §6 #18);
    otherwise one epoch of floor(n/B) minibatches of a fresh shuffle of (X_adv, y), step ``beta`` on
    the ``sum`` (Alg. 1 line 9 as printed) or ``mean`` loss, projection after each step
    (``step``, §5.2 text) or once per epoch (``epoch``, line 11); ``pgd_step`` normalised (spec §6 #15)
    or raw (line 4 as printed, X5). ``progress`` (optional): called as ``progress(done, of)`` in PGD
    steps of all ``T1_max`` rounds' (each round's PGD steps × chunks), within each round's PGD and
    after its epoch (no device read; a patience stop ends it early)."""
    if projection not in ("step", "epoch"):
        raise ValueError(f"projection {projection!r}: allowed step, epoch")
    E, _, d = W0.shape
    n, B = X.shape[0], batch_size
    per_epoch, scale = batch_plan(n, B, reduction)
    V, R = V.to(W0), R.to(W0)
    U = torch.zeros_like(W0)
    bestU = U.clone()
    best = torch.full((E,), -1.0, dtype=W0.dtype, device=W0.device)
    best_epoch = torch.zeros(E, dtype=torch.long)
    epochs = torch.zeros(E, dtype=torch.long)
    hist = torch.full((E, T1_max), float("nan"), dtype=W0.dtype)
    stop = torch.zeros(E, dtype=torch.bool, device=W0.device)
    bad = torch.zeros(E, dtype=torch.long, device=W0.device)
    prev = None
    K = T2 * -(-n // chunk)  # PGD steps of one round (tasks.attacks.pgd: steps × chunks)
    for t in range(T1_max):
        net = TwoLayer(W0 + U, b, v)
        inner = None if progress is None else (lambda done, of, t=t: progress(t * K + done, T1_max * K))
        adv = pgd_l2(net, X, y, R, steps=T2, chunk=chunk, step=pgd_step, progress=inner)
        rta = adv.robust.to(W0.dtype).mean(1)  # robust train accuracy of W_{t-1}
        hist[:, t] = torch.where(stop, torch.full_like(rta, float("nan")), rta).cpu()
        better = (rta > best) & ~stop
        bestU = torch.where(better[:, None, None], U, bestU)
        best_epoch = torch.where(better.cpu(), torch.full_like(best_epoch, t), best_epoch)
        best = torch.where(better, rta, best)
        if prev is not None:
            bad = torch.where(rta <= prev, bad + 1, torch.zeros_like(bad))
            stop |= bad >= patience
        prev = rta
        if bool(stop.all()):
            break
        epochs += (~stop).long().cpu()
        perm = epoch_order(generators, n, X.device)
        for pos in range(per_epoch):
            idx = perm[:, pos * B:(pos + 1) * B]
            xb = torch.gather(adv.x_adv, 1, idx.unsqueeze(-1).expand(-1, -1, d))  # (E,B,d)
            yb = y[idx]
            P = torch.bmm(xb, W0.transpose(1, 2)) + torch.bmm(xb, U.transpose(1, 2)) + b.unsqueeze(1)
            f = torch.bmm(torch.relu(P), v.unsqueeze(-1)).squeeze(-1)
            M = (logistic_dloss(yb * f) * yb * scale).unsqueeze(-1) * (P > 0).to(X.dtype) * v.unsqueeze(1)
            U_new = U - beta * torch.bmm(M.transpose(1, 2), xb)
            if projection == "step":
                U_new = project_ball(U_new, V)
            U = torch.where(stop[:, None, None], U, U_new)
        if projection == "epoch":
            U = project_ball(U, V)
        if progress is not None:
            progress((t + 1) * K, T1_max * K)
    return AdvRun(bestU, best, best_epoch, epochs, hist)


def budget_C0(V: float, m: int) -> float:
    """``C0 = V √m`` (spec 003 §6 #17)."""
    return V * math.sqrt(m)
