"""Experiment ``reconstruct_diff``: the chain's second threat model (Bertran et al., NeurIPS 2024,
"Reconstruction Attacks on Machine Unlearning"): an attacker who holds the net before AND after the
deletion. Reads an ``unlearn`` stage (reads "nets", needs ``forgotten``) and, through it, the net
that stage read (``reads_before``: the sweep loads the unlearn stage's upstream cell beside each
unlearned net); recovers the forgotten point from the update's top right singular vector
(``tasks/reconstruct/difference.py``; one GA step's first-layer update is rank one, its row space
x_l's direction; a trained bias gives sign and scale, else the sign comes from the activation
pattern and the scale from the norm prior ‖x‖ = the training points' mean norm). Declaration and
wiring only; the maths is ``tasks/cells/reconstruct_diff.py``.

Reports what ``reconstruct`` reports for its candidates (per training point the best distance and
cosine, recovered within ρ, forgotten and retained points apart) and the chance baseline: the
nearest *other* training point's cosine and distance. ``identity`` (no update) recovers nothing
(status unchanged: NaN distance and cosine, 0 recovered); ``ga`` recovers the point by construction
(the chain's known positive); ``retrain`` is compared the same way.
"""

from __future__ import annotations

from core.declare import COSINE, FRACTION, NONNEG, NetsNeeds, with_domain
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from tasks.cells import reconstruct_diff as cell_fn

P = {
    "rho": Param(float, 0.3, "recovery radius (spec 004 X004-8: 0.3 on the sphere)", gt=0),
    "n_candidates": Param(int, 1, "top right singular vectors of the update read as candidates (k-GA: k)",
                          min=1, max=10**4),
    "tol": Param(float, 1e-12, "relative update ‖Δθ‖/‖θ‖ at or below which the nets count as unchanged "
                 "(and a singular value below tol·σ_1 as absent)", gt=0, max=1e-3),
}

_cand, _pts = ("candidate",), ("sample",)
V = {
    "status": Var("1", f"{cell_fn.DONE} done, {cell_fn.UNCHANGED} unchanged (the nets are equal: no candidate, "
                  "nothing recovered, distances and cosines NaN)", "int8", ok=(cell_fn.DONE, cell_fn.UNCHANGED),
                  finite=True, labels=((cell_fn.DONE, "done"), (cell_fn.UNCHANGED, "unchanged"))),
    "update_rel": Var("1", "‖Δ[W, b]‖ / ‖[W, b]‖ of the deletion's update (0: unchanged)"),
    "rank1": Var("1", "σ_1² / Σσ² of the update [ΔW | Δb] (1: one GA step; NaN: unchanged)"),
    "radius": Var("l2 norm", "the attacker's norm prior: mean ‖x_i‖ of the training set", finite=True),
    "n_forgotten": Var("1", "points the unlearn stage forgot", "int64", finite=True),
    "point_dist": Var("l2 norm", "per training point: distance of the best candidate to it", dims=_pts),
    "point_cos": Var("1", "per training point: the largest cosine of a candidate to it", dims=_pts),
    "recovered_forgotten": Var("1", "fraction of the forgotten points whose best candidate is within rho "
                               "(spec 004 §2.5; 0 for an unchanged net; NaN: none forgotten)"),
    "recovered_retained": Var("1", "the same for the retained training points"),
    "dist_forgotten": Var("l2 norm", "mean best-candidate distance of the forgotten points (NaN: none, unchanged)"),
    "dist_retained": Var("l2 norm", "mean best-candidate distance of the retained points"),
    "cos_forgotten": Var("1", "mean best-candidate cosine of the forgotten points (NaN: none, unchanged)"),
    "cos_retained": Var("1", "mean best-candidate cosine of the retained points"),
    "chance_cos_forgotten": Var("1", "chance baseline: mean over the forgotten points of the best cosine of "
                                "another training point"),
    "chance_cos_retained": Var("1", "the same for the retained points"),
    "chance_dist_forgotten": Var("l2 norm", "chance baseline: mean distance of a forgotten point to the nearest "
                                 "other training point"),
    "chance_dist_retained": Var("l2 norm", "the same for the retained points"),
    "point_chance_cos": Var("1", "per training point: the best cosine of another training point", dims=_pts),
    "sv": Var("1", "singular values of the update, largest first (0: unchanged)", dims=_cand),
    "exact_scale": Var("1", "1 where the trained bias gave the candidate's sign and scale (x = r[:d]/r[d]); "
                       "0: sign from the activation pattern, scale the norm prior", "int8", dims=_cand),
    "pattern_agree": Var("1", "fraction of the update's row mass Σ_j ‖Δ[w_j, b_j]‖ on the neurons active at the "
                         "candidate under the net before (1 for one GA step; the sign rule picks the larger side)",
                         dims=_cand),
    "cand_norm": Var("l2 norm", "‖x'‖ of each candidate", dims=_cand),
    "dist": Var("l2 norm", "distance of each candidate to its nearest training point", dims=_cand),
    "nearest": Var("1", "index of that training point (-1: no candidate)", "int64", dims=_cand),
    "cos": Var("1", "largest cosine of each candidate with a training point", dims=_cand),
    "candidates": Var("1", "the candidates x' (NaN: unchanged, or the update has fewer directions)",
                      dims=("candidate", "feature")),
    "wall_s": Var("s", "bundle wall time divided by its cells", finite=True),
}
with_domain(V, NONNEG, "update_rel", "radius", "n_forgotten", "point_dist", "dist_forgotten", "dist_retained",
            "chance_dist_forgotten", "chance_dist_retained", "sv", "cand_norm", "dist", "wall_s")
with_domain(V, FRACTION, "rank1", "recovered_forgotten", "recovered_retained", "exact_scale", "pattern_agree")
with_domain(V, COSINE, "point_cos", "cos_forgotten", "cos_retained", "chance_cos_forgotten", "chance_cos_retained",
            "point_chance_cos", "cos")


def bundle_key(cell: dict) -> tuple:
    return tuple(sorted(cell.items()))


def extra_dims(cells: list[dict]) -> dict[str, int]:
    return {"candidate": max(c["n_candidates"] for c in cells)}


def needs(cell: dict) -> NetsNeeds:
    """The nets of an unlearn stage (they carry ``forgotten``; their upstream holds the nets before)."""
    return NetsNeeds(arrays=frozenset({"forgotten"}),
                     why="the update of a deletion: read an unlearn stage, whose upstream holds the nets before it")


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the unlearned nets of ``cells`` in order (storage.nets.Nets), float64 on the CPU, with
    ``inputs.before`` the nets the unlearn stage read (flows/sweep.py::load_before)."""
    n, b = inputs, inputs.before
    if b is None:
        raise ValueError("reconstruct_diff needs the nets before the deletion (inputs.before); none were loaded")
    pick = lambda t: {"W": t.W, "b": t.b, "v": t.v, "X": t.X, "y": t.y}  # noqa: E731
    return cell_fn.run(pick(b), pick(n), n.mask, n.d, n.m, n.width, n.forgotten(), cells,
                       bias=n.trained()[:, 1] if n.contracts else None)


EXPERIMENT = register(Experiment(
    name="reconstruct_diff",
    paper="Bertran et al. (NeurIPS 2024), Reconstruction Attacks on Machine Unlearning, on paper 001's chain",
    description="recover the forgotten point from the update: the nets before and after an unlearn stage "
                "(reads 'nets' of an unlearn stage and the nets it read)",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", reads_before=True,
    extra_dims=extra_dims, needs=needs,
    summary=("status", "update_rel", "rank1", "recovered_forgotten", "cos_forgotten", "chance_cos_forgotten",
             "recovered_retained", "cos_retained"),
))
