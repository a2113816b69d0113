"""End to end through the real parts: a Prefect server, a Dask LocalCluster, a Zarr store.

The kill test starts ``kktlab run`` in its own process group, SIGKILLs the whole group
(runner, Dask workers) midway, reruns the same command and compares every stored value with
an uninterrupted run of the same config.
"""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from storage.query import open_results

pytestmark = pytest.mark.requires_services

SMALL = {
    "experiment": "nonrobust",
    "name": "e2e",
    "grid": {"d": [12, 24], "alpha": [0.5, 1.0], "seed": [0, 1]},
    "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-12},
    "runner": {"workers": 2, "bundle_size": 2},
}


def test_config_to_store_to_xarray(cli, prefect_server, write_config, tmp_path):
    path = write_config(SMALL)
    store = tmp_path / "s.zarr"
    res = cli.run("run", path, "--store", store, "--json", tmp_path / "stats.json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "store:" in res.stdout and "c_star" in res.stdout
    assert "cells 8/8 (100%)" in res.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["written"] == 8 and stats["done_before"] == 0
    ds = open_results(store)
    assert dict(ds.sizes) == {"d": 2, "alpha": 2, "seed": 2, "sample": 24}
    assert bool(ds.done.all())
    assert set(ds.data_vars) >= {"c_star", "margin_frac", "kkt_eps", "iters", "q_sample", "done"}
    assert (ds.status == 1).all() and (ds.c_star < np.sqrt(ds.d)).all()
    # a second run resumes: nothing left to do, nothing overwritten
    again = cli.run("run", path, "--store", store, "--json", tmp_path / "stats2.json")
    assert again.returncode == 0, again.stderr[-2000:]
    stats2 = json.loads((tmp_path / "stats2.json").read_text())
    assert stats2["done_before"] == 8 and stats2["written"] == 0
    st = cli.run("status", store)
    assert "8/8" in st.stdout
    show = cli.run("show", store)
    assert show.returncode == 0 and "c_star" in show.stdout and "git_commit" in show.stdout


def _done(store, group):
    import zarr

    try:
        return int(np.asarray(zarr.open_group(str(store / group), mode="r")["done"][...]).sum())
    except Exception:  # noqa: BLE001 - not created yet
        return -1


def test_kill_9_midway_then_resume_equals_clean_run(cli, prefect_server, write_config, tmp_path):
    cfg = dict(SMALL, name="killme", grid={"d": [24], "alpha": [1.0], "seed": list(range(8))},
               runner={"workers": 1, "bundle_size": 1})
    cfg["params"] = dict(SMALL["params"], width=48, target_loss=1.0e-20)
    path = write_config(cfg)
    store, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    env = dict(os.environ, PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "results-a"))
    proc = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store)], cwd=cli.root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while _done(store, "killme") < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        done_at_kill = _done(store, "killme")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert 2 <= done_at_kill < 8, done_at_kill
    time.sleep(1)
    resumed = cli.run("run", path, "--store", store, "--json", tmp_path / "resume.json", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stats = json.loads((tmp_path / "resume.json").read_text())
    killed_done = stats["done_before"]
    assert killed_done >= done_at_kill
    assert stats["written"] == 8 - killed_done and stats["refused_done"] == 0  # each cell written once
    env_clean = dict(os.environ, PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "results-b"))
    ref = cli.run("run", path, "--store", clean, env=env_clean)
    assert ref.returncode == 0, ref.stderr[-3000:]
    a, b = open_results(store), open_results(clean)
    assert bool(a.done.all()) and bool(b.done.all())
    for name in b.data_vars:
        if name == "wall_s":
            continue
        np.testing.assert_allclose(a[name].values.astype(float), b[name].values.astype(float),
                                   rtol=1e-9, atol=0, equal_nan=True, err_msg=name)
