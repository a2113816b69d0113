"""Chains under stress (issue 13): no barrier between stages (downstream task runs start while
upstream ones still run, from the Prefect API's task-run timestamps and dependencies), a kill -9
of the runner at three moments, and a Dask worker SIGKILLed mid-chain. Every run is the real CLI
with a real Prefect server and a Dask LocalCluster; after each, every cell of both stages is
written once and equal to a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest
import yaml

from storage import schema

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

TRAIN = {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-12, "max_iters": 3000}
SEEDS = [0, 1, 2, 3]


def chain(name: str, workers: int, seeds=SEEDS, slack=(1.05, 1.1)) -> dict:
    return {"name": name, "runner": {"workers": workers, "bundle_size": 1}, "stages": [
        {"name": "nets", "experiment": "train", "grid": {"d": [24], "seed": list(seeds)}, "params": dict(TRAIN)},
        {"name": "robustness", "experiment": "universal_attack", "from": "nets",
         "grid": {"attack": ["margin_direction", "random_direction"], "slack": list(slack)}},
    ]}


TOTAL = {"nets": len(SEEDS), "robustness": len(SEEDS) * 4}


def _done(store, group) -> int:
    import zarr

    try:
        return int(np.asarray(zarr.open_group(str(store / group), mode="r")["done"][...]).sum())
    except Exception:  # noqa: BLE001 - not created yet
        return -1


def _values(store) -> dict:
    from storage.query import open_results

    out = {}
    for group in TOTAL:
        ds = open_results(store, group).load()
        out.update({f"{group}/{v}": ds[v].values for v in ds.data_vars if v not in schema.NOT_HASHED})
    return out


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in b:
        np.testing.assert_allclose(a[k].astype(float), b[k].astype(float), rtol=1e-9, atol=0, equal_nan=True,
                                   err_msg=k)


def _run(cli, path, store, tmp_path, tag, env=None):
    stats = tmp_path / f"{tag}.json"
    res = cli.run("run", path, "--store", store, "--json", stats, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return {s["group"]: s for s in json.loads(stats.read_text())}


@pytest.fixture(scope="module")
def clean(prefect_server, cli, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    path = tmp / "chain.yaml"
    path.write_text(yaml.safe_dump(chain("resume", workers=1)))
    stats = _run(cli, path, tmp / "clean.zarr", tmp, "clean")
    assert {g: s["written"] for g, s in stats.items()} == TOTAL
    return _values(tmp / "clean.zarr")


def _task_runs(flow_run_name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    with get_client(sync_client=True) as client:
        # runs are named "<config> @ <store>" (flows/run_ui.py)
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{flow_run_name} @ ")))
        runs = [r for r in runs if r.name.startswith(f"{flow_run_name} @ ")]
        assert len(runs) == 1, [r.name for r in runs]
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[runs[0].id])))


def test_downstream_bundles_start_before_the_upstream_stage_ends(prefect_server, cli, tmp_path, clean):
    """Two workers, six train bundles: the first universal_attack task run starts before the last
    train task run ends (no barrier), and each one depends (wait_for) on the train task run whose
    net it reads; both stages are complete and equal to a clean run's cells."""
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(chain("pipelined", workers=2, seeds=range(6), slack=[1.1])))
    stats = _run(cli, path, tmp_path / "p.zarr", tmp_path, "p")
    assert {g: s["written"] for g, s in stats.items()} == {"nets": 6, "robustness": 12}
    runs = _task_runs("pipelined")
    train = [r for r in runs if r.name.startswith("nets d=24 seed=")]
    attack = [r for r in runs if r.name.startswith("robustness d=24 seed=")]
    assert len(train) == 6 and len(attack) == 12, [r.name for r in runs]
    assert all(r.state.is_completed() for r in runs)
    first_attack = min(r.start_time for r in attack)
    last_train = max(r.end_time for r in train)
    assert first_attack < last_train, (first_attack, last_train)
    by_id = {r.id: r for r in train}
    for r in attack:
        parents = [by_id[i.id] for i in r.task_inputs.get("wait_for", []) if i.id in by_id]
        assert len(parents) == 1, r.name
        seed = r.name.split("seed=")[1].split(" ")[0]
        assert parents[0].name == f"nets d=24 seed={seed} (1 cell)" and parents[0].end_time <= r.start_time
        assert r.name in (f"robustness d=24 seed={seed} attack={a} slack=1.1 (1 cell)"
                          for a in ("margin_direction", "random_direction"))


MOMENTS = {
    "training": lambda store: 1 <= _done(store, "nets") < TOTAL["nets"],
    "between_stages": lambda store: _done(store, "nets") == TOTAL["nets"],
    "downstream": lambda store: _done(store, "robustness") >= 2,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_chain_killed_then_resumed_equals_a_clean_run(prefect_server, cli, tmp_path, clean, moment):
    """kill -9 of the runner's process group during training, once training is over (downstream
    bundles pending) or inside the downstream stage; the rerun (bundles are never cached by Prefect:
    its statistics count what it computed) writes each missing cell once and both stages equal a clean run."""
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(chain("resume", workers=1)))
    store = tmp_path / "killed.zarr"
    cli.run_killed(path, store, MOMENTS[moment], env={"PREFECT_HOME": str(tmp_path / "home-a")})
    at_kill = {g: _done(store, g) for g in TOTAL}
    assert MOMENTS[moment](store) and at_kill["robustness"] < TOTAL["robustness"], at_kill
    stats = _run(cli, path, store, tmp_path, "resumed")  # in-process, on the session's services
    for group, total in TOTAL.items():
        s = stats[group]
        assert s["done_before"] >= at_kill[group] and s["refused_done"] == 0 and s["failed"] == 0, s
        assert s["written"] + s["done_before"] == total, s  # each missing cell written once
    _same(_values(store), clean)


def _dask_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The Dask worker processes of the LocalCluster ``proc`` started (its nannies live in ``proc``
    and spawn them with multiprocessing)."""
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_dask_worker_killed_mid_chain_loses_no_cell(prefect_server, cli, tmp_path, clean):
    """SIGKILL of a busy Dask worker process once the first net is stored: its nanny starts a new
    one, its bundle runs again, and the run completes with every cell of both stages written once,
    equal to a clean run."""
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(chain("resume", workers=2)))
    store = tmp_path / "w.zarr"
    out = tmp_path / "w.json"
    proc = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--json", str(out)], cwd=cli.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _done(store, "nets") < 1:
            time.sleep(0.02)
        workers = _dask_workers(proc)
        assert _done(store, "nets") < TOTAL["nets"]
        assert len(workers) == 2, workers
        busy = max(workers, key=lambda p: p.cpu_times().user)
        busy.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    stats = {s["group"]: s for s in json.loads(out.read_text())}
    for group, total in TOTAL.items():
        assert (stats[group]["written"], stats[group]["failed"], stats[group]["refused_done"]) == (total, 0, 0)
    _same(_values(store), clean)
