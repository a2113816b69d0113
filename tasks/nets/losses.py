"""Losses of stacked nets in log space (paper 002 §6, spec 002 §2.2): never form 1e-30 as a float."""

from __future__ import annotations

import math

import torch

def log_loss_terms(q: torch.Tensor, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log ℓ(q), log |ℓ'(q)|)`` elementwise, stable for any q (spec 002 §2.2)."""
    if loss == "exp":
        return -q, -q
    if loss == "logistic":
        big = q > 30
        safe = torch.where(big, torch.zeros_like(q), q)
        log_l = torch.where(big, -q - 0.5 * torch.exp(-q), torch.log(torch.nn.functional.softplus(-safe)))
        return log_l, -torch.nn.functional.softplus(q)
    raise ValueError(f"unknown loss {loss!r}; allowed: 'exp', 'logistic'")

def mean_log_loss(q: torch.Tensor, mask: torch.Tensor, loss: str) -> torch.Tensor:
    """log of the mean loss over the valid samples from their margins q (E,n): (E,) float64."""
    log_l = log_loss_terms(q, loss)[0].masked_fill(~mask, -math.inf)
    n = mask.sum(1).clamp_min(1).to(torch.float64)
    return torch.logsumexp(log_l.to(torch.float64), 1) - torch.log(n)
