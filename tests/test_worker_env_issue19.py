"""Issue 19: the allocator settings of deploy.runtime reach the Dask workers kktlab starts
(the nanny would otherwise give them MALLOC_TRIM_THRESHOLD_=65536)."""

import os

import pytest

from deploy.runtime import QUIET_ENV, quiet_env


def _malloc_env():
    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")}


@pytest.mark.requires_services
def test_local_cluster_worker_gets_malloc_thresholds_issue19(monkeypatch):
    from distributed import Client, LocalCluster

    for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(k, raising=False)
    quiet_env()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        (got,) = client.run(_malloc_env).values()
    assert got == {"MALLOC_TRIM_THRESHOLD_": QUIET_ENV["MALLOC_TRIM_THRESHOLD_"],
                   "MALLOC_MMAP_THRESHOLD_": QUIET_ENV["MALLOC_MMAP_THRESHOLD_"]}
    assert int(got["MALLOC_MMAP_THRESHOLD_"]) == 32 << 20  # glibc's cap on 64-bit
