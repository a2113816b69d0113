"""Real data sets read from the shared folder (never copied into the repo): MNIST, CIFAR-10.

The only place that reads data files or ``$KKTLAB_DATA``; the maths in ``tasks/`` gets tensors.
"""

from __future__ import annotations

import gzip
import os
import pathlib

import numpy as np
import torch


def shared_data_dir() -> pathlib.Path:
    """``$KKTLAB_DATA`` or ``../shared/data`` next to the repository."""
    env = os.environ.get("KKTLAB_DATA")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def _idx(path: pathlib.Path, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def mnist(split: str = "train", root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST images in [0,1] as (n, 784) float64 and labels (n,) int64."""
    root = (root or shared_data_dir()) / "mnist"
    pre = "train" if split == "train" else "t10k"
    x = _idx(root / f"{pre}-images-idx3-ubyte.gz", 16).reshape(-1, 784)
    y = _idx(root / f"{pre}-labels-idx1-ubyte.gz", 8)
    return torch.from_numpy(x.astype(np.float64) / 255.0), torch.from_numpy(y.astype(np.int64))


def cifar10(split: str = "train", root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 subset in [0,1] as (n, 3072) float64 (channel-major rows) and labels (n,)."""
    root = (root or shared_data_dir()) / "cifar10"
    with np.load(root / "cifar10_batch1_test1000.npz") as z:
        x, y = z[f"x_{split}"], z[f"y_{split}"]
    x = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
    return torch.from_numpy(x.astype(np.float64) / 255.0), torch.from_numpy(y.astype(np.int64))
