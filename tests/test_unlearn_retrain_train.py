"""``retrain`` for ``train``'s nets (issue 39): the unlearning reference "the net trained again without
the point" for paper 002 / 004's nets (W, b, v trained), by the producer's own training
(flows/experiments/train.py ``retrain``): the same init, data and schedule, the forgotten points
masked out of the full-batch loss. Checked against the stored net (nothing dropped: bit for bit) and
against training on the set with the point removed (an independent stack: to round-off), then through
``unlearn_full`` (the same retrained net at every α, judged on the retained set)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

SIZE = dict(data="unit_sphere", labels="sign_x1", d=16, m=4, width=20, init_scale=0.01, lr0=0.05, lr_factor=1.2,
            lr_period=50, target_loss=1e-8, max_iters=1000)


@pytest.fixture(scope="module")
def trained():
    """Two ``train`` cells as run, and their stored nets (the experiment's bundle)."""
    from flows.experiments import train

    cells = [{p: q.default for p, q in train.P.items()} | SIZE | {"seed": s} for s in (0, 1)]
    out = train.run_bundle(cells)
    stack = lambda k: torch.stack([torch.as_tensor(o[k]) for o in out]).double()  # noqa: E731
    return cells, out, {k: stack(k) for k in ("W", "b", "v", "X", "y")}


def test_retrain_dropping_nothing_is_the_stored_net_bit_for_bit(trained):
    from flows.experiments import train

    cells, _, net = trained
    W, b, v = train.retrain(cells, torch.zeros(2, 4, dtype=torch.bool), net["W"])
    assert torch.equal(W, net["W"]) and torch.equal(b, net["b"]) and torch.equal(v, net["v"])


def test_retrain_without_a_point_is_training_on_the_set_without_it(trained):
    from flows.experiments import train
    from tasks import train as gd
    from tasks.cells import nonrobust

    cells, _, net = trained
    drop = torch.zeros(2, 4, dtype=torch.bool)
    drop[:, 0] = True
    W, b, v = train.retrain(cells, drop, net["W"])
    init, X, y, mask, _ = nonrobust.build(cells)  # the same init and data; the point removed, not masked
    ref = gd.train(init, X[:, 1:].clone(), y[:, 1:].clone(), nonrobust.schedule(cells[0]), mask=mask[:, 1:].clone())
    assert float((W - ref.net.W.double()).abs().max()) < 1e-12
    assert float((v - ref.net.v.double()).abs().max()) < 1e-12
    assert float((W - net["W"]).abs().max()) > 0.1  # and it is another net than the one trained with the point


def test_unlearn_full_stores_the_retrained_net_at_every_alpha(trained):
    from flows.experiments import train, unlearn
    from tasks.cells.unlearn_full import unlearn_full

    cells, out, net = trained
    ucells = [{p: q.default for p, q in unlearn.P.items()} | {"unlearn_method": "retrain", "alpha": a, "forget": 0}
              for a in (0.5, 1.0)] * 2
    keys = ["net0", "net0", "net1", "net1"]
    rep = lambda t: t[[0, 0, 1, 1]]  # noqa: E731
    full = lambda k, n: torch.full((4,), n)  # noqa: E731
    res = unlearn_full(rep(net["W"]), rep(net["b"]), rep(net["v"]), rep(net["X"]), rep(net["y"]),
                       torch.ones(4, 4, dtype=torch.bool), full("d", 16), full("m", 4), full("width", 20),
                       torch.zeros(4, 8, dtype=torch.uint8), keys, ucells,
                       retrain=lambda rows, drop: train.retrain([cells[r // 2] for r in rows], drop, net["W"]))
    drop = torch.zeros(2, 4, dtype=torch.bool)
    drop[:, 0] = True
    W, _, _ = train.retrain(cells, drop, net["W"])
    for i, r in enumerate(res):
        np.testing.assert_array_equal(r["W"], W[i // 2].numpy())  # the same net at α 0.5 and 1
        assert r["forgotten"].tolist() == [1, 0, 0, 0]
    assert res[0]["eps_rel"] == res[1]["eps_rel"] and np.isfinite(res[0]["eps_rel"])
