"""What the served-mode tests share (tests/test_served.py): ONE real ``prefect server start`` (its web
UI on), ``kktlab deploy`` and a process worker for the module (:class:`Served`), and the reads of
flow runs, events and artifacts off that server that the tests check."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import prefect_homes
import psutil

from deploy import launch

POOL = "kktlab-served"
HEARTBEAT_S = 30  # the smallest Prefect allows
MISSED = 2  # crashed after 2 x 30 s without one (kktlab deploy's default is 3: KKTLAB_HEARTBEATS_MISSED)
# the crash drill's workers: a heartbeat every 30 s (Prefect's default is 180 s, and the automation of
# the module's `kktlab deploy` then waits 3 x 180 s; the drill makes it again at 2 x 30 s: crash_automation)
CRASH_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}
FINAL = {"Completed", "Failed", "Crashed", "Cancelled"}

# a sweep of 2 quick cells (d=16, seeds 0 and 1)
TINY = {"experiment": "nonrobust", "grid": {"d": [16], "seed": [0, 1]},
        "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-10},
        "runner": {"workers": 1, "bundle_size": 1}}
# a chain: 2 nets, each read by one attack (4 cells)
CHAIN = {"runner": {"workers": 1, "bundle_size": 1}, "stages": [
    {"name": "nets", "experiment": "train", "grid": {"d": [16], "seed": [0, 1]}, "params": TINY["params"]},
    {"name": "robustness", "experiment": "universal_attack", "from": "nets", "grid": {"attack": ["margin_direction"]}}]}


class Served:
    """A real ``prefect server start`` on 127.0.0.1 with its web UI (its own ``PREFECT_HOME``, its SQLite
    database kept across :meth:`restart_server`), ``kktlab deploy --pool POOL`` (:meth:`deploy_all`)
    and at most one process worker at a time (``worker``, its log ``worker_log``), every process
    stopped by :meth:`close`. Every worker's bundles wait while ``gate`` exists (``$KKTLAB_GATE``,
    :meth:`hold` / :meth:`release`) and, once mid-way, while ``midway`` exists (``$KKTLAB_GATE_MIDWAY``,
    :meth:`hold_midway`), rewrite their progress file every second and let Dask's warnings into the
    worker's log."""

    def __init__(self, root, cli):
        self.root, self.cli = root, cli
        self.home, self.port = prefect_homes.fresh(root / "prefect-home"), launch.free_port()
        self.gate, self.midway = root / "gate", root / "midway"
        self.worker, self.worker_log, self.extra, self.workers_started = None, None, None, 0
        self._client = None
        self.server, self.env = launch.prefect_server(self.home, self.port, root / "server.log", ui=True)

    def deploy_all(self) -> subprocess.CompletedProcess:
        """``kktlab deploy --pool POOL``, its table 200 columns wide."""
        return self.cli.run("deploy", "--pool", POOL, env=dict(self.env, COLUMNS="200"), timeout=180)

    def crash_automation(self) -> int:
        """Prefect's zombie detection at the crash drill's bound: the automation ``kktlab deploy`` makes
        (deploy/prefect_deploy.py ``ensure_crash_automation``, as with ``KKTLAB_HEARTBEATS_MISSED=2`` and
        heartbeats every 30 s), made again on this server; its bound in seconds."""
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        from deploy.prefect_deploy import ensure_crash_automation

        saved = dict(os.environ)
        os.environ["KKTLAB_HEARTBEATS_MISSED"] = str(MISSED)
        try:
            with temporary_settings(updates={PREFECT_API_URL: self.env["PREFECT_API_URL"],
                                             PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_S}):
                return ensure_crash_automation()[1]
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def submit(self, *args, timeout: int = 600) -> subprocess.CompletedProcess:
        """``kktlab submit ARGS`` against this server, run in this process (conftest's in-process runner:
        stdout, stderr and the exit status a process would give; no 5 s of imports per call); past
        ``timeout`` s a SIGALRM ends it (status 1, the traceback on stderr)."""
        from conftest import _run_here
        from prefect.settings import PREFECT_API_URL, temporary_settings

        def expired(signum, frame):
            raise TimeoutError(f"kktlab submit ran past {timeout} s")

        saved, before = dict(os.environ), signal.signal(signal.SIGALRM, expired)
        os.environ.update(self.env)
        signal.alarm(timeout)
        try:
            with temporary_settings(updates={PREFECT_API_URL: self.env["PREFECT_API_URL"]}):
                return _run_here(("submit", *map(str, args)))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, before)
            os.environ.clear()
            os.environ.update(saved)

    def start_worker(self, log: str = "pworker.log", **extra) -> subprocess.Popen:
        """A fresh process worker on the pool (the one before stopped), its output to ``root/log``;
        ``extra``: more environment for it and its flow runs."""
        self.stop_worker()
        self.worker_log, self.extra = self.root / log, extra
        env = dict(self.env, KKTLAB_GATE=str(self.gate), KKTLAB_GATE_MIDWAY=str(self.midway),
                   KKTLAB_PROGRESS_EVERY_S="1", DASK_LOGGING__DISTRIBUTED="warning", PREFECT_WORKER_QUERY_SECONDS="3",
                   **extra)
        self.worker = launch.start([f"{launch.BIN}/prefect", "worker", "start", "--pool", POOL, "--type", "process"],
                                   self.worker_log, env)
        self.workers_started += 1
        return self.worker

    def ensure_worker(self) -> subprocess.Popen:
        """The running worker if it has the plain settings, else a fresh one that has."""
        if self.worker is None or self.worker.poll() is not None or self.extra:
            return self.start_worker()
        return self.worker

    def stop_worker(self) -> None:
        if self.worker is not None:
            launch.stop(self.worker)
            self.worker = None

    def hold(self):
        """Close the gate (every bundle waits at it, after touching the returned ``<gate>.reached``)."""
        reached = self.gate.parent / (self.gate.name + ".reached")
        reached.unlink(missing_ok=True)
        self.gate.touch()
        return reached

    def release(self) -> None:
        self.gate.unlink(missing_ok=True)
        self.midway.unlink(missing_ok=True)

    def hold_midway(self, total: int):
        """Close the mid-way gate for the bundles of ``total`` steps (each waits there once, after
        touching the returned ``<midway>.reached``; flows/bundle_progress.py ``Reporter.hold``)."""
        reached = self.midway.parent / (self.midway.name + ".reached")
        reached.unlink(missing_ok=True)
        self.midway.write_text(str(total))
        return reached

    def kill_server(self) -> None:
        self._drop_client()
        os.killpg(self.server.pid, signal.SIGKILL)  # the server goes away, no goodbye
        self.server.wait(30)

    def restart_server(self, log: str) -> None:
        """The server again on the same port and database."""
        self.server, _ = launch.prefect_server(self.home, self.port, self.root / log, ui=True)

    def close(self) -> None:
        self._drop_client()
        self.stop_worker()
        launch.stop(self.server)

    @contextlib.contextmanager
    def client(self):
        """A sync Prefect client of this server (one, kept open while the server process lives)."""
        if self._client is None:
            from prefect.client.orchestration import get_client
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings(updates={PREFECT_API_URL: self.env["PREFECT_API_URL"]}):
                self._client = get_client(sync_client=True)
                self._client.__enter__()
        yield self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.__exit__(None, None, None)
            self._client = None

    # --- what the server has ----------------------------------------------------------------------
    def state(self, run_id: str):
        with self.client() as client:
            return client.read_flow_run(run_id).state

    def wait_state(self, run_id: str, names: set, timeout: float):
        """The flow run's state once its name is in ``names`` (or at ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(run_id)
            if state is not None and state.name in names:
                return state
            time.sleep(2)
        return self.state(run_id)

    def heartbeats(self, run_id: str) -> int:
        """The heartbeat events the server has recorded for the flow run."""
        from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

        flt = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                          resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))
        with self.client() as client:
            return client.read_events(filter=flt, limit=1).total

    def set_state(self, run_id: str, state) -> None:
        with self.client() as client:
            client.set_flow_run_state(run_id, state, force=True)

    def table(self, run_id: str, store) -> dict:
        """The stages' counts of root flow run ``run_id`` into ``store``, by stage: its table artifact
        keyed ``run_ui.key(store, "summary")`` (each stage's own summary table has a key of its own)."""
        import json

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        from flows import run_ui

        with self.client() as client:
            arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        table = next(a for a in arts if a.type == "table" and a.key == run_ui.key(store, "summary"))
        return {r["stage"]: r for r in json.loads(table.data)}

    def history(self, run_id: str, t0: float) -> str:
        """The flow run's states, each with its time after ``t0`` (a ``time.time()``)."""
        with self.client() as client:
            states = sorted(client.read_flow_run_states(run_id), key=lambda s: s.timestamp)
        return ", ".join(f"{s.name} {s.timestamp.timestamp() - t0:+.1f} s" for s in states)


def run_id(stdout: str) -> str:
    """The flow run id ``kktlab submit`` printed: ``flow run NAME (ID) of ...``."""
    return stdout.split("(", 1)[1].split(")", 1)[0]


def done(store) -> int:
    """Cells done in every group of ``store`` (0 before it is made)."""
    from storage.query import status

    try:
        return sum(r["done"] for r in status(store))
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def gone(procs) -> bool:
    def alive(p):
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return not any(alive(p) for p in procs)


def wait_for(cond, timeout: float, proc=None, poll_s: float = 0.2) -> bool:
    """Poll ``cond()`` every ``poll_s`` until it holds, ``timeout`` s pass or ``proc`` ends; its last value."""
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline and (proc is None or proc.poll() is None):
        time.sleep(poll_s)
    return bool(cond())


def stored(store, axis: str = "seed") -> dict:
    """value along ``axis`` -> (done, cell_hash, wall_s) of the store's one group, a 1-d grid ({} before
    it is made)."""
    from storage.query import open_results

    try:
        ds = open_results(store).load()
    except Exception:  # noqa: BLE001 - not made yet
        return {}
    return {int(s): (bool(ds.done.sel({axis: s})), int(ds.cell_hash.sel({axis: s})),
                     float(ds.wall_s.sel({axis: s}))) for s in ds[axis].values}


def mid_bundle(store, group: str, axis: str = "seed") -> list[dict]:
    """Progress records of running bundles that have counted steps (of a total), of cells not stored
    yet (a stored bundle's file goes a moment after its cells are marked done)."""
    from storage import bundle_progress as files

    finished = [s for s, (d, _, _) in stored(store, axis).items() if d]
    return [r for r in files.read(store, group) if r.get("steps") and r.get("total")
            and not any(f"{axis}={s} " in r.get("name", "") for s in finished)]
