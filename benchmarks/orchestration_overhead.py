"""Orchestration overhead: a sweep through Prefect + Dask vs calling the kernel directly.

For cell sizes of about 0.1 s, 1 s and 10 s of work (calibrated here), a sweep of N cells of
the ``calibrate`` experiment runs through the real path (embedded Prefect server, Dask
LocalCluster of W worker processes, Zarr store) twice: with kktlab's default bundling (cells of one
shape share a Prefect task, at most ``bundle_size`` = 64 and at least one bundle per worker: what a
user gets, and what the target is judged on) and with one Prefect task per cell (the worst case,
which prices a Prefect task). The same cells also run directly in this process, one by one.
Before each sweep the benchmark waits until the Prefect server has drained its event backlog
(its CPU use below 5 %), so no sweep pays for the previous one's events.
Overhead = T_sweep / (T_direct / W) - 1 (start-up included), and the steady-state overhead
with the measured start-up of an empty sweep (cluster start, worker imports, flow run)
taken out. Default W = 1: the direct call computes on one core, so does the sweep, and the
second core hosts the orchestration (flow process, Prefect server, scheduler). Also runs one
large sweep of tiny cells in large bundles, to report the largest sweep scheduled in the run.

With ``--cluster address`` the sweeps run on a persistent cluster (a ``dask scheduler`` and W
``dask worker`` processes started once, as in served mode), so the start-up left is the flow run's
own; results go to ``results/orchestration_overhead_address.json``.

With ``--served`` it measures instead the submit-to-done overhead of a served quickstart (a Prefect
server already up, a worker polling), split into its parts, before and after issue 17's changes
(benchmarks/served_overhead.py); results go to ``results/orchestration_overhead_served.json``.

    python benchmarks/orchestration_overhead.py [--workers 2] [--quick] [--cluster address]
    python benchmarks/orchestration_overhead.py --served [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from benchmarks.common import write  # noqa: E402
from deploy import launch  # noqa: E402
from deploy import runtime  # noqa: E402
from tasks.cells.calibrate import busy  # noqa: E402


def calibrate(seconds: float) -> int:
    n = 50
    while True:
        t0 = time.perf_counter()
        busy(n, 0)
        dt = time.perf_counter() - t0
        if dt > 0.05:
            return max(1, int(n * seconds / dt))
        n *= 4


def sweep(n_cells: int, n_matmuls: int, runner: dict, bundle_size: int, tmp: str) -> tuple[float, dict]:
    from flows.sweep import run
    from flows import config

    cfg = config.parse({"experiment": "calibrate", "name": f"c{n_matmuls}x{n_cells}",
                        "grid": {"seed": list(range(n_cells))}, "params": {"n_matmuls": n_matmuls},
                        "runner": dict(runner, bundle_size=bundle_size)})
    t0 = time.perf_counter()
    stats = run(cfg, os.path.join(tmp, "bench.zarr"))
    return time.perf_counter() - t0, stats


def settle(max_s: float = 60.0) -> float:
    """Wait until this process's children (the embedded Prefect server) use < 5 % CPU over 0.5 s."""
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        kids = psutil.Process().children(recursive=True)
        for k in kids:
            k.cpu_percent(None)
        time.sleep(0.5)
        busy_pct = 0.0
        for k in kids:
            try:
                busy_pct += k.cpu_percent(None)
            except psutil.Error:
                pass
        if busy_pct < 5.0:
            break
    return time.perf_counter() - t0


def measure(a, sizes, tmp) -> tuple[list[dict], dict, float]:
    rows = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(runtime.prefect_api())
        runner = {"workers": a.workers}
        if a.cluster == "address":  # started once, as `make dask-scheduler` / `make dask-worker` do
            address, _, _ = stack.enter_context(launch.dask_cluster(a.workers, tmp))
            runner.update(cluster="address", address=address)
        sweep(2, 1, runner, 1, tmp)  # warm-up: imports, first flow run
        settle()
        startup = min(sweep(1, 0, runner, 1, f"{tmp}/s{i}")[0] for i in range(2) if settle() >= 0)
        print(f"start-up of an empty sweep (cluster, workers, flow run): {startup:.1f} s", flush=True)
        for seconds, n_cells in sizes:
            n_mm = calibrate(seconds)

            def direct_run() -> float:
                t0 = time.perf_counter()
                for s in range(n_cells):
                    busy(n_mm, s)
                return time.perf_counter() - t0

            before = direct_run()
            sweeps = {}
            for bundle_size in (64, 1):  # default bundling / one Prefect task per cell (worst case)
                waited = settle()
                sweeps[bundle_size] = (*sweep(n_cells, n_mm, runner, bundle_size, f"{tmp}/b{bundle_size}"), waited)
            after = direct_run()  # the VM's speed drifts: the reference is the mean of both sides
            direct = 0.5 * (before + after)
            for bundle_size, (t_sweep, stats, waited) in sweeps.items():
                ideal = direct / a.workers
                row = {"cell_s": direct / n_cells, "cells": n_cells, "bundle_size": bundle_size,
                       "bundles": stats["bundles"], "direct_s": direct, "direct_before_s": before,
                       "direct_after_s": after, "direct_spread_fraction": abs(after - before) / direct,
                       "sweep_s": t_sweep, "ideal_parallel_s": ideal,
                       "startup_s": startup, "overhead_fraction": t_sweep / ideal - 1,
                       "steady_overhead_fraction": (t_sweep - startup) / ideal - 1, "written": stats["written"],
                       "settle_before_s": waited}
                rows.append(row)
                print(f"cell {row['cell_s']:.2f} s x {n_cells} in {stats['bundles']} bundles: direct {direct:.1f} s "
                      f"({before:.1f} before, {after:.1f} after), "
                      f"sweep {t_sweep:.1f} s on {a.workers} workers (ideal {ideal:.1f} s) -> overhead "
                      f"{100 * row['overhead_fraction']:.1f}% ({100 * row['steady_overhead_fraction']:.1f}% without "
                      f"the {startup:.1f} s start-up)", flush=True)
        t_big, big = sweep(a.big, 0, runner, 500, tmp)
        print(f"largest sweep: {big['written']} cells in {big['bundles']} bundles, {t_big:.1f} s", flush=True)
    return rows, big, t_big


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="0.1 s and 1 s cells only, fewer cells")
    ap.add_argument("--big", type=int, default=5000, help="cells of the large tiny-cell sweep")
    ap.add_argument("--cluster", choices=("local", "address"), default="local",
                    help="local: a LocalCluster per sweep (default); address: one persistent dask cluster")
    ap.add_argument("--served", action="store_true", help="submit-to-done overhead of a served quickstart, in parts")
    ap.add_argument("--repeats", type=int, default=2, help="--served: submissions per setup")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.served:
        from benchmarks import served_overhead

        with tempfile.TemporaryDirectory() as tmp:
            result = served_overhead.measure(tmp, repeats=a.repeats)
        print(f"wrote {write('orchestration_overhead_served', result)}")
        return
    sizes = [(0.1, 30), (1.0, 10)] if a.quick else [(0.1, 60), (1.0, 30), (10.0, 6)]
    with tempfile.TemporaryDirectory() as tmp:
        # a fresh result store: no cached bundle from an earlier run may stand in for work
        os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = os.path.join(tmp, "prefect-results")
        rows, big, t_big = measure(a, sizes, tmp)
    target = [r for r in rows if r["cell_s"] >= 0.9 and r["bundle_size"] == 64]
    per_cell = {round(r["cell_s"], 1): r for r in rows if r["bundle_size"] == 1}
    bundled = {round(r["cell_s"], 1): r for r in rows if r["bundle_size"] == 64}
    task_cost = [(per_cell[k]["sweep_s"] - bundled[k]["sweep_s"]) / max(per_cell[k]["bundles"] - bundled[k]["bundles"], 1)
                 for k in per_cell if k in bundled]
    path = write("orchestration_overhead" + ("_address" if a.cluster == "address" else ""), {
        "workers": a.workers, "cluster": a.cluster, "rows": rows,
        "largest_sweep": {"cells": big["written"], "bundles": big["bundles"], "wall_s": t_big},
        "target": "overhead <= 5% for cells >= 1 s with kktlab's default bundling (steady state; start-up "
                  "reported separately, and the overhead including it too); bundle_size=1 rows price one "
                  "Prefect task per cell",
        "seconds_per_extra_prefect_task": task_cost,
        "target_met_steady": bool(target) and all(r["steady_overhead_fraction"] <= 0.05 for r in target),
        "target_met_including_startup": bool(target) and all(r["overhead_fraction"] <= 0.05 for r in target)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
