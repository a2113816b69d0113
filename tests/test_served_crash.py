"""Issue 30 item 1: a flow run whose worker died is marked Crashed by Prefect's own mechanism (flow-run
heartbeats and the automation ``kktlab deploy`` makes: deploy/prefect_deploy.py), within a bound,
with a message saying how to resume; a real server, process worker and submit on 127.0.0.1. The same
``kktlab submit`` then resumes the store, and every stored value equals a clean run's of the same config."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from conftest import assert_stores_equal
from deploy import launch

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

SLOW = {"experiment": "nonrobust", "name": "zombie", "grid": {"seed": list(range(3))},
        "params": {"d": 8, "width": 8, "target_loss": 1.0e-6}, "runner": {"workers": 1, "bundle_size": 1}}
HEARTBEAT_S = 30  # the smallest Prefect allows
MISSED = 2  # crashed after 2 x 30 s without one (kktlab deploy's default is 3: KKTLAB_HEARTBEATS_MISSED)


def _state(env, run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            return client.read_flow_run(run_id).state


def _wait(env, run_id: str, names: set, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(env, run_id)
        if state is not None and state.name in names:
            return state
        time.sleep(2)
    return _state(env, run_id)


def _heartbeats(env, run_id: str) -> int:
    """The heartbeat events the server has recorded for the flow run."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flt = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                      resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            return client.read_events(filter=flt, limit=1).total


def _done(store) -> int:
    from storage.query import status

    try:
        return sum(r["done"] for r in status(store))
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def test_a_run_whose_worker_died_is_marked_crashed_and_resumes(cli, tmp_path, write_config):
    port = launch.free_port()
    server, env = launch.prefect_server(tmp_path / "prefect-home", port, tmp_path / "server.log")
    env = dict(env, PREFECT_FLOWS_HEARTBEAT_FREQUENCY=str(HEARTBEAT_S), KKTLAB_HEARTBEATS_MISSED=str(MISSED))
    worker = clean = None
    try:
        dep = subprocess.run([*cli.argv, "deploy", "--pool", "kktlab-crash"], cwd=cli.root,
                             env=dict(os.environ, **env), capture_output=True, text=True, timeout=180)
        assert dep.returncode == 0 and f"heartbeat for {MISSED * HEARTBEAT_S} s" in dep.stdout, dep.stderr[-2000:]
        gate = tmp_path / "gate"  # the run's bundles wait at it (flows/sweep.py wait_at_gate): alive, not done
        gate.touch()
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-crash", "--type",
                               "process"], tmp_path / "pworker.log", dict(env, KKTLAB_GATE=str(gate)))
        path, store = write_config(SLOW), tmp_path / "z.zarr"
        sub = cli.run("submit", path, "--store", store, env=env, timeout=120)
        assert sub.returncode == 0, sub.stdout + sub.stderr[-2000:]
        run_id = sub.stdout.split("(")[1].split(")")[0]
        assert _wait(env, run_id, {"Running"}, 180).name == "Running"
        deadline = time.monotonic() + 3 * HEARTBEAT_S  # the automation watches what follows a heartbeat
        while time.monotonic() < deadline and not (_heartbeats(env, run_id) and (tmp_path / "gate.reached").exists()):
            time.sleep(1)
        assert _heartbeats(env, run_id) and (tmp_path / "gate.reached").exists()
        assert _state(env, run_id).name == "Running"
        victims = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
        for p in victims:  # the worker, its flow-run process and the run's Dask cluster die at once
            p.kill()
        psutil.wait_procs(victims, timeout=30)
        t_kill = time.monotonic()
        # meanwhile (the server takes minutes to see it) a clean run of the same config to another store
        clean = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(tmp_path / "clean.zarr")], cwd=cli.root,
                                 env=dict(os.environ, **env), stdout=(tmp_path / "clean.log").open("w"),
                                 stderr=subprocess.STDOUT)
        state = _wait(env, run_id, {"Crashed", "Completed", "Failed", "Cancelled"}, MISSED * HEARTBEAT_S + 150)
        assert state.name == "Crashed", state
        assert "no heartbeat" in (state.message or "") and "resume" in (state.message or "")
        assert time.monotonic() - t_kill <= MISSED * HEARTBEAT_S + 150
        assert _done(store) == 0  # the crash cut the run short at its gate: the resume has every cell to compute
        gate.unlink()
        # resumed by the same command (a fresh worker): the store completes
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-crash", "--type",
                               "process"], tmp_path / "pworker2.log", env)
        res = cli.run("submit", path, "--store", store, "--watch", env=env, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "cells: 3/3 done" in res.stdout and "Traceback" not in res.stdout + res.stderr, res.stdout[-3000:]
        assert clean.wait(600) == 0, (tmp_path / "clean.log").read_text()[-3000:]
        assert_stores_equal(store, tmp_path / "clean.zarr")
    finally:
        if clean is not None and clean.poll() is None:
            clean.kill()
            clean.wait()
        if worker is not None and worker.poll() is None:
            launch.stop(worker)
        launch.stop(server)
