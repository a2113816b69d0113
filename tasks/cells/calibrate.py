"""A fixed, deterministic amount of compute, for measuring orchestration overhead."""

from __future__ import annotations

import torch


EVERY = 64  # matmuls between two calls of ``progress``


def busy(n_matmuls: int, seed: int, size: int = 128, progress=None) -> float:
    """``n_matmuls`` products of ``size x size`` float32 matrices (2·size³ FLOP each);
    returns a checksum so the work cannot be skipped. ``progress`` (optional): called as
    ``progress(matmuls done, n_matmuls)`` every :data:`EVERY` matmuls and at the end."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g) / size**0.5
    x = torch.randn(size, size, generator=g)
    for i in range(n_matmuls):
        if progress is not None and i % EVERY == 0:
            progress(i, n_matmuls)
        x = torch.tanh(a @ x)
    if progress is not None:
        progress(n_matmuls, n_matmuls)
    return float(x.sum())
