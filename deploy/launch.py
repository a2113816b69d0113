"""Long-lived service processes: Prefect server, Dask scheduler, Dask workers.

One definition of how kktlab starts them, used by ``make dask-scheduler`` / ``make dask-worker``
(foreground, ``python -m deploy.launch scheduler|worker``), by the served-mode tests and by the
orchestration benchmark (background, each in its own process group, stopped with SIGINT then
SIGKILL). Workers get one torch thread, a passive OpenMP wait policy and no statistical profiler
(STACK.md §4; the profiler cost ~10% of a Python-heavy kernel), and optionally the ``GPU=1``
resource that GPU bundles ask for (deploy/dask.py).

    python -m deploy.launch scheduler --host 127.0.0.1 --port 8786
    python -m deploy.launch worker tcp://127.0.0.1:8786 [--gpu] [--name w0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from deploy.runtime import QUIET_ENV

BIN = os.path.dirname(sys.executable)

# kktlab's offline defaults (logging left at its default: a worker's log says whom it joined) + one OpenMP thread
WORKER_ENV = {**{k: v for k, v in QUIET_ENV.items() if "LOGGING" not in k}, "OMP_NUM_THREADS": "1"}


def worker_env() -> dict:
    """WORKER_ENV, less what the caller's environment already sets (the user's settings win)."""
    return {k: v for k, v in WORKER_ENV.items() if k not in os.environ}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scheduler_args(host: str = "127.0.0.1", port: int = 8786) -> list[str]:
    return [f"{BIN}/dask", "scheduler", "--host", host, "--port", str(port), "--dashboard-address", f"{host}:0"]


def worker_args(address: str, name: str | None = None, host: str = "127.0.0.1", gpu: bool = False,
                n: int = 1) -> list[str]:
    """``n`` single-threaded worker processes (bundles are already batched tensor problems)."""
    args = [f"{BIN}/dask", "worker", address, "--host", host, "--nworkers", str(n), "--nthreads", "1",
            "--dashboard-address", f"{host}:0", "--preload", "deploy.worker_exit",
            "--preload", "deploy.api_retry"]
    if name:
        args += ["--name", name]
    if gpu:
        args += ["--resources", "GPU=1"]
    return args


def prefect_server_args(host: str = "127.0.0.1", port: int = 4200, ui: bool = False) -> list[str]:
    return [f"{BIN}/prefect", "server", "start", "--host", host, "--port", str(port), *([] if ui else ["--no-ui"])]


def start(args: list[str], log_path, env: dict | None = None) -> subprocess.Popen:
    """Start ``args`` in its own process group, output to ``log_path``."""
    log = open(log_path, "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})),
                            start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGINT the process group (twice), then SIGKILL it."""
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


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through $HTTP_PROXY


def answers(url: str, timeout: float = 2) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def wait_http(url: str, timeout: float = 120, say=None, say_every_s: float = 10.0) -> float:
    """Wait until ``url`` answers 200; returns the seconds it took. ``say(line)``: called every
    ``say_every_s`` while waiting (a Prefect server takes about a minute the first time: migrations)."""
    t0 = time.monotonic()
    deadline, said = t0 + timeout, t0
    while time.monotonic() < deadline:
        if answers(url):
            return time.monotonic() - t0
        time.sleep(0.3)
        if say is not None and time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            say(f"waiting for {url} to answer ({said - t0:.0f} s; a new Prefect server takes about a minute)")
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def wait_workers(address: str, n: int, timeout: float = 60) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as c:
        c.wait_for_workers(n, timeout=timeout)


def prefect_server(home, port: int, log_path, ui: bool = False) -> tuple[subprocess.Popen, dict]:
    """A ``prefect server start`` on 127.0.0.1:``port`` with its own ``PREFECT_HOME`` (and its web UI
    if ``ui``); returns the process and the environment a client or worker needs to reach it."""
    env = {"PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    proc = start(prefect_server_args(port=port, ui=ui), log_path, env)
    wait_http(f"http://127.0.0.1:{port}/api/health")
    return proc, env


@contextlib.contextmanager
def dask_cluster(n_workers: int, log_dir, gpu: bool = False):
    """A ``dask scheduler`` and ``n_workers`` ``dask worker`` processes on 127.0.0.1; yields
    ``(address, scheduler, workers)``; every process is stopped on exit."""
    port = free_port()
    sched = start(scheduler_args(port=port), os.path.join(log_dir, f"scheduler-{port}.log"))
    address = f"tcp://127.0.0.1:{port}"
    workers: list[subprocess.Popen] = []
    try:
        for i in range(n_workers):
            workers.append(start(worker_args(address, f"w{i}", gpu=gpu), os.path.join(log_dir, f"worker-w{i}.log"),
                                 worker_env()))
        wait_workers(address, n_workers)
        yield address, sched, workers
    finally:
        for w in workers:
            stop(w, grace=1)
        stop(sched, grace=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scheduler", help="run a dask scheduler in the foreground")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8786)
    h = sub.add_parser("wait", help="say every 10 s that URL does not answer yet, and when it does (make server)")
    h.add_argument("url")
    h.add_argument("--timeout", type=float, default=600)
    w = sub.add_parser("worker", help="run N single-threaded dask worker processes in the foreground")
    w.add_argument("address")
    w.add_argument("-n", "--nworkers", type=int, default=1, help="worker processes (one per core; GPU: one per GPU)")
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--name")
    w.add_argument("--gpu", action="store_true", help="advertise the GPU=1 resource (one worker per GPU)")
    a = ap.parse_args(argv)
    if a.what == "wait":
        say = lambda line: print(f"[kktlab] {line}", file=sys.stderr, flush=True)  # noqa: E731
        try:
            took = wait_http(a.url, a.timeout, say)
        except TimeoutError as err:
            say(str(err))
            return 1
        say(f"{a.url} answers (after {took:.0f} s): `make worker` and `make deploy` can start")
        return 0
    if a.what == "scheduler":
        args, env = scheduler_args(a.host, a.port), {}
    else:
        args, env = worker_args(a.address, a.name if a.nworkers == 1 else None, a.host, a.gpu, a.nworkers), worker_env()
    os.execve(args[0], args, dict(os.environ, **env))
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
