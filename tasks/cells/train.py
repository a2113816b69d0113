"""The cell of experiment ``train`` (the first stage of a paper-002 chain): a trained stack in,
per cell its training numbers and the net and training set at their true sizes out, so a later
stage (``universal_attack``) analyses exactly the net that ``nonrobust`` would have analysed.

The stack is the one ``tasks/cells/nonrobust.py::build`` pads (zeros past each cell's true m, d,
k); the store pads every cell again with zeros to the group's largest sizes (``Var(pad=0.0)``).
"""

from __future__ import annotations

import torch

from tasks import kkt, nets
from tasks.cells.nonrobust import n_samples


def pack(net: nets.TwoLayer, X: torch.Tensor, y: torch.Tensor, cells: list[dict],
         gens: list[torch.Generator]) -> list[dict]:
    """Per cell: m_used, d_used, width_used, train_acc (fraction of y_i N(x_i) > 0, as
    ``nonrobust`` computes it), the parameters W (k,d), b (k), v (k), the data X (m,d), y (m)
    (float64, CPU; empty when the cell's ``store_nets`` is false), and the state of its minibatch
    generator after training (``random_direction`` continues that stream, as in ``nonrobust``)."""
    q = kkt.margins(net, X, y)
    out = []
    for e, c in enumerate(cells):
        m, d, k = n_samples(c), c["d"], c["width"]
        keep = c.get("store_nets", True)
        cut = (lambda t: t.numpy()) if keep else (lambda t: t[:0].numpy())  # noqa: E731 - empty: not stored
        out.append({
            "m_used": m, "d_used": d, "width_used": k, "nets_stored": int(keep),
            "train_acc": float((q[e, :m] > 0).double().mean()),
            "W": cut(net.W[e, :k, :d]), "b": cut(net.b[e, :k]), "v": cut(net.v[e, :k]),
            "X": cut(X[e, :m, :d]), "y": cut(y[e, :m]),
            "batch_rng_state": gens[e].get_state().numpy(),
        })
    return out
