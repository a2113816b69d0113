"""Issue 30 items 1 and 6 with real services on 127.0.0.1: one ``prefect server start``, ``kktlab deploy``
and a process worker (``prefect worker start --type process``) shared by the module.

- ``kktlab deploy`` prints ONE table of the deployments (Prefect's ``deploy(*deployments)`` once), each
  experiment in it once;
- ``kktlab cancel STORE`` stops a served run mid-bundle within seconds: it returns 0, the flow run ends
  Cancelled on the server, the flow-run process and its Dask workers are gone, the progress files stop
  moving, the store verifies; the same ``kktlab submit`` resumes it to Completed without recomputing the
  cells done before the cancel.
"""

from __future__ import annotations

import json
import re
import time
import types

import psutil
import pytest

from deploy import launch
from flows import experiments
from storage import bundle_progress as files
from storage import runlock
from test_served_crash import _done, _state

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

POOL = "kktlab-cancel"
# lr 1e-6 and a loss target never met: every cell trains exactly max_iters steps (10-30 s on 2 cores),
# long enough to cancel the second bundle mid-way (its progress file is written every second:
# WORKER_ENV), short enough to resume quickly
LONG = {"experiment": "nonrobust", "name": "cancelme", "grid": {"seed": [0, 1]},
        "params": {"d": 20, "m": 30, "width": 64, "lr0": 1e-6, "lr_factor": 1.0, "lr_period": 100,
                   "target_loss": 1e-30, "max_iters": 25_000},
        "runner": {"workers": 1, "bundle_size": 1}}
FINAL = {"Completed", "Failed", "Crashed", "Cancelled"}
WORKER_ENV = {"KKTLAB_PROGRESS_EVERY_S": "1"}  # the flow process and its Dask workers inherit it


@pytest.fixture(scope="module")
def served(cli, tmp_path_factory):
    """The module's server, its deployments (``kktlab deploy``'s output kept) and a process worker."""
    root = tmp_path_factory.mktemp("served-cancel")
    server, env = launch.prefect_server(root / "prefect-home", launch.free_port(), root / "server.log")
    worker = None
    try:
        dep = cli.run("deploy", "--pool", POOL, env=dict(env, COLUMNS="200"), timeout=180)
        assert dep.returncode == 0, dep.stdout[-2000:] + dep.stderr[-2000:]
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", POOL, "--type", "process"],
                              root / "pworker.log", dict(env, **WORKER_ENV))
        yield types.SimpleNamespace(env=env, deploy=dep, worker=worker, root=root)
    finally:
        if worker is not None:
            launch.stop(worker)
        launch.stop(server)


def test_deploy_prints_one_table(served):
    out = served.deploy.stdout
    lines = [line.strip() for line in out.splitlines()]
    assert lines.count("Deployments") == 1, out  # the rich table's title
    assert sum(bool(re.match(r"┃\s*Name\s*┃\s*Status", line)) for line in lines) == 1, out  # its header
    assert out.count("Successfully created/updated all deployments!") == 1, out
    names = experiments.names()
    for name in names:
        assert len(re.findall(rf"kktlab-submit/{re.escape(name)}\s", out)) == 1, (name, out)
    assert out.count("kktlab-submit/") == len(names) and f"deployed {len(names)} deployments" in out, out


def _flow_processes(worker) -> list[psutil.Process]:
    """The process worker's descendants: its flow-run process and that one's Dask cluster."""
    return psutil.Process(worker.pid).children(recursive=True)


def _table(env, run_id: str) -> dict:
    """The stages' counts (the summary table artifact) of root flow run ``run_id``, by stage."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    table = next(a for a in arts if a.type == "table")
    return {r["stage"]: r for r in json.loads(table.data)}


def _history(env, run_id: str, t0: float) -> str:
    """The flow run's states, each with its time after ``t0`` (a ``time.time()``)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            states = client.read_flow_run_states(run_id)
    states = sorted(states, key=lambda s: s.timestamp)
    return ", ".join(f"{s.name} {s.timestamp.timestamp() - t0:+.1f} s" for s in states)


def _stored(store) -> dict:
    """seed -> (done, cell_hash, wall_s) of the store's one group ({} before it is made)."""
    from storage.query import open_results

    try:
        ds = open_results(store).load()
    except Exception:  # noqa: BLE001 - not made yet
        return {}
    return {int(s): (bool(ds.done.sel(seed=s)), int(ds.cell_hash.sel(seed=s)), float(ds.wall_s.sel(seed=s)))
            for s in ds.seed.values}


def _mid_bundle(store, group: str) -> list[dict]:
    """Progress records of running bundles that have counted steps (of a total), of cells not stored
    yet (a stored bundle's file goes a moment after its cells are marked done)."""
    done = [s for s, (d, _, _) in _stored(store).items() if d]
    return [r for r in files.read(store, group) if r.get("steps") and r.get("total")
            and not any(f"seed={s} " in r.get("name", "") for s in done)]


def _gone(procs) -> bool:
    def alive(p):
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return not any(alive(p) for p in procs)


def test_kktlab_cancel_stops_a_served_run_within_seconds_and_it_resumes(served, cli, write_config):
    env, group = served.env, LONG["name"]
    path = write_config(LONG)
    store = path.parent / "c.zarr"
    t_submit = time.monotonic()
    sub = cli.run("submit", path, "--store", store, env=env, timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr[-2000:]
    run_id = sub.stdout.split("(")[1].split(")")[0]
    # the first cell stored and the second bundle mid-way (its progress file counts steps)
    deadline, recs = time.monotonic() + 240, []
    while time.monotonic() < deadline and _state(env, run_id).name not in FINAL:
        if _done(store) >= 1 and (recs := _mid_bundle(store, group)):
            break
        time.sleep(0.5)
    assert recs and _done(store) == 1, (recs, _done(store), _state(env, run_id))
    assert 0 < recs[0]["steps"] < recs[0]["total"] == LONG["params"]["max_iters"], recs
    busy = _flow_processes(served.worker)
    assert busy, "no flow-run process under the worker"
    before = _stored(store)
    print(f"running {time.monotonic() - t_submit:.1f} s after submit: {recs[0]['steps']} steps of the 2nd bundle; "
          f"{len(busy)} processes under the worker")
    t0, wall0 = time.monotonic(), time.time()
    res = cli.run("cancel", store, env=env, timeout=120)
    cancel_s = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Cancelling" in res.stdout and "stopped" in res.stdout, res.stdout
    state, state_s, gone_s = _state(env, run_id), None, None
    while time.monotonic() - t0 < 90 and (state_s is None or gone_s is None):
        if state_s is None and (state := _state(env, run_id)).name in FINAL:
            state_s = time.monotonic() - t0
        if gone_s is None and _gone(busy):
            gone_s = time.monotonic() - t0
        time.sleep(0.25)
    print(f"kktlab cancel returned 0 after {cancel_s:.1f} s; the flow run {state.name} after {state_s} s "
          f"({state.message!r}); its processes gone after {gone_s} s")
    print("states:", _history(env, run_id, wall0))
    assert state.name == "Cancelled", (state, (served.root / "pworker.log").read_text()[-4000:])
    assert gone_s is not None, "the flow-run process or its Dask workers still run 90 s after the cancel"
    assert cancel_s < 60 and gone_s < 60 and state_s < 60, (cancel_s, gone_s, state_s)
    assert runlock.held_by(store, group) is None
    moved = {r["key"]: r["updated"] for r in files.read(store, group)}
    time.sleep(2.0)  # a bundle still computing would rewrite its file every second (WORKER_ENV)
    assert {r["key"]: r["updated"] for r in files.read(store, group)} == moved
    assert _done(store) == 1
    check = cli.run("verify", store, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    # the same command resumes: Completed, every cell done, the one done before not recomputed
    again = cli.run("submit", path, "--store", store, "--watch", env=env, timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "cells: 2/2 done" in again.stdout and "Traceback" not in again.stdout + again.stderr, again.stdout[-3000:]
    run2 = again.stdout.split("(")[1].split(")")[0]
    assert _state(env, run2).name == "Completed"
    rows = _table(env, run2)[group]
    assert (rows["done_before"], rows["written"], rows["failed"]) == (1, 1, 0), rows
    after = _stored(store)
    assert all(done for done, _, _ in after.values()), after
    kept = [s for s, (done, _, _) in before.items() if done]
    assert len(kept) == 1 and all(after[s] == before[s] for s in kept), (before, after)  # same hash, same wall_s
    assert not (store.parent / (store.name + files.SUFFIX)).exists()  # the resumed run cleared the cancel request
