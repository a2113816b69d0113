"""Synthetic datasets (paper 002 §2.7, E5-E7) and pure transforms of labelled data.

Files (MNIST, CIFAR-10) are read by ``storage/datasets.py``, never here.

Synthetic generators take a ``torch.Generator`` and return float64 CPU tensors; callers move
them to the device/dtype of the bundle. ``seed_streams`` derives independent sub-seeds for
data, labels, init and minibatch order from one grid seed (spec 002 A8).
"""

from __future__ import annotations

import math

import numpy as np
import torch

STREAMS = ("data", "labels", "init", "batches")


def seed_streams(seed: int, salt: tuple[int, ...] = ()) -> dict[str, torch.Generator]:
    """Independent generators for each random stream of one grid seed (SeedSequence.spawn).

    ``salt`` (e.g. the cell's shape) decorrelates cells that share a seed but differ in size.
    """
    children = np.random.SeedSequence([int(seed), *map(int, salt)]).spawn(len(STREAMS))
    gens = {}
    for name, child in zip(STREAMS, children):
        g = torch.Generator()
        g.manual_seed(int(child.generate_state(1, np.uint64)[0] >> np.uint64(1)))
        gens[name] = g
    return gens


def sphere(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """``x ~ U(√d · S^{d-1})`` (paper 002 Sec. 6)."""
    z = torch.randn(m, d, generator=g, dtype=torch.float64)
    return math.sqrt(d) * z / z.norm(dim=1, keepdim=True)


def unit_sphere(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """``x ~ U(S^{d-1})``, the unit sphere (paper 004 Sec 4: 500 points on S^783)."""
    z = torch.randn(m, d, generator=g, dtype=torch.float64)
    return z / z.norm(dim=1, keepdim=True)


def gauss(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """``x ~ N(0, I_d)`` (spec 002 A11: the √d-scale reading of the Gaussian variant)."""
    return torch.randn(m, d, generator=g, dtype=torch.float64)


def gauss_scaled(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """``x ~ N(0, I_d/d)`` (the literal "variance 1/d" of Sec. 6; ‖x‖ ≈ 1, spec A11)."""
    return torch.randn(m, d, generator=g, dtype=torch.float64) / math.sqrt(d)


def orthogonal(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """``X = √d · Q[:m]`` with Q a random orthogonal matrix (Theorem 4.1 regime, spec E6)."""
    if m > d:
        raise ValueError(f"orthogonal data needs m <= d, got m={m}, d={d}")
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    Q, R = torch.linalg.qr(A)
    Q = Q * torch.sign(torch.diagonal(R))  # Haar measure
    return math.sqrt(d) * Q[:m]


def orthonormal(m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """Rows of a random orthonormal m × d matrix, ‖x_i‖ = 1 (paper 001 fixture O, F001-2: ψ = φ = 0)."""
    if m > d:
        raise ValueError(f"orthonormal data needs m <= d, got m={m}, d={d}")
    Q, R = torch.linalg.qr(torch.randn(d, m, generator=g, dtype=torch.float64))
    return (Q * torch.sign(torch.diagonal(R))).T.contiguous()


DISTRIBUTIONS = {"sphere": sphere, "gauss": gauss, "gauss_scaled": gauss_scaled, "orthogonal": orthogonal,
                 "orthonormal": orthonormal, "unit_sphere": unit_sphere}


def labels(m: int, g: torch.Generator, *, balanced: bool = False) -> torch.Tensor:
    """Labels in {-1, +1}: i.i.d. uniform (paper), re-drawn while one class is empty (spec A7);
    or exactly balanced (a random half positive) for the theory-regime checks."""
    if balanced:
        y = torch.ones(m, dtype=torch.float64)
        y[torch.randperm(m, generator=g)[: m // 2]] = -1
        return y
    while True:
        y = torch.randint(0, 2, (m,), generator=g).to(torch.float64) * 2 - 1
        if m < 2 or (y > 0).any() and (y < 0).any():
            return y


def synthetic(kind: str, m: int, d: int, gens: dict[str, torch.Generator], *, balanced: bool = False,
              sign_x1: bool = False):
    """A labelled synthetic dataset ``(X (m,d), y (m,))`` of a registered kind.

    ``sign_x1`` (paper 004 Sec 4, spec F004-1): exactly balanced labels y, then x_1 ← y |x_1|, so
    y = sign(x_1) and each class is uniform on its half of the distribution (m/2 per class)."""
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"unknown data kind {kind!r}; allowed: {sorted(DISTRIBUTIONS)}")
    X, y = DISTRIBUTIONS[kind](m, d, gens["data"]), labels(m, gens["labels"], balanced=balanced or sign_x1)
    if sign_x1:
        X[:, 0] = y * X[:, 0].abs()
    return X, y


def binary_subset(x: torch.Tensor, y: torch.Tensor, pos: int, neg: int, n: int | None,
                  g: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Class ``pos`` vs ``neg`` as labels ±1, optionally a random subset of n points."""
    keep = (y == pos) | (y == neg)
    xs, ys = x[keep], torch.where(y[keep] == pos, 1.0, -1.0).to(torch.float64)
    if n is not None:
        idx = torch.randperm(len(xs), generator=g)[:n]
        xs, ys = xs[idx], ys[idx]
    return xs, ys
