"""Issue 30 item 1: a flow run whose worker died is marked Crashed by Prefect's own mechanism (flow-run
heartbeats and the automation ``kktlab deploy`` makes: deploy/prefect_deploy.py), within a bound,
with a message saying how to resume; a real server, process worker and submit on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from deploy import launch

pytestmark = pytest.mark.requires_services

SLOW = {"experiment": "nonrobust", "name": "zombie", "grid": {"seed": list(range(6))},
        "params": {"d": 16, "width": 48, "target_loss": 1.0e-20}, "runner": {"workers": 1, "bundle_size": 1}}
HEARTBEAT_S = 30  # the smallest Prefect allows: crashed after 3 x 30 s without one


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


def test_a_run_whose_worker_died_is_marked_crashed(cli, tmp_path, write_config):
    port = launch.free_port()
    server, env = launch.prefect_server(tmp_path / "prefect-home", port, tmp_path / "server.log")
    env = dict(env, PREFECT_FLOWS_HEARTBEAT_FREQUENCY=str(HEARTBEAT_S))
    worker = None
    try:
        dep = subprocess.run([*cli.argv, "deploy", "--pool", "kktlab-crash"], cwd=cli.root,
                             env=dict(os.environ, **env), capture_output=True, text=True, timeout=180)
        assert dep.returncode == 0 and f"heartbeat for {3 * HEARTBEAT_S} s" in dep.stdout, dep.stderr[-2000:]
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-crash", "--type",
                               "process"], tmp_path / "pworker.log", env)
        sub = cli.run("submit", write_config(SLOW), "--store", tmp_path / "z.zarr", env=env, timeout=120)
        assert sub.returncode == 0, sub.stdout + sub.stderr[-2000:]
        run_id = sub.stdout.split("(")[1].split(")")[0]
        assert _wait(env, run_id, {"Running"}, 180).name == "Running"
        time.sleep(HEARTBEAT_S + 10)  # at least one heartbeat sent: the automation watches what follows it
        assert _state(env, run_id).name == "Running"
        victims = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
        for p in victims:  # the worker, its flow-run process and the run's Dask cluster die at once
            p.kill()
        psutil.wait_procs(victims, timeout=30)
        t_kill = time.monotonic()
        state = _wait(env, run_id, {"Crashed", "Completed", "Failed", "Cancelled"}, 3 * HEARTBEAT_S + 150)
        assert state.name == "Crashed", state
        assert "no heartbeat" in (state.message or "") and "resume" in (state.message or "")
        assert time.monotonic() - t_kill <= 3 * HEARTBEAT_S + 150
    finally:
        if worker is not None and worker.poll() is None:
            launch.stop(worker)
        launch.stop(server)
