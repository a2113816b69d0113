"""Untrained stacks of nets with their synthetic datasets (tests, benchmarks)."""

from __future__ import annotations

import torch

from tasks.data.synthetic import seed_streams, synthetic
from tasks.nets import TwoLayer, init_two_layer, stack


def synthetic_stack(seeds, d: int, m: int, k: int, *, kind: str = "sphere", init_scale: float = 1.0,
                    dtype=torch.float64, device="cpu") -> tuple[TwoLayer, torch.Tensor, torch.Tensor]:
    """E = len(seeds) untrained nets with their synthetic datasets, one seed each (the data,
    labels and init streams of :func:`tasks.seed_streams`). Returns (net, X (E,m,d), y (E,m))."""
    nets, Xs, ys = [], [], []
    for s in seeds:
        g = seed_streams(s, (d, m))
        X, y = synthetic(kind, m, d, g)
        Xs.append(X), ys.append(y)
        nets.append(init_two_layer(d, k, g["init"], init_scale=init_scale, dtype=dtype, device=device))
    return stack(nets), torch.stack(Xs).to(device, dtype), torch.stack(ys).to(device, dtype)
