"""Served mode and faults with real processes on 127.0.0.1 (issue: served mode and faults).

- a real ``prefect server start``, a process work pool + worker, the deployments, and a flow
  run created by ``kktlab submit`` that completes and writes the store;
- a real ``dask scheduler`` + two ``dask worker`` processes; one worker is SIGKILLed mid-sweep
  and the sweep still writes every cell exactly once, equal to the kernels run directly;
- two sweeps writing different experiment groups into one store at the same time.
"""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from flows import experiments
from flows import config
from storage.query import open_results, status
from deploy import dask as dask_specs
from deploy import launch

pytestmark = pytest.mark.requires_services

TINY = {"experiment": "nonrobust", "grid": {"d": [16], "seed": [0, 1]},
        "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-10},
        "runner": {"workers": 1, "bundle_size": 1}}


def _cancel(env, run_id: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelled

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Cancelled(), force=True)


def test_prefect_server_pool_worker_deployment_submit(cli, tmp_path, write_config):
    port = launch.free_port()
    server, env = launch.prefect_server(tmp_path / "prefect-home", port, tmp_path / "server.log")
    worker = None
    try:
        dep = subprocess.run([*cli.argv, "deploy", "--pool", "kktlab-test"], cwd=cli.root,
                             env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
        assert dep.returncode == 0, dep.stderr[-2000:]
        # no worker yet: --watch says so and exits non-zero; the API URL comes from a Prefect profile only
        home = tmp_path / "profile-home"
        home.mkdir()
        (home / "profiles.toml").write_text(f'active = "kk"\n[profiles.kk]\nPREFECT_API_URL = "{env["PREFECT_API_URL"]}"\n')
        no_url = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        t0 = time.monotonic()
        lone = subprocess.run([*cli.argv, "submit", write_config(dict(TINY, name="lonely"), "lonely.yaml"), "--store",
                               tmp_path / "lonely.zarr", "--watch"], cwd=cli.root, capture_output=True, text=True,
                              env=dict(no_url, PREFECT_HOME=str(home), KKTLAB_NO_WORKER_S="3"), timeout=120)
        assert lone.returncode == 2 and time.monotonic() - t0 < 60, lone.stdout + lone.stderr
        assert "no worker is polling work pool 'kktlab-test'" in lone.stderr and "Traceback" not in lone.stderr
        assert f"127.0.0.1:{port}/runs/flow-run/" in lone.stdout  # the profile's server was used
        _cancel(env, lone.stdout.split("(")[1].split(")")[0])
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-test",
                                 "--type", "process"], tmp_path / "pworker.log", env)
        path = write_config(dict(TINY, name="served"))
        store = tmp_path / "served.zarr"
        res = cli.run("submit", path, "--store", store, "--watch", env=env, timeout=400)
        assert res.returncode == 0, res.stdout + res.stderr[-3000:]
        assert "Completed" in res.stdout and f"127.0.0.1:{port}/runs/flow-run/" in res.stdout
        ds = open_results(store)
        assert bool(ds.done.all()) and (ds.status == 1).all()
        # the run is on the server: the parent run (the one submit printed) carries the progress
        # (artifact text "cells 2/2", log lines); task runs are named by stage and cells (issue 17)
        chain = {"name": "servedchain", "runner": {"workers": 1, "bundle_size": 1}, "stages": [
            {"name": "nets", "experiment": "train", "grid": {"d": [16], "seed": [0]}, "params": TINY["params"]},
            {"name": "robustness", "experiment": "universal_attack", "from": "nets",
             "grid": {"attack": ["margin_direction"]}}]}
        res2 = cli.run("submit", write_config(chain, "chain.yaml"), "--store", tmp_path / "chain.zarr", "--watch",
                       env=env, timeout=400)
        assert res2.returncode == 0, res2.stdout + res2.stderr[-3000:]
        assert bool(open_results(tmp_path / "chain.zarr", "robustness").done.all())
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            import asyncio

            async def runs():
                async with get_client() as client:
                    frs = await client.read_flow_runs()
                    parents = [fr for fr in frs if fr.parent_task_run_id is None]
                    logs = {fr.id: await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])))
                            for fr in parents}
                    return frs, parents, await client.read_artifacts(), logs, await client.read_task_runs()

            flow_runs, parents, artifacts, logs, task_runs = asyncio.run(runs())
        flow_runs = [fr for fr in flow_runs if fr.state.name != "Cancelled"]  # the one no worker took
        parents = [fr for fr in parents if fr.state.name != "Cancelled"]
        assert {fr.state.name for fr in flow_runs} == {"Completed"} and len(flow_runs) == 4  # 2 x (submit + sweep)
        assert len(parents) == 2
        for parent in parents:
            mine = [a for a in artifacts if a.flow_run_id == parent.id]
            assert any(a.type == "progress" and float(a.data) == 100.0 for a in mine)
            texts = [str(a.data) for a in mine if a.type == "markdown"]
            assert any("cells 2/2 (100%)" in t for t in texts) or any("cells 1/1 (100%)" in t for t in texts), texts
            assert any("cells" in log.message and "ETA" in log.message for log in logs[parent.id])
        assert any(a.key == "kktlab-chain-robustness" for a in artifacts)
        names = {t.name for t in task_runs}
        assert "served d=16 seed=0 (1 cell)" in names and "nets d=16 seed=0 (1 cell)" in names, names
        assert "robustness d=16 seed=0 attack=margin_direction (1 cell)" in names, names
    finally:
        if worker is not None:
            launch.stop(worker)
        launch.stop(server)


def test_sweep_survives_sigkill_of_a_dask_worker(cli, tmp_path, write_config, prefect_server):
    with launch.dask_cluster(2, tmp_path) as (address, _, workers):
        # bundles are cut for the workers the scheduler has (at least one each)
        assert dask_specs.worker_count({"cluster": "address", "address": address}) == 2
        raw = dict(TINY, name="dk", grid={"d": [20], "seed": list(range(6))})
        raw["params"] = dict(TINY["params"], width=48, target_loss=1.0e-25)
        path = write_config(raw)
        store = tmp_path / "dk.zarr"
        env = dict(os.environ, PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "res"))
        runner = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--dask-address", address,
                                   "--json", str(tmp_path / "stats.json")], cwd=cli.root, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and runner.poll() is None:
            done = sum(r["done"] for r in status(store)) if (store / "zarr.json").exists() else 0
            if done >= 1:
                break
            time.sleep(0.2)
        os.killpg(workers[0].pid, signal.SIGKILL)  # the nanny and its worker, no goodbye
        out, _ = runner.communicate(timeout=400)
        assert runner.returncode == 0, out[-3000:]
        stats = json.loads((tmp_path / "stats.json").read_text())
        assert stats["written"] == 6 and stats["refused_done"] == 0
        ds = open_results(store)
        assert bool(ds.done.all())
        cfg = config.load(path)
        exp = experiments.get("nonrobust")
        for cell in cfg.cells():  # the same cells run directly, in this process
            ref = exp.run_bundle([cell], "cpu")[0]
            got = ds.sel(d=cell["d"], seed=cell["seed"])
            for name in ("c_star", "iters", "gamma", "kkt_eps", "margin_frac"):
                np.testing.assert_allclose(float(got[name]), float(ref[name]), rtol=1e-9, err_msg=name)


def test_two_experiments_into_one_store_concurrently(cli, tmp_path, write_config, prefect_server):
    """A nonrobust sweep and a forging sweep write one store at the same time: nothing lost."""
    store = tmp_path / "shared.zarr"
    a = write_config(dict(TINY, name="groupa", grid={"d": [12, 16], "seed": [0, 1, 2]}), "a.yaml")
    b = write_config({"experiment": "forging", "name": "groupb",
                      "grid": {"d": [2, 3], "eps": [0.1, 0.3], "estimator": ["exact", "naive_mc"]},
                      "params": {"model": "linreg", "n_samples": 500}, "runner": {"workers": 1}}, "b.yaml")
    procs = [subprocess.Popen([*cli.argv, "run", str(p), "--store", str(store)], cwd=cli.root, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for p in (a, b)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    got = {r["group"]: (r["experiment"], r["done"], r["total"]) for r in status(store)}
    assert got == {"groupa": ("nonrobust", 6, 6), "groupb": ("forging", 8, 8)}
    ds = open_results(store, "groupa")
    assert np.isfinite(ds.c_star.values).all() and (ds.status == 1).all()
    fg = open_results(store, "groupb")
    assert np.isfinite(fg.log_volume.sel(estimator="exact").values).all()
