"""Experiment ``forging_sgd``: paper 000 Fig 1 (F000-1, P000-15), SGD on the §2 two-basin loss with
the original first point x0 and a forged x̃0; declaration and wiring only, the maths is
tasks/cells/forging_sgd.py -> tasks/forging/sgd.py. The trajectories live in the store (extra dim
``step``), so `kktlab report` draws Fig 1 from stored numbers (analysis/forging_sgd.py)."""

from __future__ import annotations

from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register
from tasks.cells.forging_sgd import OUTPUTS, forging_sgd_cell

P = {
    "x0": Param(float, -0.5, "original first data point x_0 (paper Fig 1)"),
    "x0_forged": Param(float, 0.2, "forged first data point x̃_0 (paper Fig 1)"),
    "w0": Param(float, 1e-4, "initial weight w_0 (paper Fig 1)"),
    "h": Param(float, 0.3, "constant SGD step size h (Eq 2)", gt=0),
    "n_updates": Param(int, 20, "SGD updates K (w_0..w_K; paper: 20)", min=1, max=10**6),
    "c": Param(float, 2.0, "basin centres ±c, mu = c e1 (not in the paper; spec §4: 2)", gt=0),
    "A": Param(float, 1.0, "a(x) = A x (not in the paper; spec §4: 1)"),
    "seed": Param(int, 0, "numpy default_rng seed of the shared points x_1..x_{K-1}", min=0, max=2**32 - 1),
    "data": Param(str, "uniform", "law of the shared points: U(-1, 1) (spec default), N(0, 0.3²), N(0, 1), or 0",
                  choices=("uniform", "normal0.3", "normal1", "zeros")),
}

V = {
    "w_original": Var("1", "SGD iterates w_0..w_K with the original x_0 (NaN past K)", dims=("step",)),
    "w_forged": Var("1", "SGD iterates w_0..w_K with the forged x̃_0 (NaN past K)", dims=("step",)),
    "x_shared": Var("1", "shared data points x_1..x_{K-1} of both runs (NaN past K - 1)", dims=("point",)),
    "grad_original_w0": Var("1", "∇_w f(w_0; x_0) (P000-15: 0.248206)"),
    "grad_forged_w0": Var("1", "∇_w f(w_0; x̃_0) (P000-15: -0.101799)"),
    "w_final_original": Var("1", "w_K of the original run (P000-15: < -1.5)"),
    "w_final_forged": Var("1", "w_K of the forged run (P000-15: > 1.5)"),
    "opposite_basins": Var("1", "1 if sign(w_K) differs between the runs", "int8", finite=True),
    "wall_time": Var("s", "wall time of the cell", finite=True),
}
assert set(V) == set(OUTPUTS)


def extra_dims(cells: list[dict]) -> dict[str, int]:
    k = max(int(c["n_updates"]) for c in cells)
    return {"step": k + 1, "point": max(k - 1, 1)}


def run_bundle(cells: list[dict], device: str = "auto") -> list[dict]:
    """One dict of stored variables per cell (CPU float64; ``device`` is accepted and ignored). The
    bundle reports its SGD updates done of all its cells' (issue 30); a cancel request stops it there."""
    return [forging_sgd_cell(**{k: c[k] for k in P}, progress=progress)
            for c, progress in zip(cells, bundle_progress.per_cell([int(c["n_updates"]) for c in cells]))]


EXPERIMENT = register(Experiment(
    name="forging_sgd",
    figures="analysis.forging_sgd",
    paper="000 Dixit, Hui, Saab: The Measure of Deception (data forging in machine unlearning)",
    description="Fig 1: SGD on the two-basin loss, original vs forged first point (trajectories stored per step)",
    params=P, variables=V, run_bundle=run_bundle, extra_dims=extra_dims,
    summary=("grad_original_w0", "grad_forged_w0", "w_final_original", "w_final_forged", "opposite_basins"),
    spec_ids=("F000-1", "P000-15"),
))
