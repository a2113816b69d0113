"""Paper 000 Fig 1 (F000-1, P000-15): one cell = the original and the forged SGD trajectory.

Scalars in, numbers out: the two trajectories w_0..w_K (extra dim ``step``), the shared points
x_1..x_{K-1} (extra dim ``point``; spec §6.11: not given in the paper, drawn here and stored), the
gradients at w_0 and whether the runs end in opposite basins. The maths is tasks/forging/sgd.py.
"""

from __future__ import annotations

import time

import numpy as np

from tasks.forging.sgd import figure1_trajectories

__all__ = ["forging_sgd_cell", "OUTPUTS"]

OUTPUTS = ("w_original", "w_forged", "x_shared", "grad_original_w0", "grad_forged_w0", "w_final_original",
           "w_final_forged", "opposite_basins", "wall_time")


def forging_sgd_cell(*, x0: float, x0_forged: float, w0: float, h: float, n_updates: int, c: float, A: float,
                     seed: int, data: str, progress=None) -> dict:
    """Run Fig 1's two SGD trajectories (Eq 2) on the two-basin loss; arrays are numpy float64.
    ``progress`` (optional): ``progress(updates done, n_updates)`` (``sgd_trajectories``')."""
    t0 = time.perf_counter()
    r = figure1_trajectories(x0=x0, x0_forged=x0_forged, w0=w0, h=h, n_updates=n_updates, c=c, A=A, seed=seed,
                             data=data, progress=progress)
    wo, wf = np.asarray(r["w_original"], dtype=float), np.asarray(r["w_forged"], dtype=float)
    return {"w_original": wo, "w_forged": wf, "x_shared": np.asarray(r["xs"], dtype=float),
            "grad_original_w0": r["grad_original_w0"], "grad_forged_w0": r["grad_forged_w0"],
            "w_final_original": float(wo[-1]), "w_final_forged": float(wf[-1]),
            "opposite_basins": int(np.sign(wo[-1]) != np.sign(wf[-1])), "wall_time": time.perf_counter() - t0}
