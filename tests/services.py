"""Real service processes for tests: Prefect server, Prefect worker, Dask scheduler/workers.

Every process listens on 127.0.0.1 only, runs in its own process group and is stopped
(SIGINT, then SIGKILL) when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log_path, env=None) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})),
                            start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGINT, signal.SIGINT):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def wait_workers(address: str, n: int, timeout: float = 60) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as c:
        c.wait_for_workers(n, timeout=timeout)


def prefect_server(tmp_path, port: int) -> tuple[subprocess.Popen, dict]:
    env = {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    proc = start([f"{BIN}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
                 tmp_path / "server.log", env)
    wait_http(f"http://127.0.0.1:{port}/api/health")
    return proc, env


def dask_scheduler(tmp_path, port: int) -> subprocess.Popen:
    return start([f"{BIN}/dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                  "--dashboard-address", "127.0.0.1:0"], tmp_path / f"scheduler-{port}.log")


def dask_worker(tmp_path, address: str, name: str) -> subprocess.Popen:
    return start([f"{BIN}/dask", "worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                  "--dashboard-address", "127.0.0.1:0", "--name", name], tmp_path / f"worker-{name}.log")
