"""Paper 000 (forging) cells are bundled so a sweep is a handful of task runs (issue 17): cells run
one after another in a bundle (``Experiment.stacked`` False), a few bundles per worker cut by summed
cost, and each cell's numbers are the ones it gets when run alone."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from flows import config, experiments
from flows.bundles import BUNDLES_PER_WORKER, bundle_name, make_bundles

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORGING_CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("paper-000-*.yaml")
                         if config.load(p).stages[0].experiment == "forging") + ["quickstart-forging.yaml"]


def _bundles(name: str, workers: int = 2):
    stage = config.load(ROOT / "configs" / name).stages[0]
    items = [((i,), cell) for i, cell in enumerate(stage.cells())]
    return stage, items, make_bundles(stage.exp, items, stage.runner["bundle_size"], workers=workers)


@pytest.mark.parametrize("name", FORGING_CONFIGS)
def test_forging_sweep_is_a_handful_of_bundles_each_cell_once_in_grid_order(name):
    stage, items, bundles = _bundles(name)
    assert len(bundles) <= max(2 * BUNDLES_PER_WORKER, math.ceil(len(items) / stage.runner["bundle_size"]))
    assert [it for b in bundles for it in b] == items  # every cell once, contiguous runs of the grid order
    assert all(0 < len(b) <= stage.runner["bundle_size"] for b in bundles)


def test_the_144_cell_probability_sweep_is_8_balanced_named_tasks():
    stage, items, bundles = _bundles("paper-000-probability.yaml")
    assert len(items) == 144 and len(bundles) == 2 * BUNDLES_PER_WORKER
    costs = [sum(stage.exp.cost(cell) for _, cell in b) for b in bundles]
    assert max(costs) <= 1.25 * np.mean(costs)  # measured 1.05
    names = [bundle_name(stage.name, list(stage.grid), [cell for _, cell in b]) for b in bundles]
    assert all(n.startswith("forging-probability domain=") and n.endswith("cells)") for n in names), names


def test_stacked_experiments_keep_the_padding_rule():
    """Only forging opts out; the padding rule of stacked experiments is tests/test_store.py's."""
    assert not experiments.get("forging").stacked
    assert all(experiments.get(n).stacked for n in experiments.names() if n != "forging")


CELLS = [dict(model="linreg", d=2, eps=0.3, estimator="exact", label="integrated"),
         dict(model="linreg", d=3, eps=0.3, estimator="naive_mc", n_samples=2000, seed=1),
         dict(model="linreg", d=2, eps=0.01, estimator="subset_simulation", n_samples=500, n_repeats=10),
         dict(model="relu1", d=2, eps=0.1, width=4, estimator="naive_mc", n_samples=2000, domain="cylinder")]


def test_a_bundle_of_mixed_forging_cells_equals_each_cell_run_alone(one_torch_thread):
    """The worker's task function (flows.sweep.run_bundle) on one bundle of 4 cells of 3 estimators,
    2 models and 2 domains vs each cell alone: every stored number identical (wall time aside)."""
    from flows.sweep import run_bundle

    cells = [dict(c) for c in config.parse({"experiment": "forging", "name": "m", "grid": {"d": [2]}}).cells()]
    defaults = cells[0]
    full = [dict(defaults, **c) for c in CELLS]
    together = run_bundle.fn("forging", full, "cpu")
    alone = [run_bundle.fn("forging", [c], "cpu")[0] for c in full]
    assert len(together) == len(alone) == 4
    for i, (got, ref) in enumerate(zip(together, alone)):
        assert set(got) == set(ref)
        for key in sorted(set(ref) - {"wall_time"}):
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(ref[key]), err_msg=f"cell {i} {key}")
