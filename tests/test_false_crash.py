"""Issue 43, the false crash: a live run the server marked Crashed (its heartbeats lost while the server
could not be reached) sets itself Running again (flows/liveness.py), ``kktlab submit --watch`` watches
it on while its process holds the store's run lock (kktlab/watch_crash.py), and a rerun's refusal says
its holder is alive although the server calls it Crashed (storage/runlock.py). The state changes are
made on the session's real Prefect server, as the heartbeat automation makes them (a forced Crashed)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from core.errors import StoreError
from kktlab.watch_crash import CrashCheck
from storage import runlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUTOMATION = "no heartbeat for 90 s: its worker or machine died; rerun the same kktlab submit (or run) command"


def _crashed():
    from prefect.states import Crashed

    return Crashed(message=AUTOMATION)


# --- the watcher's verdict: a real run lock (held by this process), Prefect's own states ---------------

def test_a_crashed_run_whose_process_holds_its_run_lock_is_watched_on_until_it_lets_go(tmp_path):
    from prefect.states import Running

    store, said, now = tmp_path / "s.zarr", [], [0.0]
    check = CrashCheck("run-1", str(store), ["nets"], said.append, settle_s=10, clock=lambda: now[0])
    with runlock.hold(store, ["nets"], about={"flow_run_id": "run-1"}):
        assert check.goes_on(_crashed(), "zombie") and check.goes_on(_crashed(), "zombie")
    assert len(said) == 1, said  # one line per Crashed spell
    assert "flow run zombie Crashed (no heartbeat for 90 s" in said[0] and f"pid {os.getpid()}@" in said[0]
    assert said[0].endswith("watching on")
    assert check.goes_on(_crashed())  # the lock let go a moment ago: its final state may be on its way
    now[0] = 10.0
    assert not check.goes_on(_crashed())  # then Crashed is final
    assert not check.goes_on(Running())


def test_a_crashed_run_is_dead_when_no_process_of_it_holds_the_lock(tmp_path):
    store, said = tmp_path / "s.zarr", []
    check = CrashCheck("run-1", str(store), ["nets"], said.append, settle_s=0)
    assert not check.goes_on(_crashed())  # never locked
    with runlock.hold(store, ["nets"], about={"flow_run_id": "run-2"}):  # another run computes the store
        assert not check.goes_on(_crashed())
    assert said == []


# --- on the real server ------------------------------------------------------------------------------------

def _client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _new_run() -> str:
    from prefect import flow
    from prefect.states import Running

    @flow(name="kktlab-false-crash")
    def nothing():
        pass

    with _client() as client:
        run = client.create_flow_run(nothing, name="zombie")
        client.set_flow_run_state(run.id, Running(), force=True)
    return str(run.id)


def _set(run_id: str, state) -> None:
    with _client() as client:
        client.set_flow_run_state(run_id, state, force=True)  # as the heartbeat automation's action does


def _states(run_id: str) -> list[str]:
    with _client() as client:
        return [s.name for s in sorted(client.read_flow_run_states(run_id), key=lambda s: s.timestamp)]


CFG = {"experiment": "nonrobust", "name": "alive", "grid": {"seed": [0]},
       "params": {"d": 8, "width": 8, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-6},
       "runner": {"cluster": "inline", "workers": 1, "bundle_size": 1}}


@pytest.mark.requires_services
def test_a_live_run_the_server_marks_crashed_sets_itself_running_again(prefect_server, write_config, tmp_path,
                                                                      monkeypatch, capfd):
    from flows import config as config_mod
    from flows import liveness
    from flows.sweep import run

    monkeypatch.setattr(liveness, "CHECK_S", 0.5)
    gate, store = tmp_path / "gate", tmp_path / "s.zarr"
    gate.touch()  # the run's bundle waits at it (flows/sweep.py wait_at_gate): alive, not done
    monkeypatch.setenv("KKTLAB_GATE", str(gate))
    seen: dict = {}

    def crash_it():  # what the heartbeat automation does after an outage, to a run that is computing
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (
                    (tmp_path / "gate.reached").exists() and runlock.holder(store, "alive").get("flow_run_id")):
                time.sleep(0.05)
            seen["id"] = run_id = runlock.holder(store, "alive")["flow_run_id"]
            _set(run_id, _crashed())
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and _states(run_id)[-1] != "Running":
                time.sleep(0.1)
        finally:
            gate.unlink(missing_ok=True)

    helper = threading.Thread(target=crash_it)
    helper.start()
    try:
        stats = run(config_mod.load(write_config(CFG), {}), str(store))
    finally:
        gate.unlink(missing_ok=True)
        helper.join()
    assert stats["written"] == 1, stats
    states = _states(seen["id"])
    assert states[-3:] == ["Crashed", "Running", "Completed"], states
    said = [line for line in capfd.readouterr().err.splitlines() if "marked flow run" in line]
    assert len(said) == 1, said
    assert "Crashed while it could not be reached (no heartbeat for 90 s" in said[0] and "still running" in said[0]


@pytest.mark.requires_services
def test_watch_rides_out_a_false_crash_and_exits_0(prefect_server, tmp_path, monkeypatch):
    from prefect.states import Completed, Running
    from rich.console import Console

    from kktlab import served

    monkeypatch.setattr(served, "POLL_S", 0.2)
    store, out, done = tmp_path / "s.zarr", io.StringIO(), threading.Event()
    run_id = _new_run()
    _set(run_id, _crashed())

    def recover():  # once the watcher has said it watches on: Running again (flows/liveness.py), then done
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not done.is_set() and "watching on" not in out.getvalue():
            time.sleep(0.05)
        if not done.is_set():
            _set(run_id, Running())
            time.sleep(0.5)
            _set(run_id, Completed())

    helper = threading.Thread(target=recover)
    with runlock.hold(store, ["g"], about={"flow_run_id": run_id}):
        helper.start()
        try:
            rc = served.watch(run_id, "ui", store=str(store), stages=[SimpleNamespace(name="g")],
                              console=Console(file=out, width=400))
        finally:
            done.set()
            helper.join()
    lines = out.getvalue().splitlines()
    assert rc == 0, lines
    assert sum("Crashed" in line and "but it is alive" in line for line in lines) == 1, lines
    assert any(line.endswith(": Running") for line in lines), lines  # its return is said


HOLD = """
import sys, time
from storage.runlock import hold
with hold(sys.argv[1], ["g"], about={"flow_run_id": sys.argv[2], "flow_run_url": sys.argv[3]}):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.mark.requires_services
def test_a_rerun_is_refused_saying_the_holder_is_alive_although_the_server_says_crashed(prefect_server, tmp_path):
    store, run_id = tmp_path / "s.zarr", _new_run()
    url = f"{prefect_server.rstrip('/').removesuffix('/api')}/runs/flow-run/{run_id}"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store), run_id, url], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(StoreError) as running:
            runlock.check(store, ["g"])  # what kktlab submit asks first (kktlab run: runlock.hold, the same line)
        _set(run_id, _crashed())
        with pytest.raises(StoreError) as crashed:
            runlock.check(store, ["g"])
    finally:
        proc.kill()
        proc.wait()
    assert "Crashed" not in str(running.value) and "alive" not in str(running.value)
    line = str(crashed.value)
    assert "\n" not in line and f"pid {proc.pid}@{socket.gethostname()}" in line and url in line, line
    assert "it is alive although the Prefect server shows it Crashed" in line, line
    assert line.endswith("rerun with --wait to wait for it"), line
