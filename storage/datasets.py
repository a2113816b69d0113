"""Real data sets read from the shared folder (never copied into the repo): MNIST, CIFAR-10, and
scikit-learn's bundled digits.

The only place that reads data files or ``$KKTLAB_DATA``; the maths in ``tasks/`` gets tensors.
MNIST and CIFAR files are checked against their folder's ``SHA256SUMS`` before use
(:func:`check_data`, also when a config is validated): a missing or corrupt file, checksum list or
data folder stops with one line naming the file and what to do.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import pathlib

import numpy as np
import torch

from core.errors import UserError

MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# spec 003 §2.5: the binary 0-vs-1 subset has exactly these counts (digit 0, digit 1)
MNIST01_COUNTS = {"train": (5923, 6742), "test": (980, 1135)}
DIGITS01_COUNTS = (178, 182)  # spec 003 §5.3


class DataError(UserError):
    """A data file is missing, corrupt or not what the loader expects."""


def shared_data_dir() -> pathlib.Path:
    """``$KKTLAB_DATA`` or ``../shared/data`` next to the repository."""
    env = os.environ.get("KKTLAB_DATA")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def _idx(path: pathlib.Path, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _verified(path: str, size: int, mtime: float) -> str:
    """The file's SHA-256 (cached per path, size and mtime: a changed file is hashed again)."""
    return _sha256(pathlib.Path(path))


def check_mnist(root: pathlib.Path) -> dict[str, str]:
    """Check every MNIST file of ``root`` against ``root/SHA256SUMS``; returns name -> sha256.
    Raises :class:`DataError` naming the file when one is missing, unlisted or corrupt."""
    sums_path = root / "SHA256SUMS"
    if not sums_path.is_file():
        raise DataError(f"MNIST checksum list {sums_path} is missing; the shared data folder should hold "
                        "SHA256SUMS beside the IDX files (set KKTLAB_DATA to the data folder)")
    sums = {}
    for line in sums_path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    out = {}
    for name in MNIST_FILES:
        path = root / name
        if not path.is_file():
            raise DataError(f"MNIST file {path} is missing (expected the four original IDX .gz files in {root}; "
                            "set KKTLAB_DATA to the data folder)")
        if name not in sums:
            raise DataError(f"MNIST file {name} has no checksum in {sums_path}")
        st = path.stat()
        got = _verified(str(path), st.st_size, st.st_mtime)
        if got != sums[name]:
            raise DataError(f"MNIST file {path} is corrupt: sha256 {got[:16]}... differs from SHA256SUMS "
                            f"{sums[name][:16]}...; copy the file again from the shared data folder")
        out[name] = got
    return out


def check_cifar(root: pathlib.Path | None = None) -> str:
    """Check the CIFAR-10 file against ``cifar10/SHA256SUMS``; returns its sha256. Raises
    :class:`DataError` naming the file when it, or its checksum, is missing or does not match."""
    path = cifar_path(root)
    sums_path = path.parent / "SHA256SUMS"
    if not path.is_file():
        raise DataError(f"CIFAR-10 file {path} is missing (set KKTLAB_DATA to the folder holding cifar10/)")
    if not sums_path.is_file():
        raise DataError(f"CIFAR-10 checksum list {sums_path} is missing; the shared data folder should hold "
                        "SHA256SUMS beside the npz file (set KKTLAB_DATA to the data folder)")
    sums = {parts[1].lstrip("*"): parts[0].lower() for parts in map(str.split, sums_path.read_text().splitlines())
            if len(parts) == 2}
    if path.name not in sums:
        raise DataError(f"CIFAR-10 file {path.name} has no checksum in {sums_path}")
    st = path.stat()
    got = _verified(str(path), st.st_size, st.st_mtime)
    if got != sums[path.name]:
        raise DataError(f"CIFAR-10 file {path} is corrupt: sha256 {got[:16]}... differs from SHA256SUMS "
                        f"{sums[path.name][:16]}...; copy the file again from the shared data folder")
    return got


# values of an experiment's ``data`` parameter that name a real data set read from files, and the
# check of those files (the other values are synthetic or bundled with a package, like digits)
DATA_SETS = {"mnist": lambda root: check_mnist(root / "mnist"), "cifar_vehicles": check_cifar}


def check_data(name: str, root: pathlib.Path | None = None) -> None:
    """The files of data set ``name`` (a key of :data:`DATA_SETS`) are present and match their
    checksums; raises :class:`DataError` naming the missing or corrupt file (or data folder)."""
    root = root or shared_data_dir()
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist (set KKTLAB_DATA to the folder holding mnist/ and "
                        "cifar10/)")
    DATA_SETS[name](root)


def _mnist_raw(root: pathlib.Path, split: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The checked MNIST ``split`` files of ``root`` (the mnist folder): images (n, 784) uint8,
    labels (n,) int64 and the images file's sha256."""
    sums = check_mnist(root)
    pre = "train" if split == "train" else "t10k"
    try:
        x = _idx(root / f"{pre}-images-idx3-ubyte.gz", 16).reshape(-1, 784)
        y = _idx(root / f"{pre}-labels-idx1-ubyte.gz", 8)
    except (OSError, EOFError, ValueError) as err:
        raise DataError(f"MNIST {split} files in {root} cannot be read as IDX: {err}") from None
    if len(x) != len(y):
        raise DataError(f"MNIST {split} files in {root}: {len(x)} images but {len(y)} labels")
    return x, y.astype(np.int64), sums[f"{pre}-images-idx3-ubyte.gz"]


def mnist(split: str = "train", root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST images in [0,1] as (n, 784) float64 and labels (n,) int64 (files checked first)."""
    x, y, _ = _mnist_raw((root or shared_data_dir()) / "mnist", split)
    return torch.from_numpy(x.astype(np.float64) / 255.0), torch.from_numpy(y)


def mnist01(split: str = "train", root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Binary MNIST 0 vs 1 (spec 003 §2.5): images (n, 28, 28) float64 in [0,1], labels (n,) in
    {-1, +1} (digit 1 -> +1, digit 0 -> -1, spec 003 §6 #8), in file order, and the SHA-256 of the
    images file they came from. Checks the paper's counts (12665 train, 2115 test)."""
    name = f"mnist-{'train' if split == 'train' else 'test'}"
    x, lab = file_rows(name, positions(name, (0, 1), root), checksum60(name, root), root)
    pre = "train" if split == "train" else "t10k"
    sha = check_mnist((root or shared_data_dir()) / "mnist")[f"{pre}-images-idx3-ubyte.gz"]
    return x, (lab * 2 - 1).double(), sha


def digits01() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits, 0 vs 1 (spec 003 §5.3): images (360, 8, 8) float64 in [0,1]
    (values / 16), labels in {-1, +1} (1 -> +1), in the data set's order."""
    x, lab = file_rows("digits", positions("digits", (0, 1)), checksum60("digits"))
    return x, (lab * 2 - 1).double()


def _cifar_raw(path: pathlib.Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The CIFAR-10 subset's ``split``: (n, 3072) uint8 channel-major rows and labels (n,) int64."""
    with np.load(path) as z:
        x, y = z[f"x_{split}"], z[f"y_{split}"]
    return x.transpose(0, 3, 1, 2).reshape(len(x), -1), y.astype(np.int64)


def cifar10(split: str = "train", root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 subset in [0,1] as (n, 3072) float64 (channel-major rows) and labels (n,)."""
    x, y = _cifar_raw(cifar_path(root), split)
    return torch.from_numpy(x.astype(np.float64) / 255.0), torch.from_numpy(y)


CIFAR_FILE = "cifar10_batch1_test1000.npz"
VEHICLES = (0, 1, 8, 9)  # airplane, automobile, ship, truck; the rest (2-7) are animals


def cifar_path(root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or shared_data_dir()) / "cifar10" / CIFAR_FILE


def sha256(path: pathlib.Path) -> str:
    """Hex sha256 of a file (read in 1 MiB blocks)."""
    return _sha256(path)


def cifar_vehicles_animals(n_per_class: int, root: pathlib.Path | None = None):
    """Haim et al.'s binary CIFAR-10 set (paper 004 F004-2): the first ``n_per_class`` vehicles (+1)
    and the first ``n_per_class`` animals (−1) of the training split, pixels in [0, 1] minus the
    set's mean, (2n, 3072) float64 channel-major. Returns (X, y, indices into the training split,
    mean (3072,), sha256 of the file). :class:`DataError` names a missing or corrupt file."""
    digest = check_cifar(root)
    x, labels = cifar10("train", root)
    veh = torch.isin(labels, torch.tensor(VEHICLES))
    pos, neg = veh.nonzero().squeeze(1)[:n_per_class], (~veh).nonzero().squeeze(1)[:n_per_class]
    if len(pos) < n_per_class or len(neg) < n_per_class:
        raise ValueError(f"CIFAR-10 subset has {len(pos)} vehicles and {len(neg)} animals, fewer than {n_per_class}")
    idx = torch.cat([pos, neg])
    X = x[idx]
    y = torch.cat([torch.ones(n_per_class), -torch.ones(n_per_class)]).to(torch.float64)
    mean = X.mean(0)
    return X - mean, y, idx, mean, digest


def cifar_rows(indices, checksum: int, root: pathlib.Path | None = None) -> torch.Tensor:
    """The training rows a ``train`` stage stored as indices (``data_index``) plus a checksum
    (``data_checksum``: the first 60 bits of the file's sha256) instead of a copy: rows ``indices``
    of the CIFAR-10 training split, minus their mean, as :func:`cifar_vehicles_animals` gave them to
    training. A file with another checksum or a missing one raises :class:`DataError` naming it."""
    X, _ = file_rows("cifar-train", indices, checksum, root)
    return X - X.mean(0)



# --- file data sets rebuilt from indices (issue 13 item 4: a stage stores indices + a checksum,
# never a copy of MNIST / CIFAR) ---------------------------------------------------------------
FILE_SETS = ("mnist-train", "mnist-test", "digits", "cifar-train")


def _stamp(name: str, root: pathlib.Path) -> tuple:
    """What identifies the file(s) behind ``name`` now (a changed file is read and hashed again)."""
    if name == "digits":
        return ()
    paths = ([root / "mnist" / f"{'train' if name == 'mnist-train' else 't10k'}-{k}-idx{n}-ubyte.gz"
              for k, n in (("images", 3), ("labels", 1))] if name.startswith("mnist") else [cifar_path(root)])
    for p in paths:
        if not p.is_file():
            raise DataError(f"data file {p} of '{name}' not found (set KKTLAB_DATA to the data folder)")
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime) for p in paths)


@functools.lru_cache(maxsize=4)
def _file_set(name: str, root: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(raw images, labels, pixel scale, 60-bit checksum) of a whole file data set."""
    base = pathlib.Path(root)
    if name.startswith("mnist"):
        x, y, sha = _mnist_raw(base / "mnist", name.split("-")[1])
        return x.reshape(-1, 28, 28), y, 255.0, int(sha[:15], 16)
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as err:
            raise DataError(f"the digits data set needs scikit-learn ({err})") from None
        ds = load_digits()
        h = hashlib.sha256(ds.images.astype(np.float64).tobytes() + ds.target.astype(np.int64).tobytes())
        return ds.images, ds.target.astype(np.int64), 16.0, int(h.hexdigest()[:15], 16)
    x, y = _cifar_raw(cifar_path(base), "train")
    return x, y, 255.0, int(sha256(cifar_path(base))[:15], 16)


def checksum60(name: str, root: pathlib.Path | None = None) -> int:
    """The first 60 bits of the sha256 of ``name``'s images (the file; for digits its arrays)."""
    root = root or shared_data_dir()
    return _file_set(name, str(root), _stamp(name, root))[3]


COUNTS01 = {"mnist-train": MNIST01_COUNTS["train"], "mnist-test": MNIST01_COUNTS["test"], "digits": DIGITS01_COUNTS}


def positions(name: str, labels: tuple[int, ...], root: pathlib.Path | None = None) -> np.ndarray:
    """Indices (file order) of the rows of ``name`` whose label is in ``labels``; the 0/1 subsets
    are checked against their known counts (spec 003 §2.5, §5.3)."""
    root = root or shared_data_dir()
    lab = _file_set(name, str(root), _stamp(name, root))[1]
    if tuple(labels) == (0, 1) and name in COUNTS01:
        got = (int((lab == 0).sum()), int((lab == 1).sum()))
        if got != COUNTS01[name]:
            raise DataError(f"'{name}' in {root}: {got[0]} zeros and {got[1]} ones, expected {COUNTS01[name]} "
                            "(spec 003 §2.5 / §5.3); the files are not the standard ones")
    return np.flatnonzero(np.isin(lab, labels)).astype(np.int64)


def file_rows(name: str, indices, checksum: int, root: pathlib.Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``indices`` of the file data set ``name`` (one of FILE_SETS) as float64 images in [0, 1]
    and their raw labels (int64), after checking that the file is the one the indices were taken from
    (``checksum``: :func:`checksum60` then). Raises :class:`DataError` naming the file otherwise."""
    if name not in FILE_SETS:
        raise DataError(f"unknown file data set '{name}'; known: {', '.join(FILE_SETS)}")
    root = root or shared_data_dir()
    x, y, scale, have = _file_set(name, str(root), _stamp(name, root))
    if have != int(checksum):
        raise DataError(f"'{name}' in {root} has checksum {have:x}, not {int(checksum):x} of the data these nets "
                        "were trained on: the stored indices cannot be resolved")
    idx = np.asarray(indices, dtype=np.int64)
    return torch.from_numpy(x[idx].astype(np.float64) / scale), torch.from_numpy(y[idx])
