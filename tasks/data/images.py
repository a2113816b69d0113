"""Image preprocessing for paper 003 (spec 003 §2.5): downsampling to d = k^2, the raw and
unit-norm variants, a seeded stratified split. Pure torch; images come in as tensors
(``storage/datasets.py`` reads the files)."""

from __future__ import annotations

import math

import torch

RESAMPLE = ("bilinear", "area", "nearest")  # nearest: X5 only (spec 003 §2.5: it aliases strokes)
VARIANTS = ("raw", "unit")


def side(d: int) -> int:
    """k with k^2 = d; ValueError when d is not a square (an image variant needs one)."""
    k = math.isqrt(int(d))
    if k * k != int(d):
        raise ValueError(f"d = {d} is not a square k^2 (image data are resized to k x k)")
    return k


def downsample(img: torch.Tensor, d: int, mode: str = "bilinear") -> torch.Tensor:
    """Images (n, h, w) in [0,1] -> (n, d) rows, resized to k x k (k^2 = d) and flattened row-major.

    ``bilinear``: ``interpolate(..., mode="bilinear", antialias=True, align_corners=False)``, equal to
    torchvision ``Resize((k, k))`` (spec 003 §2.5 default); ``area``: adaptive average pooling (the
    recorded alternative); ``nearest``: nearest-neighbour, only for spec 003 X5's sensitivity check. No upsampling: k must not exceed the image side."""
    if mode not in RESAMPLE:
        raise ValueError(f"resample {mode!r}: allowed {', '.join(RESAMPLE)}")
    k = side(d)
    n, h, w = img.shape
    if k > min(h, w):
        raise ValueError(f"d = {d} (k = {k}) is larger than the {h} x {w} images; no upsampling")
    if k == h and k == w:
        return img.reshape(n, d).clone()
    x = img.unsqueeze(1)
    if mode == "bilinear":
        out = torch.nn.functional.interpolate(x, size=(k, k), mode="bilinear", antialias=True, align_corners=False)
    elif mode == "area":
        out = torch.nn.functional.adaptive_avg_pool2d(x, (k, k))
    else:
        out = torch.nn.functional.interpolate(x, size=(k, k), mode="nearest")
    return out.reshape(n, d)


def variant(X: torch.Tensor, name: str) -> torch.Tensor:
    """``raw``: pixels as they are ([0,1], no mean/std, spec 003 §6 #6); ``unit``: x / ||x|| per row
    (spec 003 §2.5 "Normalisation")."""
    if name == "raw":
        return X
    if name == "unit":
        return X / X.norm(dim=1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    raise ValueError(f"variant {name!r}: allowed {', '.join(VARIANTS)}")


def stratified_split(y: torch.Tensor, test_frac: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, test) of a seeded stratified split (spec 003 §5.3: digits 270 / 90 at 0.25),
    each sorted ascending."""
    train, test = [], []
    for c in torch.unique(y):
        idx = torch.nonzero(y == c).flatten()
        perm = idx[torch.randperm(len(idx), generator=generator)]
        n_test = round(test_frac * len(idx))
        test.append(perm[:n_test])
        train.append(perm[n_test:])
    return torch.sort(torch.cat(train)).values, torch.sort(torch.cat(test)).values
