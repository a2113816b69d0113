"""Universal attack directions of paper 002 (Sec. 6; spec 002 §2.8, E10/E11), one function each:
``(net, X, y, I, generators) -> ẑ (E,d)`` unit vectors, registered in ``tasks.attacks.DIRECTIONS``."""

from __future__ import annotations

import torch


def _unit(z: torch.Tensor) -> torch.Tensor:
    return z / z.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(z.dtype).tiny)


def margin_direction(net, X, y, I, generators=None) -> torch.Tensor:
    """ẑ ∝ Σ_{i∈I} y_i x_i over the margin set (paper Sec. 6, the z of Theorem 4.1)."""
    return _unit(torch.einsum("en,end->ed", y * I, X))


def all_samples_direction(net, X, y, I, generators=None) -> torch.Tensor:
    """ẑ ∝ Σ_i y_i x_i over all samples (data-only direction, spec E10b; padded rows are 0)."""
    return _unit(torch.einsum("en,end->ed", y, X))


def random_direction(net, X, y, I, generators=None) -> torch.Tensor:
    """A uniformly random unit direction in the features the data use (baseline, spec E10/E11).

    ``generators``: one ``torch.Generator`` per net, so each net's draw is its own; the draw
    has the size of the features the net's data use, whatever the bundle's padded d.
    """
    used = (X != 0).any(1).cpu()  # (E,d) the features the data use; zero-padded ones stay zero
    z = torch.zeros(used.shape, dtype=torch.float64)
    for e in range(used.shape[0]):  # drawn at the net's true d: padding never changes the draw
        n = int(used[e].sum())
        z[e, used[e]] = torch.randn(n, dtype=torch.float64, generator=None if generators is None else generators[e])
    return _unit(z.to(device=X.device, dtype=X.dtype))
