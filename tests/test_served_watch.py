"""Served mode a lab can leave overnight (issue 30).

- A: a served run and ``kktlab submit --watch`` ride out a restart of a real ``prefect server start``
  (same port, same SQLite database): the run ends Completed, the watch says so and exits 0; a server
  that stays lost past the bound ends in one line (the URL, ``kktlab status STORE``) and exit 4, no
  traceback;
- B: a stage's elapsed time and ETA count from its first running bundle (fake clock);
- C: a run's root flow run is named ``<config> @ <store>`` and tagged; it holds exactly one progress
  card per stage (updated in place), a table of the stages' counts and the store path with the
  ``kktlab report`` command; a second run of the same config to the same store carries the same
  artifact keys, each once (no new key, no duplicate).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from deploy import launch

CHAIN = {"runner": {"workers": 1, "bundle_size": 1}, "stages": [
    {"name": "nets", "experiment": "train", "grid": {"d": [16], "seed": [0, 1]},
     "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-10}},
    {"name": "robustness", "experiment": "universal_attack", "from": "nets", "grid": {"attack": ["margin_direction"]}}]}


# --- B ------------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_eta_counts_from_the_stage_s_first_running_bundle():
    from flows.progress import Progress

    clock, out = Clock(), io.StringIO()
    p = Progress(10, 0, "robustness", stream=out, every_s=0.0, clock=clock)
    clock.t += 500.0  # the upstream stage runs: 500 s of waiting, not this stage's time
    assert p.event().elapsed_s == 0.0 and p.event().eta_s is None
    p.running()
    clock.t += 10.0
    p.advance(2)  # 2 cells in 10 s: 8 left -> 40 s (counted from the flow's start it would be 2040 s)
    assert p.event().elapsed_s == pytest.approx(10.0) and p.event().eta_s == pytest.approx(40.0)
    p.running()  # a later bundle changes nothing
    clock.t += 10.0
    p.advance(3, cached=3)  # cached cells are not in the rate: 2 computed in 20 s, 5 left
    assert p.event().eta_s == pytest.approx(20.0 / 2 * 5)
    assert out.getvalue().splitlines()[-1] == "[kktlab] robustness: cells 5/10 (50%) elapsed 0:00:20 ETA 0:00:50, " \
                                              "3 from cache"


def test_a_stage_all_from_cache_starts_its_clock_when_stored():
    from flows.progress import Progress

    clock = Clock()
    p = Progress(4, 0, "nets", stream=io.StringIO(), every_s=0.0, clock=clock)
    clock.t += 300.0
    p.advance(4, cached=4)
    assert p.event().elapsed_s == 0.0 and p.event().eta_s is None


# --- A: the bound -------------------------------------------------------------------------------
def test_watch_gives_up_on_a_lost_server_in_one_line(capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from rich.console import Console

    from kktlab import served

    api = f"http://127.0.0.1:{launch.free_port()}/api"  # nothing listens there
    t0 = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: api}):
        code = served.watch("00000000-0000-0000-0000-000000000000", "http://ui/runs/flow-run/x", store="/data/s.zarr",
                            console=Console(file=io.StringIO()), api=api, lost_s=3.0)
    err = capsys.readouterr().err
    assert code == served.EXIT_LOST == 4 and time.monotonic() - t0 < 20
    assert len(err.strip().splitlines()) == 1 and api in err and "`kktlab status /data/s.zarr`" in err, err
    assert "Traceback" not in err


# --- A: a restart -------------------------------------------------------------------------------
def _lines(proc, sink: list) -> None:
    for line in proc.stdout:
        sink.append(line)


def _cells_done(store) -> int:
    from storage.query import status

    try:
        return sum(r["done"] for r in status(store))
    except Exception:  # noqa: BLE001 - no store yet
        return 0


def _kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the server goes away, no goodbye
    proc.wait(30)


@pytest.mark.requires_services
@pytest.mark.slow
def test_watch_rides_out_a_server_restart(cli, tmp_path, write_config):
    port, home = launch.free_port(), tmp_path / "prefect-home"  # its SQLite database outlives the restart
    server, env = launch.prefect_server(home, port, tmp_path / "server.log")
    worker = watcher = None
    try:
        dep = cli.run("deploy", "--pool", "kktlab-watch", env=env, timeout=180)
        assert dep.returncode == 0, dep.stderr[-2000:]
        wenv = dict(env)  # Prefect's default client retries, as `make worker` has them (deploy/api_retry.py)
        worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", "kktlab-watch", "--type",
                               "process"], tmp_path / "pworker.log", wenv)
        store = tmp_path / "watched.zarr"
        watcher = subprocess.Popen([*cli.argv, "submit", str(write_config(dict(CHAIN, name="watched"))), "--store",
                                    str(store), "--watch"], cwd=cli.root, env=dict(os.environ, **env),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        threading.Thread(target=_lines, args=(watcher, out), daemon=True).start()
        deadline = time.monotonic() + 150
        while not any(": Running" in line for line in out) and time.monotonic() < deadline and watcher.poll() is None:
            time.sleep(0.2)
        assert any(": Running" in line for line in out), "".join(out)
        assert _cells_done(store) < 4  # the restart comes while the run goes on (2 nets + 2 robustness cells)
        _kill(server)
        time.sleep(4.0)
        server, _ = launch.prefect_server(home, port, tmp_path / "server2.log")
        code = watcher.wait(300)
        time.sleep(0.5)
        text = "".join(out)
        assert "waiting for the Prefect server at" in text and f"127.0.0.1:{port}/api" in text, text[-4000:]
        assert "answers again" in text and "Traceback" not in text, text[-4000:]
        # the run's true final state, as the restarted server has it, and the matching exit code
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        run_id = text.split("(", 1)[1].split(")", 1)[0]
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as client:
                final = client.read_flow_run(run_id).state
        print(f"the run across the server restart: {final.name}, --watch exit {code}")  # shown by pytest -rA
        # the run itself rides out the restart too: Prefect clients made while the server was away
        # retry (deploy/api_retry.py), so it ends Completed and --watch says so with exit 0
        assert final.is_completed(), (final.name, text[-4000:], (tmp_path / "pworker.log").read_text()[-4000:])
        assert text.rstrip().count(f": {final.name}\n") + text.rstrip().endswith(final.name) >= 1
        assert code == 0, (final.name, text[-4000:])
        assert "cells: 2/2 done" in text, text[-4000:]  # the summary tables, read from the store
        assert _cells_done(store) == 4
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        if worker is not None:
            launch.stop(worker)
        launch.stop(server)


# --- C ------------------------------------------------------------------------------------------
@pytest.mark.requires_services
def test_the_run_in_the_ui_leads_to_the_results_and_keeps_its_artifact_keys(run_chain, prefect_server, cli):
    import asyncio

    from prefect.client.orchestration import get_client

    root = run_chain(dict(CHAIN, name="uichain"), "uichain", timeout=400)
    store = str(root / "chain.zarr")

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    async def query():  # filtered on the server: the session's server holds every test's runs (pages)
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="uichain")))
            runs = [fr for fr in runs if fr.name.startswith("uichain")]
            ids = [fr.id for fr in runs if fr.parent_task_run_id is None]
            return runs, await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))

    runs, artifacts = asyncio.run(query())
    _check_first_run(runs, artifacts, store)
    # the same config to the same store again (every cell done): the same keys, each once per run
    again = cli.run("run", root / "chain.yaml", "--store", store, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    runs, artifacts = asyncio.run(query())
    parents = sorted((fr for fr in runs if fr.parent_task_run_id is None), key=lambda fr: fr.created)
    assert [fr.name for fr in parents] == [f"uichain @ {store}"] * 2, [fr.name for fr in runs]
    keys = [sorted(a.key for a in artifacts if a.flow_run_id == fr.id) for fr in parents]
    assert keys[0] == sorted(["kktlab-chain-nets", "kktlab-chain-nets-progress", "kktlab-chain-robustness",
                              "kktlab-chain-robustness-progress", "kktlab-chain-summary", "kktlab-chain-results"])
    # no duplicate in either run, no new key; a run with nothing to compute has no progress cards, only
    # its summary and results (the same keys: their pages show the newest run's)
    assert all(k == sorted(set(k)) for k in keys) and set(keys[1]) <= set(keys[0]), keys
    assert {"kktlab-chain-summary", "kktlab-chain-results"} <= set(keys[1]), keys
    table = next(a for a in artifacts if a.flow_run_id == parents[1].id and a.type == "table")
    rows = {r["stage"]: r for r in json.loads(table.data)}  # the second run's own counts
    assert (rows["nets"]["done_before"], rows["nets"]["written"]) == (2, 0), rows


def _check_first_run(runs, artifacts, store: str) -> None:
    parent = [fr for fr in runs if fr.parent_task_run_id is None]
    assert [fr.name for fr in parent] == [f"uichain @ {store}"], [fr.name for fr in runs]
    assert set(parent[0].tags) >= {"kktlab", "config:uichain", "experiment:train", "experiment:universal_attack",
                                   f"store:{store}"}, parent[0].tags
    mine = [a for a in artifacts if a.flow_run_id == parent[0].id]
    progress = sorted(a.key for a in mine if a.type == "progress")
    assert progress == ["kktlab-chain-nets-progress", "kktlab-chain-robustness-progress"], progress
    bars = {a.key: a for a in mine if a.type == "progress"}
    assert float(bars["kktlab-chain-nets-progress"].data) == 100.0
    assert bars["kktlab-chain-nets-progress"].description.startswith("nets: cells 2/2 (100%)")
    lines = {a.key: a.data for a in mine if a.type == "markdown"}
    assert lines["kktlab-chain-robustness"].startswith("robustness: cells 2/2 (100%)"), lines  # no quote marks
    tables = [a for a in mine if a.type == "table"]
    assert len(tables) == 1
    rows = {r["stage"]: r for r in json.loads(tables[0].data)}
    assert rows["nets"]["total"] == 2 and rows["nets"]["written"] == 2 and rows["nets"]["failed"] == 0
    assert rows["robustness"]["experiment"] == "universal_attack" and rows["robustness"]["written"] == 2
    results = lines["kktlab-chain-results"]
    assert f"kktlab report {store} --out DIR" in results and f"kktlab status {store}" in results, results
