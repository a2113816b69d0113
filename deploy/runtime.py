"""Where flows run: quiet Prefect settings, one embedded Prefect server, the task runner.

The embedded server is started once per process and its URL exported before any Dask worker
exists, so workers report to it instead of each starting their own (STACK.md §2.4).
"""

from __future__ import annotations

import contextlib
import os

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "OMP_WAIT_POLICY": "PASSIVE",
    "DASK_LOGGING__DISTRIBUTED": "error",
    "DASK_DISTRIBUTED__WORKER__DAEMON": "false",
    # Dask's statistical profiler samples worker stacks every 10 ms under the GIL: it slowed
    # a Python-loop kernel by ~10% on 2 cores (21.2 s vs 19.6 s without it, 19.2 s direct)
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    # Dask's idle bookkeeping: the blocked-event-loop tick every 20 ms, the system monitor every
    # 500 ms and the nanny's memory check every 100 ms cost an idle worker 1.1 CPU s a minute; at
    # 1 s / 2 s / 1 s 0.16 (measured here, two idle workers for 60 s). A worker over its memory
    # limit is then stopped within 1 s instead of 0.1 s.
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s",
    # glibc malloc (issue 19): keep freed temporaries of up to 32 MiB (glibc's cap) in the heap
    # instead of mmap/munmap-ing them every step. Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536,
    # which also freezes glibc's adaptive mmap threshold at 128 KiB: every (E,n,k) temporary of
    # the training step was then a fresh mmap, ~12,500 page faults and half the step in the
    # kernel at E=256, n=50, k=100, float64 (2x slower). The nanny takes these values from the
    # environment; a worker then keeps up to 256 MiB of freed heap instead of returning it.
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
    # issue 29: MKL's dgemm picks its kernel by its operands' memory alignment, so a net at an odd
    # offset in its bundle got another X W^T in the last bit (2.2e-16 in W after 200 steps) than
    # the same net alone. Conditional numerical reproducibility (AVX2 code path, strict) makes a
    # cell's numbers a function of the cell alone; read once when MKL loads (so it must be in the
    # environment before torch is imported: kktlab/__init__.py, the Makefile, Dask's workers).
    # Measured here: no cost above noise (benchmarks/results/mkl_cbwr.json).
    "MKL_CBWR": "AVX2,STRICT",
    # inductor compiles a graph's C++ kernels in a pool of one subprocess per core, each importing
    # torch: on 2 cores, where kktlab's Dask workers already fill the cores, the pool only adds its
    # start-up. Compiling in the process that traces: the three compiled-step tests on an empty
    # inductor cache took 74.2 CPU s (74.4 s wall) instead of 95.8 CPU s (82.8 s wall), measured here.
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}


VERBOSE_ENV = {"PREFECT_LOGGING_LEVEL": "INFO", "DASK_LOGGING__DISTRIBUTED": "info"}


def quiet_env(verbose: bool = False) -> None:
    """Set the offline/quiet defaults (never overrides what the user set); ``verbose`` (``--verbose``):
    Prefect's and Dask's INFO logs as they come out of the box."""
    if verbose:
        os.environ.update(VERBOSE_ENV, KKTLAB_VERBOSE="1")
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)


def quiet_logs(verbose: bool = False) -> None:
    """The same, for loggers already configured (a flow run started by a Prefect worker imported
    Dask and Prefect before the flow could set the environment): the local cluster's ~45 INFO lines,
    the jupyter-server-proxy hint and prefect-dask's cluster lines are hidden unless ``verbose``.
    The dashboard address is printed once by the sweep itself (flows/sweep.py)."""
    import logging

    import distributed  # noqa: F401 - its import sets the 'distributed' level from Dask's config: first, then ours

    # $DASK_LOGGING__DISTRIBUTED if the user set one (quiet_env sets "error" where not)
    wanted = os.environ.get("DASK_LOGGING__DISTRIBUTED", "error").upper()
    level = logging.INFO if verbose else max(logging.getLevelName(wanted) if wanted.isalpha() else 0, logging.WARNING)
    for name in ("distributed", "prefect.task_runner.dask"):
        logging.getLogger(name).setLevel(level)
    logging.getLogger("distributed.http.proxy").setLevel(logging.INFO if verbose else logging.ERROR)


def embedded_server(verbose: bool = False):
    """An embedded Prefect server started now (deploy/embedded_server.py), for :func:`prefect_api` to
    wait for later, when no server is set ($PREFECT_API_URL, the active profile's); else None, and
    None where it cannot be started now (:func:`prefect_api` starts one then, and says why it cannot).
    ``kktlab run`` starts it before it imports torch and reads its configs, which take as long as the
    server's start (issue 44); a refused config stops it."""
    from deploy.embedded_server import EmbeddedServer
    from deploy.probe import api_url

    quiet_env(verbose)
    if api_url():
        return None
    try:
        return EmbeddedServer()
    except OSError:  # e.g. the interpreter not executable by this user: the checks first, then prefect_api's error
        return None


@contextlib.contextmanager
def prefect_api(server=None):
    """Use $PREFECT_API_URL or the active profile's URL if set (a real server,
    :func:`deploy.probe.api_url`), else one embedded server for the run: ``server`` (from
    :func:`embedded_server`) or one started now. The server is stopped on the way out."""
    from deploy.probe import api_url

    quiet_env()
    url = None if server else api_url()
    if url:
        yield url
        return
    from deploy.embedded_server import EmbeddedServer

    server = server or EmbeddedServer()
    limit = int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    try:
        server.wait(limit)
    except RuntimeError as err:  # issue 44: one line, not a traceback, when the start times out
        server.stop()
        from core.errors import UserError

        raise UserError(f"the embedded Prefect server did not answer within {limit} s "
                        f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): {str(err).splitlines()[0]} A busy machine "
                        "starts it slowly: raise that limit, or start a server once (make server) and export "
                        "PREFECT_API_URL") from None
    from prefect.settings import PREFECT_API_URL, temporary_settings

    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        try:  # the flow's last log lines ("Finished in state ...") and events (a crashed run's state
            # changes) reach the server before it stops: left queued, Prefect's exit hook retried
            # them against the stopped server for ~75 s after a SIGTERM had been answered
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            for service in (APILogWorker, EventsWorker):  # (Prefect 3.8 keeps one registry for all its
                service.drain_all(timeout=10, at_exit=False)  # queue services: the first call drains both)
        except Exception:  # noqa: BLE001 - nothing to send, or the server is gone already
            pass
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()
