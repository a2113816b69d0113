"""CPU seconds per test, for ``make test-durations`` (``$KKTLAB_TEST_CPU`` names a folder): on a
shared 2-core machine a test's wall time says how long it waited as much as what it cost; its CPU
time (this process, the services it started and every process it ran, reaped or alive) is what the
other tests wait for. One JSON line per test in ``<folder>/<xdist worker>.jsonl``."""

from __future__ import annotations

import json
import os
import pathlib

import psutil
import pytest


def cpu_seconds() -> float:
    """This process's CPU time, its reaped children's, and every live descendant's (with theirs)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])
    for proc in me.children(recursive=True):
        try:
            total += sum(proc.cpu_times()[:4])
        except psutil.Error:  # gone meanwhile: its parent reaped it, and its time went there
            pass
    return total


class CpuClock:
    def __init__(self, folder: str):
        self.path = pathlib.Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        t0 = cpu_seconds()
        yield
        with self.path.open("a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu_seconds() - t0, 3)}) + "\n")


def install(config) -> None:
    folder = os.environ.get("KKTLAB_TEST_CPU")
    if folder:
        config.pluginmanager.register(CpuClock(folder), "kktlab-cpu-clock")
