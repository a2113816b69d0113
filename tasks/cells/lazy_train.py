"""The cell of experiment ``lazy_train`` (paper 003 §5.1; spec 003 §2.6): one lazy-SGD trajectory
per seed of the bundle, a snapshot for every C0 of the bundle from that one trajectory, and per
cell the net, its init W0, the training and test sets and the per-model numbers of spec 003 §2.11.

A bundle shares (data, variant, d, m, ...): its models stack on a leading axis (one per seed).
"""

from __future__ import annotations

import math

import torch

from tasks.data.images import downsample, variant
from tasks.nets import TwoLayer
from tasks.nets.lazy import cone_C0, deviation_C0, init_lazy
from tasks.train import lazy_sgd
from tasks.train.lazy_sgd import mean_logistic_loss

BATCH_STREAM = 1_000_003  # the batch-order generator of seed s is seeded with s + this (init uses s)


def has_bias(cell: dict) -> bool:
    """``bias: auto`` is on for raw inputs (Figs 2/3) and off for unit-norm ones (Figs 4-6), spec 003 §2.2."""
    return cell["bias"] == "on" or (cell["bias"] == "auto" and cell["variant"] == "raw")


def prepare(images: torch.Tensor, cell: dict) -> torch.Tensor:
    """Images (n,h,w) in [0,1] -> rows (n,d) of the cell's variant (spec 003 §2.5)."""
    return variant(downsample(images, cell["d"], cell["resample"]), cell["variant"])


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """(init, batch order) generators of one seed (spec 003 §6 #24: W0, a and the order vary)."""
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + BATCH_STREAM)


def init_stack(seeds: list[int], d: int, m: int, bias: bool, dtype, device):
    """W0 (E,m,d), v (E,m), b0 (E,m) and the batch generators of the seeds."""
    parts, gens = [], []
    for s in seeds:
        g_init, g_batch = generators(s)
        parts.append(init_lazy(d, m, g_init, bias=bias, dtype=dtype, device=device))
        gens.append(g_batch)
    W0, v, b0 = (torch.stack(t) for t in zip(*parts))
    return W0, v, b0, gens


def run(cells: list[dict], X: torch.Tensor, y: torch.Tensor, Xt: torch.Tensor, yt: torch.Tensor,
        device: torch.device, progress=None) -> list[dict]:
    """X (n,d), y (n), Xt (nt,d), yt (nt) float64 (prepared); every cell shares the bundle's
    (data, variant, d, m, lr, batch_size, max_steps); cells differ in seed and C0. ``progress``: the
    optional ``progress(done, of, loss)`` of :func:`tasks.train.lazy_sgd`."""
    c0 = cells[0]
    dtype = getattr(torch, c0["dtype"])
    d, m = c0["d"], c0["m"]
    seeds = sorted({c["seed"] for c in cells})
    C0s = sorted({float(c["C0"]) for c in cells})
    bias = has_bias(c0)
    exit_rule = c0.get("exit_rule", True)  # false (X4): no exit, every cell gets the iterate at max_steps
    W0, v, b0, gens = init_stack(seeds, d, m, bias, dtype, device)
    run_ = lazy_sgd(W0, v, b0, X.to(device, dtype), y.to(device, dtype), C0s if exit_rule else [math.inf], gens, lr=c0["lr"],
                    batch_size=c0["batch_size"], max_steps=c0["max_steps"], train_bias=bias,
                    reduction=c0["reduction"], progress=progress)
    cpu = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
    W0, v, U, B = cpu(W0), cpu(v), cpu(run_.U), cpu(run_.b)
    out = []
    for c in cells:
        e, j = seeds.index(c["seed"]), C0s.index(float(c["C0"])) if exit_rule else 0
        net = TwoLayer((W0[e] + U[e, j])[None], B[e, j][None], v[e][None])
        f_tr, f_te = net(X[None])[0], net(Xt[None])[0]
        keep = c.get("store_nets", True)
        cut = (lambda t: t.numpy()) if keep else (lambda t: t[:0].numpy())  # noqa: E731 - empty: not stored
        out.append({
            "exited": int(run_.exited[e, j]), "steps": int(run_.steps[e, j]),
            "C0_reached": float(deviation_C0(U[e, j][None])[0]),
            "C0_cone": float(cone_C0(net.W, W0[e][None])[0]) if not bias else float("nan"),
            "V": float(c["C0"]) / math.sqrt(m),
            "test_acc": float((yt * f_te > 0).double().mean()), "train_acc": float((y * f_tr > 0).double().mean()),
            "train_loss": float(mean_logistic_loss(f_tr, y)),
            "m_used": len(y), "d_used": d, "width_used": m, "n_test_used": len(yt), "nets_stored": int(keep),
            "W": cut(net.W[0]), "b": cut(net.b[0]), "v": cut(net.v[0]),
            "batch_rng_state": gens[e].get_state().numpy(),
        })
    return out
