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

CFG = {"experiment": "nonrobust", "name": "twice", "grid": {"seed": list(range(2))},
       "params": {"d": 8, "width": 8, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-6},
       "runner": {"cluster": "inline", "workers": 1, "bundle_size": 1}}


def _said_waiting(log) -> bool:
    return "waiting for the run computing group" in log.read_text()


def _flow_started(store, group) -> bool:
    """A run holds the lock of ``group`` and its flow run has started (its record names it)."""
    return "flow_run_url" in runlock.holder(store, group)


@pytest.mark.requires_services
def test_a_second_run_of_the_same_config_is_refused_and_wait_computes_nothing(cli, write_config, tmp_path,
                                                                              prefect_server):
    path, store, gate = write_config(CFG), tmp_path / "s.zarr", tmp_path / "gate"
    gate.touch()  # the first run's bundles wait at the gate (flows/sweep.py wait_at_gate) until the test lifts it
    first = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--json", str(tmp_path / "a.json")],
                             cwd=cli.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, KKTLAB_GATE=str(gate)))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and not (
                _flow_started(store, "twice") and (tmp_path / "gate.reached").exists()):
            time.sleep(0.05)
        rec = runlock.holder(store, "twice")
        assert rec.get("pid") == first.pid, first.stderr.read() if first.poll() is not None else rec
        assert rec["flow_run_url"].startswith(prefect_server.rstrip("/").removesuffix("/api") + "/runs/flow-run/")
        waiter = subprocess.Popen([*cli.argv, "run", str(path), "--store", str(store), "--wait",
                                   "--json", str(tmp_path / "c.json")], cwd=cli.root, stdout=subprocess.DEVNULL,
                                  stderr=(tmp_path / "c.log").open("w"), text=True)
        second = cli.run("run", path, "--store", store, "--json", tmp_path / "b.json", timeout=120)
        assert first.poll() is None, "the first run ended at its gate"
        deadline = time.monotonic() + 120  # the waiter has said it waits before the gate lifts
        while time.monotonic() < deadline and waiter.poll() is None and not _said_waiting(tmp_path / "c.log"):
            time.sleep(0.05)
        gate.unlink()
        waiter.wait(timeout=120)
        waited = (tmp_path / "c.log").read_text()
        _, err = first.communicate(timeout=120)
    finally:
        for proc in (first, locals().get("waiter")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = second.stderr.strip().splitlines()  # why it does not run, before any server starts or stage is announced
    assert second.returncode == 2 and len(lines) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert lines[0] == f"kktlab: error: {runlock.refusal(store, 'twice', rec)}"
    assert not (tmp_path / "b.json").exists()
    assert first.returncode == 0, err[-3000:]
    stats = json.loads((tmp_path / "a.json").read_text())
    assert (stats["written"], stats["computed"], stats["from_cache"], stats["refused_done"]) == (2, 2, 0, 0), stats
    assert waiter.returncode == 0, waited[-3000:]
    assert f"waiting for the run computing group 'twice' of {store} (pid {first.pid}@" in waited
    stats = json.loads((tmp_path / "c.json").read_text())
    assert (stats["written"], stats["computed"], stats["done_before"]) == (0, 0, 2), stats


# --- the lock before any server (kktlab run), and kktlab submit ----------------------------------------

def test_a_group_this_process_holds_is_held_again_without_waiting_and_kept(tmp_path, cli):
    """``kktlab run`` holds its groups' locks before it starts a server; flows.sweep.run takes them
    again inside: held by this process already, they are neither waited for nor released early."""
    store = tmp_path / "s.zarr"
    with runlock.hold(store, ["nets"]):
        with runlock.hold(store, ["nets", "robustness"]):  # would block forever (wait) or refuse without re-entry
            assert runlock.holder(store, "robustness")["pid"] == os.getpid()
        ours = runlock.holder(store, "nets")["pid"]
        probe = subprocess.run([sys.executable, "-c", "import sys; from storage.runlock import hold\n"
                                "with hold(sys.argv[1], ['nets']): pass", str(store)],
                               cwd=cli.root, capture_output=True, text=True)
        assert ours == os.getpid() and probe.returncode != 0 and "is being computed by another run" in probe.stderr
    with runlock.hold(store, ["nets", "robustness"]):  # both released by the outer hold
        pass


def test_a_held_group_is_found_whether_its_store_is_named_relative_or_absolute(tmp_path, monkeypatch):
    """``kktlab run --store s.zarr`` holds the lock by the name given; flows.sweep.run takes it again by
    the absolute path it sends the workers (a worker's folder is not the run's): the same lock."""
    monkeypatch.chdir(tmp_path)
    with runlock.hold("s.zarr", ["nets"]):
        with runlock.hold(tmp_path / "s.zarr", ["nets"]):  # refused, as another run's, without the absolute path
            assert runlock.holder("s.zarr", "nets")["pid"] == os.getpid()


def test_check_refuses_a_held_group_naming_its_flow_run_and_holds_nothing(tmp_path, holder_proc):
    store = tmp_path / "s.zarr"
    runlock.check(store, ["nets"])  # never run: no lock file, nothing made
    assert not runlock.lock_path(store, "nets").parent.exists()
    a = holder_proc(store, "nets")
    with pytest.raises(StoreError) as err:
        runlock.check(store, ["other", "nets"])
    assert str(err.value) == runlock.refusal(store, "nets", runlock.holder(store, "nets"))
    assert f"pid {a.pid}@" in str(err.value) and "flow run http://prefect.example/runs/flow-run/42" in str(err.value)
    a.kill()
    a.wait()
    runlock.check(store, ["nets"])  # free: the check passes and keeps nothing
    rec = runlock.holder(store, "nets")
    assert rec["pid"] == a.pid, "check wrote a record"
    with runlock.hold(store, ["nets"]):
        pass


class ServerStart(Exception):
    """Raised where the run would start its embedded Prefect server (the tests below stop there)."""


def _no_server(calls: list, store=None):
    """A stand-in for deploy.runtime.prefect_api that records when a server would start, then stops the run."""
    import contextlib

    @contextlib.contextmanager
    def start(server=None):
        calls.append(time.monotonic())
        if store is not None:  # who holds the group when the server would start (this run, once it waited)
            calls.append(runlock.holder(store, "twice").get("pid"))
        raise ServerStart("server start reached")
        yield  # pragma: no cover

    return start


def test_run_is_refused_before_any_server_starts(tmp_path, holder_proc, write_config, monkeypatch, capsys):
    """The refusal comes before the run waits for its embedded Prefect server (and before the cluster
    starts): the old order started the server first and was refused after its start-up. The server
    started early, while the config is read (issue 44), is stopped with the refusal."""
    from deploy import runtime
    from kktlab.cli import main

    path, store = write_config(CFG), tmp_path / "s.zarr"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    calls: list = []
    monkeypatch.setattr(runtime, "prefect_api", _no_server(calls))
    early, started = runtime.embedded_server, []
    monkeypatch.setattr(runtime, "embedded_server", lambda verbose=False: started.append(early(verbose)) or started[-1])
    holder_proc(store, "twice")
    assert main(["run", str(path), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert calls == [] and err == [f"kktlab: error: {runlock.refusal(store, 'twice', runlock.holder(store, 'twice'))}"]
    assert len(started) == 1 and started[0].process.poll() is not None  # started early, stopped with the refusal


def test_run_wait_waits_before_any_server_starts(tmp_path, holder_proc, write_config, monkeypatch):
    from deploy import runtime
    from kktlab.cli import main

    path, store = write_config(CFG), tmp_path / "s.zarr"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    calls: list = []
    monkeypatch.setattr(runtime, "prefect_api", _no_server(calls, store))
    monkeypatch.setattr(runtime, "embedded_server", lambda verbose=False: calls.append("started early"))
    a = holder_proc(store, "twice", seconds=1.5)
    with pytest.raises(ServerStart):
        main(["run", str(path), "--store", str(store), "--wait"])
    # (the holder may not have exited yet on a busy machine: the lock is what must have changed hands)
    assert calls[1:] == [os.getpid()], f"the server started while {calls[1:]} held the group (holder pid {a.pid})"
    assert a.wait(timeout=60) == 0


SUBMIT_ENV = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}  # nothing listens: any call to the server fails


def test_submit_of_a_running_config_is_refused_with_its_url_before_the_server_is_asked(write_config, tmp_path,
                                                                                      holder_proc, monkeypatch):
    """Issue 30 item 5: ``kktlab submit`` of a config one of whose groups a run is computing stops in
    one line naming that run and its page, before the server is asked anything or a run queued (in
    this process, its server one where nothing listens, as ``submit`` reads it: ``$PREFECT_API_URL``)."""
    from conftest import _run_here

    path, store = write_config(CFG), tmp_path / "s.zarr"
    holder_proc(store, "twice")
    for name, value in SUBMIT_ENV.items():
        monkeypatch.setenv(name, value)
    res = _run_here(("submit", str(path), "--store", str(store)))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert lines[0] == f"kktlab: error: {runlock.refusal(store, 'twice', runlock.holder(store, 'twice'))}"
    assert "http://prefect.example/runs/flow-run/42" in lines[0]


def test_submit_wait_waits_for_the_running_one_then_goes_on(cli, write_config, tmp_path, holder_proc):
    """``kktlab submit --wait`` waits (saying so) while the group is held, and asks the server only once
    the holder is gone (here SIGKILLed once the wait was said)."""
    path, store = write_config(CFG), tmp_path / "s.zarr"
    a = holder_proc(store, "twice")
    sub = subprocess.Popen([*cli.argv, "submit", str(path), "--store", str(store), "--wait"], cwd=cli.root,
                           env=dict(os.environ, **SUBMIT_ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    try:
        first = sub.stderr.readline()
        assert f"waiting for the run computing group 'twice' of {store} (pid {a.pid}@" in first, first
        assert sub.poll() is None, "submit --wait did not wait"  # (and "is free after" below: until the holder went)
        a.kill()
        a.wait()
        rest = sub.communicate(timeout=120)[1]
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert "is free after" in rest
    # then on to the server (nothing answers here): the wait came first
    assert sub.returncode == 2 and "127.0.0.1:9" in rest.strip().splitlines()[-1], rest[-3000:]
