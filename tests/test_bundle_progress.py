"""Progress inside a bundle and stopping it (issue 30 items 1, 3): the worker's reporter and its
files, the training loop's hook, the line users read, and a real run whose long bundle is read
while it trains (its file, ``kktlab status``, and the run's logs and progress card in the Prefect
API) and then cancelled with ``kktlab cancel`` (resumable)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time

import pytest
import torch

from flows import bundle_progress as rep_mod
from flows.progress import Event, parse_line
from storage import bundle_progress as files
from tasks import nets, train


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_reporter_writes_at_a_bounded_rate_and_the_checkpoint_time(tmp_path):
    clock = Clock()
    rep = rep_mod.Reporter(str(tmp_path / "s.zarr"), "g", "k1", "g d=1 (2 cells)", 2, every_s=10, clock=clock)
    path = files.path_for(tmp_path / "s.zarr", "g", "k1")
    assert json.loads(path.read_text())["steps"] is None  # written at the start
    rep(steps=100, total=1000, loss=-5.0, target=-30.0)
    assert json.loads(path.read_text())["steps"] is None  # within 10 s: not rewritten
    clock.t += 10
    rep(steps=200)
    got = json.loads(path.read_text())
    assert (got["steps"], got["total"], got["loss"], got["target"], got["updated"]) == (200, 1000, -5.0, -30.0, 1010.0)
    clock.t += 1
    rep.checkpointed()
    assert json.loads(path.read_text())["checkpoint_at"] == 1011.0
    assert not list(path.parent.glob(".*tmp*"))  # the temp file was renamed
    [rec] = files.read(tmp_path / "s.zarr", "g")
    assert files.describe(rec, now=1071.0) == "step 200/1000 (20%), loss 1e-5.0 (target 1e-30), checkpoint 0:01:00 ago"
    files.remove(tmp_path / "s.zarr", "g", "k1")
    assert files.read(tmp_path / "s.zarr", "g") == []


def test_cancel_request_stops_the_bundle_at_its_next_report(tmp_path):
    clock = Clock()
    rep = rep_mod.Reporter(str(tmp_path / "s.zarr"), "g", "k", clock=clock)
    files.request_cancel(tmp_path / "s.zarr", "g")
    rep(steps=1)  # looked for at most every CANCEL_CHECK_S
    clock.t += rep_mod.CANCEL_CHECK_S
    with pytest.raises(rep_mod.BundleCancelled):
        rep(steps=2)
    with pytest.raises(rep_mod.BundleCancelled):  # a bundle that starts after the request does not run
        with rep_mod.reporting({"store": str(tmp_path / "s.zarr"), "group": "g"}, "k2"):
            pass
    files.clear(tmp_path / "s.zarr", "g")
    assert not (tmp_path / "s.zarr.progress").exists()


def test_the_midway_gate_holds_the_bundle_of_its_total_once_and_a_cancel_still_stops_it(tmp_path, monkeypatch):
    """$KKTLAB_GATE_MIDWAY (tests/test_served.py's cancel drill): a bundle of the total the gate names
    waits once mid-way, its progress file written and ``<gate>.reached`` made; a bundle of another
    total, or at its start or end, goes on; released, it goes on; a cancel request stops it there."""
    import threading

    gate = tmp_path / "midway"
    monkeypatch.setenv(rep_mod.MIDWAY_ENV, str(gate))
    gate.write_text("100")
    store = str(tmp_path / "s.zarr")
    other = rep_mod.Reporter(store, "g", "other")
    other(steps=50, total=200)  # not the gate's bundle: no wait
    held = rep_mod.Reporter(store, "g", "held")
    held(steps=0, total=100)  # not mid-way yet
    done = threading.Event()
    threading.Thread(target=lambda: (held(steps=50, total=100), done.set()), daemon=True).start()
    reached = tmp_path / "midway.reached"
    deadline = time.monotonic() + 10
    while not reached.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reached.exists() and not done.wait(0.3)  # waiting at the gate
    assert {r["steps"] for r in files.read(store, "g") if r["total"] == 100} == {50}  # its file says how far
    gate.unlink()
    assert done.wait(5)
    held(steps=60, total=100)  # once per bundle
    gate.write_text("")  # any bundle: a cancel request stops one waiting there
    waiting = rep_mod.Reporter(store, "g", "cancelled")
    files.request_cancel(store, "g")
    with pytest.raises(rep_mod.BundleCancelled):
        waiting(steps=5, total=10)
    files.clear(store, "g")


def test_outside_a_bundle_nothing_is_reported(tmp_path):
    rep = rep_mod.current()
    assert not rep.active and rep.within(0, 10) is None
    rep(steps=1)
    with rep_mod.reporting({"store": str(tmp_path / "s.zarr"), "group": "g"}, "k") as inner:
        assert rep_mod.current() is inner and inner.active
    assert rep_mod.current() is rep


@pytest.mark.parametrize("chunk", [None, 1], ids=["one-chunk", "net-by-net"])
def test_train_calls_progress_at_sync_points_up_to_the_calls_steps(chunk):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 8, 4, generator=g, dtype=torch.float64)
    y = torch.sign(X[..., 0])
    net = nets.TwoLayer(torch.randn(2, 6, 4, generator=g, dtype=torch.float64) * 0.1,
                        torch.zeros(2, 6, dtype=torch.float64), torch.randn(2, 6, generator=g, dtype=torch.float64))
    sched = train.Schedule(lr0=1e-3, target_loss=1e-300, max_iters=10_000, sync_every=10)
    seen = []
    st = train.train(net, X, y, sched, max_steps=50, chunk=chunk,
                     progress=lambda done, of, loss: seen.append((done, of, loss())))
    of = 50 if chunk is None else 100
    assert seen[-1][:2] == (of, of) and all(o == of for _, o, _ in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen) and len(seen) == of // 10
    last = seen[-1][2] if chunk is None else max(seen[4][2], seen[-1][2])  # net-by-net: each part's own worst
    assert last == pytest.approx(float(st.log_loss.max()), rel=1e-12)


def test_a_written_step_carries_its_loss(tmp_path):
    """``within``'s record: a step is never written without the loss of the same moment (the first
    record of a long bundle on a slow machine was step 900, loss None: CI of stop 55)."""
    now = [0.0]
    rep = rep_mod.Reporter(str(tmp_path / "s.zarr"), "g", "k", "b", 2, every_s=1.0, clock=lambda: now[0])
    cb = rep.within(0, 100, 1000)
    cb(10, 100, loss=lambda: -2 * math.log(10))  # not due: the loss is not read
    now[0] = 5.0
    cb(20, 100, loss=lambda: -3 * math.log(10))
    rec = files.read(str(tmp_path / "s.zarr"), "g")[0]
    assert (rec["steps"], rec["total"]) == (20, 1000) and rec["loss"] == pytest.approx(-3.0)


def test_the_progress_line_carries_the_bundles_own_progress_and_parses_back():
    e = Event("nets", 2, 8, 12.0, 30.0, 1, 0, "bundle nets d=25 (4 cells): step 3000/150000 (2%), loss 1e-12.0")
    assert e.line().endswith("; bundle nets d=25 (4 cells): step 3000/150000 (2%), loss 1e-12.0")
    assert parse_line(e.line()) == e
    assert parse_line(Event("nets", 2, 8, 12.0).line()).inside == ""


def test_summary_names_the_least_advanced_of_several_bundles():
    recs = [{"name": "a", "steps": 50, "total": 100}, {"name": "b", "steps": 10, "total": 100}]
    assert files.summary(recs).startswith("2 bundles running, slowest b: step 10/100 (10%)")


LONG = {"experiment": "nonrobust", "name": "long", "grid": {"seed": [0, 1]},
        "params": {"d": 20, "m": 30, "width": 64, "lr0": 1e-6, "lr_factor": 1.0, "lr_period": 100,
                   "target_loss": 1e-30, "max_iters": 2_000_000},
        "runner": {"workers": 1, "bundle_size": 2}}


INSIDE = re.compile(r"; bundle long seed=0\.\.1 \(2 cells\): step \d+/2000000 \(\d+%\), loss 1e")


def _inside_in_the_api(run_id: str) -> tuple[list[str], list[str]]:
    """The root flow run's progress log lines and its progress card's text that carry the bundle's own
    progress (read filtered on the server by the flow run: the session's server holds every test's runs)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200,
                                sort=LogSort.TIMESTAMP_DESC)
        cards = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    texts = [f"{a.key}: {a.description if a.type == 'progress' else a.data}" for a in cards
             if a.type in ("progress", "markdown")]
    return [m.message for m in logs if INSIDE.search(m.message)], [t for t in texts if INSIDE.search(t)]


@pytest.mark.requires_services
@pytest.mark.slow
def test_a_long_bundle_shows_its_progress_while_it_runs_and_kktlab_cancel_stops_it(cli, prefect_server, tmp_path):
    """A bundle of 2M steps (hours): its progress file and ``kktlab status`` say its step and loss
    within seconds of its start, and so do the run's log lines and progress card in the Prefect API
    (the ``; bundle <name>: step N/M`` text) while it runs; ``kktlab cancel`` stops the run (Dask work
    included) within seconds; the store stays resumable (status reads it, nothing done, no progress files left behind).
    The run's worker writes the file every second (``$KKTLAB_PROGRESS_EVERY_S``; 10 s by default), so
    each is seen after seconds of training, not tens; ``status`` and ``cancel`` run in this process."""
    import yaml

    from conftest import _run_here

    cfg, store = tmp_path / "long.yaml", tmp_path / "long.zarr"
    cfg.write_text(yaml.safe_dump(LONG))
    proc = subprocess.Popen([*cli.argv, "run", str(cfg), "--store", str(store)], cwd=cli.root,
                            env=dict(os.environ, KKTLAB_PROGRESS_EVERY_S="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, recs = time.monotonic() + 120, []
        while time.monotonic() < deadline and proc.poll() is None:
            recs = [r for r in files.read(store, "long") if r.get("steps")]
            if recs:
                break
            time.sleep(0.5)
        assert recs, "no in-bundle progress within 120 s"
        assert recs[0]["total"] == 2_000_000 and 0 < recs[0]["steps"] < 2_000_000 and recs[0]["loss"] is not None
        status = cli.run("status", store, timeout=60)
        assert "running: long seed=0..1 (2 cells): step " in status.stdout, status.stdout + status.stderr
        from storage import runlock

        run_id = runlock.holder(store, "long").get("flow_run_id")  # the run's root flow run, as its lock records it
        assert run_id, runlock.holder(store, "long")
        deadline, logs, cards = time.monotonic() + 60, [], []
        while time.monotonic() < deadline and proc.poll() is None and not (logs and cards):
            logs, cards = _inside_in_the_api(run_id)
            time.sleep(1.0)
        assert proc.poll() is None, "the run ended before its progress was read"  # seen while the bundle runs
        assert logs, "no '; bundle long ...: step N/2000000' log line on the run within 60 s"
        assert cards and all(c.startswith(("kktlab-long-long-progress: ", "kktlab-long-long: ")) for c in cards), cards
        t0 = time.monotonic()
        res = _run_here(("cancel", str(store)))
        stopped_s = time.monotonic() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert stopped_s < 60, (stopped_s, res.stdout)  # 31 s measured with 2 busy cores: the flow tears down its cluster and server
    assert proc.returncode != 0 and "run cancelled" in out, out[-3000:]
    after = cli.run("status", store, timeout=60).stdout
    assert "long" in after and "running:" not in after, after  # readable, resumable; no run computes it now
    assert files.cancel_requested(store, "long")  # kept for workers still to see it; the next run clears it


def test_a_served_run_whose_bundles_a_cancel_request_stopped_ends_cancelled(tmp_path, monkeypatch):
    """flows/served.py (run by kktlab/served_flow.py): a cancel request that stops the bundles before the Prefect worker stops the
    flow process (or with no worker acting on Cancelling at all) ends the run Cancelled, not Failed;
    tests/test_served.py cancels a served run end to end."""
    import yaml

    from flows import sweep
    from kktlab import served_flow

    def stopped(*_, **__):
        raise rep_mod.BundleCancelled("run cancelled: group 'long' of s.zarr stopped (rerun to resume): the cells "
                                      "stored stay, checkpoints are kept; the same command resumes")

    monkeypatch.setattr(sweep, "run", stopped)
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(LONG))
    state = served_flow.submit.fn(str(cfg), str(tmp_path / "long.zarr"))
    assert state.is_cancelled() and state.message.startswith("run cancelled: group 'long'"), state


def test_a_stored_bundles_progress_file_is_removed_and_the_others_kept(tmp_path):
    """The flow removes a bundle's progress file once its cells are stored (flows/chain.py ``_store``):
    the worker names it by the bundle's result-cache key, the flow by the stem of the receipt's path."""
    import types

    from flows import chain, result_cache

    store, done, running = str(tmp_path / "s.zarr"), "ab" * 16, "cd" * 16
    rep_mod.Reporter(store, "g", done)(steps=5, total=10)
    rep_mod.Reporter(store, "g", running)(steps=1, total=10)
    written = []
    st = types.SimpleNamespace(cfg=types.SimpleNamespace(name="g"), pending={(0,)},
                               writer=types.SimpleNamespace(write=lambda b, r, cached: written.append(r)))
    flow = types.SimpleNamespace(path=store, _release=lambda *a: None)
    chain.Scheduler._store(flow, st, [((0,), {})], [{"h": 1}], False, result_cache.path_for(store, "g", done), None,
                           None)
    assert written == [[{"h": 1}]] and st.pending == set()
    assert [r["key"] for r in files.read(store, "g")] == [running]  # the stored bundle's file is gone


QUICK = {"experiment": "forging", "name": "quick", "grid": {"seed": [0, 1, 2]},
         "params": {"model": "linreg", "d": 2, "eps": 0.3, "estimator": "naive_mc", "n_samples": 200},
         "runner": {"workers": 1, "bundle_size": 1}}


@pytest.mark.requires_services
def test_a_completed_run_leaves_no_progress_files(cli, prefect_server, tmp_path):
    """Three one-cell bundles run, report (cells done of their total) and are stored: once the run
    ends no progress file, folder or cancel request is left beside the store."""
    import yaml

    cfg, store = tmp_path / "quick.yaml", tmp_path / "quick.zarr"
    cfg.write_text(yaml.safe_dump(QUICK))
    res = cli.run("run", cfg, "--store", store, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert files.read(store, "quick") == [] and not files.cancel_requested(store, "quick")
    assert not (tmp_path / ("quick.zarr" + files.SUFFIX)).exists()
