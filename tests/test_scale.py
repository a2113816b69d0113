"""Sweeps at scale (issue 33): big grids are short to write (``{range: ...}``, ``{linspace: ...}``),
stay small as flow parameters, are planned by ``kktlab run --dry-run`` without starting anything,
and a 10^5-cell group is created without a per-cell task graph (timings: benchmarks/sweep_scale.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.errors import ConfigError
from flows import config
from flows.sweep import open_store

BIG = {"experiment": "forging", "name": "big", "grid": {"model_seed": {"range": [0, 100_000]}},
       "params": {"estimator": "exact", "d": 2}}


def test_range_and_linspace_axes():
    cfg = config.parse(BIG)
    assert cfg.n_cells == 100_000 and cfg.grid["model_seed"][:3] == [0, 1, 2] and cfg.grid["model_seed"][-1] == 99_999
    assert cfg.to_dict()["grid"]["model_seed"] == {"range": [0, 100_000, 1]}  # small as a flow parameter
    assert config.parse(cfg.to_dict()).grid == cfg.grid
    odd = config.parse(dict(BIG, grid={"model_seed": {"range": [3, 40, 4]}}))
    assert odd.grid["model_seed"] == list(range(3, 40, 4))
    lin = config.parse({"experiment": "nonrobust", "grid": {"d": [10], "alpha": {"linspace": [0.5, 1.5, 5]}},
                        "params": {"width": 8}})
    assert lin.grid["alpha"] == [0.5, 0.75, 1.0, 1.25, 1.5]


@pytest.mark.parametrize("axis, field", [({"range": [0]}, "grid.model_seed.range"),
                                         ({"range": [0, 1.5]}, "grid.model_seed.range"),
                                         ({"range": [0, 10**9]}, "grid.model_seed.range"),
                                         ({"range": [5, 0]}, "grid.model_seed.range"),
                                         ({"linspace": [0, 1, 2.5]}, "grid.model_seed.linspace")])
def test_a_bad_range_names_its_field(axis, field):
    with pytest.raises(ConfigError) as err:
        config.parse(dict(BIG, grid={"model_seed": axis}))
    assert err.value.field == field


def test_a_hundred_thousand_cells_group_is_made_from_metadata(tmp_path):
    """One dask chunk per variable in the template: the group's arrays are made without writing or
    graphing a chunk per cell, so the new store holds only metadata and the coordinate."""
    import os

    open_store(config.parse(BIG), tmp_path / "big.zarr", "cpu")
    n_files = sum(len(f) for _, _, f in os.walk(tmp_path / "big.zarr"))
    assert n_files < 100


def test_dry_run_plans_without_starting_anything(tmp_path):
    import yaml

    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(BIG))
    res = subprocess.run([sys.executable, "-m", "kktlab.cli", "run", "--dry-run", str(path), "--store",
                          str(tmp_path / "s.zarr")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("big (forging)"))
    assert "100,000 cells (new group)" in line and "bundles" in line and "files" in line
    assert not (tmp_path / "s.zarr").exists() and "Prefect" not in res.stderr + res.stdout
