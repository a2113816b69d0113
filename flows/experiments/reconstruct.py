"""Experiment ``reconstruct``: paper 004 (Refael et al., "No Prior, No Leakage") F004-1 / F004-2:
Haim et al.'s KKT reconstruction attack on nets a ``train`` stage stored (reads "nets"), with the
init radius, λ_min, learning rates, surrogate slope, restart and secret shift as grid axes. Every
cell of a bundle (nets × settings × restarts) is one row of ONE stacked problem
(``tasks/cells/reconstruct.py``). Declaration and wiring only.

Stored per cell: the final objective (and relative to ‖θ‖², and its trace), the exact-ReLU residual
of the final candidates, the true (shifted) training set's ε*/‖θ‖ under the attacked net, the
scores of spec §2.5 / X004-8, and per candidate its distance, nearest training index, NCC, λ, norm
and the candidate itself (dims candidate, feature: one chunk per cell).
"""

from __future__ import annotations


from core.declare import NONNEG, FRACTION, COSINE, with_domain
from core.errors import ConfigError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from tasks.cells import reconstruct as cell_fn
from tasks.reconstruct import INITS, OBJECTIVES
from tasks.reconstruct.attack import BLOWUP, DIVERGED, DONE

P = {
    "radius": Param(float, 1.0, "init radius r of the candidates (paper 004 Sec 4; gauss: s = r/sqrt(d))", gt=0),
    "init": Param(str, "sphere", "candidate init: uniform on the sphere of radius r (paper) or r/sqrt(d) N(0,I) (Haim)",
                  choices=tuple(INITS)),
    "lam_min": Param(float, 0.01, "lambda >= lambda_min penalty 5 relu(lambda_min - lambda)^2 (0: off)", min=0),
    "lr_x": Param(float, 0.01, "SGD-momentum learning rate of the candidates", gt=0),
    "lr_lam": Param(float, 1e-4, "SGD-momentum learning rate of the multipliers (Haim: 1e-4)", gt=0),
    "alpha": Param(float, 300.0, "surrogate ReLU derivative sigmoid(alpha z) in the attacked copy (Haim: 300)", gt=0),
    "surrogate": Param(bool, True, "use the surrogate derivative (false: exact step, X004-2)"),
    "restart": Param(int, 0, "restart index (its own init draw)", min=0, max=10**6),
    "seed": Param(int, 0, "seed of the candidate inits (with restart)", min=0, max=2**32 - 1),
    "shift": Param(float, 0.0, "secret shift u = shift * 1 (App D bias transform b - W u; 0: none)", min=-1e6, max=1e6),
    "n_candidates": Param(int, 100, "candidates l (half labelled -1, half +1; Haim: 2n)", min=2, max=10**6),
    "steps": Param(int, 1000, "attack steps (Haim: 50000)", min=1, max=10**8),
    "objective": Param(str, "haim", "Haim's squared per-tensor residual, lambda/l (default) or the paper's Eq 5",
                       choices=tuple(OBJECTIVES)),
    "box": Param(bool, False, "domain box [-1,1] penalty (a prior; paper 004: off)"),
    "norm_prior": Param(float, 0.0, "the attacker's prior on the data's norm (issue 39): every candidate projected "
                        "onto the sphere of this radius after each step (0: off, the paper; a frozen output layer "
                        "without bias leaves a candidate's norm free, so only a prior makes distances mean something)",
                        min=0, max=1e6),
    "rho": Param(float, 0.3, "recovery radius for n_recovered (spec X004-8)", gt=0),
}

_cand = ("candidate",)
V = {
    "status": Var("1", f"{DONE} done, {DIVERGED} diverged (non-finite objective or gradient, objective above "
                  f"{BLOWUP:g}² x its init value, or a candidate norm above {BLOWUP:g} x max(radius, largest training "
                  "point norm); frozen there; its scores, distances and candidates stored as NaN)", "int8",
                  ok=(DONE,), finite=True, labels=((DONE, "done"), (DIVERGED, "diverged"))),
    "objective": Var("1", "final attack objective (spec §2.4; paper: 330-332 for every sphere run)"),
    "objective_rel": Var("1", "objective / ||theta||^2 (X004-5)"),
    "objective_init": Var("1", "objective at the init candidates"),
    "residual_exact_rel": Var("1", "||R|| / ||theta|| of the final candidates with the exact step derivative (X004-2)"),
    "train_eps": Var("1", "eps*/||theta|| of the true (shifted) training set under the attacked net, NNLS (X004-6)"),
    "score5": Var("l2 norm", "mean distance of the 5 best candidates to the training set (paper's score)"),
    "score10": Var("l2 norm", "mean distance of the 10 best candidates"),
    "score5_unique": Var("l2 norm", "duplicate-free 5-best: each training point once (X004-8)"),
    "score5_active": Var("l2 norm", "5-best over candidates with lambda >= lambda_min/10 (X004-8)"),
    "score5_init": Var("l2 norm", "score5 of the init candidates (a random-candidate reference, §2.5)"),
    "n_recovered": Var("1", "distinct training points with a candidate within rho", "int64"),
    "ssim10": Var("1", "mean SSIM of the 10 candidates closest to the training set (images; NaN otherwise)"),
    "ssim_max": Var("1", "largest SSIM of any candidate with its nearest training image (images; NaN otherwise)"),
    "avg_frac": Var("1", "P004-17: fraction of the 10 best candidates closer (unit-normalised, shift off) to the mean "
                    "of their K = 2..10 nearest training points than to the nearest one"),
    "avg_ratio": Var("1", "P004-17: median over the 10 best of min_K d(mean of K nearest) / d(nearest), unit-normalised"),
    "wall_s": Var("s", "bundle attack wall time divided by the bundle's cells", finite=True),
    "objective_trace": Var("1", f"objective at {cell_fn.N_TRACE} evenly spaced steps (first: init)", dims=("trace",)),
    "dist": Var("l2 norm", "distance of each candidate to its nearest training point", dims=_cand),
    "nearest": Var("1", "index of that training point (train stage's sample axis)", "int64", dims=_cand),
    "ncc": Var("1", "best normalised cross-correlation with a training point", dims=_cand),
    "lam": Var("1", "final multiplier lambda_i of each candidate (Haim's scale: l x the paper's)", dims=_cand),
    "cand_norm": Var("l2 norm", "final ||x'_i||", dims=_cand),
    "ssim": Var("1", "SSIM with the nearest training image, shift taken off (CIFAR, d = 3072; NaN otherwise)",
                dims=_cand),
    "candidates": Var("1", "the final candidates x'_i (in the shifted space; NaN past d)", dims=("candidate", "feature")),
    "point_dist": Var("l2 norm", "per training point: distance of the best candidate to it (shift taken off)",
                      dims=("sample",)),
    "recovered_forgotten": Var("1", "fraction of the points an upstream unlearn stage forgot whose best candidate "
                               "is within rho (spec 004 §2.5; NaN: none forgotten)"),
    "recovered_retained": Var("1", "the same for the retained training points"),
    "dist_forgotten": Var("l2 norm", "mean best-candidate distance of the forgotten points (NaN: none)"),
    "dist_retained": Var("l2 norm", "mean best-candidate distance of the retained points"),
    "point_cos": Var("1", "per training point: the largest cosine of a candidate to it (direction; W-only nets "
                     "identify points up to scale)", dims=("sample",)),
    "cos_forgotten": Var("1", "mean best-candidate cosine of the forgotten points (NaN: none)"),
    "cos_retained": Var("1", "mean best-candidate cosine of the retained points"),
}
with_domain(V, NONNEG, "objective", "objective_rel", "objective_init", "residual_exact_rel", "train_eps", "score5",
            "score10", "score5_unique", "score5_active", "score5_init", "n_recovered", "avg_ratio", "wall_s",
            "objective_trace", "dist", "cand_norm", "point_dist", "dist_forgotten", "dist_retained")
with_domain(V, FRACTION, "avg_frac", "recovered_forgotten", "recovered_retained")
with_domain(V, COSINE, "ssim10", "ssim_max", "ncc", "ssim", "point_cos", "cos_forgotten", "cos_retained")


def bundle_key(cell: dict) -> tuple:
    """Rows that share the problem's shape and method stack: one init, objective, candidate count,
    step count, box, surrogate switch and rho per bundle."""
    return tuple((k, cell[k]) for k in ("init", "objective", "n_candidates", "steps", "box", "surrogate", "rho"))


def extra_dims(cells: list[dict]) -> dict[str, int]:
    return {"candidate": max(c["n_candidates"] for c in cells), "trace": cell_fn.N_TRACE}


def cost(cell: dict) -> float:
    return float(cell["n_candidates"] * cell["steps"])


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets of ``cells``, in order (storage.nets.Nets), float64 on the CPU."""
    import torch

    n = inputs
    dev = "cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    if dev == "cuda":  # float64 throughout; never TF32 on a side path (X004-3)
        torch.backends.cuda.matmul.allow_tf32 = False
    return cell_fn.run(n.W, n.b, n.v, n.X, n.y, n.mask, n.d, n.m, n.width, cells, device=dev, blocks=n.trained(),
                       forgotten=n.forgotten(),
                       progress=bundle_progress.for_kernel(bundle_progress.current()))  # attack steps, objective


def check(cell: dict) -> None:
    """A norm prior is on the data's sphere; the shift defence moves the data off it."""
    if cell["norm_prior"] > 0 and cell["shift"] != 0:
        raise ConfigError("norm_prior", "a norm prior needs shift: 0 (the shifted data x + u is not on the "
                          "sphere the prior names)")


EXPERIMENT = register(Experiment(
    name="reconstruct",
    figures="analysis.reconstruct",
    acceptance="analysis.acceptance_004",
    paper="004 Refael, Smorodinsky, Lindenbaum, Safran: No Prior, No Leakage (KKT reconstruction)",
    description="KKT reconstruction attack (Haim et al.) on stored nets, stacked over radii x settings x restarts "
                "(reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", extra_dims=extra_dims,
    cost=cost, check=check, summary=("status", "objective", "objective_rel", "score5", "score5_init", "n_recovered", "train_eps"),
    spec_ids=("F004-1", "F004-2", "P004-13", "P004-14", "P004-15", "P004-16", "P004-17"),
))
