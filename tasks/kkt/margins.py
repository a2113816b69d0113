"""Margins of stacked nets and the margin set (paper 002 Eq. (2), Sec. 6; spec 002 §2.8, A14)."""

from __future__ import annotations

import math

import torch

from tasks.nets import TwoLayer


def margins(net: TwoLayer, X, y) -> torch.Tensor:
    """q_i = y_i N(x_i), (E,m)."""
    return y * net(X)


def normalized_margin(net: TwoLayer, q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """γ = min_i q_i / ||θ||² (Lyu-Li normalized margin for 2-homogeneous nets), (E,)."""
    return q.masked_fill(~valid, math.inf).min(1).values / net.sq_norm()


def margin_set(q: torch.Tensor, valid: torch.Tensor, slack: float = 1.1) -> torch.Tensor:
    """``I = {i : 0 < q_i <= slack · min_{l: q_l > 0} q_l}`` (paper Sec. 6), (E,m) bool.

    Spec 002 A14: the minimum is over the correctly classified points only, so one
    misclassified point (flagged by ``train_acc`` < 1) never empties the set."""
    correct = valid & (q > 0)
    q_min = q.masked_fill(~correct, math.inf).min(1, keepdim=True).values
    return correct & (q <= slack * q_min)
