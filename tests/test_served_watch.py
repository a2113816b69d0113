"""Served mode a lab can leave overnight (issue 30), and faults with real processes; none of these
needs a ``prefect server start`` of its own (tests/test_served.py has the served drills on one shared
server: the watch riding out a server restart among them).

- A: a server that stays lost past the bound ends ``--watch`` in one line (the URL, ``kktlab status
  STORE``) and exit 4, no traceback;
- B: a stage's elapsed time and ETA count from its first running bundle (fake clock);
- C: a run's root flow run is named ``<config> @ <store>`` and tagged; it holds exactly one progress
  card per stage (updated in place), a table of the stages' counts and the store path with the
  ``kktlab report`` command; a second run of the same config to the same store carries the same
  artifact keys, each once (no new key, no duplicate);
- a real ``dask scheduler`` + two ``dask worker`` processes; one worker is SIGKILLed mid-sweep (while
  each worker holds a bundle at a gate) and the sweep still writes every cell exactly once, equal to
  the kernels run directly;
- two sweeps (two processes, on the session's Dask cluster) writing different experiment groups into
  one store at the same time: nothing lost.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from deploy import dask as dask_specs
from deploy import launch
from flows import config, experiments
from served_support import CHAIN, TINY
from storage.query import open_results, status


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


# --- faults with real processes ----------------------------------------------------------------
@pytest.mark.requires_services
def test_sweep_survives_sigkill_of_a_dask_worker(cli, tmp_path, write_config, prefect_server, monkeypatch):
    from distributed import Client

    gate = tmp_path / "gate"  # every bundle waits at it (flows/sweep.py wait_at_gate): the kill comes while
    gate.touch()  # both workers hold one, whatever the machine's speed
    monkeypatch.setenv("KKTLAB_GATE", str(gate))  # the Dask workers' environment
    with launch.dask_cluster(2, tmp_path) as (address, _, workers):
        # bundles are cut for the workers the scheduler has (at least one each)
        assert dask_specs.worker_count({"cluster": "address", "address": address}) == 2
        path = write_config(dict(TINY, name="dk", grid={"d": [20], "seed": list(range(6))}))
        store = tmp_path / "dk.zarr"
        env = dict(os.environ, PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(tmp_path / "res"))
        runner = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--dask-address", address,
                                   "--json", str(tmp_path / "stats.json")], cwd=cli.root, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            with Client(address, timeout=30) as client:
                names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}

                def busy() -> set:
                    return {names.get(a) for a, keys in client.processing().items() if keys}

                deadline = time.monotonic() + 240
                while time.monotonic() < deadline and runner.poll() is None and not (
                        busy() >= {"w0", "w1"} and (tmp_path / "gate.reached").exists()):
                    time.sleep(0.2)
                assert busy() >= {"w0", "w1"}, runner.poll()  # each worker holds a bundle at the gate
            os.killpg(workers[0].pid, signal.SIGKILL)  # the nanny and its worker, no goodbye, mid-bundle
        finally:
            gate.unlink()
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


@pytest.mark.requires_services
def test_two_experiments_into_one_store_concurrently(cli, tmp_path, write_config, dask_address):
    """A nonrobust sweep and a forging sweep write one store at the same time (two processes, their
    bundles on the session's Dask workers): nothing lost."""
    store = tmp_path / "shared.zarr"
    a = write_config(dict(TINY, name="groupa", grid={"d": [12, 16], "seed": [0, 1, 2]}), "a.yaml")
    b = write_config({"experiment": "forging", "name": "groupb",
                      "grid": {"d": [2, 3], "eps": [0.1, 0.3], "estimator": ["exact", "naive_mc"]},
                      "params": {"model": "linreg", "n_samples": 500}, "runner": {"workers": 1}}, "b.yaml")
    env = dict(os.environ, KKTLAB_DASK_ADDRESS=dask_address)
    procs = [subprocess.Popen([*cli.argv, "run", str(p), "--store", str(store)], cwd=cli.root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in (a, b)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    got = {r["group"]: (r["experiment"], r["done"], r["total"]) for r in status(store)}
    assert got == {"groupa": ("nonrobust", 6, 6), "groupb": ("forging", 8, 8)}
    ds = open_results(store, "groupa")
    assert np.isfinite(ds.c_star.values).all() and (ds.status == 1).all()
    fg = open_results(store, "groupb")
    assert np.isfinite(fg.log_volume.sel(estimator="exact").values).all()
