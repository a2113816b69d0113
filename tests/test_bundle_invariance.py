"""No stored number depends on a cell's bundle mates (issue 12 item 1, issue 11 item 5).

A cell of experiment ``nonrobust`` is run alone and in a bundle with larger cells (larger d,
m and width: zero-padded features, masked samples, all-zero neurons) and every variable
``run_bundle`` returns must agree: float64 to 1e-12 (relative above 1, absolute below), NaN
equal to NaN, integers exactly. ``wall_s`` (wall time) is the one variable left out.
Tiny nets (d <= 20, m <= 12, k <= 16) trained to loss 1e-10 with a fast schedule: seconds.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from conftest import mismatches
from flows import experiments
from tasks import attacks, kkt

EXP = experiments.get("nonrobust")
BASE = {name: p.default for name, p in EXP.params.items()}
TINY = dict(BASE, lr0=1e-2, lr_period=10, target_loss=1e-10, max_iters=4000, kkt_max_m=10)
NOT_INVARIANT = {"wall_s"}  # bundle wall time / cells: a timing, not a result

# case: (the cell, its larger bundle mates, parameters shared by the bundle)
CASES = {
    "sphere": (dict(d=6, m=8, width=12, seed=3),
               [dict(d=12, m=12, width=16, seed=1), dict(d=9, m=11, width=14, seed=2)], {}),
    "random_direction": (dict(d=16, m=10, width=12, seed=3), [dict(d=20, m=12, width=16, seed=5)],
                         {"attack": "random_direction"}),
    "orthogonal_balanced": (dict(d=8, m=4, width=12, seed=0), [dict(d=12, m=6, width=16, seed=1)],
                            {"data": "orthogonal", "labels": "balanced"}),
    "logistic_fast_period": (dict(d=6, m=8, width=12, seed=4), [dict(d=12, m=12, width=16, seed=1)],
                             {"loss": "logistic", "lr_period_fast": 5}),
    "minibatch": (dict(d=6, m=12, width=12, seed=3), [dict(d=10, m=12, width=16, seed=1)],
                  {"batch_size": 5, "kkt_max_m": 12}),  # minibatch bundles share m: padded in d, k only
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.cache
def runs(case: str):
    cell, mates, shared = CASES[case]
    cell = dict(TINY, **shared, **cell)
    mates = [dict(TINY, **shared, **m) for m in mates]
    alone = EXP.run_bundle([cell], "cpu")[0]
    bundled = EXP.run_bundle([mates[0], cell, *mates[1:]], "cpu")
    return cell, mates, alone, bundled[1], bundled


@pytest.mark.parametrize("case", list(CASES))
def test_every_stored_variable_is_the_same_alone_and_bundled(case):
    cell, mates, alone, bundled, everyone = runs(case)
    assert set(alone) == set(EXP.variables), "run_bundle must return every declared variable"
    assert [r["status"] for r in everyone] == [1] * len(everyone), "every net must converge for the test to bite"
    assert mismatches(alone, bundled, skip=NOT_INVARIANT) == {}


def test_small_m_cell_gets_its_kkt_fit_beside_a_cell_above_kkt_max_m():
    """Item 5: the KKT fit is decided per cell, not by the bundle's largest m."""
    cell, mates, alone, bundled, everyone = runs("sphere")
    assert all(m["m"] > cell["kkt_max_m"] >= cell["m"] for m in mates)
    assert math.isfinite(bundled["kkt_eps"]) and math.isfinite(bundled["kkt_eps_proj"])
    assert bundled["kkt_support"] > 0 and np.isfinite(bundled["lam_sample"]).all()
    for r in everyone[:1] + everyone[2:]:
        assert math.isnan(r["kkt_eps"]) and r["kkt_support"] == -1


def test_random_direction_draw_ignores_padding():
    """The random baseline draws at the data's true d (torch's randn(n) takes another path for
    n >= 16, so a draw at the padded d would change the first d numbers)."""
    X = torch.randn(1, 5, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Xp = torch.zeros(1, 7, 33, dtype=torch.float64)
    Xp[:, :5, :20] = X
    z = attacks.DIRECTIONS["random_direction"](None, X, None, None, [torch.Generator().manual_seed(1)])
    zp = attacks.DIRECTIONS["random_direction"](None, Xp, None, None, [torch.Generator().manual_seed(1)])
    torch.testing.assert_close(zp[:, :20], z, rtol=0, atol=0)
    assert zp[:, 20:].abs().max() == 0


def test_theorem_z_is_zero_on_padded_features_when_eta_is_infinite():
    """One class missing from I makes η2 infinite; ||z|| must then be inf alone and padded alike
    (inf·0 on a padded feature used to give NaN)."""
    from tasks.nets import init_two_layer

    g = torch.Generator().manual_seed(0)
    X = torch.randn(1, 4, 5, dtype=torch.float64, generator=g)
    y = torch.ones(1, 4, dtype=torch.float64)
    I = torch.ones(1, 4, dtype=torch.bool)
    net = init_two_layer(5, 6, g, k_pad=6, d_pad=5)
    Xp = torch.zeros(1, 4, 9, dtype=torch.float64)
    Xp[:, :, :5] = X
    netp = type(net)(torch.cat([net.W, torch.zeros(1, 6, 4, dtype=torch.float64)], 2), net.b, net.v)
    d = torch.tensor([5.0], dtype=torch.float64)
    a, b = kkt.theory_check(net, X, y, I, d=d), kkt.theory_check(netp, Xp, y, I, d=d)
    assert float(a.c_bal[0]) == 0 and math.isinf(float(a.z_norm[0]))
    assert float(b.z_norm[0]) == float(a.z_norm[0])
