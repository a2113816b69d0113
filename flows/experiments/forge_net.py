"""Experiment ``forge_net``: paper 000's forging volume (Eq 1, D000-1/D000-3) at the training points of
stored two-layer ReLU nets (reads "nets": ``train``, ``train_kkt``, ``lazy_train``, ``adv_train``,
``unlearn``). Per cell, one net: the log-volume of {x' ∈ B_R(0) : ‖∇_θ ℓ(x', y_i) − ∇_θ ℓ(x_i, y_i)‖
≤ eps·‖∇_θ ℓ(x_i, y_i)‖} over the trained blocks of θ, per measured point and averaged separately
over the points an upstream ``unlearn`` forgot and the retained ones. Declaration and wiring only;
the maths is ``tasks/cells/forge_net.py``, the estimators ``tasks/forging/estimators``.
"""

from __future__ import annotations

import torch

from core.declare import NONNEG, with_domain
from core.errors import ConfigError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, timed
from tasks.cells import forge_net as cell_fn
from tasks.forging.estimators import ESTIMATORS, LEVELLED, REPEATED

P = {
    "eps": Param(float, 0.1, "relative forging tolerance: eps·‖∇_θ ℓ(θ; x_i, y_i)‖ is the ε of Eq 1 (< 1)",
                 gt=0, max=1),
    "R": Param(float, 0.0, "radius of the forging domain B_R(0) (D000-3); 0: the largest training-point norm "
               "of the net", min=0, max=1e6),
    "estimator": Param(str, "subset_importance", "volume estimator (tasks/forging/estimators): subset simulation "
                       "+ importance sampling (main), nested sampling (cross-check), ...", choices=tuple(ESTIMATORS)),
    "n_samples": Param(int, 1000, "subset_*: samples per level and run; nested_sampling: live points per run; "
                       "naive_mc: samples", min=10, max=10**9),
    "n_repeats": Param(int, 10, "independent runs of subset_* / nested_sampling (>= 10, spec §5)", min=2,
                       max=10_000),
    "n_importance": Param(int, 100_000, "subset_importance: importance draws after the subset-simulation pilot",
                          min=100, max=10**9),
    "points": Param(int, 4, "training points measured per net: the first `points` (-1: all), plus every point "
                    "an upstream unlearn stage forgot", min=-1, max=10**6),
    "seed": Param(int, 0, "estimator seed (with the net's content, the point index and the other estimator "
                  "params; never the upstream cell's coordinates: identical nets get identical estimates)",
                  min=0, max=2**32 - 1),
    "loss": Param(str, "logistic", "the per-example loss ℓ(y f(x)) the nets were trained with (taken from the "
                  "upstream cell where it has one)", choices=("logistic", "exp")),
}
INHERITS = {"loss": "loss"}  # the gradient is that of the loss the upstream trained (train: exp or logistic)

_s = ("sample",)
V = {
    "logvol_forgotten": Var("log(volume)", "mean over the forgotten points (upstream unlearn) of logvol; NaN when "
                            "none"),
    "logvol_retained": Var("log(volume)", "mean over the measured retained points of logvol; NaN when none"),
    "n_forgotten": Var("1", "forgotten points measured", "int64", finite=True),
    "n_retained": Var("1", "retained points measured", "int64", finite=True),
    "n_failed": Var("1", "measured points without a volume (point_status != 0)", "int64", finite=True),
    "R_used": Var("1", "radius R of the forging domain B_R(0)", finite=True),
    "log_domain_volume": Var("log(volume)", "log vol(B_R) in R^d (logvol minus this: log forging probability "
                             "under the uniform law on B_R)", finite=True),
    "n_gradient_evals": Var("1", "gradient evaluations of the estimators, all points", finite=True),
    "logvol": Var("log(volume)", "natural log of the Lebesgue measure of S_eps ∩ B_R(0) ⊂ R^d at training point i "
                  "(NaN: not measured or point_status != 0)", dims=_s),
    "logvol_stderr": Var("1", "the estimator's stated standard error of logvol (≈ relative error of the volume)",
                         dims=_s),
    "log_grad_norm": Var("1", "log ‖∇_θ ℓ(θ; x_i, y_i)‖ over the trained blocks (the unit of eps)", dims=_s),
    "point_status": Var("1", "0 ok, 2 estimator stalled, 3 unreliable (flagged by the estimator: Pareto k-hat, "
                        "ESS < 100, < 10 hits; or no finite volume and SE), 4 zero gradient at x_i; NaN where not "
                        "measured", dims=_s),
    "wall_s": Var("s", "bundle wall time divided by its cells", finite=True),
}
with_domain(V, NONNEG, "n_forgotten", "n_retained", "n_failed", "R_used", "n_gradient_evals", "logvol_stderr",
            "wall_s")


def check(cell: dict) -> None:
    """Cross-field checks (ConfigError names the field)."""
    if not cell["eps"] < 1:
        raise ConfigError("eps", "must be < 1: at eps >= 1 every x' with zero gradient (all neurons off, saturated "
                          "margin) forges (spec T000-4, §6 item 4)")
    if cell["estimator"] in LEVELLED and cell["n_samples"] % 10:
        raise ConfigError("n_samples", "subset simulation needs a multiple of 10 (p0 = 0.1)")
    if cell["estimator"] in REPEATED and cell["n_repeats"] < 10:
        raise ConfigError("n_repeats", "spec §5: rare-event estimators report a CV from >= 10 repetitions")


def cost(cell: dict) -> float:
    """Rough gradient evaluations per net (points × runs × samples × ~10 levels)."""
    pts = 8 if cell["points"] < 0 else max(cell["points"], 1)
    extra = cell["n_importance"] if cell["estimator"] == "subset_importance" else 0
    return pts * (cell["n_repeats"] * cell["n_samples"] * 10 + extra)


@timed
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets of ``cells``, in order (storage.nets.Nets), float64 on the CPU
    (``device`` is accepted and ignored). Each net is cut to its own sizes; ``inputs.trained`` names
    the trained blocks, ``inputs.extra["forgotten"]`` (E, M) marks the points unlearn forgot."""
    n = inputs
    forgotten = n.extra.get("forgotten")
    fgs = [forgotten[e, :int(n.m[e])] > 0.5 if forgotten is not None else torch.zeros(int(n.m[e]), dtype=torch.bool)
           for e in range(len(cells))]
    counts = [int(cell_fn.measured_points(fg, c["points"]).sum()) for fg, c in zip(fgs, cells)]
    # the bundle's measured points done of all of them (issue 30); a cancel request stops it there
    progresses, out = bundle_progress.per_cell(counts), []
    for e, (cell, fg, progress) in enumerate(zip(cells, fgs, progresses)):
        k, d, m = int(n.width[e]), int(n.d[e]), int(n.m[e])
        own = {key: cell[key] for key in P}
        out.append(cell_fn.measure_net(n.W[e, :k, :d], n.b[e, :k], n.v[e, :k], n.X[e, :m, :d], n.y[e, :m], fg,
                                       trained_blocks(n, e), own, progress=progress))
    return out


def trained_blocks(nets, e: int) -> frozenset:
    """The blocks net ``e`` trained: ``nets.trained`` as one frozenset for the stack, or as the method
    giving an (E, 3) bool over (W, b, v) per net; all three where the nets say nothing."""
    t = getattr(nets, "trained", None)
    if t is None:
        return frozenset(cell_fn.BLOCKS)
    if callable(t):
        return frozenset(blk for blk, on in zip(cell_fn.BLOCKS, t()[e].tolist()) if on)
    return frozenset(t)


EXPERIMENT = register(Experiment(
    name="forge_net",
    figures="analysis.pipeline",
    paper="000 Dixit, Hui, Saab: The Measure of Deception (data forging in machine unlearning)",
    description="log volume of the eps-forging set (Eq 1) at the training points of stored nets, forgotten vs "
                "retained (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, reads="nets", inherits=INHERITS, check=check, cost=cost,
    bundle_key=lambda cell: (),  # cells run one after another (each point is its own estimator problem)
    summary=("logvol_forgotten", "logvol_retained", "n_forgotten", "n_retained", "n_failed", "R_used"),
    spec_ids=("D000-1", "D000-3"),
))
