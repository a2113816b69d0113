"""Sweeps at scale (issue 33): big grids are short to write (``{range: ...}``, ``{linspace: ...}``),
stay small as flow parameters, are planned by ``kktlab run --dry-run`` without starting anything,
and a 10^5-cell group is created without a per-cell task graph (timings: benchmarks/sweep_scale.py)."""

from __future__ import annotations

import os
import re
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


def test_too_many_cells_are_refused_before_any_value_is_made(monkeypatch):
    """Issue 42: the cells are counted from the axes as written (a range's length, not its values):
    a 10^7-cell grid is refused naming its sizes before one value is expanded or checked (it was
    refused after 171 s and 1.26 GB); within the limit (--max-cells) the axes are expanded as before."""
    from flows import config_axes

    big = dict(BIG, grid={"model_seed": {"range": [0, 5_000_000]}, "d": [2, 3]})
    big["params"] = {"estimator": "exact"}
    expanded = []
    monkeypatch.setattr(config, "axis_values", lambda f, v: expanded.append(f) or config_axes.axis_values(f, v))
    with pytest.raises(ConfigError) as err:
        config.parse(big)
    assert err.value.field == "grid" and "10,000,000 cells (5000000 model_seed x 2 d)" in str(err.value)
    assert expanded == []
    small = dict(big, grid={"model_seed": {"range": [0, 50]}, "d": [2, 3]})
    assert config.parse(small).n_cells == 100 and expanded == ["grid.model_seed", "grid.d"]
    with pytest.raises(ConfigError, match="100 cells"):
        config.parse(dict(small, runner={"max_cells": 99}))


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


def test_a_store_holds_a_few_files_per_block_and_the_dry_run_counts_them(tmp_path):
    """Issue 33 item 1: chunks hold a block of cells (storage/blocks.py), so 3,000 written cells of
    ~30 variables are ~100 files, not one per cell and variable; ``--dry-run`` predicts the count."""
    import numpy as np

    from kktlab.plan import stage_plan

    cfg = config.parse(dict(BIG, grid={"model_seed": {"range": [0, 4000]}}, runner={"bundle_size": 2000}))
    store = open_store(cfg, tmp_path / "s.zarr", "cpu")
    assert store.block() == (2000,)
    extra = cfg.extra_sizes()
    vals = {name: np.zeros([extra[d] for d in var.dims], dtype=var.dtype) for name, var in cfg.exp.variables.items()}
    cells = store.cell_indices()
    hashes = store.write_many(cells, [vals] * len(cells))
    assert all(store.mark_many(cells, hashes)) and store.verify(cfg.exp).ok
    n_files = sum(len(f) for _, _, f in os.walk(tmp_path / "s.zarr"))
    # the plan counts every chunk; ``failed``'s (one a block) are written only once a cell fails; the
    # store adds its root zarr.json
    assert n_files == stage_plan(cfg, str(tmp_path / "none.zarr"))["files"] - len(cells) // 2000 + 1
    assert n_files < 0.05 * len(cells)


@pytest.mark.parametrize("stacked", [True, False])
def test_bundles_are_cut_from_whole_blocks(stacked):
    """A block's cells (a chunk of every array, storage/blocks.py) always go to one bundle, so no two
    bundles ever write one chunk; a block is the smallest bundle, even under a smaller bundle_size."""
    import dataclasses

    from flows import experiments
    from flows.bundles import make_bundles

    exp = dataclasses.replace(experiments.get("nonrobust"), stacked=stacked)
    base = {n: prm.default for n, prm in exp.params.items()}
    cells = [((d, s), dict(base, d=10 * (d + 1), seed=s, width=8)) for d in range(3) for s in range(5)]
    for size in (1, 3, 4, 7):
        bundles = make_bundles(exp, cells, size, block=(1, 4), workers=2)
        assert sorted(idx for b in bundles for idx, _ in b) == sorted(idx for idx, _ in cells)
        blocks_of = {}
        for i, b in enumerate(bundles):
            for (d, s), _ in b:
                assert blocks_of.setdefault((d, s // 4), i) == i, (size, bundles)


def test_a_chain_opens_its_groups_in_the_blocks_the_dry_run_plans(tmp_path):
    """A reading stage's group is chunked within its upstream group's block (flows/bundles.py
    ``block_for``) when ``kktlab run`` makes the groups, before any server (``open_stores``): pipeline-small's
    readers of ``unlearned`` (block (1, 1, 2)) hold both α of a net in one chunk, as ``--dry-run`` plans
    (its file and bundle counts come from these blocks). Made without the upstream's block, they were
    (1, 1, 1, 2): twice the bundles the plan said (18 per reader, not 9)."""
    import pathlib

    from flows.sweep import open_stores
    from kktlab.plan import print_plan, stage_plan

    cfg = config.load(pathlib.Path(__file__).resolve().parents[1] / "configs" / "pipeline-small.yaml")
    stores = dict(zip([s.name for s in cfg.stages], open_stores(cfg.stages, str(tmp_path / "p.zarr"))))
    planned, ups = {}, {}
    for stage in cfg.stages:
        row = stage_plan(stage, str(tmp_path / "none.zarr"), *ups.get(stage.source, (None, None, None)))
        ups[stage.name] = (tuple(row["block"]), row["bundle_cells"], stage)
        planned[stage.name] = (tuple(row["block"]), row["bundles"])
    assert {name: s.block() for name, s in stores.items()} == {name: b for name, (b, _) in planned.items()}
    assert stores["recon"].block() == (1, 1, 2, 2) and stores["unlearned"].block() == (1, 1, 2)
    # the run's bundles (pipeline-small, measured: 2, 9 and 9 per reader) and the printed plan
    assert [n for _, n in planned.values()] == [2, 9, 9, 9, 9, 9, 9]
    import io

    out = io.StringIO()
    print_plan([cfg], [str(tmp_path / "none.zarr")], out=out)
    assert "recon (reconstruct): 36 cells (new group), ~9 bundles" in out.getvalue()
    # a reader declares no memory of its own: at least the largest net it reads, through a reader of a reader
    # (issue 45: "largest cell unknown" for every reading stage); the train_kkt stage's own estimate is that net
    nets = re.search(r"nets \(train_kkt\): .*largest cell ([0-9.,]+ [KMG]?B) ", out.getvalue()).group(1)
    for reader in ("unlearned (unlearn)", "recon (reconstruct)", "forge (forge_net)"):
        assert re.search(re.escape(reader) + r": .*largest cell at least " + re.escape(nets) + r" \(the largest net it reads",
                         out.getvalue()), reader
