"""Shared fixtures: quiet offline settings, one real Prefect server per session, markers."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from deploy import runtime

runtime.quiet_env()
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="kktlab-prefect-")  # hermetic: no cache from earlier runs
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("PREFECT_RESULTS_LOCAL_STORAGE_PATH", None)

ROOT = pathlib.Path(__file__).resolve().parents[1]
KKTLAB = [sys.executable, "-m", "kktlab.cli"]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


DURATIONS = ROOT / "benchmarks" / "results" / "test_durations.json"  # make test-durations writes it


def _slowest_files_first(items) -> None:
    """Order the files by their recorded time, slowest first (a file's tests keep their order), so
    pytest-xdist's workers (``--dist loadfile``) do not end on one long file while the other idles."""
    import json

    try:
        by_file = json.loads(DURATIONS.read_text())["by_file"]
    except (OSError, ValueError, KeyError):
        return
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.location[0], i)
    items.sort(key=lambda it: (-by_file.get(it.location[0], 0.0), first[it.location[0]]))


def pytest_configure(config):
    import cpu_clock
    import prefect_homes

    cpu_clock.install(config)  # CPU seconds per test when $KKTLAB_TEST_CPU is set (make test-durations)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        prefect_homes.claim_root()  # one migrated Prefect home for the session's servers to copy
        _check_installed_here()


def _check_installed_here() -> None:
    """Processes that do not start in the checkout (``dask worker``, a Prefect worker's flow runs) import
    kktlab through its editable install: if that points at another checkout (a removed worktree), they
    fail with ModuleNotFoundError deep inside a test. Say so once, before any test runs."""
    out = subprocess.run([sys.executable, "-c", "import deploy; print(deploy.__file__)"], cwd="/", text=True,
                         capture_output=True).stdout.strip()
    if pathlib.Path(out or "/").resolve().parent.parent != ROOT:
        pytest.exit(f"kktlab is installed from {out or 'nowhere'}, not from this checkout {ROOT}: run "
                    f"'{sys.executable} -m pip install --no-deps -e {ROOT}' (or make install) first", returncode=4)


def pytest_unconfigure(config):
    import prefect_homes

    if "PYTEST_XDIST_WORKER" not in os.environ:
        prefect_homes.release_root()


def pytest_collection_modifyitems(config, items):
    _slowest_files_first(items)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="requires a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    for item in items:
        if "requires_gpu" in item.keywords:
            item.add_marker(skip)


class Services:
    """The session's real services, each started on first use and stopped at the session's end: one
    embedded Prefect server (its URL exported, so subprocesses and Dask workers report to it) and one
    Dask LocalCluster of 2 worker processes with kktlab's worker settings (deploy/dask.py), which
    ``kktlab run`` attaches to through ``$KKTLAB_DASK_ADDRESS`` instead of starting its own."""

    def __init__(self):
        import contextlib

        self.stack = contextlib.ExitStack()
        self.url = self.address = None

    def prefect(self) -> str:
        if self.url is None:
            import prefect_homes

            prefect_homes.fresh(os.environ["PREFECT_HOME"])  # migrated already (tests/prefect_homes.py)
            self.url = self.stack.enter_context(runtime.prefect_api())
        return self.url

    def dask(self) -> str:
        if self.address is None:
            self.prefect()  # the workers inherit $PREFECT_API_URL: they report to the session's server
            from distributed import LocalCluster

            from deploy.dask import API_RETRY_PRELOAD, WORKER_PRELOAD, fork_workers_from_a_preloaded_server

            fork_workers_from_a_preloaded_server()  # as kktlab run's LocalCluster
            cluster = self.stack.enter_context(LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", preload=[WORKER_PRELOAD, API_RETRY_PRELOAD]))
            self.address = cluster.scheduler_address
        return self.address


SERVICES = Services()


@pytest.fixture(scope="session", autouse=True)
def _stop_services():
    yield
    SERVICES.stack.close()


@pytest.fixture(scope="session")
def prefect_server():
    """A real embedded Prefect API server on 127.0.0.1 for the whole session; its URL is
    exported so subprocesses (kktlab run, Dask workers) report to it."""
    return SERVICES.prefect()


@pytest.fixture(scope="session")
def dask_address(prefect_server):
    """The session's Dask scheduler (tcp://127.0.0.1:port; 2 worker processes)."""
    return SERVICES.dask()


FLOW_RUNS = ("run",)  # commands that attach to the session's services
# commands cli.run runs in this process (no 3-10 s of imports per call): runs, the readers and schema
IN_PROCESS = (*FLOW_RUNS, "status", "verify", "show", "table", "report", "experiments", "schema")


def _run_cli(*args, env=None, timeout=600, process=False, cwd=None, **kw) -> subprocess.CompletedProcess:
    """Run the kktlab command line ``ARGS`` in ``cwd`` (default the repo root), capturing output.
    ``kktlab run`` (on the session's Prefect server and Dask cluster) and the reading commands run in
    this process, unless ``process`` or ``env`` is given: then, as every other command, it is
    ``python -m kktlab.cli ARGS`` in a subprocess (a run still on the session's services when
    ``env`` is not given)."""
    args = tuple(map(str, args))
    if not process and env is None and not kw and args and args[0] in IN_PROCESS:
        return _run_here(args, cwd or ROOT)
    full_env = dict(os.environ, **(env or {}))
    if env is None and args and args[0] in FLOW_RUNS:
        full_env.setdefault("KKTLAB_DASK_ADDRESS", SERVICES.dask())
    return subprocess.run([*KKTLAB, *args], cwd=cwd or ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def _run_here(args: tuple[str, ...], cwd=ROOT) -> subprocess.CompletedProcess:
    """``kktlab ARGS`` as :func:`kktlab.cli.main` in this process, with what a process would give:
    stdout, stderr, the exit status (an uncaught exception printed as the interpreter prints it,
    status 1); the environment, working directory and signal handlers are put back afterwards."""
    import contextlib
    import io
    import signal
    import traceback

    from kktlab import cli as kcli

    if args[0] in FLOW_RUNS:
        SERVICES.prefect()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if args[0] in FLOW_RUNS:
        os.environ["KKTLAB_DASK_ADDRESS"] = SERVICES.dask()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = kcli.main(list(args))
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 - what the interpreter would print
                traceback.print_exc()
                rc = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess([*KKTLAB, *args], rc or 0, out.getvalue(), err.getvalue())


def _run_killed(config, store, until, env=None, timeout: float = 300) -> None:
    """``kktlab run CONFIG --store STORE`` in its own process group, SIGKILLed (the whole group: the
    embedded server and the Dask workers too) as soon as ``until(store)`` holds, or after ``timeout`` s."""
    import signal
    import time

    proc = subprocess.Popen([*KKTLAB, "run", str(config), "--store", str(store)], cwd=ROOT,
                            env=dict(os.environ, **(env or {})), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not until(store):
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def cli():
    """The kktlab command line as tests use it: ``cli.run(*args, env=, timeout=)`` runs it to the
    end; ``cli.run_killed(config, store, until, env=)`` kill -9s a run at a moment; ``cli.argv`` and
    ``cli.root`` start it by hand (``subprocess.Popen([*cli.argv, ...], cwd=cli.root)``)."""
    import types

    return types.SimpleNamespace(run=_run_cli, run_killed=_run_killed, argv=list(KKTLAB), root=ROOT)


@pytest.fixture(scope="session")
def run_chain(prefect_server, cli, tmp_path_factory):
    """``run_chain(raw, name, timeout=600)``: write the config dict ``raw`` to a fresh folder as
    ``chain.yaml``, run ``kktlab run`` on it (store ``chain.zarr``, counts ``stats.json``) through the
    real CLI (real Prefect server, Dask LocalCluster), assert it exits 0; returns the folder."""
    import yaml

    def _run(raw: dict, name: str, timeout: int = 600) -> pathlib.Path:
        root = tmp_path_factory.mktemp(name)
        (root / "chain.yaml").write_text(yaml.safe_dump(raw))
        res = cli.run("run", root / "chain.yaml", "--store", root / "chain.zarr", "--json", root / "stats.json",
                      timeout=timeout)
        assert res.returncode == 0, res.stderr[-3000:]
        return root

    return _run


@pytest.fixture
def prefect_home(tmp_path):
    """``prefect_home(name)``: a fresh ``PREFECT_HOME`` under the test's folder, its database migrated
    already (tests/prefect_homes.py), for a process that starts a Prefect server of its own."""
    import prefect_homes

    return lambda name="prefect-home": str(prefect_homes.fresh(tmp_path / name))


@pytest.fixture
def write_config(tmp_path):
    """Write a YAML config dict to a file and return its path."""
    import yaml

    def _write(cfg: dict, name: str = "cfg.yaml") -> pathlib.Path:
        p = tmp_path / name
        p.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return p

    return _write


# --- paper 000 (forging) helpers, shared by tests/test_forging_*.py -------------------------------

@pytest.fixture
def torch_gen():
    """``torch_gen(seed)`` -> a fresh ``torch.Generator`` seeded with ``seed``."""
    import torch

    return lambda seed: torch.Generator().manual_seed(seed)


@pytest.fixture
def linreg():
    """``linreg(d, A=1.0, seed=0)`` -> (model, x*): linear regression with w, x* ~ N(0, I) from ``seed``
    and y* set so that ||∇_w f(w; x*)|| = A (spec 000 §4 defaults)."""
    import torch

    from tasks.forging.models import make_model, make_target

    def _linreg(d: int, A: float = 1.0, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        model = make_model("linreg", d, 0, gen)
        return model, make_target(model, A, gen)

    return _linreg


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny kernels (faster than two threads on a busy 2-core box,
    and what a Dask worker uses); the old setting comes back afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- comparing results: stores and bundles -----------------------------------------------------

def mismatches(a: dict, b: dict, tol: float = 1e-12, skip=("wall_s",)) -> dict:
    """The names whose values differ between two ``{name: array}`` results, with why: integers and
    booleans exactly, floats to ``tol`` (relative above 1, absolute below; ``tol=0``: bit for bit),
    NaN equal to NaN (NaN against a number, or inf against finite, differs); names in ``skip`` left
    out. One rule for bundle invariance and for stores resumed vs run clean."""
    import numpy as np

    out = {}
    for name in sorted(set(a) | set(b)):
        if name in skip:
            continue
        if name not in a or name not in b:
            out[name] = "missing"
            continue
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape or x.dtype != y.dtype:
            out[name] = f"shape/dtype {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
        elif x.dtype.kind not in "fc":
            if not np.array_equal(x, y):
                out[name] = f"{x} vs {y}"
        elif tol == 0:
            if not np.array_equal(x, y, equal_nan=True):
                err = np.nanmax(np.abs(x.astype(float) - y) / np.maximum(1.0, np.abs(x.astype(float))))
                out[name] = f"not bit-identical (max rel {err:.2g})"
        else:
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            with np.errstate(invalid="ignore"):
                err = np.where(same, 0.0, np.abs(x - y) / np.maximum(1.0, np.abs(x)))
            if not (err <= tol).all():
                out[name] = f"{x} vs {y}"
    return out


def store_values(store, group: str | None = None) -> dict:
    """Every stored variable of a group (the store's one group if not named), timings left out."""
    from storage import schema
    from storage.query import open_results

    ds = (open_results(store) if group is None else open_results(store, group)).load()
    return {v: ds[v].values for v in ds.data_vars if v not in schema.NOT_HASHED}


def assert_stores_equal(a, b, group: str | None = None, skip=("cell_hash",)) -> None:
    """Two stores hold the same values in ``group`` (:func:`mismatches` at 1e-12), every cell done."""
    va, vb = store_values(a, group), store_values(b, group)
    assert bool(va["done"].all()) and bool(vb["done"].all())
    assert set(va) == set(vb) and len(va) > 5, sorted(va)
    assert mismatches(va, vb, skip=skip) == {}


# --- kill drills held at a gate, and resumed stores against clean ones (issue 38) ---------------------

def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL of ``proc``'s process group (it was started with ``start_new_session``), then wait until
    every process of it is gone (its Dask workers too), so nothing writes to the store afterwards."""
    import signal

    import psutil

    try:
        members = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        members = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    psutil.wait_procs(members, timeout=60)


def run_killed_at_gate(config, store, until, gate, env=None, timeout: float = 300, always: bool = False,
                       poll: float = 0.02) -> None:
    """``kktlab run CONFIG --store STORE`` in its own process group (its own Dask cluster), every bundle
    held at the gate ``gate`` ($KKTLAB_GATE, flows/sweep.py ``wait_at_gate``) and let through one at a
    time; the whole group is SIGKILLed (:func:`kill_group`) as soon as ``until(store)`` holds at a
    moment when a bundle waits at the gate and each bundle let through before is stored (its progress
    file, written once it passed the gate, is gone: the flow removes it after marking its cells done),
    or, with ``always``, at any poll (``until`` then should be cheap). A bundle let through says so
    (``<gate>.passed``) and the gate closes behind it. With one worker (the config's
    ``runner.workers: 1``) one bundle computes at a time, so a condition on the cells done is met
    exactly, whatever the machine's speed; the kill lands while a bundle is in flight."""
    import time

    gate = pathlib.Path(gate)
    reached, passed = pathlib.Path(f"{gate}.reached"), pathlib.Path(f"{gate}.passed")
    progress = pathlib.Path(f"{store}.progress")
    gate.touch()
    proc = subprocess.Popen([*KKTLAB, "run", str(config), "--store", str(store)], cwd=ROOT,
                            env=dict(os.environ, **(env or {}), KKTLAB_GATE=str(gate)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if always and until(store):
                return
            if not gate.exists():  # a bundle was let through: close the gate once it is past it
                if passed.exists():
                    gate.touch()
                    passed.unlink()
            elif reached.exists() and not any(progress.glob("*/*.json")):  # a bundle waits; the ones before are stored
                if until(store):
                    return
                reached.unlink()
                gate.unlink()
            time.sleep(poll)
    finally:
        kill_group(proc)


def stage_values(store, groups, **isel) -> dict:
    """:func:`store_values` of each of ``groups``, named ``group/variable``; ``isel``: the cells of a
    sub-grid (e.g. ``seed=slice(0, 3)``: a run of fewer seeds against a clean run of more), along the
    dims a group has."""
    from storage import schema
    from storage.query import open_results

    out = {}
    for group in groups:
        ds = open_results(store, group)
        ds = ds.isel({d: s for d, s in isel.items() if d in ds.dims}).load()
        out.update({f"{group}/{v}": ds[v].values for v in ds.data_vars if v not in schema.NOT_HASHED})
    return out


def assert_resumed_equals_clean(store, clean, groups, **isel) -> None:
    """Every cell of ``groups`` of the resumed ``store`` is done and holds what the clean run stored
    (:func:`mismatches` at 1e-12, each cell's ``cell_hash`` included); ``isel`` narrows ``clean``."""
    got, want = stage_values(store, groups), stage_values(clean, groups, **isel)
    for group in groups:
        assert bool(got[f"{group}/done"].all()) and bool(want[f"{group}/done"].all()), group
    assert set(got) == set(want) and len(got) > 5 * len(groups), sorted(set(got) ^ set(want))
    assert mismatches(got, want, skip=()) == {}
