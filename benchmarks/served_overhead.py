"""Submit-to-done overhead of a served quickstart (issue 17): ``kktlab submit`` of a small sweep to
a Prefect server that is already up, with a process worker already polling its pool, split into
its parts from the flow run's state history and its kktlab log lines (one clock: all on 127.0.0.1):

- ``cli_s``: the ``kktlab submit`` command, start to exit (imports, config check, API calls);
- ``poll_wait_s``: Scheduled -> Pending (until the worker's next poll takes the run);
- ``process_start_s``: Pending -> Running (the worker starts a process, imports Prefect, loads the flow);
- ``to_sweep_s``: Running -> the sweep's first progress line (imports of kktlab / torch, store made);
- ``cluster_start_s``: -> the Dask dashboard line (the LocalCluster and its worker processes start);
- ``compute_s``: -> the last progress line (cells N/N);
- ``teardown_s``: -> Completed (cluster closed, flow run ends).

"before": Prefect's default worker poll (10 s) and Dask workers killed after 4 s at teardown (as
before issue 17: ``KKTLAB_WORKER_FAST_EXIT=0``); "after": ``make worker``'s 2 s poll and workers
that exit once closed (deploy/worker_exit.py). Called by ``orchestration_overhead.py --served``.
"""

from __future__ import annotations

import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

from deploy import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
KKTLAB = [sys.executable, "-m", "kktlab.cli"]
SETUPS = {"before": {"PREFECT_WORKER_QUERY_SECONDS": "10", "KKTLAB_WORKER_FAST_EXIT": "0"},
          "after": {"PREFECT_WORKER_QUERY_SECONDS": "2", "KKTLAB_WORKER_FAST_EXIT": "1"}}
PARTS = ("cli_s", "poll_wait_s", "process_start_s", "to_sweep_s", "cluster_start_s", "compute_s", "teardown_s")


def _client(env):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ctx = temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]})
    ctx.__enter__()
    return get_client(sync_client=True)


def _wait_worker(client, pool: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(str(w.status.value).upper() == "ONLINE" for w in client.read_workers_for_work_pool(pool)):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no worker online in pool {pool}")


def one_submission(config: pathlib.Path, store: pathlib.Path, env: dict, client, cells: int) -> dict:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    t0 = time.time()
    res = subprocess.run([*KKTLAB, "submit", str(config), "--store", str(store)], cwd=ROOT, capture_output=True,
                         text=True, env=dict(os.environ, **env), timeout=300)
    t1 = time.time()
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    run_id = re.search(r"\(([0-9a-f-]{36})\)", res.stdout).group(1)
    while True:
        run = client.read_flow_run(run_id)
        if run.state and run.state.is_final():
            break
        time.sleep(0.5)
    assert run.state.is_completed(), run.state
    states = {s.type.value: s.timestamp.timestamp() for s in client.read_flow_run_states(run_id)}
    for _ in range(30):  # log lines may reach the server after the final state
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), sort=LogSort.TIMESTAMP_ASC)
        if any(f": cells {cells}/{cells} (" in log.message for log in logs):
            break
        time.sleep(0.5)
    progress = [log.timestamp.timestamp() for log in logs if re.search(r": cells \d+/\d+ \(", log.message)]
    dash = [log.timestamp.timestamp() for log in logs if "Dask dashboard" in log.message]
    t_sweep, t_last = progress[0], progress[-1]
    t_dash = dash[0] if dash else t_sweep
    parts = {"cli_s": t1 - t0, "poll_wait_s": states["PENDING"] - states["SCHEDULED"],
             "process_start_s": states["RUNNING"] - states["PENDING"], "to_sweep_s": t_sweep - states["RUNNING"],
             "cluster_start_s": t_dash - t_sweep, "compute_s": t_last - t_dash,
             "teardown_s": states["COMPLETED"] - t_last}
    parts["total_s"] = states["COMPLETED"] - t0
    parts["overhead_s"] = parts["total_s"] - parts["compute_s"]
    return parts


def measure(tmp: str, repeats: int = 2, cells: int = 2, n_matmuls: int = 200) -> dict:
    """Both setups on one server (started first, not counted)."""
    import yaml

    tmp = pathlib.Path(tmp)
    port = launch.free_port()
    server, env = launch.prefect_server(tmp / "prefect-home", port, tmp / "server.log")
    out: dict = {"repeats": repeats, "cells": cells, "n_matmuls": n_matmuls, "setups": SETUPS, "runs": {}}
    try:
        dep = subprocess.run([*KKTLAB, "deploy", "--pool", "bench"], cwd=ROOT, capture_output=True, text=True,
                             env=dict(os.environ, **env), timeout=300)
        assert dep.returncode == 0, dep.stderr[-2000:]
        config = tmp / "served-quickstart.yaml"
        config.write_text(yaml.safe_dump({"experiment": "calibrate", "name": "served-quickstart",
                                          "grid": {"seed": list(range(cells))}, "params": {"n_matmuls": n_matmuls},
                                          "runner": {"workers": 2, "bundle_size": 1}}))
        with _client(env) as client:
            for label, extra in SETUPS.items():
                worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "bench", "--type",
                                       "process"], tmp / f"worker-{label}.log", dict(env, **extra))
                try:
                    _wait_worker(client, "bench")
                    runs = []
                    for i in range(repeats):
                        runs.append(one_submission(config, tmp / f"{label}-{i}.zarr", env, client, cells))
                        print(label, {k: round(v, 2) for k, v in runs[-1].items()}, flush=True)
                    out["runs"][label] = runs
                finally:
                    launch.stop(worker)
                time.sleep(3)  # the stopped worker goes offline before the next one polls
    finally:
        launch.stop(server)
    out["median"] = {label: {k: statistics.median(r[k] for r in runs) for k in (*PARTS, "total_s", "overhead_s")}
                     for label, runs in out["runs"].items()}
    return out
