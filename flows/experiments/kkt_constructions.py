"""Experiment ``kkt_constructions``: paper 004 F004-3 (spec §4 F004-3; no figure in the paper, it
validates Sec 3): the non-uniqueness constructions checked on the nets a ``train`` stage stored
(reads "nets"): SPLIT / MERGE residuals vs operation count (Lemmas 2-3), Thm 4's far KKT sets of the
exactified net (n < d), the split budgets B5 / B8 of Thms 5 / 8 against the exact admissible range
per training point, and App C's γ(U_d) vs σ_d. Declaration and wiring only; the maths is
``tasks/cells/kkt_constructions.py``.
"""

from __future__ import annotations


from core.declare import NetsNeeds
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from tasks.cells import kkt_constructions as cell_fn

P = {
    "n_ops": Param(int, 10, "splits along U_d (each of another support point), then as many merges (F004-3 (a))",
                   min=0, max=10_000),
}

_s, _op, _tau = ("sample",), ("op",), ("tau",)
V = {
    "eps_rel": Var("1", "eps*/||theta|| of the stored net on its training set (NNLS, spec §2.3)"),
    "n_support": Var("1", "support points: #{lambda_i > 1e-6 max lambda}", "int64"),
    "merge_split_max": Var("1", "(a) max over operations of ||R(S_t) - R(S_0)|| / ||theta|| (P004-2/3: round-off)"),
    "op_residual": Var("1", "(a) ||R(S_t) - R(S_0)|| / ||theta|| after operation t (splits, then merges)", dims=_op),
    "op_kind": Var("1", f"(a) operation t: {cell_fn.SPLIT} split, {cell_fn.MERGE} merge", "int8", dims=_op),
    "far_tau": Var("l2 norm", "(b) tau of Thm 4's far set S_tau (P004-4)", dims=_tau),
    "far_dist": Var("l2 norm", "(b) d(S, S_tau) (> tau); NaN when n >= d", dims=_tau),
    "far_residual": Var("1", "(b) ||R(S_tau) - R(S)|| / ||theta|| of the exactified net", dims=_tau),
    "far_phi_err": Var("1", "(b) max | |Phi(x')| - |Phi(x)| | / max |Phi(x)| over S_tau", dims=_tau),
    "far_pattern_kept": Var("1", "(b) 1 if every point of S_tau has its parent's activation pattern", "int8",
                            dims=_tau),
    "far_ok": Var("1", "(b) 1 if for every tau: d(S, S_tau) > tau, residual and |Phi| change <= 1e-10, patterns kept "
                  "(P004-4); 0 if not; -1 when n >= d (no far set)", "int8"),
    "b8": Var("l2 norm", "(c) Thm 8 split budget B8(i) along U_d (eps = eps*)", dims=_s),
    "exact_range": Var("l2 norm", "(c) exact admissible split range min(alpha_max, beta_max) along U_d", dims=_s),
    "b5": Var("l2 norm", "(c) Thm 5 budget (corrected, |v_j|) at the exact W-block W - R_W", dims=_s),
    "exact_range_b5": Var("l2 norm", "(c) exact range of the net with the exact W-block", dims=_s),
    "b8_ok_frac": Var("1", "(c) fraction of points with B8 <= exact range (P004-7: 1)"),
    "b8_keep_frac": Var("1", "(c) fraction whose splits at +-0.99 B8 keep the pattern (P004-7: 1)"),
    "b5_ok_frac": Var("1", "(c) fraction with B5 <= exact range (P004-7: 1)"),
    "b5_printed_violations": Var("1", "(c) points where the printed B5 (no |v_j|) exceeds the exact range "
                                 "(X004-10; recorded, not gated)", "int64"),
    "sigma_d": Var("l2 norm", "(e) sigma_d, the d-th singular value of X (0 when n < d)"),
    "gamma_ud": Var("l2 norm", "(e) max_i |<x_i, U_d>| (Thm 15: <= sigma_d)"),
    "sigma_d_sqrt_n": Var("l2 norm", "(e) sigma_d / sqrt(n) (App C remark, corrected from sigma_d / n)"),
    "thm15_sumsq_err": Var("1", "(e) |sum_i <x_i, U_d>^2 - sigma_d^2|"),
    "wall_s": Var("s", "bundle wall time divided by the bundle's cells", finite=True),
}


def bundle_key(cell: dict) -> tuple:
    return (("n_ops", cell["n_ops"]),)


def extra_dims(cells: list[dict]) -> dict[str, int]:
    """op and tau; "sample" comes from the train stage read."""
    return {"op": max(2 * c["n_ops"] for c in cells) or 1, "tau": len(cell_fn.TAUS)}


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets of ``cells``, in order (storage.nets.Nets), float64 on the CPU. The
    bundle reports its construction steps done of all its nets' (issue 30); a cancel request stops it there."""
    n = inputs
    return cell_fn.run(n.W, n.b, n.v, n.X, n.y, n.d, n.m, n.width, [c["n_ops"] for c in cells],
                       progress=bundle_progress.for_kernel(bundle_progress.current()))


def needs(cell: dict) -> NetsNeeds:
    """Paper 004's Lemmas 2-3 / Thm 4 act on all of θ = (W, b, v)."""
    return NetsNeeds(trained=(frozenset({"W", "b", "v"}),), why="paper 004's SPLIT / MERGE act on W, b and v")


EXPERIMENT = register(Experiment(
    name="kkt_constructions",
    figures="analysis.kkt_constructions",
    acceptance="analysis.kkt_constructions",
    paper="004 Refael, Smorodinsky, Lindenbaum, Safran: No Prior, No Leakage (KKT reconstruction)",
    description="F004-3: merge/split residuals, Thm 4 far sets, Thm 5/8 split budgets vs exact ranges, "
                "App C on stored nets (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", needs=needs, extra_dims=extra_dims,
    summary=("eps_rel", "merge_split_max", "b8_ok_frac", "b8_keep_frac", "b5_ok_frac", "gamma_ud", "sigma_d"),
    spec_ids=("F004-3", "P004-2", "P004-3", "P004-4", "P004-6", "P004-7"),
))
