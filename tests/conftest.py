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


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="requires a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    for item in items:
        if "requires_gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prefect_server():
    """A real embedded Prefect API server on 127.0.0.1 for the whole session; its URL is
    exported so subprocesses (kktlab run, Dask workers) report to it."""
    with runtime.prefect_api() as url:
        yield url


def _run_cli(*args, env=None, timeout=600, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m kktlab.cli ARGS`` in the repo root, capturing output."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([*KKTLAB, *map(str, args)], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout, **kw)


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
