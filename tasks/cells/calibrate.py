"""A fixed, deterministic amount of compute, for measuring orchestration overhead."""

from __future__ import annotations

import torch


def busy(n_matmuls: int, seed: int, size: int = 128) -> float:
    """``n_matmuls`` products of ``size x size`` float32 matrices (2·size³ FLOP each);
    returns a checksum so the work cannot be skipped."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g) / size**0.5
    x = torch.randn(size, size, generator=g)
    for _ in range(n_matmuls):
        x = torch.tanh(a @ x)
    return float(x.sum())
