"""The cell of experiment ``universal_attack`` (paper 002 on a chain): stored nets in (as
``storage.query.load_nets`` gives them), every measure of ``nonrobust``'s analysis out: margins
and margin sets, the universal direction and exact c*, KKT fit, Theorem 4.1's check, the
Theorem 3.1 robust net (``tasks/cells/nonrobust.py::analyse``, unchanged).
"""

from __future__ import annotations

import torch

from tasks import nets
from tasks.cells.nonrobust import analyse


def generators(states: torch.Tensor) -> list[torch.Generator]:
    """CPU generators restored from stored states (E, n) uint8."""
    out = []
    for s in states:
        g = torch.Generator()
        g.set_state(s.to(torch.uint8).clone())  # a copy: set_state on a view of a stack segfaults (torch 2.13)
        out.append(g)
    return out


def attack(W, b, v, X, y, mask, d, m, rng_states, cells: list[dict], progress=None) -> list[dict]:
    """W (E,k,d), b, v (E,k), X (E,m,d), y (E,m), mask (E,m), d, m (E,) true sizes, rng_states
    (E,n) as stored by ``train``; ``cells`` give slack, attack, kkt_max_m (one slack and attack per
    bundle). Padding is zeros, as ``nonrobust`` pads; padded labels are set to 1 as there. ``progress``
    (optional): ``analyse``'s, ``progress(done, ANALYSIS_STEPS)`` (the KKT fit's iterations, mostly)."""
    net = nets.TwoLayer(W.double(), b.double(), v.double())
    y = torch.where(mask, y.double(), torch.ones_like(y, dtype=torch.float64))
    full = [dict(c, d=int(d[e]), m=int(m[e]), alpha=1.0) for e, c in enumerate(cells)]
    return analyse(net, X.double(), y, mask, full, generators(rng_states), progress=progress)
