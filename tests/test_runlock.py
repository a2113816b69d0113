"""Issue 29 item 11 / issue 30 item 5: one run at a time per group of a store (storage/runlock.py).

Real processes, no mocks: a helper process holds a group's lock; this process is refused in one
line naming it, takes the lock at once after the holder is SIGKILLed, and with ``wait`` waits for
it. End to end, a second ``kktlab run`` of the same config on the same store exits 2 with that line
while the first runs, ``--wait`` waits and then computes nothing, and the first computes each cell once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from core.errors import StoreError
from storage import runlock

HOLD = """
import sys, time
from storage.runlock import hold
with hold(sys.argv[1], sys.argv[2].split(","), about={"flow_run_url": "http://prefect.example/runs/flow-run/42"}):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


@pytest.fixture
def holder_proc(cli):
    """``holder_proc(store, groups, seconds)``: a process that holds the run lock of ``groups``
    (comma-separated) for ``seconds``, started and returned once it holds it; killed at the end."""
    procs = []

    def _start(store, groups: str, seconds: float = 120) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store), groups, str(seconds)], cwd=cli.root,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held", "the helper process did not take the lock"
        return proc

    yield _start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_held_group_is_refused_in_one_line_naming_its_holder(tmp_path, holder_proc):
    store = tmp_path / "s.zarr"
    a = holder_proc(store, "nets")
    with pytest.raises(StoreError) as err:
        with runlock.hold(store, ["nets"]):
            pytest.fail("the lock of a held group was taken")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"group 'nets' of store {store} is being computed by another run (")
    assert f"pid {a.pid}@{socket.gethostname()} since " in line and " UTC" in line
    assert "flow run http://prefect.example/runs/flow-run/42" in line
    assert line.endswith("; rerun with --wait to wait for it")
    assert not (store).exists(), "the lock file was put inside the store folder"


def test_the_lock_of_a_sigkilled_holder_is_free_at_once(tmp_path, holder_proc):
    store = tmp_path / "s.zarr"
    a = holder_proc(store, "nets")
    a.send_signal(signal.SIGKILL)
    a.wait()
    with runlock.hold(store, ["nets"], about={"flow_run_id": "abc"}):  # the kernel dropped the flock
        rec = runlock.holder(store, "nets")  # the dead holder's record is overwritten
        assert (rec["pid"], rec["host"], rec["flow_run_id"], rec["group"]) == (
            os.getpid(), socket.gethostname(), "abc", "nets")
        assert "flow_run_url" not in rec and rec["command"]


def test_a_refused_chain_keeps_none_of_its_groups(tmp_path, holder_proc):
    """A chain whose second group (in lock order) is held releases the first one it took."""
    store = tmp_path / "s.zarr"
    a = holder_proc(store, "robustness")
    with pytest.raises(StoreError, match=f"group 'robustness' .*pid {a.pid}@"):
        with runlock.hold(store, ["robustness", "nets"]):
            pass
    with runlock.hold(store, ["nets"]):  # not left held by the refused call
        pass


def test_wait_waits_for_the_holder_then_holds(tmp_path, holder_proc):
    store = tmp_path / "s.zarr"
    a = holder_proc(store, "nets,robustness", seconds=1.5)
    said: list[str] = []
    with runlock.hold(store, ["robustness", "nets"], wait=True, say=said.append, poll_s=0.05, say_every_s=0.5):
        assert runlock.holder(store, "nets")["pid"] == os.getpid()
    assert a.wait(timeout=30) == 0  # the holder ran to its end: it was waited for, not pushed aside
    assert said and f"pid {a.pid}@" in said[0] and "waiting for the run computing group 'nets'" in said[0]
    assert len(said) >= 3 and "is free after" in said[-1], said  # lines while waiting


# --- end to end: the real CLI twice on one store -----------------------------------------------------

CFG = {"experiment": "nonrobust", "name": "twice", "grid": {"seed": list(range(4))},
       "params": {"d": 12, "width": 48, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-20},
       "runner": {"cluster": "inline", "workers": 1, "bundle_size": 1}}


def _flow_started(store, group) -> bool:
    """A run holds the lock of ``group`` and its flow run has started (its record names it)."""
    return "flow_run_url" in runlock.holder(store, group)


@pytest.mark.requires_services
def test_a_second_run_of_the_same_config_is_refused_and_wait_computes_nothing(cli, write_config, tmp_path,
                                                                              prefect_server):
    path, store = write_config(CFG), tmp_path / "s.zarr"
    first = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--json", str(tmp_path / "a.json")],
                             cwd=cli.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and first.poll() is None and not _flow_started(store, "twice"):
            time.sleep(0.05)
        rec = runlock.holder(store, "twice")
        assert rec.get("pid") == first.pid, first.stderr.read() if first.poll() is not None else rec
        assert rec["flow_run_url"].startswith(prefect_server.rstrip("/").removesuffix("/api") + "/runs/flow-run/")
        waiter = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--wait",
                                   "--json", str(tmp_path / "c.json")], cwd=cli.root, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        second = cli.run("run", path, "--store", store, "--json", tmp_path / "b.json", timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused: make CFG longer"
        _, waited = waiter.communicate(timeout=120)
        _, err = first.communicate(timeout=120)
    finally:
        for proc in (first, locals().get("waiter")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = second.stderr.strip().splitlines()  # what it runs, then why it does not
    assert second.returncode == 2 and len(lines) == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert lines[1] == f"kktlab: error: {runlock.refusal(store, 'twice', rec)}"
    assert not (tmp_path / "b.json").exists()
    assert first.returncode == 0, err[-3000:]
    stats = json.loads((tmp_path / "a.json").read_text())
    assert (stats["written"], stats["computed"], stats["from_cache"], stats["refused_done"]) == (4, 4, 0, 0), stats
    assert waiter.returncode == 0, waited[-3000:]
    assert f"waiting for the run computing group 'twice' of {store} (pid {first.pid}@" in waited
    stats = json.loads((tmp_path / "c.json").read_text())
    assert (stats["written"], stats["computed"], stats["done_before"]) == (0, 0, 4), stats
