"""Hand edits of stored values are found (issue 29 item 4): `verify` recomputes each done cell's
content hash from what is stored and names the cell whose values no longer match the cell_hash
written with them; the next run recomputes it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from flows import config
from flows.sweep import run as run_sweep
from storage.verify import verify_group

pytestmark = pytest.mark.requires_services

RAW = {"name": "tamper", "runner": {"cluster": "inline", "workers": 1, "bundle_size": 2}, "stages": [
    {"name": "nets", "experiment": "train_kkt", "grid": {"seed": [0, 1]},
     "params": {"d": 8, "m": 4, "width": 4, "epochs": 20}}]}


@pytest.fixture(scope="module")
def made(prefect_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("tamper") / "s.zarr"
    run_sweep(config.parse(RAW), str(path))
    assert verify_group(path, "nets").damaged == 0
    return path


@pytest.fixture
def store(made, tmp_path):
    shutil.copytree(made, tmp_path / "s.zarr")
    return tmp_path / "s.zarr"


@pytest.mark.parametrize("name, edit", [("W", lambda a: a + 1e-9), ("m_used", lambda a: a - 1)], ids=["W", "m_used"])
def test_an_edited_value_is_named_and_recomputed(store, name, edit):
    arr = zarr.open_array(str(store / "nets" / name), mode="r+", zarr_format=3)
    arr[1] = edit(np.asarray(arr[1]))
    report = verify_group(store, "nets")
    assert report.damaged == 1 and any("seed=1" in line and "cell_hash" in line for line in report.lines()), \
        report.lines()
    stats = run_sweep(config.parse(RAW), str(store))[0]
    assert stats["damaged_recomputed"] == 1 and verify_group(store, "nets").damaged == 0
