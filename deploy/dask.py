"""Dask cluster specs selectable from a config's ``runner`` block.

- ``local``: a ``distributed.LocalCluster`` of worker processes on 127.0.0.1 (default);
- ``address``: an existing scheduler (``dask scheduler`` + ``dask worker`` processes, a
  dask-jobqueue SLURM cluster, or a Kubernetes ``dask-kubernetes`` cluster: anything with a
  ``tcp://host:port``). Example for SLURM::

      from dask_jobqueue import SLURMCluster
      cluster = SLURMCluster(cores=1, processes=1, memory="16GB", job_extra_directives=["--gres=gpu:1"],
                             worker_extra_args=["--resources", "GPU=1"])
      cluster.scale(jobs=8); print(cluster.scheduler_address)   # -> runner.address

  and for Kubernetes (dask-kubernetes operator; one GPU per worker pod)::

      from dask_kubernetes.operator import KubeCluster, make_cluster_spec
      spec = make_cluster_spec(name="kktlab", image="<image with kktlab installed>", n_workers=8,
                               resources={"limits": {"nvidia.com/gpu": "1"}},
                               worker_command=["dask", "worker", "--nthreads", "1", "--resources", "GPU=1"])
      cluster = KubeCluster(custom_cluster_spec=spec); print(cluster.scheduler_address)

  On one machine, ``make dask-scheduler`` and ``make dask-worker`` (deploy/launch.py) start
  them with kktlab's worker settings. The sweep asks the scheduler how many worker threads it
  has (:func:`worker_count`) and cuts at least one bundle per worker;

- ``cuda``: ``dask_cuda.LocalCUDACluster``, one worker per GPU, each with the resource
  ``GPU=1`` so GPU bundles only go to GPU workers (``pip install -e .[gpu]``);
- ``inline``: no Dask, bundles run in threads of the flow process (debugging).

``$KKTLAB_DASK_ADDRESS`` (a ``tcp://host:port`` that answers, e.g. one left by ``make dask-scheduler``
and ``make dask-worker``): a ``local`` runner attaches to that scheduler instead of starting a
LocalCluster (5-8 s of a short run's start and close; the test suite shares one cluster this way).

Torch uses one thread per worker process (``OMP_NUM_THREADS=1`` from the nanny plus
``torch.set_num_threads(1)`` in the task), else 2-core machines crawl (STACK.md §4).
"""

from __future__ import annotations

import contextlib
import logging
import os

GPU_RESOURCE = {"GPU": 1}
WORKER_PRELOAD = "deploy.worker_exit"
API_RETRY_PRELOAD = "deploy.api_retry"  # task runs ride out a restart of the Prefect server


ATTACH_ENV = "KKTLAB_DASK_ADDRESS"
# what a local worker process imports before its first bundle, imported once in the forkserver it forks from
# (no module here starts a thread at import: xarray's does, jemalloc's background thread, so it is left out)
FORKSERVER_PRELOAD = ("distributed", "torch", "prefect", "prefect_dask", "zarr", "tasks.cells", WORKER_PRELOAD,
                      API_RETRY_PRELOAD)


def fork_workers_from_a_preloaded_server() -> None:
    """Start local Dask workers by forking a forkserver that imported torch, Prefect and Dask once
    (``distributed.worker.multiprocessing-method: forkserver``) instead of spawning interpreters that
    each import them: a 2-worker LocalCluster costs 2.6 CPU s instead of 5 (measured on 2 cores).
    The forkserver starts with the first worker, inside the nanny's ``pre-spawn-environ``
    (``OMP_NUM_THREADS=1``, ...), so torch is imported there with one thread. ``$KKTLAB_DASK_SPAWN=1``
    keeps Dask's default (spawn)."""
    import dask
    from distributed.utils import get_mp_context

    if os.environ.get("KKTLAB_DASK_SPAWN") == "1":
        return
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    get_mp_context().set_forkserver_preload(list(FORKSERVER_PRELOAD))  # after Dask's own default list


def attached(runner: dict) -> dict:
    """``runner`` with a ``local`` cluster swapped for the scheduler at ``$KKTLAB_DASK_ADDRESS``, if set."""
    address = os.environ.get(ATTACH_ENV, "")
    if runner["cluster"] != "local" or not address:
        return runner
    return dict(runner, cluster="address", address=address)


def task_runner(runner: dict):
    """The Prefect task runner for a validated ``runner`` block."""
    import dask

    runner = attached(runner)

    # no statistical profiler on workers we start (it costs ~10% of a Python-heavy kernel);
    # for external `dask worker`s set DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False
    dask.config.set({"distributed.worker.profile.enabled": False})
    kind = runner["cluster"]
    if kind == "inline":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=runner["workers"])
    from prefect_dask import DaskTaskRunner

    if kind == "address":
        return DaskTaskRunner(address=runner["address"])
    # deploy/worker_exit.py: a closed worker process exits at once (no forced kill after 4 s at teardown)
    # ($KKTLAB_WORKER_FAST_EXIT=0: the old teardown, for benchmarks/orchestration_overhead.py --served's "before")
    fast_exit = os.environ.get("KKTLAB_WORKER_FAST_EXIT", "1") != "0"
    preload = [*([WORKER_PRELOAD] if fast_exit else []), API_RETRY_PRELOAD]
    common = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", "preload": preload}
    if kind == "cuda":
        return DaskTaskRunner(cluster_class="dask_cuda.LocalCUDACluster",
                              cluster_kwargs={**common, "threads_per_worker": runner["threads_per_worker"],
                                              "resources": GPU_RESOURCE})
    fork_workers_from_a_preloaded_server()
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={**common, "n_workers": runner["workers"], "threads_per_worker": runner["threads_per_worker"],
                        "processes": True},
    )


def worker_count(runner: dict) -> int:
    """How many workers a sweep's bundles should spread over: the config's ``workers`` for local
    and inline runners, the visible GPUs for ``cuda``, and for an ``address`` the worker threads
    the scheduler has now (at least 1: workers that join later, e.g. SLURM jobs still queued,
    still get bundles, just larger ones)."""
    runner = attached(runner)
    kind = runner["cluster"]
    if kind in ("local", "inline"):
        return runner["workers"]
    if kind == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    from distributed import Client

    with Client(runner["address"], timeout=30) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        return max(1, sum(w.get("nthreads", 1) for w in workers))


def resources_for(device: str) -> dict | None:
    """Dask resource annotation for a bundle: GPU bundles only run on GPU workers."""
    return GPU_RESOURCE if device == "cuda" else None



@contextlib.contextmanager
def on_dashboard(callback):
    """Call ``callback(url)`` when the flow's Dask task runner has started (or joined) its cluster and
    knows the dashboard's address: prefect-dask logs it at INFO on ``prefect.task_runner.dask``;
    that logger's lines reach the terminal only with ``--verbose`` ($KKTLAB_VERBOSE)."""
    logger = logging.getLogger("prefect.task_runner.dask")

    class Catch(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "dashboard is available at" in msg:
                callback(msg.rsplit(" ", 1)[-1])

    handler, old = Catch(), (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = bool(os.environ.get("KKTLAB_VERBOSE"))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old[0])
        logger.propagate = old[1]
