"""Losses of stacked nets in log space (paper 002 §6, spec 002 §2.2): never form 1e-30 as a float."""

from __future__ import annotations

import math

import torch


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) as torch's softplus (x past 20: x), from exp, log1p and where only: each element
    is a function of that element alone. torch's fused CPU softplus (and sigmoid, logaddexp, pow)
    takes its SIMD path for most elements and a scalar path for the tail of the tensor, which differ
    in the last bit, so an element's value depended on the tensor's length and its position in it:
    on its bundle mates (issue 29 item 2; tests/test_bundle_invariance_readers.py)."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp_max(20))))


def log_loss_terms(q: torch.Tensor, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log ℓ(q), log |ℓ'(q)|)`` elementwise, stable for any q (spec 002 §2.2)."""
    if loss == "exp":
        return -q, -q
    if loss == "logistic":
        big = q > 30
        safe = torch.where(big, torch.zeros_like(q), q)
        log_l = torch.where(big, -q - 0.5 * torch.exp(-q), torch.log(softplus(-safe)))
        return log_l, -softplus(q)
    raise ValueError(f"unknown loss {loss!r}; allowed: 'exp', 'logistic'")

def mean_log_loss(q: torch.Tensor, mask: torch.Tensor, loss: str) -> torch.Tensor:
    """log of the mean loss over the valid samples from their margins q (E,n): (E,) float64."""
    log_l = log_loss_terms(q, loss)[0].masked_fill(~mask, -math.inf)
    n = mask.sum(1).clamp_min(1).to(torch.float64)
    return torch.logsumexp(log_l.to(torch.float64), 1) - torch.log(n)
