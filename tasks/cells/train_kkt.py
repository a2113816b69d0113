"""The cell of experiment ``train_kkt`` (paper 001 App. E, spec 001 F001-1 … F001-6): nets with a
frozen ±1/√n output layer and no biases (Eq. 1), or linear predictors (§3), trained by full-batch
GD with weight decay on the logistic / exponential loss, float64, batched over the bundle.

Per cell out: the training numbers and the net as a ``train`` stage stores it ("nets": W, b = 0,
v = u (linear: width 1, v = 1), X, y), so ``unlearn`` reads it with ``storage.nets.load_nets_at``.
``batch_rng_state`` holds two CPU generator states (spec: the retrain reference and Thm 6.1's
fresh test points must be drawn as training drew them): [init stream before W0 | mixture stream
before μ_+].

Real data (``mnist``, ``cifar10``; issue 39): the rows come in as images (read by
``storage/datasets.py`` in the experiment, never here) and are prepared by :func:`prepare`: resized to
d = k² (MNIST) or 3k² (CIFAR, per channel) as paper 003's loaders do (``tasks.data.images.downsample``),
then ``unit`` (x/‖x‖), ``center_unit`` (minus the training set's mean, then unit rows) or ``raw``.
Every trained net reports its KKT distance (``eps_rel`` = ε/‖cθ‖ by NNLS, spec 004 §2.3 / K1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tasks.data import mixture
from tasks.data.images import downsample, variant
from tasks.data.synthetic import DISTRIBUTIONS, labels, seed_streams
from tasks.kkt.measure import kkt_measure
from tasks.train.fixed_output import init_weights, output_signs, train_fixed_output

FILE_DATA = ("mnist", "cifar10")  # real data: rows read from the shared files by the experiment
DATA = ("gauss_scaled", "orthonormal", "d_mg", *FILE_DATA)
PREPROCESS = ("center_unit", "unit", "raw")


def prepare(img: torch.Tensor, data: str, d: int, preprocess: str) -> torch.Tensor:
    """Images of ``data`` in [0, 1] (MNIST (n, 28, 28); CIFAR (n, 3072) channel-major rows) -> (n, d)
    float64 rows: bilinear + antialias resize to k x k (MNIST d = k², CIFAR d = 3k², each channel),
    then ``preprocess``: ``unit`` rows, ``center_unit`` (minus the set's mean, then unit rows) or ``raw``."""
    if data == "cifar10":
        k2 = d // 3
        ch = img.reshape(-1, 3, 32, 32)
        X = torch.cat([downsample(ch[:, i], k2) for i in range(3)], 1)
    else:
        X = downsample(img, d)
    X = X.to(torch.float64)
    if preprocess == "center_unit":
        X = X - X.mean(0, keepdim=True)
    return variant(X, "raw" if preprocess == "raw" else "unit")


def pick_rows(c: dict, neg: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The cell's m file rows: m//2 of ``neg`` (class_neg, y = -1) and the rest of ``pos`` (y = +1),
    drawn without replacement by the data seed (``data_seed``, else ``seed``), then shuffled, so a
    forgotten index l is no particular class. ValueError when a class has too few rows."""
    m = c["m"]
    n_neg, n_pos = m // 2, m - m // 2
    if n_neg > len(neg) or n_pos > len(pos):
        raise ValueError(f"m: {m} points need {n_neg} of class {c['class_neg']} and {n_pos} of class "
                         f"{c['class_pos']}; the file has {len(neg)} and {len(pos)}")
    data_seed = c["seed"] if c["data_seed"] < 0 else c["data_seed"]
    g = seed_streams(data_seed, (c["d"], m))["data"]
    a = neg[torch.randperm(len(neg), generator=g)[:n_neg].numpy()]
    b = pos[torch.randperm(len(pos), generator=g)[:n_pos].numpy()]
    rows = np.concatenate([a, b])
    return rows[torch.randperm(m, generator=g).numpy()]
RNG_BYTES = int(torch.Generator().get_state().numel())


def dataset(c: dict, gens: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(X (m,d), y (m,)) of a cell: N(0, I/d) or orthonormal rows with labels (random: uniform,
    both classes present; balanced; alternating: fixture O), or D_MG (labels from the clusters)."""
    m, d = c["m"], c["d"]
    if c["data"] == "d_mg":
        mu = mixture.mixture_mean(d, c["mu_a"], c["mu_scaling"], gens["batches"])
        return mixture.mixture_points(m, mu, gens["data"])
    X = DISTRIBUTIONS[c["data"]](m, d, gens["data"])
    if c["labels"] == "alternating":
        return X, torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(m)], dtype=torch.float64)
    return X, labels(m, gens["labels"], balanced=c["labels"] == "balanced")


def build(cells: list[dict], sets: list | None = None):
    """Data, u and W0 of a bundle, zero-padded to its largest (m, d, n), with the generator states;
    ``sets``: per cell (X, y) of real data (prepared rows) or None (drawn here)."""
    M, D = max(c["m"] for c in cells), max(c["d"] for c in cells)
    linear = cells[0]["model"] == "linear"
    N = 1 if linear else max(c["width"] for c in cells)
    E = len(cells)
    X, y = torch.zeros(E, M, D, dtype=torch.float64), torch.zeros(E, M, dtype=torch.float64)
    mask = torch.zeros(E, M, dtype=torch.bool)
    W0, u = torch.zeros(E, N, D, dtype=torch.float64), torch.zeros(E, N, dtype=torch.float64)
    states = []
    for e, c in enumerate(cells):
        m, d = c["m"], c["d"]
        data_seed = c["seed"] if c["data_seed"] < 0 else c["data_seed"]
        gd = seed_streams(data_seed, (d, m))  # share_data: one data seed for every net
        gi = seed_streams(c["seed"], (d, m))
        mix_state = gd["batches"].get_state()
        X[e, :m, :d], y[e, :m] = sets[e] if sets is not None and sets[e] is not None else dataset(c, gd)
        mask[e, :m] = True
        if linear:
            init_state = gi["init"].get_state()
            W0[e, :1, :d] = init_weights(1, d, gi["init"], c["init_scale"])
            u[e, 0] = 1.0
        else:
            n = c["width"]
            u[e, :n] = output_signs(n, gi["init"])
            init_state = gi["init"].get_state()
            W0[e, :n, :d] = init_weights(n, d, gi["init"], c["init_scale"])
        states.append(torch.cat([init_state, mix_state]))
    return W0, u, X, y, mask, states


def train_cells(cells: list[dict], device: torch.device | str = "cpu", progress=None,
                sets: list | None = None) -> list[dict]:
    """Train the bundle (one schedule per bundle) on ``device`` in float64 and pack each cell at its
    true sizes (CPU tensors); ``progress`` the optional ``progress(done, of, loss)`` of
    :func:`tasks.train.fixed_output.train_fixed_output`.

    A lone cell trains as a stack of two copies of itself, the second dropped: under
    ``MKL_CBWR=AVX2,STRICT`` (deploy/runtime.py) MKL's batched dgemm gives a net the same bits at
    any place in the stack, but a stack of one goes to plain dgemm, whose blocking differs in the
    last bit, so the net trained alone would differ from itself bundled (issue 29 item 2)."""
    if len(cells) == 1 and torch.device(device).type == "cpu":
        return train_cells(cells * 2, device, progress, None if sets is None else sets * 2)[:1]
    c0 = cells[0]
    linear = c0["model"] == "linear"
    W0, u, X, y, mask, states = build(cells, sets)
    dv = lambda t: t.to(device)  # noqa: E731
    run = train_fixed_output(dv(W0), None if linear else dv(u), dv(X), dv(y), dv(mask), lr=c0["lr"], wd=c0["wd"],
                             epochs=c0["epochs"], loss=c0["loss"], progress=progress)
    run.W, run.q_min, run.log_loss = run.W.cpu(), run.q_min.cpu(), run.log_loss.cpu()
    q = y * (X @ run.W.transpose(-1, -2))[..., 0] if linear else y * (torch.relu(X @ run.W.transpose(-1, -2))
                                                                         * u.unsqueeze(1)).sum(-1)
    kkt = kkt_measure(run.W, None if linear else u, X, y, mask, "nnls")  # how near a KKT point (K1)
    out = []
    for e, c in enumerate(cells):
        m, d, n = c["m"], c["d"], 1 if linear else c["width"]
        keep = c.get("store_nets", True)
        cut = (lambda t: t.numpy()) if keep else (lambda t: t[:0].numpy())  # noqa: E731 - empty: not stored
        out.append({
            "m_used": m, "d_used": d, "width_used": n, "nets_stored": int(keep),
            "train_acc": float((q[e, :m] > 0).double().mean()),
            "log10_loss": float(run.log_loss[e]) / math.log(10), "q_min": float(run.q_min[e]),
            "first_below": int(run.first_below[e].cpu()),
            "eps": float(kkt.eps[e]), "eps_rel": float(kkt.eps_rel[e]), "delta": float(kkt.delta[e]),
            "n_support": int(kkt.n_support[e]),
            "mu_norm": mixture.mu_norm(d, c["mu_a"], c["mu_scaling"]) if c["data"] == "d_mg" else math.nan,
            "W": cut(run.W[e, :n, :d]), "b": cut(torch.zeros(n, dtype=torch.float64)), "v": cut(u[e, :n]),
            "X": cut(X[e, :m, :d]), "y": cut(y[e, :m]), "batch_rng_state": states[e].numpy(),
        })
    return out
