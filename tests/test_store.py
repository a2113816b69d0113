"""The store: template, region writes, done mask, refusal to overwrite, identity checks."""

import threading

import numpy as np
import pytest
import xarray as xr

from flows import experiments
from flows.sweep import open_store
from flows import config
from core.errors import StoreError
from storage import schema
from storage.query import open_results, status


def cfg(runner=None, **params):
    raw = {"experiment": "nonrobust", "grid": {"d": [10, 20, 30], "seed": [0, 1]}, "params": {"width": 8, **params},
           "runner": runner or {}}
    return config.parse(raw)


def fake_values(exp, m):
    out = {}
    for name, var in exp.variables.items():
        out[name] = np.arange(m, dtype=var.dtype) if var.dims else np.asarray(7, dtype=var.dtype)
    return out


def test_template_schema(tmp_path):
    c = cfg()
    store = open_store(c, tmp_path / "s.zarr", "cpu")
    ds = open_results(tmp_path / "s.zarr")
    assert ds.sizes == {"d": 3, "seed": 2, "sample": 30}
    assert list(ds.d.values) == [10, 20, 30] and list(ds.seed.values) == [0, 1]
    for name, var in c.exp.variables.items():
        assert ds[name].attrs["units"] == schema.cf_units(var.units, var.description)[0] and ds[name].attrs["description"]
        assert ds[name].dims == ("d", "seed", *var.dims)
        assert ds[name].encoding["chunks"][:2] == store.block() == (1, 2)  # a chunk per block: the seeds of a d
    assert not ds.done.any() and np.isnan(ds.c_star).all()
    for key in ("config", "versions", "git_commit", "device", "created"):
        assert key in ds.attrs
    assert store.done_mask().shape == (3, 2)


def test_write_cell_then_refuse_overwrite(tmp_path):
    c = cfg()
    store = open_store(c, tmp_path / "s.zarr", "cpu")
    vals = fake_values(c.exp, 20)
    assert store.write_cell((1, 0), vals)
    assert not store.write_cell((1, 0), {k: v * 0 for k, v in vals.items()})  # refused, unchanged
    ds = open_results(tmp_path / "s.zarr")
    assert bool(ds.done[1, 0]) and int(ds.done.sum()) == 1
    assert float(ds.c_star[1, 0]) == 7
    r = ds.r_sample[1, 0].values
    np.testing.assert_array_equal(r[:20], np.arange(20)) and np.isnan(r[20:]).all()
    assert store.write_cell((1, 0), {k: v * 0 for k, v in vals.items()}, force=True)
    assert float(open_results(tmp_path / "s.zarr").c_star[1, 0]) == 0


def test_other_experiment_or_grid_in_same_group_is_refused(tmp_path):
    open_store(cfg(), tmp_path / "s.zarr", "cpu")
    with pytest.raises(StoreError, match="params.width"):
        open_store(cfg(width=9), tmp_path / "s.zarr", "cpu")
    other = config.parse({"experiment": "nonrobust", "grid": {"d": [10], "seed": [0]}, "params": {"width": 8}})
    with pytest.raises(StoreError, match="grid.d"):
        open_store(other, tmp_path / "s.zarr", "cpu")


def test_non_store_directory_is_refused(tmp_path):
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "file.txt").write_text("x")
    with pytest.raises(StoreError, match="not a Zarr store"):
        open_store(cfg(), tmp_path / "notastore", "cpu")


def test_two_groups_written_concurrently_lose_nothing(tmp_path):
    """Two experiments (groups) in one store, written from two threads at once."""
    path = tmp_path / "s.zarr"
    c1 = cfg()
    c2 = config.parse({"experiment": "nonrobust", "name": "other", "grid": {"d": [10, 20, 30], "seed": [0, 1]},
                       "params": {"width": 16}})
    stores = [open_store(c, path, "cpu") for c in (c1, c2)]

    def fill(store, val):
        for idx in store.cell_indices():
            v = fake_values(c1.exp, 10)
            v["c_star"] = np.asarray(val + idx[0] * 10 + idx[1])
            store.write_cell(idx, v)

    threads = [threading.Thread(target=fill, args=(s, 100 * (i + 1))) for i, s in enumerate(stores)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i, name in enumerate(("nonrobust", "other")):
        ds = open_results(path, name)
        assert bool(ds.done.all())
        expect = 100 * (i + 1) + np.arange(3)[:, None] * 10 + np.arange(2)[None, :]
        np.testing.assert_array_equal(ds.c_star.values, expect)
    assert {r["group"]: r["done"] for r in status(path)} == {"nonrobust": 6, "other": 6}
    assert isinstance(xr.open_zarr(path, group="other", consolidated=False), xr.Dataset)


def test_bundles_share_shapes_and_bound_padding():
    from flows.bundles import make_bundles

    exp = experiments.get("nonrobust")
    c = config.parse({"experiment": "nonrobust", "grid": {"d": [10, 20, 200], "seed": [0, 1, 2], "loss": ["exp", "logistic"]},
                      "params": {"width": 8}})
    items = list(enumerate(c.cells()))
    bundles = make_bundles(exp, items, bundle_size=4)
    seen = sorted(i for b in bundles for i, _ in b)
    assert seen == list(range(len(items)))  # every cell exactly once
    for b in bundles:
        assert len(b) <= 4 and len({cell["loss"] for _, cell in b}) == 1
        costs = [exp.cost(cell) for _, cell in b]
        assert len(b) * max(costs) <= 2 * sum(costs)


def test_bundles_fit_the_memory_budget():
    from flows.bundles import make_bundles

    exp = experiments.get("nonrobust")
    c = config.parse({"experiment": "nonrobust", "grid": {"seed": list(range(10))}, "params": {"width": 100, "d": 50}})
    items = list(enumerate(c.cells()))
    per_cell = exp.memory(c.cells()[0])
    bundles = make_bundles(exp, items, bundle_size=64, memory_budget=3.5 * per_cell)
    assert [len(b) for b in bundles] == [3, 3, 3, 1]


def test_bundles_spread_over_workers():
    from flows.bundles import make_bundles

    exp = experiments.get("nonrobust")
    c = config.parse({"experiment": "nonrobust", "grid": {"seed": list(range(10))}, "params": {"width": 8}})
    items = list(enumerate(c.cells()))
    assert [len(b) for b in make_bundles(exp, items, bundle_size=64, workers=1)] == [10]
    assert [len(b) for b in make_bundles(exp, items, bundle_size=64, workers=4)] == [3, 3, 3, 1]


def test_status_of_a_store_not_created_yet_says_so(tmp_path, capsys):
    """Issue 17: a store a queued run has not created yet is 'no store yet', not a damaged store."""
    from kktlab.cli import main

    assert main(["status", str(tmp_path / "queued.zarr")]) == 3
    assert "no store yet" in capsys.readouterr().out
    (tmp_path / "starting.zarr.partial").mkdir()
    assert main(["status", str(tmp_path / "starting.zarr")]) == 3
    assert "being created" in capsys.readouterr().out


@pytest.mark.parametrize("value,ok", [(None, True), (12345, False)], ids=["new param at its default", "new param set"])
def test_a_param_newer_than_the_group_matches_at_its_default(tmp_path, value, ok):
    """A group made before a parameter existed (its identity lacks it) reopens when the config leaves
    that parameter at its default (new parameters keep the old behaviour by default); a config that
    sets it to anything else is refused, naming the field."""
    import json

    c = cfg()
    st = open_store(c, str(tmp_path / "s.zarr"), "cpu")
    g = st.group("r+")
    ident = json.loads(g.attrs["kktlab_identity"])
    newest = "max_iters"  # a parameter the config leaves at its default
    assert ident["params"][newest] == c.exp.params[newest].default
    del ident["params"][newest]  # as the group was made before `newest` was a parameter
    g.attrs["kktlab_identity"] = json.dumps(ident, sort_keys=True)
    if ok:
        open_store(c, str(tmp_path / "s.zarr"), "cpu")
        return
    bad = config.parse(dict(c.to_dict(), params=dict(c.to_dict()["params"], **{newest: value})))
    with pytest.raises(StoreError, match=f"params.{newest}"):
        open_store(bad, str(tmp_path / "s.zarr"), "cpu")


def test_status_shows_the_pace_and_an_eta_from_the_stored_cells(tmp_path, capsys):
    """``kktlab status`` on a part-done group: the pace of its current run and an ETA, from when the
    cells' own ``done`` chunks were written (storage/pace.py): the first bundle's cells start the
    clock, a pause of over half an hour starts a new run, and a run of one bundle has no ETA yet."""
    import os
    import re
    import time

    from kktlab.cli import main
    from storage import pace, schema

    c = cfg(runner={"chunk_cells": 1})  # a chunk per cell: a time per cell (a block's cells share theirs)
    path = tmp_path / "s.zarr"
    store = open_store(c, path, "cpu")
    vals = fake_values(c.exp, 30)
    cells = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    for idx in cells:
        assert store.write_cell(idx, vals)
    now = time.time()
    group = status(path)[0]["group"]
    when = {(0, 0): now - 7200, (0, 1): now - 130, (1, 0): now - 127, (1, 1): now - 70, (2, 0): now - 10}
    for (i, j), t in when.items():  # an old run, then a bundle of two, then one cell a minute
        os.utime(path / group / schema.DONE / "c" / str(i) / str(j), (t, t))
    p = pace.pace(path, group, 5, now=now)
    assert (p.done, p.total) == (5, 6) and abs(p.last_age_s - 10) < 1e-6
    assert abs(p.rate - 2 / 130) < 1e-9 and abs(p.eta_s - 65) < 1e-6  # 2 cells after the first bundle, 130 s since it
    assert pace.pace(path, group, 4, now=now).eta_s == 2 / p.rate  # a damaged done cell is one more to compute
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out
    # the CLI's clock has moved on a little since ``now``: the numbers above, to the second
    assert re.search(r"pace 0\.9\d* cells/min, last cell stored 1\d s ago, ETA ~6\d s for 1 cells", out), out
    for idx in cells[2:]:  # now the last run stored one bundle (two cells), after a pause: no rate yet
        os.utime(path / group / schema.DONE / "c" / str(idx[0]) / str(idx[1]), (now - 7200, now - 7200))
    assert pace.pace(path, group, 5, now=now).rate is None
    assert main(["status", str(path)]) == 0
    assert "too early for an ETA" in capsys.readouterr().out


def test_a_store_made_before_blocks_keeps_its_chunk_per_cell_and_resumes(tmp_path):
    """Issue 33: a group without ``kktlab_block`` (made before blocks, a chunk per cell) reads its
    block from its ``done`` chunks, is bundled cell by cell and takes new cells without re-chunking."""
    from flows.bundles import make_bundles

    c = cfg(runner={"chunk_cells": 1})
    store = open_store(c, tmp_path / "s.zarr", "cpu")
    g = store.group("r+")
    del g.attrs["kktlab_block"]  # as a store made before blocks
    assert store.block() == (1, 1)
    vals = fake_values(c.exp, 30)
    assert all(store.mark_many([(0, 0), (2, 1)], store.write_many([(0, 0), (2, 1)], [vals, vals])))
    reopened = open_store(cfg(), tmp_path / "s.zarr", "cpu")  # a rerun (default chunk_cells): the group keeps its layout
    assert reopened.block() == (1, 1) and reopened.verify(c.exp).ok
    todo = [(idx, cell) for idx, cell, d in zip(reopened.cell_indices(), c.store_cells(), reopened.done_mask().ravel())
            if not d]
    bundles = make_bundles(c.exp, todo, 64, block=reopened.block())
    assert sorted(idx for b in bundles for idx, _ in b) == [(0, 1), (1, 0), (1, 1), (2, 0)]


def test_status_and_run_summary_count_cells_left_out_by_status(tmp_path, capsys):
    """Issue 39: done cells whose ``status`` is not ok (a diverged attack or training, stored as
    not-a-result) are counted by status value and named by the experiment's status labels in
    ``kktlab status`` and the run summary; failed cells (status never written) are not among them."""
    from kktlab import cli
    from kktlab.status_lines import left_out
    from storage.query import left_out_by_status

    c = cfg()
    path = tmp_path / "s.zarr"
    store = open_store(c, path, "cpu")
    vals = fake_values(c.exp, 30)
    for idx, st in {(0, 0): 1, (0, 1): 4, (1, 0): 4, (1, 1): 2, (2, 0): 1}.items():  # converged, diverged, max_iters
        assert store.write_cell(idx, dict(vals, status=np.asarray(st, dtype=np.int8)))
    assert store.write_failed((2, 1), "boom")
    group = status(path)[0]["group"]
    assert left_out_by_status(path, group) == {2: 1, 4: 2}
    assert left_out(str(path), group, "nonrobust") == "1 max_iters, 2 diverged"
    assert cli.main(["status", str(path)]) == 0
    assert "(1 max_iters, 2 diverged: done, left out by status)" in capsys.readouterr().out
    stats = dict(total=6, done_before=0, written=6, from_cache=0, damaged_recomputed=0, stale_recomputed=0, failed=1,
                 refused_done=0, bundles=1, wall_s=0.0, failures=[])
    cli._print_stage(c, str(path), stats, "")
    assert "  left out by status: 1 max_iters, 2 diverged (stored as not-a-result;" in capsys.readouterr().out
