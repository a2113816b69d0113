"""Experiment ``forging`` — paper 000 (Dixit, Hui, Saab): volume of the ε-forging set.

A cell = (model, d, eps, R, A, width, domain, label, estimator, m, B, budget, seeds). Each cell
computes log mu(S_eps) at ONE eps with the named estimator (or the exact T000-2x formula for
linreg), the paper's bounds at that eps, and the nullity r of M0 at x*. Exponent fits across eps
(F000-3 slopes, P000-5/P000-8) are done at report time from the stored eps axis
(analysis/forging.py), not per cell. All maths is in tasks/forging_cell.py and tasks/forging_*.
Fig 1 (F000-1) is the separate experiment ``forging_sgd`` (flows/experiments/forging_sgd.py).

Cells are independent and cheap; the stacking that matters (thousands of candidate points per
gradient call, 10 repetitions per tensor) happens inside each estimator (cells of different eps,
d or estimator do not share tensors), so bundles are just lists of cells run one after the other
(``stacked=False``): any cells share a bundle, a few bundles per worker, cut by summed cost, so a
144-cell sweep is a handful of task runs (issue 17), each cell's numbers as when run alone.
"""

from __future__ import annotations

from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register
from core.errors import ConfigError
from tasks.cells.forging import OUTPUTS, cell_cost, forging_cell
from tasks.forging.estimators import ESTIMATORS, LEVELLED, REPEATED
from tasks.forging.models import MODELS

P = {
    "model": Param(str, "linreg", "squared-loss model: linear regression (D000-2) or one-hidden-layer net "
                   "with ReLU (D000-3) / tanh / softplus (D000-4)", choices=MODELS),
    "d": Param(int, 3, "input dimension d (data dimension D = d + 1 with the label)", min=1, max=10_000),
    "eps": Param(float, 0.1, "forging tolerance eps of Eq 1", gt=0, max=1e6),
    "R": Param(float, 1.0, "radius of the ball B_R (slab: z ∈ B_R(0); ball: D2 = B_R(x*))", gt=0, max=1e6),
    "A": Param(float, 1.0, "||∇_w f(w; x*)||: y* is set so the target gradient has this norm (spec §4)", gt=0, max=1e6),
    "width": Param(int, 8, "hidden width n of the one-layer nets (ignored for linreg)", min=1, max=100_000),
    "domain": Param(str, "slab", "slab: z ∈ B_R, label unrestricted (Props 2/4); ball: x = (z, t) ∈ B_R(x*) "
                    "(§4 / Thm 2; with m > 1 the batch set of Eq 41); cylinder / gaussian: forging probability "
                    "for (z, t) uniform on B_R × [-R2, R2] (Cor 1) or ~ N(0, I) (F000-5)",
                    choices=("slab", "ball", "cylinder", "gaussian")),
    "R2": Param(float, 4.0, "cylinder: half-height of the label interval [-R2, R2] (F000-5)", gt=0, max=1e6),
    "label": Param(str, "sampled", "slab only: label sampled (real-gradient membership, P000-2) or integrated "
                   "out exactly (Rao-Blackwellised)", choices=("sampled", "integrated")),
    "estimator": Param(str, "exact", "volume method; 'exact' = T000-2x (linreg, slab, m = 1 only)",
                       choices=("exact", *ESTIMATORS)),
    "m": Param(int, 1, "points replaced in the batch (§5, D000-6); m > 1 needs domain=ball", min=1, max=1000),
    "B": Param(int, 1, "batch size B of batch SGD (§5); must be >= m; B > 1 needs domain=ball", min=1, max=1000),
    "n_samples": Param(int, 100_000, "naive_mc: samples; subset_simulation / subset_importance: samples per "
                       "level and run; nested_sampling: live points per run", min=10, max=10**9),
    "n_importance": Param(int, 200_000, "subset_importance: importance-sampling draws after the subset-simulation "
                          "pilot (20% of them adapt the proposal)", min=100, max=10**9),
    "n_repeats": Param(int, 10, "subset_simulation / subset_importance / nested_sampling: independent runs "
                        "(>= 10, spec §5)", min=2, max=10_000),
    "p0": Param(float, 0.1, "subset_simulation / subset_importance: level probability", gt=0, max=0.5),
    "model_seed": Param(int, 0, "seed of w, x* (and of the Lipschitz estimate)", min=0, max=2**32 - 1),
    "seed": Param(int, 0, "seed of the estimator's random numbers", min=0, max=2**32 - 1),
    "lipschitz_pairs": Param(int, 256, "ball domain: random pairs/directions for the estimate of L", min=1, max=10**7),
}

V = {
    "log_volume": Var("log(volume)", "natural log of mu(S_eps ∩ domain) (slab: (d+1)-dim measure, z ∈ B_R, t ∈ R; "
                      "ball/batch: measure in R^{m(d+1)}; cylinder: mu(S_eps ∩ V); gaussian: NaN, see "
                      "log_probability); +inf = unbounded (status 1)"),
    "log_volume_stderr": Var("1", "standard error of log_volume (delta method; repeated estimators: spread of the runs, "
                             "subset simulation floored by the Au-Beck within-run CoV, times sqrt((R-1)/(R-3)))"),
    "log_volume_exact": Var("log(volume)", "exact T000-2x value (linreg, slab); NaN otherwise"),
    "log_probability": Var("log(probability)", "log of the forging probability under the uniform law on the "
                           "reference region (slab: {||z||<R, |s| ||z|| <= A+eps}; ball: D2^m; cylinder: B_R × [-R2, R2]) or "
                           "under N(0, I) (gaussian)"),
    "log_ball_volume": Var("log(volume)", "log vol(B_R) of the data ball (slab: R^d; ball: (R^{d+1})^m; "
                           "cylinder: vol(B_R × [-R2, R2]))"),
    "log_probability_bound": Var("log(probability)", "cylinder: min of the valid Cor 1 bounds (30) and "
                                 "(31)-corrected (linreg) or Cor 2 corrected (relu1) on P(forge) (P000-14); "
                                 "NaN otherwise"),
    "log_probability_bound_thm3": Var("log(probability)", "cylinder / gaussian, C² models (linreg, tanh1, "
                                      "softplus1): Thm 3 (T000-8, heuristic constants) with r = nullity at x*, L = "
                                      "lipschitz_estimate; cylinder: D2 = V, L_g = 0, no tail; gaussian: D2 = "
                                      "B_rho(0), L_g = rho, exact chi² tail P(||x|| >= rho), min over rho "
                                      "(thm3_radius); NaN where eps >= 1/(2L) or for relu1"),
    "thm3_radius": Var("1", "gaussian: radius rho of D2 = B_rho(0) giving the smallest Thm 3 bound; NaN otherwise"),
    "log_bound_remark5": Var("log(volume)", "ball domain, m = 1: Remark 5 form of Thm 2 (diam D2 = 2R, r at x*, "
                             "L estimated; heuristic); NaN when eps >= 1/(2L) or otherwise"),
    "log_probability_bound_cor1_eq30": Var("log(probability)", "cylinder, linreg: Cor 1 (30), L_g = 0, no tail"),
    "log_probability_bound_cor1_eq31_corrected": Var("log(probability)", "cylinder, linreg: Cor 1 (31) with the "
                                                     "eps(c eps)^(d-1) correction; NaN where its hypotheses fail"),
    "log_bound": Var("log(volume)", "tightest rigorous bound: min of Prop 2 (16)/(17)-corrected (linreg) or "
                     "Prop 4 (24)/(25)-corrected (ReLU) whose hypotheses hold; NaN otherwise"),
    "log_bound_eq16": Var("log(volume)", "Prop 2 (16) / Prop 4 (24); NaN where hypotheses fail"),
    "log_bound_eq17_paper": Var("log(volume)", "Prop 2 (17) / Prop 4 (25) as printed (paper erratum), c = π/(2A)"),
    "log_bound_eq17_corrected": Var("log(volume)", "Prop 2 (17) / Prop 4 (25) corrected eps(c eps)^{d-1}, c = c*"),
    "log_bound_thm2": Var("log(volume)", "Thm 2 / Eq 47 heuristic reference (ball domain, L estimated, r at x*); "
                          "NaN when eps >= 1/(2L) or slab domain"),
    "n_gradient_evals": Var("1", "gradient evaluations used by the estimator (0 for exact)"),
    "n_hits": Var("1", "sampled points inside S_eps (final level for subset simulation)"),
    "nullity": Var("1", "r = dim ker M0(x*), M0 = ∇_x∇_w f (n × (d+1), batch: n × m(d+1)), NumPy tolerance; "
                   "measured at x* only (F000-4 inset, r_min = r_max = r in the Thm 2/3 bounds; see forging_cell)"),
    "nullity_loose": Var("1", "r at tolerance 1e-6 σ_max (exposes near-degeneracy, spec §6.7)"),
    "m0_sigma_min": Var("1", "smallest non-zero singular value of M0(x*)"),
    "m0_sigma_max": Var("1", "largest singular value of M0(x*)"),
    "predicted_exponent": Var("1", "paper's small-eps exponent: d (Props 2/4, slab linreg/ReLU), else (D - r)/2 (Thm 2)"),
    "thm2_exponent": Var("1", "(D - r)/2 with D = m(d+1), Thm 2 / Eq 47"),
    "tube_exponent": Var("1", "D - r, the rate of a tube around the exact-forging manifold (spec §6.3)"),
    "grad_norm": Var("1", "||∇_w f(w; x*)|| (= A)"),
    "lipschitz_estimate": Var("1", "estimate (lower bound) of L, Lipschitz constant of M(w, ·) on D2 (ball: "
                              "B_R(x*); cylinder / gaussian: the ball about 0 containing D2; NaN on the slab)"),
    "status": Var("1", "0 ok, 1 unbounded (ReLU, eps >= ||∇f(x*)||, P000-10), 2 subset simulation or nested "
                  "sampling stalled (eps below min of the mismatch on the domain), 3 estimate flagged unreliable "
                  "by its estimator (log_volume, its stderr and log_probability NaN; see log_volume_unreliable)", ok=(0,),
                  finite=True),
    "reliable": Var("1", "1 if the estimator trusts its estimate and stated stderr, 0 if it flags it unreliable "
                    "(subset_importance: Pareto k-hat > 0.7); such a cell is kept out of figures and summaries"),
    "log_volume_unreliable": Var("log(volume)", "the raw log_volume of an estimate flagged unreliable (status 3), "
                                 "for inspection only; NaN otherwise"),
    "min_level": Var("1", "status 2: lowest mismatch level reached"),
    "importance_ess": Var("1", "subset_importance: effective sample size of the final importance weights"),
    "importance_khat": Var("1", "subset_importance: Pareto k-hat of the weight tail (> 0.7: stated stderr "
                           "unreliable)"),
    "wall_time": Var("s", "wall time of the cell", finite=True),
}
assert set(V) == set(OUTPUTS)


def check(cell: dict) -> None:
    """Cross-field checks (ConfigError names the field)."""
    if cell["estimator"] == "exact":
        if cell["model"] != "linreg":
            raise ConfigError("estimator", f"'exact' exists only for model 'linreg', got model {cell['model']!r}")
        if cell["domain"] != "slab" or cell["m"] != 1 or cell["B"] != 1:
            raise ConfigError("estimator", "'exact' needs domain 'slab' and m = B = 1 (T000-2x)")
    if cell["domain"] in ("slab", "cylinder") and cell["d"] < 2:
        raise ConfigError("d", f"the slab volume (Props 2/4) needs d >= 2, got {cell['d']}")
    if (cell["m"] > 1 or cell["B"] > 1) and cell["domain"] != "ball":
        raise ConfigError("domain", "batch forging (m > 1 or B > 1) needs domain 'ball'")
    if cell["B"] < cell["m"]:
        raise ConfigError("B", f"batch size B = {cell['B']} must be >= m = {cell['m']}")
    if cell["estimator"] in LEVELLED:
        n_seed = round(cell["p0"] * cell["n_samples"])
        if n_seed < 1 or cell["n_samples"] % n_seed or n_seed == cell["n_samples"]:
            raise ConfigError("n_samples", f"must be a multiple of p0·n_samples (= {n_seed}) and larger than it")
    if cell["estimator"] in REPEATED and cell["n_repeats"] < 10:
        raise ConfigError("n_repeats", "spec §5: rare-event estimators report a CV from >= 10 repetitions")


def run_bundle(cells: list[dict], device: str = "auto") -> list[dict]:
    """One dict of stored variables per cell (CPU float64; ``device`` is accepted and ignored). The
    bundle reports its cells done of all (issue 30), and stops at a cell's start on a cancel request."""
    rep, out = bundle_progress.current(), []
    for i, c in enumerate(cells):
        rep(steps=i, total=len(cells))
        out.append(forging_cell(**{k: c[k] for k in P}))
    rep(steps=len(cells), total=len(cells))
    return out


EXPERIMENT = register(Experiment(
    name="forging",
    figures="analysis.forging",
    acceptance="analysis.acceptance_000",
    paper="000 Dixit, Hui, Saab: The Measure of Deception (data forging in machine unlearning)",
    description="log volume of the eps-forging set: exact (linreg), naive MC, subset simulation (+ importance "
                "sampling), nested sampling; bounds, nullity",
    params=P, variables=V, run_bundle=run_bundle, cost=cell_cost, check=check,
    stacked=False, bundle_key=lambda cell: (),  # any cells share a bundle, run one after another
    summary=("log_volume", "log_volume_stderr", "log_volume_exact", "log_bound", "n_gradient_evals", "nullity",
             "status"),
    spec_ids=("F000-3", "F000-4", "F000-5", "F000-6", "P000-2", "P000-3", "P000-4", "P000-5", "P000-6", "P000-8",
              "P000-10", "P000-12", "P000-13", "P000-14"),
))
