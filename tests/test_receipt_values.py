"""Issue 40: a killed run's receipt (flows/result_cache.py) is used only if the store still holds the
values it records. A worker wrote its cell and its receipt, then the run was killed before marking
the cell done; meanwhile a chunk of one variable was lost. The rerun must not mark the cell done from
the receipt (its cell_hash still matches, its values do not): it recomputes it, and the stored
numbers are a clean run's."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from flows import config, experiments, result_cache
from flows.sweep import code_fingerprint, open_store, run, write_bundle
from storage import schema
from storage.query import open_results

pytestmark = pytest.mark.requires_services

CELL = {"experiment": "nonrobust", "name": "lost", "grid": {"seed": [0]},
        "params": {"d": 8, "width": 8, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-8},
        "runner": {"cluster": "inline", "workers": 1}}


def _values(store):
    ds = open_results(store, "lost").load()
    return {v: ds[v].values for v in ds.data_vars if v not in schema.NOT_HASHED}


def test_a_receipt_whose_values_were_lost_since_is_not_used(prefect_server, tmp_path):
    cfg = config.parse(CELL)
    clean = str(tmp_path / "clean.zarr")
    assert run(cfg, clean)["written"] == 1
    store = str(tmp_path / "s.zarr")
    key = result_cache.bundle_key(cfg.experiment, cfg.cells(), cfg.runner["device"], code_fingerprint())
    path = result_cache.path_for(store, cfg.name, key)
    cells = open_store(cfg, store, cfg.runner["device"]).cell_indices()
    results = experiments.get("nonrobust").run_bundle(cfg.cells(), "auto")
    result_cache.save(path, key, write_bundle({"store": store, "group": cfg.name, "indices": cells}, results))
    chunks = [p for p in (pathlib.Path(store) / "lost" / "c_star").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert chunks
    for p in chunks:  # the chunk of c_star holding the cell: lost after the worker's receipt
        os.remove(p)
    stats = run(cfg, store)
    assert (stats["from_cache"], stats["computed"], stats["written"]) == (0, 1, 1), stats
    got, want = _values(store), _values(clean)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
