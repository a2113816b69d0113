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


CIFAR_FILE = "cifar10_batch1_test1000.npz"
VEHICLES = (0, 1, 8, 9)  # airplane, automobile, ship, truck; the rest (2-7) are animals


def cifar_path(root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or shared_data_dir()) / "cifar10" / CIFAR_FILE


def sha256(path: pathlib.Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cifar_vehicles_animals(n_per_class: int, root: pathlib.Path | None = None):
    """Haim et al.'s binary CIFAR-10 set (paper 004 F004-2): the first ``n_per_class`` vehicles (+1)
    and the first ``n_per_class`` animals (−1) of the training split, pixels in [0, 1] minus the
    set's mean, (2n, 3072) float64 channel-major. Returns (X, y, indices into the training split,
    mean (3072,), sha256 of the file). FileNotFoundError names the missing file."""
    path = cifar_path(root)
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-10 file {path} not found (set KKTLAB_DATA to the folder holding cifar10/)")
    x, labels = cifar10("train", root)
    veh = torch.isin(labels, torch.tensor(VEHICLES))
    pos, neg = veh.nonzero().squeeze(1)[:n_per_class], (~veh).nonzero().squeeze(1)[:n_per_class]
    if len(pos) < n_per_class or len(neg) < n_per_class:
        raise ValueError(f"CIFAR-10 subset has {len(pos)} vehicles and {len(neg)} animals, fewer than {n_per_class}")
    idx = torch.cat([pos, neg])
    X = x[idx]
    y = torch.cat([torch.ones(n_per_class), -torch.ones(n_per_class)]).to(torch.float64)
    mean = X.mean(0)
    return X - mean, y, idx, mean, sha256(path)
