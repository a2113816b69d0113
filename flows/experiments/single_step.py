"""Experiment ``single_step`` (paper 003 §5.1 / App. A; spec 003 §2.7, §2.11; E1, E2, E3, X2, X6):
reads stored nets (``lazy_train``, ``adv_train``, or with ``points: train`` any producer, ``unlearn``
included) and measures, per point, the exact minimal gradient step that flips the sign and every
diagnostic of §2.11 (per-point variables over the ``point`` dim: the upstream's test points, or its
training points with ``points: train``; forgotten and retained points apart when the nets come from
an ``unlearn`` stage). Declaration and wiring only (``tasks/cells/single_step.py``)."""

from __future__ import annotations


import torch

from core.declare import FRACTION, NONNEG, NetsNeeds, with_domain
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from flows.bundles import memory_budget
from tasks.attacks import STEP_ATTACKS, chunk_for
from tasks.cells import single_step as cell_fn

P = {
    "single_step_method": Param(str, "single_step_exact", "exact breakpoint sort (default) or its bisection oracle",
                                choices=tuple(STEP_ATTACKS)),
    "deepfool": Param(bool, False, "also run the DeepFool-style iterative linearisation (X3)"),
    "points": Param(str, "test", "the points attacked: the upstream's test set, or its training points (for "
                    "forgotten vs retained points of unlearned nets)", choices=("test", "train")),
    "chunk": Param(int, 0, "test points per chunk (bounds the E x chunk x m blocks); 0: as many as half the "
                   "free memory allows", min=0, max=10**6),
}
DOC = {
    "f": "f(x; W)", "f0": "f(x; W0)", "gnorm": "||grad_x f(x; W)||", "gnorm0": "||grad_x f(x; W0)||",
    "eta_star": "|eta*| = t*: the smallest flipping step along -sign(f) grad f (inf: none)",
    "t_lin": "|f|/||grad f||^2 (linearised step)", "t_ratio": "t*/t_lin",
    "delta_rel": "||delta*||/||x|| = t* ||grad f||/||x||", "eta_rel": "t*/||x||", "x_norm": "||x||",
    "rho": "||grad f(x+delta*) - grad f(x)||/||grad f(x)|| (Lemma B.9)", "C2_hat": "t* ||grad f||^2 (Thm 3.1's C2)",
    "t_thm": "2|f|/((1-rho)||grad f||^2) (theorem's plug-in step, G-plugin; inf if rho >= 1)",
    "n_flip_W": "#neurons whose sign at x differs between W and W0 (Lemma B.4)",
    "n_margin_V": "#neurons with |w_s0 . x| <= V ||x|| (Lemma B.4 superset)",
    "n_flip_delta": "#neurons whose sign changes between x and x + delta* (Lemma B.6)",
    "correct": "1 if y f(x) > 0", "delta_deepfool": "||delta|| of DeepFool-style linearisation (NaN: not run)",
}
V = {k: Var("1", DOC[k], dims=("point",)) for k in cell_fn.SAMPLE_VARS}
MEDIANS = ("delta_rel", "eta_star", "eta_rel", "gnorm", "rho", "t_ratio", "t_thm")
V.update({f"med_{k}": Var("1", f"median over test points of {k}") for k in MEDIANS})
V["med_delta_forgotten"] = Var("l2 norm", "median ||delta*|| over the points an upstream unlearn stage forgot (NaN: none)")
V["med_delta_retained"] = Var("l2 norm", "median ||delta*|| over the other points")
V["flip_frac"] = Var("1", "fraction of test points a positive step flips", finite=True)
V["test_acc"] = Var("1", "clean test accuracy", finite=True)
V["sqrt_d"] = Var("1", "sqrt of the net's input dimension", finite=True)
V["wall_s"] = Var("s", "bundle wall time divided by its cells", finite=True)
with_domain(V, NONNEG, "gnorm", "gnorm0", "x_norm", "med_gnorm", "med_delta_forgotten", "med_delta_retained",
            "sqrt_d", "wall_s")
with_domain(V, FRACTION, "flip_frac", "test_acc")


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets (storage.nets.Nets with extras W0, X_test, y_test, n_test_used).
    Float64 on the CPU (spec §7: fp64 cumulative sums; the CPU oracle)."""
    n = inputs
    ex = n.extra
    C0 = torch.tensor([float(c.get("C0", "nan")) for c in n.cells], dtype=torch.float64)
    V_nom = C0 / torch.sqrt(n.width.double())
    X, y, count, gone = attacked_points(n, cells[0]["points"])
    return cell_fn.attack(n.W, n.b, n.v, ex.get("W0"), ex.get("b0"), X, y, count, V_nom, cells,
                          cells[0]["chunk"] or chunk_for(len(cells), int(n.W.shape[1]), memory_budget("cpu", 1)),
                          forgotten=gone, progress=bundle_progress.for_kernel(bundle_progress.current()))


def attacked_points(n, points: str):
    """(X, y, count, forgotten) of the points a reader attacks: the nets' test set, or their training
    points (then ``forgotten`` marks those an upstream unlearn stage removed; None for test points)."""
    if points == "train":
        return n.X, n.y, n.m, n.forgotten()
    return n.extra["X_test"], n.extra["y_test"], n.extra["n_test_used"].long(), None


def needs(cell: dict) -> NetsNeeds:
    return NetsNeeds(arrays=frozenset({"X_test", "y_test"}) if cell["points"] == "test" else frozenset(),
                     why="points: test attacks the upstream's test set; points: train attacks its training points")


def extra_dims(cells: list[dict]) -> dict:
    """``point``: as long as the upstream's test set or training set (names resolved by the config)."""
    return {"point": sorted({"test_sample" if c["points"] == "test" else "sample" for c in cells})}


def bundle_key(cell: dict) -> tuple:
    return tuple(sorted(cell.items()))


def points_word(params: dict, grid: dict) -> str:
    """Which points a reader's cells attack, for its variables' descriptions: "training" (``points:
    train``), "test", or both where both values are on the grid."""
    points = {str(p) for p in grid.get("points", [params.get("points", "test")])}
    return ("training" if points == {"train"} else "test" if points == {"test"}
            else "test or training (by the cell's points)")


def describe(params: dict, grid: dict) -> dict[str, str]:
    """The medians, ``flip_frac`` and ``test_acc`` say which points were attacked: with ``points:
    train`` the upstream's training points (issue 40), with both values on the grid either, by cell."""
    which = points_word(params, grid)
    out = {f"med_{k}": f"median over {which} points of {k}" for k in MEDIANS}
    out.update(flip_frac=f"fraction of {which} points a positive step flips", test_acc=f"clean {which} accuracy")
    return out


EXPERIMENT = register(Experiment(
    name="single_step",
    figures="analysis.lazy",
    acceptance="analysis.acceptance_003",
    paper="003 Wang, Ullah, Mianjy, Arora: Adversarial robustness is at odds with lazy training",
    description="exact minimal single gradient step flipping sign f on stored lazy nets + §2.11 diagnostics (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", needs=needs,
    extra_dims=extra_dims, describe=describe,
    summary=("test_acc", "flip_frac", "med_delta_rel", "med_gnorm", "med_eta_star"),
    spec_ids=("E1", "E2", "E3", "X2", "X3", "X6"),
))
