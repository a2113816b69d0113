"""Chains under stress (issue 13): no barrier between stages (downstream task runs start while
upstream ones still run, from the Prefect API's task-run timestamps and dependencies), a kill -9
of the runner at three moments, and a Dask worker SIGKILLed mid-chain. Every run is the real CLI
with a real Prefect server and a Dask LocalCluster; after each, every cell of both stages is
written once and equal to a clean run.

One clean run (six nets, the pipelining test's) is the reference of every other test: the kill
drills run the chain on its first three nets (each cell is computed from its own parameters, one
cell a bundle, so the same cells hold the same numbers) and compare with those cells of it."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import psutil
import pytest
import yaml

from conftest import assert_resumed_equals_clean, run_killed_at_gate

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

TRAIN = {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-12, "max_iters": 3000}
CLEAN_SEEDS = range(6)  # the pipelining test's run: six train bundles on two workers
SEEDS = range(3)  # the drills': the kill lands mid-stage at a gate, not by the size of the run
ATTACKS = ("margin_direction", "random_direction")
GROUPS = ("nets", "robustness")


def chain(name: str, workers: int, seeds=SEEDS, slack=(1.1,)) -> dict:
    return {"name": name, "runner": {"workers": workers, "bundle_size": 1}, "stages": [
        {"name": "nets", "experiment": "train", "grid": {"d": [24], "seed": list(seeds)}, "params": dict(TRAIN)},
        {"name": "robustness", "experiment": "universal_attack", "from": "nets",
         "grid": {"attack": list(ATTACKS), "slack": list(slack)}},
    ]}


TOTAL = {"nets": len(SEEDS), "robustness": len(SEEDS) * len(ATTACKS)}


def _done(store, group) -> int:
    import zarr

    try:
        return int(np.asarray(zarr.open_group(str(store / group), mode="r")["done"][...]).sum())
    except Exception:  # noqa: BLE001 - not created yet
        return -1


def _run(cli, path, store, tmp_path, tag):
    stats = tmp_path / f"{tag}.json"
    res = cli.run("run", path, "--store", store, "--json", stats)  # in-process, on the session's services
    assert res.returncode == 0, res.stderr[-3000:]
    return {s["group"]: s for s in json.loads(stats.read_text())}


def _write(tmp_path, raw: dict):
    path = tmp_path / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def clean(prefect_server, cli, tmp_path_factory):
    """The chain on six nets, two workers, run once through the CLI: its store and its statistics."""
    tmp = tmp_path_factory.mktemp("clean")
    stats = _run(cli, _write(tmp, chain("pipelined", workers=2, seeds=CLEAN_SEEDS)), tmp / "clean.zarr", tmp, "clean")
    return tmp / "clean.zarr", stats


def _same_as_clean(store, clean) -> None:
    """Both stages of ``store`` (the drills' first three nets) equal those cells of the clean run."""
    assert_resumed_equals_clean(store, clean[0], GROUPS, seed=slice(0, len(SEEDS)))


def _task_runs(flow_run_name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    with get_client(sync_client=True) as client:
        # runs are named "<config> @ <store>" (flows/run_ui.py)
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{flow_run_name} @ ")))
        runs = [r for r in runs if r.name.startswith(f"{flow_run_name} @ ")]
        assert len(runs) == 1, [r.name for r in runs]
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[runs[0].id])))


def test_downstream_bundles_start_before_the_upstream_stage_ends(clean):
    """Two workers, six train bundles: the first universal_attack task run starts before the last
    train task run ends (no barrier), and each one depends (wait_for) on the train task run whose
    net it reads; both stages are complete (the other tests compare their cells with resumed runs)."""
    _, stats = clean
    assert {g: s["written"] for g, s in stats.items()} == {"nets": 6, "robustness": 12}
    assert all(s["failed"] == 0 and s["done_before"] == 0 for s in stats.values())
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
        assert r.name in (f"robustness d=24 seed={seed} attack={a} slack=1.1 (1 cell)" for a in ATTACKS)


MOMENTS = {  # checked while a bundle waits at the gate, each bundle let through before stored
    "training": lambda store: 1 <= _done(store, "nets") < TOTAL["nets"],
    "between_stages": lambda store: _done(store, "nets") == TOTAL["nets"],
    "downstream": lambda store: _done(store, "robustness") >= 2,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_chain_killed_then_resumed_equals_a_clean_run(prefect_server, cli, tmp_path, clean, moment):
    """kill -9 of the runner's process group (one Dask worker, a bundle in flight at the gate) during
    training, once training is over (downstream bundles pending) or inside the downstream stage; the
    rerun (bundles are never cached by Prefect: its statistics count what it computed) writes each
    missing cell once and both stages equal a clean run."""
    path = _write(tmp_path, chain("resume", workers=1))
    store = tmp_path / "killed.zarr"
    run_killed_at_gate(path, store, MOMENTS[moment], tmp_path / "gate", env={"PREFECT_HOME": str(tmp_path / "home-a")})
    at_kill = {g: _done(store, g) for g in TOTAL}
    assert MOMENTS[moment](store) and at_kill["robustness"] < TOTAL["robustness"], at_kill
    stats = _run(cli, path, store, tmp_path, "resumed")
    for group, total in TOTAL.items():
        s = stats[group]
        assert s["done_before"] == at_kill[group] and s["refused_done"] == 0 and s["failed"] == 0, s
        assert s["written"] + s["done_before"] == total, s  # each missing cell written once
    _same_as_clean(store, clean)


def test_a_dask_worker_killed_mid_chain_loses_no_cell(cli, dask_address, tmp_path, clean):
    """SIGKILL of a Dask worker process while it holds a bundle, once the first net is stored (the
    session's cluster, which the run attaches to): its nanny starts a new one, its bundle runs again,
    and the run completes with every cell of both stages written once, equal to a clean run."""
    from distributed import Client

    path, store = _write(tmp_path, chain("worker", workers=2)), tmp_path / "w.zarr"
    killed, stop = [], threading.Event()

    def kill_a_busy_worker(client):  # in a thread while the run computes in this process's main thread
        pids = client.run(os.getpid)  # worker address -> its process
        while not stop.wait(0.05):
            if 1 <= _done(store, "nets") < TOTAL["nets"]:
                busy = [addr for addr, keys in client.processing().items() if keys]
                if busy:
                    proc = psutil.Process(pids[busy[0]])
                    killed.append((busy[0], proc.pid, _done(store, "nets")))
                    proc.send_signal(signal.SIGKILL)
                    return

    with Client(dask_address, timeout=30, set_as_default=False) as client:
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2
        killer = threading.Thread(target=kill_a_busy_worker, args=(client,))
        killer.start()
        try:
            stats = _run(cli, path, store, tmp_path, "w")
        finally:
            stop.set()
            killer.join()
        client.wait_for_workers(2, timeout=120)  # the nanny's new worker: the session's cluster is whole again
        assert killed and killed[0][1] not in client.run(os.getpid).values(), killed
    assert killed[0][2] < TOTAL["nets"], killed  # killed mid-chain, with a bundle on it
    for group, total in TOTAL.items():
        assert (stats[group]["written"], stats[group]["failed"], stats[group]["refused_done"]) == (total, 0, 0)
    _same_as_clean(store, clean)
