"""Experiment ``calibrate``: cells doing a fixed amount of matmul work, to measure what the
Prefect + Dask path costs on a cluster (benchmarks/orchestration_overhead.py)."""

from __future__ import annotations

import time

from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register
from tasks.cells.calibrate import busy


def run_bundle(cells: list[dict], device: str = "cpu") -> list[dict]:
    """The bundle reports its matmuls done of all its cells' (issue 30); a cancel request stops it there."""
    out = []
    # the work of a cell is sequential by design: it is the unit being timed
    for c, progress in zip(cells, bundle_progress.per_cell([int(c["n_matmuls"]) for c in cells])):
        t0 = time.perf_counter()
        checksum = busy(c["n_matmuls"], c["seed"], progress=progress)
        out.append({"checksum": checksum, "wall_s": time.perf_counter() - t0})
    return out


EXPERIMENT = register(Experiment(
    name="calibrate",
    paper="none (infrastructure)",
    description="fixed matmul work per cell; measures orchestration overhead",
    params={"n_matmuls": Param(int, 100, "128x128 float32 matmuls per cell", min=0, max=10**7),
            "seed": Param(int, 0, "seed of the matrices", min=0, max=2**32 - 1)},
    variables={"checksum": Var("1", "sum of the final matrix (proves the work ran)"),
               "wall_s": Var("s", "time the cell's work took on its worker", finite=True)},
    run_bundle=run_bundle,
    bundle_key=lambda cell: (cell["n_matmuls"],),
    cost=lambda cell: float(cell["n_matmuls"]),
    summary=("wall_s",),
))
