"""Served mode with real services on 127.0.0.1 (issues 17 and 30). ONE real ``prefect server start`` (its
web UI on) and ONE ``kktlab deploy`` serve the whole module, and a process worker the tests that need
one (tests/served_support.py ``Served``): the tests run in file order, each starting the worker it
needs and leaving the server up; the crash drill comes last (it tightens the crash automation). One
watched ``kktlab submit`` of a 2-cell sweep (the ``tiny`` fixture, on a worker of its own) is checked by
several tests and is the crash drill's clean run. ``kktlab submit`` runs in the test process
(``Served.submit``) except where a process of its own is the point (a Prefect profile read at start, a
watch that goes on while the server restarts); ``kktlab deploy`` and ``kktlab cancel`` run as processes.

- ``kktlab deploy`` prints ONE table of the deployments (Prefect's ``deploy(*deployments)`` once), each
  experiment in it once, and the bound of the crash automation it made;
- no worker polls the pool yet: ``submit --watch`` says so in one line and exits 2; the API URL comes
  from a Prefect profile only;
- a sweep and a chain submitted with ``--watch`` complete and write their stores; the server has their
  progress (artifacts, log lines with ETA) on the run ``submit`` printed and task runs named by stage
  and cells (issue 17); the worker's log shows a quiet sweep: no local-cluster INFO lines, the
  dashboard address once, no forced kill of Dask workers at teardown;
- in a real browser (headless Chromium, the system's package; skipped with a reason where there is
  none) the run's page and its progress artifact's page show the progress, the results artifact's page
  the store path and the ``kktlab report`` command (docs/served-flow-run.png is taken the same way);
- ``kktlab cancel STORE`` stops a served run mid-bundle within seconds: the flow run ends Cancelled, its
  process and Dask workers are gone, the progress files stop moving, the store verifies; the same
  ``kktlab submit`` resumes it to Completed without recomputing the cell done before;
- a served run and ``submit --watch`` ride out a restart of the server (same port, same SQLite
  database; the run held at a gate until the server is gone): the run ends Completed, the watch says
  so and exits 0;
- a run whose worker died (worker, flow-run process and Dask cluster SIGKILLed, the run held at a gate)
  is marked Crashed by Prefect's own mechanism (flow-run heartbeats every 30 s and the automation
  ``kktlab deploy`` makes, made again at 2 missed: deploy/prefect_deploy.py ``ensure_crash_automation``)
  within a bound, with how to resume; the same ``kktlab submit`` resumes it, and every stored value
  equals the clean ``tiny`` run's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import types

import psutil
import pytest
import yaml

from conftest import assert_stores_equal
from served_support import (CHAIN, CRASH_ENV, FINAL, HEARTBEAT_S, MISSED, POOL, TINY, Served, done, gone, mid_bundle,
                            run_id, stored, wait_for)
from storage.query import open_results

pytestmark = [pytest.mark.requires_services, pytest.mark.slow]

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
requires_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="requires headless Chromium (apt install chromium); none of chromium, chromium-browser, "
                             "google-chrome is on PATH")


@pytest.fixture(scope="module")
def served(cli, tmp_path_factory):
    """The module's server and deployments; a worker is started by the tests that need one."""
    s = Served(tmp_path_factory.mktemp("served"), cli)
    try:
        s.deploy = s.deploy_all()
        assert s.deploy.returncode == 0, s.deploy.stdout[-2000:] + s.deploy.stderr[-2000:]
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def tiny(served, tmp_path_factory):
    """TINY submitted with ``--watch`` (``res``: the command's result; ``store``), run by a worker started
    for it and stopped after its flow-run process ended (``log``: that worker's whole log)."""
    root = tmp_path_factory.mktemp("tiny")
    path, store = root / "served.yaml", root / "served.zarr"
    path.write_text(yaml.safe_dump(dict(TINY, name="served")))
    worker = served.start_worker("pworker-tiny.log")
    res = served.submit(path, "--store", store, "--watch", timeout=400)
    # its flow-run process ends (its Dask cluster closed after the run's final state) before the worker stops
    wait_for(lambda: not psutil.Process(worker.pid).children(recursive=True), 120)
    served.stop_worker()
    return types.SimpleNamespace(res=res, store=store, log=served.worker_log.read_text())


def test_deploy_prints_one_table(served):
    from flows import experiments

    out = served.deploy.stdout
    lines = [line.strip() for line in out.splitlines()]
    assert lines.count("Deployments") == 1, out  # the rich table's title
    assert sum(bool(re.match(r"┃\s*Name\s*┃\s*Status", line)) for line in lines) == 1, out  # its header
    assert out.count("Successfully created/updated all deployments!") == 1, out
    names = experiments.names()
    for name in names:
        assert len(re.findall(rf"kktlab-submit/{re.escape(name)}\s", out)) == 1, (name, out)
    assert out.count("kktlab-submit/") == len(names) and f"deployed {len(names)} deployments" in out, out
    # and Prefect's zombie detection: the automation's bound (the crash drill makes it again at its own)
    assert len(re.findall(r"flow runs without a heartbeat for \d+ s are marked Crashed", out)) == 1, out


def test_submit_says_when_no_worker_polls_the_pool(served, cli, tmp_path, write_config):
    assert served.workers_started == 0, "this test runs before the module starts any worker (file order)"
    env = served.env
    home = tmp_path / "profile-home"  # the API URL comes from a Prefect profile only
    home.mkdir()
    (home / "profiles.toml").write_text(f'active = "kk"\n[profiles.kk]\nPREFECT_API_URL = "{env["PREFECT_API_URL"]}"\n')
    no_url = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    t0 = time.monotonic()
    lone = subprocess.run([*cli.argv, "submit", write_config(dict(TINY, name="lonely"), "lonely.yaml"), "--store",
                           tmp_path / "lonely.zarr", "--watch"], cwd=cli.root, capture_output=True, text=True,
                          env=dict(no_url, PREFECT_HOME=str(home), KKTLAB_NO_WORKER_S="3"), timeout=120)
    assert lone.returncode == 2 and time.monotonic() - t0 < 60, lone.stdout + lone.stderr
    assert f"no worker is polling work pool '{POOL}'" in lone.stderr and "Traceback" not in lone.stderr
    assert f"127.0.0.1:{served.port}/runs/flow-run/" in lone.stdout  # the profile's server was used
    from prefect.states import Cancelled

    served.set_state(run_id(lone.stdout), Cancelled())  # no later worker takes it


def test_a_submitted_sweep_and_chain_complete_with_their_progress_on_the_server(served, tiny, cli, write_config):
    res = tiny.res
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "Completed" in res.stdout and f"127.0.0.1:{served.port}/runs/flow-run/" in res.stdout
    ds = open_results(tiny.store)
    assert bool(ds.done.all()) and (ds.status == 1).all()
    # the worker's log: a quiet sweep (Dask's warnings let through, so a forced kill at teardown would show)
    assert "distributed.scheduler" not in tiny.log and "jupyter-server-proxy" not in tiny.log, tiny.log[-3000:]
    assert "still alive" not in tiny.log, tiny.log[-3000:]
    dashboards = re.findall(r"\[kktlab\] Dask dashboard: http://127\.0\.0\.1:\d+/status", tiny.log)
    assert len(dashboards) == 1, tiny.log[-3000:]
    # the run is on the server: the parent run (the one submit printed) carries the progress
    # (artifact text "cells 2/2", log lines); task runs are named by stage and cells (issue 17)
    served.ensure_worker()
    chain = {"name": "servedchain", "runner": {"workers": 1, "bundle_size": 1}, "stages": [
        {"name": "nets", "experiment": "train", "grid": {"d": [16], "seed": [0]}, "params": TINY["params"]},
        {"name": "robustness", "experiment": "universal_attack", "from": "nets",
         "grid": {"attack": ["margin_direction"]}}]}
    store2 = tiny.store.parent / "chain.zarr"
    res2 = served.submit(write_config(chain, "chain.yaml"), "--store", store2, "--watch", timeout=400)
    assert res2.returncode == 0, res2.stdout + res2.stderr[-3000:]
    assert bool(open_results(store2, "robustness").done.all())
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId,
                                                LogFilter, LogFilterFlowRunId)

    ids = [run_id(res.stdout), run_id(res2.stdout)]
    with served.client() as client:  # the two submits' runs and what hangs off them (other tests' runs left out)
        parents = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=ids)))
        flow_runs = [*parents, *subflows]
        mine = FlowRunFilter(id=FlowRunFilterId(any_=[fr.id for fr in flow_runs]))
        logs = {fr.id: client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id]))) for fr in parents}
        artifacts, task_runs = client.read_artifacts(flow_run_filter=mine), client.read_task_runs(flow_run_filter=mine)
    assert {fr.state.name for fr in flow_runs} == {"Completed"} and len(flow_runs) == 4  # 2 x (submit + sweep)
    assert len(parents) == 2 and all(fr.parent_task_run_id is None for fr in parents)
    for parent in parents:
        on_it = [a for a in artifacts if a.flow_run_id == parent.id]
        assert any(a.type == "progress" and float(a.data) == 100.0 for a in on_it)
        texts = [str(a.data) for a in on_it if a.type == "markdown"]
        assert any("cells 2/2 (100%)" in t for t in texts) or any("cells 1/1 (100%)" in t for t in texts), texts
        assert any("cells" in log.message and "ETA" in log.message for log in logs[parent.id])
    assert any(a.key == "kktlab-chain-robustness" for a in artifacts)
    # kktlab report's tables in the UI (issue 43): each stage's summary, as ``kktlab show`` gives it, on the
    # run submit printed
    import json as json_mod

    from storage.query import summary_frame

    tables = {a.key: a for a in artifacts if a.type == "table"}
    for key, store_, group in (("kktlab-served-served-summary", tiny.store, "served"),
                               ("kktlab-chain-nets-summary", store2, "nets"),
                               ("kktlab-chain-robustness-summary", store2, "robustness")):
        rows = tables[key].data if isinstance(tables[key].data, list) else json_mod.loads(tables[key].data)
        want = json_mod.loads(summary_frame(open_results(store_, group)).reset_index().to_json(orient="records"))
        assert rows == want and str(tables[key].flow_run_id) in ids, (key, rows, want)
    # and each stage's acceptance table, as kktlab report judges it (kktlab/served_flow.py)
    from kktlab.served_flow import report_artifacts

    for key, store_, group in (("kktlab-served-served-acceptance", tiny.store, "served"),
                               ("kktlab-chain-robustness-acceptance", store2, "robustness")):
        rows = tables[key].data if isinstance(tables[key].data, list) else json_mod.loads(tables[key].data) \
            if key in tables else None
        want = next(a["data"] for a in report_artifacts(store_, [group]) if a["suffix"] == f"{group}-acceptance")
        assert rows == want and {r["result"] for r in rows} <= {"pass", "FAIL", "not judged", "not judged (no data)"}, \
            (key, rows)
    # and the report's figures, written beside each store and linked from its run (issue 43)
    import pathlib
    from urllib.parse import unquote, urlparse

    from flows import run_ui

    for store_ in (tiny.store, store2):
        page = next(a for a in artifacts if a.key == run_ui.key(store_, "report"))
        links = [pathlib.Path(unquote(urlparse(u).path)) for u in re.findall(r"\((file://[^)]+)\)", page.data)]
        assert links and links[0] == (pathlib.Path(str(store_) + ".report") / "index.html").resolve(), page.data
        assert all(p.is_file() for p in links) and str(page.flow_run_id) in ids, page.data
        assert len(links) - 1 == len(list(links[0].parent.rglob("*.png"))), page.data  # every figure linked
    names = {t.name for t in task_runs}
    assert "served d=16 seed=0 (1 cell)" in names and "nets d=16 seed=0 (1 cell)" in names, names
    assert "robustness d=16 seed=0 attack=margin_direction (1 cell)" in names, names


def _page_text(url: str, tmp_path, *shows: str, screenshot=None) -> str:
    """The text of ``url`` once the UI has loaded its data (Chromium's virtual time budget), loaded again
    (3 times at most) while it lacks one of ``shows`` (its data came late: a busy machine); a screenshot
    too if asked for (in the same run: Chromium's headless mode takes both at once)."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1500",
            "--virtual-time-budget=20000", f"--user-data-dir={tmp_path / 'chromium'}"]
    shot = [] if screenshot is None else [f"--screenshot={screenshot}"]
    for _ in range(3):
        dom = subprocess.run([*args, *shot, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                             check=True).stdout
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
        if all(s in text for s in shows):
            break
    if shot and not screenshot.exists():  # an older headless mode does one of the two per run
        subprocess.run([*args, *shot, url], capture_output=True, timeout=120, check=True)
    return text


@requires_chromium
def test_run_page_in_a_browser_shows_the_progress(served, tiny, tmp_path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    out = tiny.res.stdout
    assert tiny.res.returncode == 0, out + tiny.res.stderr[-3000:]
    # --watch off a terminal: plain progress lines, then the summary table read from the store
    assert "[kktlab] served: cells 2/2 (100%)" in out and "\x1b[" not in out, out
    assert "== nonrobust / served" in out and "cells: 2/2 done" in out, out
    url = re.search(r"http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36}", out).group(0)
    rid, site = url.rsplit("/", 1)[1], url.split("/runs/")[0]
    text = _page_text(url, tmp_path, "Completed", "served: cells 2/2 (100%)", screenshot=tmp_path / "run.png")
    assert "Completed" in text and "served: cells 2/2 (100%)" in text, text[-3000:]  # its progress log lines
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with served.client() as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=["kktlab-served-served", "kktlab-served-results"])))
    final = [a for a in arts if a.key == "kktlab-served-served" and "cells 2/2 (100%)" in str(a.data)
             and str(a.flow_run_id) == rid]
    assert final, [(a.key, a.data) for a in arts]
    art_text = _page_text(f"{site}/artifacts/artifact/{final[0].id}", tmp_path, "kktlab-served-served",
                          "served: cells 2/2 (100%)")
    assert "kktlab-served-served" in art_text and "served: cells 2/2 (100%)" in art_text, art_text[-2000:]
    # from the run to the results: the results artifact's page names the store and the report command
    results = [a for a in arts if a.key == "kktlab-served-results" and str(a.flow_run_id) == rid]
    assert len(results) == 1, [(a.key, a.flow_run_id) for a in arts]
    store = str(tiny.store)
    res_text = _page_text(f"{site}/artifacts/artifact/{results[0].id}", tmp_path, f"Results: {store}",
                          f"kktlab report {store} --out DIR", screenshot=tmp_path / "results.png")
    assert f"Results: {store}" in res_text, res_text[-3000:]
    assert f"kktlab report {store} --out DIR" in res_text and f"kktlab status {store}" in res_text, res_text[-3000:]
    if os.environ.get("KKTLAB_UPDATE_SCREENSHOT"):  # refresh the README's picture: docs/served-flow-run.png
        shutil.copy(tmp_path / "run.png", os.path.join(os.path.dirname(__file__), "..", "docs", "served-flow-run.png"))


# lr 1e-6 and a loss target never met: every cell trains exactly max_iters steps, a short first bundle,
# then one held at the mid-way gate (served.hold_midway: it waits there, its progress file written,
# until the test has cancelled the run); the resume computes that one again. (Cells of different
# max_iters are bundled apart, and the bundles go in the order of their keys' repr, flows/bundles.py:
# 1000 before 4000.)
LONG_ITERS = 4_000
LONG = {"experiment": "nonrobust", "name": "cancelme", "grid": {"max_iters": [1_000, LONG_ITERS]},
        "params": {"d": 20, "m": 30, "width": 64, "lr0": 1e-6, "lr_factor": 1.0, "lr_period": 100,
                   "target_loss": 1e-30, "seed": 0},
        "runner": {"workers": 1, "bundle_size": 1}}


def test_kktlab_cancel_stops_a_served_run_within_seconds_and_it_resumes(served, cli, write_config, request):
    from storage import bundle_progress as files
    from storage import runlock

    request.addfinalizer(served.release)  # no later test's bundle waits at this test's gates

    worker, env, group = served.ensure_worker(), served.env, LONG["name"]
    path = write_config(LONG)
    store = path.parent / "c.zarr"
    t_submit = time.monotonic()
    reached = served.hold_midway(LONG_ITERS)  # the second bundle waits mid-way until the cancel
    sub = served.submit(path, "--store", store, timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr[-2000:]
    rid = run_id(sub.stdout)
    # the first cell stored and the second bundle held mid-way (its progress file counts steps)
    deadline, recs = time.monotonic() + 240, []
    while time.monotonic() < deadline and served.state(rid).name not in FINAL:
        if reached.exists() and (recs := mid_bundle(store, group, "max_iters")):
            break
        time.sleep(0.2)
    assert recs and done(store) == 1, (recs, done(store), served.state(rid))
    assert 0 < recs[0]["steps"] < recs[0]["total"] == LONG_ITERS, recs
    busy = psutil.Process(worker.pid).children(recursive=True)  # its flow-run process and that one's Dask cluster
    assert busy, "no flow-run process under the worker"
    before = stored(store, "max_iters")
    print(f"running {time.monotonic() - t_submit:.1f} s after submit: {recs[0]['steps']} steps of the 2nd bundle; "
          f"{len(busy)} processes under the worker")
    t0, wall0 = time.monotonic(), time.time()
    res = cli.run("cancel", store, env=env, timeout=120)
    cancel_s = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Cancelling" in res.stdout and "stopped" in res.stdout, res.stdout
    state, state_s, gone_s = served.state(rid), None, None
    while time.monotonic() - t0 < 90 and (state_s is None or gone_s is None):
        if state_s is None and (state := served.state(rid)).name in FINAL:
            state_s = time.monotonic() - t0
        if gone_s is None and gone(busy):
            gone_s = time.monotonic() - t0
        time.sleep(0.25)
    print(f"kktlab cancel returned 0 after {cancel_s:.1f} s; the flow run {state.name} after {state_s} s "
          f"({state.message!r}); its processes gone after {gone_s} s")
    print("states:", served.history(rid, wall0))
    assert state.name == "Cancelled", (state, served.worker_log.read_text()[-4000:])
    assert gone_s is not None, "the flow-run process or its Dask workers still run 90 s after the cancel"
    assert cancel_s < 60 and gone_s < 60 and state_s < 60, (cancel_s, gone_s, state_s)
    assert runlock.held_by(store, group) is None
    moved = {r["key"]: r["updated"] for r in files.read(store, group)}
    time.sleep(2.0)  # a bundle still computing would rewrite its file every second (the workers' setting)
    assert {r["key"]: r["updated"] for r in files.read(store, group)} == moved
    assert done(store) == 1
    check = cli.run("verify", store, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    # the same command resumes: Completed, every cell done, the one done before not recomputed
    served.release()
    again = served.submit(path, "--store", store, "--watch", timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "cells: 2/2 done" in again.stdout and "Traceback" not in again.stdout + again.stderr, again.stdout[-3000:]
    run2 = run_id(again.stdout)
    assert served.state(run2).name == "Completed"
    rows = served.table(run2, store)[group]
    assert (rows["done_before"], rows["written"], rows["failed"]) == (1, 1, 0), rows
    after = stored(store, "max_iters")
    assert all(ok for ok, _, _ in after.values()), after
    kept = [s for s, (ok, _, _) in before.items() if ok]
    assert len(kept) == 1 and all(after[s] == before[s] for s in kept), (before, after)  # same hash, same wall_s
    assert not (store.parent / (store.name + files.SUFFIX)).exists()  # the resumed run cleared the cancel request


def _lines(proc, sink: list) -> None:
    for line in proc.stdout:
        sink.append(line)


def test_watch_rides_out_a_server_restart(served, cli, tmp_path, write_config):
    served.ensure_worker()  # Prefect's default client retries, as `make worker` has them (deploy/api_retry.py)
    store = tmp_path / "watched.zarr"
    reached = served.hold()  # its bundles wait at the gate (flows/sweep.py wait_at_gate): the restart comes mid-run
    watcher = None
    try:
        watcher = subprocess.Popen([*cli.argv, "submit", str(write_config(dict(CHAIN, name="watched"))), "--store",
                                    str(store), "--watch"], cwd=cli.root, env=dict(os.environ, **served.env),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        reader = threading.Thread(target=_lines, args=(watcher, out), daemon=True)
        reader.start()
        assert wait_for(lambda: any(": Running" in line for line in out) and reached.exists(), 180, watcher), \
            "".join(out)
        assert done(store) < 4  # the restart comes while the run goes on (2 nets + 2 robustness cells)
        served.kill_server()
        served.release()  # the run goes on while the server is away: its calls to the API must retry
        assert wait_for(lambda: any("waiting for the Prefect server at" in line for line in out), 60, watcher), \
            "".join(out)
        served.restart_server("server2.log")
        code = watcher.wait(300)
        reader.join(30)
    finally:
        served.release()
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
    text = "".join(out)
    assert f"127.0.0.1:{served.port}/api" in text, text[-4000:]
    assert "answers again" in text and "Traceback" not in text, text[-4000:]
    # the run's true final state, as the restarted server has it, and the matching exit code
    final = served.state(run_id(text))
    print(f"the run across the server restart: {final.name}, --watch exit {code}")  # shown by pytest -rA
    # the run itself rides out the restart too: Prefect clients made while the server was away
    # retry (deploy/api_retry.py), so it ends Completed and --watch says so with exit 0
    assert final.is_completed(), (final.name, text[-4000:], served.worker_log.read_text()[-4000:])
    assert text.rstrip().count(f": {final.name}\n") + text.rstrip().endswith(final.name) >= 1
    assert code == 0, (final.name, text[-4000:])
    assert "cells: 2/2 done" in text, text[-4000:]  # the summary tables, read from the store
    assert done(store) == 4


def test_a_run_whose_worker_died_is_marked_crashed_and_resumes(served, tiny, cli, tmp_path, write_config):
    # Prefect's zombie detection at the drill's bound: heartbeats every 30 s, crashed after 2 missed (the
    # automation `kktlab deploy` makes, made again; the workers before had Prefect's 180 s and 3 x 180 s)
    assert served.crash_automation() == MISSED * HEARTBEAT_S
    reached = served.hold()  # the run's bundles wait at the gate: alive, not done
    try:
        worker = served.start_worker("pworker-crash.log", **CRASH_ENV)
        path, store = write_config(dict(TINY, name="zombie")), tmp_path / "z.zarr"  # tiny's config: its clean run
        sub = served.submit(path, "--store", store, timeout=120)
        assert sub.returncode == 0, sub.stdout + sub.stderr[-2000:]
        rid = run_id(sub.stdout)
        assert served.wait_state(rid, {"Running"}, 180).name == "Running"
        # the automation watches what follows a heartbeat
        assert wait_for(lambda: served.heartbeats(rid) and reached.exists(), 3 * HEARTBEAT_S, poll_s=1)
        assert served.state(rid).name == "Running"
        victims = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
        for p in victims:  # the worker, its flow-run process and the run's Dask cluster die at once
            p.kill()
        psutil.wait_procs(victims, timeout=30)
        t_kill = time.monotonic()
        state = served.wait_state(rid, {"Crashed", "Completed", "Failed", "Cancelled"}, MISSED * HEARTBEAT_S + 150)
        assert state.name == "Crashed", state
        assert "no heartbeat" in (state.message or "") and "resume" in (state.message or "")
        assert time.monotonic() - t_kill <= MISSED * HEARTBEAT_S + 150
        assert done(store) == 0  # the crash cut the run short at its gate: the resume has every cell to compute
    finally:
        served.release()
    # resumed by the same command (a fresh worker): the store completes
    served.start_worker("pworker-crash2.log", **CRASH_ENV)
    res = served.submit(path, "--store", store, "--watch", timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "cells: 2/2 done" in res.stdout and "Traceback" not in res.stdout + res.stderr, res.stdout[-3000:]
    assert tiny.res.returncode == 0, tiny.res.stdout[-3000:]
    assert_stores_equal(store, tiny.store)
