"""Paper 004 P004-17 ("reconstructions look like averages", F004-2): the K-nearest-mean test of
``tasks.reconstruct.score.knn_averages`` on constructed candidates, its acceptance row from a group
with shift 0.5, and its stored value in a ``reconstruct`` cell."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from tasks.reconstruct import score as S


@pytest.fixture(scope="module")
def points():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1, 30, 200, generator=g, dtype=torch.float64)
    return X, torch.ones(1, 30, dtype=torch.bool), g


def test_P004_17_mean_of_three_points_is_an_average_and_a_noisy_point_is_not(points):
    X, mask, g = points
    avg = X[0, [3, 7, 11]].mean(0)
    near = X[0, 5] + 1e-3 * torch.randn(200, generator=g, dtype=torch.float64)
    Xc = torch.stack([2.5 * avg, 0.2 * near])[None]  # scale must not matter
    closer, ratio, kbest = S.knn_averages(Xc, X, mask, torch.tensor([[0, 1]]))
    assert closer.tolist() == [[True, False]]
    assert float(ratio[0, 0]) < 1e-12 and int(kbest[0, 0]) == 3  # exactly the mean of its 3 nearest
    assert float(ratio[0, 1]) > 1.0


def test_P004_17_padding_and_stacking_change_nothing(points):
    X, mask, g = points
    Xc = torch.randn(1, 8, 200, generator=g, dtype=torch.float64)
    best = torch.arange(8)[None]
    alone = S.knn_averages(Xc, X, mask, best)
    Xp = torch.cat([X, torch.zeros(1, 5, 200, dtype=torch.float64)], 1)
    mp = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], 1)
    two = S.knn_averages(torch.cat([Xc, Xc.flip(1)]), torch.cat([Xp, Xp]), torch.cat([mp, mp]),
                         torch.cat([best, best]))
    torch.testing.assert_close(two[1][0], alone[1][0], rtol=0, atol=1e-13)
    torch.testing.assert_close(two[1][1], alone[1][0].flip(0), rtol=0, atol=1e-13)


def _group(fracs_at_half: list[float]) -> xr.Dataset:
    n = len(fracs_at_half)
    frac = np.array([[0.0] * n, fracs_at_half])  # (shift, restart)
    dims = ("shift", "restart")
    status = xr.DataArray(np.ones((2, n), dtype=np.int8), dims=dims, attrs={"ok_values": [1]})
    ones = (dims, np.ones((2, n)))
    return xr.Dataset({"avg_frac": (dims, frac), "done": (dims, np.ones((2, n), bool)), "status": status,
                       "score5": ones, "objective": ones},
                      coords={"shift": [0.0, 0.5], "restart": list(range(n))})


@pytest.mark.parametrize("fracs,passed", [([0.6, 0.7, 0.2], True), ([0.5, 0.4, 0.9], False)],
                         ids=["P004-17-majority", "P004-17-minority"])
def test_P004_17_acceptance_row(fracs, passed):
    from analysis.acceptance_004 import acceptance

    row = [r for r in acceptance(_group(fracs)) if r.spec_id == "P004-17"][0]
    assert row.passed is passed and row.value == pytest.approx(float(np.median(fracs)), abs=1e-15)


def test_P004_17_not_judged_without_shift_half():
    from analysis.acceptance_004 import acceptance

    ds = _group([0.9, 0.9]).sel(shift=[0.0])
    row = [r for r in acceptance(ds) if r.spec_id == "P004-17"][0]
    assert row.passed is None and "shift 0.5" in row.note
