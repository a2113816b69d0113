"""Dask worker preload (``--preload deploy.worker_exit``): a worker process that has closed cleanly
exits without Python's interpreter teardown.

A worker process that imported torch, Prefect and pandas took more than 4 s to finalise its
modules after ``Worker closed`` (2 cores), so every LocalCluster teardown ended with the nanny's
"Worker process still alive after 4.0 seconds, killing" and a 4 s wait. Once the worker has
closed (:func:`dask_teardown`), the last ``atexit`` handler (registered first, so the handlers
of Prefect's log and event shipping registered later still run before it) flushes stdout/stderr
and calls ``os._exit(0)``. A worker process that ends any other way exits as before."""

from __future__ import annotations

import atexit
import os
import sys

_CLOSED: list[bool] = []


def _exit_now() -> None:
    if not _CLOSED:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    os._exit(0)


def dask_setup(worker) -> None:
    atexit.register(_exit_now)


def dask_teardown(worker) -> None:
    _CLOSED.append(True)
