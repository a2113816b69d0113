"""The cell of experiment ``adv_train`` (paper 003 §5.2 / Alg. 1; spec 003 §2.9; E4, E5, X1): one
projected adversarial training per cell, the bundle's (V, R, seed) cells stacked on the model axis;
per cell the best-RTA net, its init, the data, the training history, and whether training moved the
net at all (``train_status``, issue 28 item 9)."""

from __future__ import annotations

import math

import torch

from tasks.cells.lazy_train import has_bias, init_stack
from tasks.nets import TwoLayer
from tasks.nets.lazy import deviation_C0
from tasks.train import projected_adv_train

TRAINED, RETURNED_INIT = 0, 1  # train_status codes (flows/experiments/adv_train.py declares them)


def train_status(best_epoch: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """best_epoch (E,), U (E,m,d) the returned deviation W - W0 -> (E,) int: ``RETURNED_INIT``
    where the returned iterate is W0 (its best round is 0, e.g. a patience stop with robust train
    accuracy 0 at W0 and after one epoch, or U = 0 exactly), else ``TRAINED``."""
    at_init = (best_epoch.cpu() == 0) | (U.flatten(1).abs().amax(1).cpu() == 0)
    return torch.where(at_init, RETURNED_INIT, TRAINED)


def run(cells: list[dict], X: torch.Tensor, y: torch.Tensor, Xt: torch.Tensor, yt: torch.Tensor,
        device: torch.device, chunk: int = 4096, progress=None) -> list[dict]:
    """X (n,d), y (n), Xt, yt float64 prepared rows; cells share (data, variant, d, m, T1_max, ...);
    ``chunk`` training points per PGD chunk; ``progress`` the optional ``progress(done, of)`` of
    :func:`tasks.train.projected_adv_train`."""
    c0 = cells[0]
    dtype = getattr(torch, c0["dtype"])
    d, m = c0["d"], c0["m"]
    bias = has_bias(c0)
    W0, v, b0, gens = init_stack([c["seed"] for c in cells], d, m, bias, dtype, device)
    V = torch.tensor([float(c["V"]) for c in cells], dtype=dtype, device=device)
    R = torch.tensor([float(c["R"]) for c in cells], dtype=dtype, device=device)
    run_ = projected_adv_train(W0, v, b0, X.to(device, dtype), y.to(device, dtype), V, R, gens,
                               T1_max=c0["T1_max"], T2=c0["T2_train"] or c0["T2"], beta=c0["beta"],
                               batch_size=c0["batch_size"], reduction=c0["reduction"], projection=c0["projection"],
                               patience=c0["patience"], chunk=chunk,
                               pgd_step=c0.get("pgd_step", "normalised"), progress=progress)
    cpu = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
    W0, v, b0, U = cpu(W0), cpu(v), cpu(b0), cpu(run_.U)
    net = TwoLayer(W0 + U, b0, v)
    f_te = net(Xt[None].expand(len(cells), -1, -1))
    status = train_status(run_.best_epoch, U)
    out = []
    for e, c in enumerate(cells):
        keep = c.get("store_nets", True)
        cut = (lambda t: t.numpy()) if keep else (lambda t: t[:0].numpy())  # noqa: E731
        out.append({
            "rta_train": float(run_.rta_train[e]), "best_epoch": int(run_.best_epoch[e]), "epochs": int(run_.epochs[e]),
            "train_status": int(status[e]),
            "rta_train_hist": run_.hist[e].double().numpy(), "C0": float(c["V"]) * math.sqrt(m),
            "C0_reached": float(deviation_C0(U[e][None])[0]),
            "clean_acc": float((yt * f_te[e] > 0).double().mean()),
            "R_train": float(c["R"]), "V_train": float(c["V"]),
            "m_used": len(y), "d_used": d, "width_used": m, "n_test_used": len(yt), "nets_stored": int(keep),
            "W": cut(net.W[e]), "b": cut(net.b[e]), "v": cut(net.v[e]),
            "batch_rng_state": gens[e].get_state().numpy(),
        })
    return out
