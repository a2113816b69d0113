"""Paper 000 (forging sets): one grid cell = scalars in, a dict of numbers out.

The flow layer (flows/experiments/forging.py) only calls :func:`forging_cell`; everything it
stores is computed here from tasks/forging_* kernels. Conventions (spec §4 "Defaults"):
w, x* ~ N(0, I) from ``model_seed``; y* = φ(x*) - A/||h(x*)|| so that ||∇_w f(x*)|| = A.

domain = "slab": z ∈ B_R, label unrestricted (Props 2/4, D000-2/3); "ball": x = (z, t) in
D2 = B_R(x*) ⊂ R^{d+1} (§4, D000-4), with m > 1 or B > 1 the batch set of Eq 41 on D2^m (§5, D000-6:
m of the B points of a batch replaced; m = 1 < B is one replaced point seen through the 1/B batch mean).
"cylinder" / "gaussian": the forging probability for (z, t) uniform on B_R × [-R2, R2] (§3.3, Cor 1)
or (z, t) ~ N(0, I) (F000-5); the label parameter does not apply (the law fixes it).

Nullity r: measured at x* only and used as r_min = r_max = r in Thm 2 / Eq 47 / Thm 3 / Remark 5.
F000-4 asks for r at x* (its inset plots the slope against D - r and (D - r)/2 with this r); T000-7
also asks for r at forgers found by the samplers ("report both"): not done, because the estimators
return no forger points (only subset simulation keeps its last level, as latents of the law). For
linreg it changes nothing (r = 1 at every (x, y) with wᵀx != y, App H / P000-9); for the nets r at
forgers may differ from r at x* and is not measured (open).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch.func import grad

from tasks.forging import bounds as fb
from tasks.forging.estimators import ESTIMATORS
from tasks.forging.exact import linreg_log_region_measure, linreg_log_volume, log_ball_volume
from tasks.forging.models import (batch_mixed_hessian, estimate_lipschitz, make_model, make_target,
                                  mixed_hessian, nullity, relu_unbounded)
from tasks.forging.problems import ball_problem, batch_problem, cylinder_problem, gaussian_problem, slab_problem

__all__ = ["forging_cell", "OUTPUTS", "STATUS_UNRELIABLE"]

OUTPUTS = (
    "log_volume", "log_volume_stderr", "log_volume_exact", "log_probability", "log_ball_volume",
    "log_bound", "log_bound_eq16", "log_bound_eq17_paper", "log_bound_eq17_corrected", "log_bound_thm2",
    "n_gradient_evals", "n_hits", "nullity", "nullity_loose", "m0_sigma_min", "m0_sigma_max",
    "predicted_exponent", "thm2_exponent", "tube_exponent", "grad_norm", "lipschitz_estimate",
    "status", "reliable", "log_volume_unreliable", "min_level", "importance_ess", "importance_khat", "wall_time",
    "log_probability_bound", "log_probability_bound_cor1_eq30", "log_probability_bound_cor1_eq31_corrected",
    "log_probability_bound_thm3", "thm3_radius", "log_bound_remark5",
)
PROBABILITY_DOMAINS = ("cylinder", "gaussian")  # F000-5: forging probability under a law on (z, t)


def _valid(b: fb.Bound) -> float:
    return b.log_value if b.valid else math.nan


def _slab_bounds(model, x_star, d, R, eps, G) -> dict[str, float]:
    """Props 2 / 4 (rigorous, slab convention); NaN where hypotheses fail or the model has none."""
    nan = math.nan
    if model.name == "linreg":
        b16, b17p, b17c = fb.prop2_eq16(d, R, eps), fb.prop2_eq17_paper(d, R, eps, G), fb.prop2_eq17_corrected(d, R, eps, G)
    elif model.name == "relu1":
        n, v_min, A_rows = _relu_factors(model, x_star)
        b16 = fb.prop4_eq24(d, R, eps, n, v_min, G)
        b17p = fb.prop4_eq25_paper(d, R, eps, n, v_min, A_rows, grad_norm=G)
        b17c = fb.prop4_eq25_corrected(d, R, eps, n, v_min, A_rows, grad_norm=G)
    else:
        return dict(log_bound=nan, log_bound_eq16=nan, log_bound_eq17_paper=nan, log_bound_eq17_corrected=nan)
    valid = [b.log_value for b in (b16, b17c) if b.valid]
    return dict(log_bound=min(valid) if valid else nan, log_bound_eq16=_valid(b16),
                log_bound_eq17_paper=_valid(b17p), log_bound_eq17_corrected=_valid(b17c))


def _relu_factors(model, x_star) -> tuple[int, float, list[float]]:
    """(n, v_min = min_{v_i != 0} |v_i|, A_i of D000-3) of a one-layer ReLU net at x* (Props 4, Cor 2)."""
    W, v = model.split()
    s = float(model.phi(model.w, x_star[:-1]) - x_star[-1])
    active = (W @ x_star[:-1] > 0).double()
    A_rows = (abs(s) * v.abs() * active * x_star[:-1].norm()).tolist()
    return model.width, float(v.abs()[v != 0].min()), A_rows


def forging_cell(*, model: str, d: int, eps: float, R: float = 1.0, A: float = 1.0, width: int = 8,
                 domain: str = "slab", label: str = "sampled", estimator: str = "exact", m: int = 1, B: int = 1,
                 R2: float = 4.0,
                 n_samples: int = 100_000, n_repeats: int = 10, p0: float = 0.1, n_importance: int = 200_000,
                 model_seed: int = 0,
                 seed: int = 0, lipschitz_pairs: int = 256) -> dict[str, float]:
    """Estimate log mu(S_eps) for one configuration and evaluate bounds, nullity and exponents."""
    t0 = time.perf_counter()
    if domain not in ("slab", "ball", *PROBABILITY_DOMAINS):
        raise ValueError(f"domain must be 'slab', 'ball', 'cylinder' or 'gaussian', got {domain!r}")
    if domain in PROBABILITY_DOMAINS and estimator == "exact":
        raise ValueError(f"estimator 'exact' has no closed form for domain {domain!r} (F000-5 is estimated)")
    if estimator != "exact" and estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be 'exact' or one of {sorted(ESTIMATORS)}, got {estimator!r}")
    if estimator == "exact" and (model != "linreg" or domain != "slab" or m != 1):
        raise ValueError("estimator 'exact' exists only for model='linreg', domain='slab', m=1 (T000-2x)")
    batch = m > 1 or B > 1
    if batch and domain != "ball":
        raise ValueError("m > 1 or B > 1 (batch forging, §5) needs domain='ball'")
    if not (eps > 0 and R > 0 and A > 0):
        raise ValueError(f"eps, R and A must be > 0, got eps={eps}, R={R}, A={A}")
    gen = torch.Generator().manual_seed(int(model_seed))
    mdl = make_model(model, d, width, gen)
    x_star = make_target(mdl, A, gen)
    G = float(grad(mdl.loss, argnums=0)(mdl.w, x_star).norm())
    D = d + 1
    out = dict.fromkeys(OUTPUTS, math.nan)
    out.update(grad_norm=G, status=0.0, reliable=1.0, n_gradient_evals=0.0, n_hits=math.nan)

    # nullity of M0 at x* (data incl. label, D = d+1; batch: the n × mD block row of Eq 42)
    M0 = mixed_hessian(mdl.loss, mdl.w, x_star) if not batch else \
        batch_mixed_hessian(mdl.loss, mdl.w, x_star.expand(m, D), B)
    r, sig = nullity(M0)
    r_loose, _ = nullity(M0, rtol=1e-6)
    nz = sig[sig > sig.max() * max(M0.shape) * torch.finfo(torch.float64).eps]
    Dm = m * D
    out.update(nullity=float(r), nullity_loose=float(r_loose), m0_sigma_max=float(sig.max()),
               m0_sigma_min=float(nz.min()) if nz.numel() else math.nan,
               thm2_exponent=(Dm - r) / 2, tube_exponent=float(Dm - r))

    sizes = dict(n_samples=int(n_samples), n_repeats=int(n_repeats), p0=float(p0), n_importance=int(n_importance))
    if domain in PROBABILITY_DOMAINS:
        return _probability_cell(out, mdl, x_star, model, d, eps, R, R2, A, domain, estimator, t0, seed, sizes,
                                 G, model_seed, lipschitz_pairs)
    if domain == "slab":
        out["log_ball_volume"] = log_ball_volume(d, R)
        log_ref = linreg_log_region_measure(d, R, G + eps)  # region U sampled by label='sampled'
        out.update(_slab_bounds(mdl, x_star, d, R, eps, G))
        out["predicted_exponent"] = float(d) if model in ("linreg", "relu1") else (Dm - r) / 2
        if model == "linreg":
            out["log_volume_exact"] = linreg_log_volume(d, eps, G, R)
        if relu_unbounded(mdl, x_star, eps):  # spec P000-10: infinite, not a number
            out.update(log_volume=math.inf, status=1.0)
            return _finish(out, t0)
        if estimator == "exact":
            out.update(log_volume=out["log_volume_exact"], log_volume_stderr=0.0,
                       log_probability=out["log_volume_exact"] - log_ref)
            return _finish(out, t0)
        problem = slab_problem(mdl, x_star, R, label, eps_max=eps)
    else:
        out["log_ball_volume"] = m * log_ball_volume(D, R)
        log_ref = out["log_ball_volume"]
        out["predicted_exponent"] = (Dm - r) / 2
        L = estimate_lipschitz(mdl.loss, mdl.w, x_star, R, lipschitz_pairs, torch.Generator().manual_seed(model_seed))
        out["lipschitz_estimate"] = L
        if L > 0:
            b = fb.thm2_global(D, L, r, r, log_ball_volume(D, R), eps) if not batch else \
                fb.batch_eq47(D, m, B, L, r, r, log_ball_volume(D, R), eps)
            out["log_bound_thm2"] = _valid(b)
            if not batch:  # Remark 5: Thm 2 with vol(D2) <= diam^D and Stirling, diam D2 = 2R
                out["log_bound_remark5"] = _valid(fb.remark5_bound(D, L, r, 2 * R, eps))
        problem = ball_problem(mdl.loss, mdl.w, x_star, R) if not batch else \
            batch_problem(mdl.loss, mdl.w, x_star, m, B, R)
    est = _estimate(problem, estimator, eps, seed, sizes)
    _store_estimate(out, est, log_ref)
    return _finish(out, t0)


STATUS_UNRELIABLE = 3.0


def _store_estimate(out: dict, est, log_ref: float) -> None:
    """Store an estimate. One its estimator flags unreliable (``extra["reliable"] = False``: the
    importance weights' Pareto k̂ too large or their ESS < 100, see ``importance.trusted_weights``, or
    every subset-simulation run died: neither the number nor its SE can be trusted; measured
    78-99.99 % off at p = 1e-30, label sampled) is kept out of every mean: log_volume,
    log_volume_stderr and log_probability are NaN, status 3, ``reliable`` 0 and the raw value is in
    ``log_volume_unreliable``."""
    reliable = bool(est.extra.get("reliable", True))
    out.update(log_volume=est.log_volume, log_volume_stderr=est.log_volume_stderr,
               n_gradient_evals=float(est.n_gradient_evals), n_hits=float(est.n_hits),
               log_probability=est.log_volume - log_ref,
               status=1.0 if est.extra.get("unbounded") else 2.0 if est.extra.get("stalled") else 0.0,
               reliable=1.0 if reliable else 0.0,
               min_level=est.extra.get("min_level", math.nan),
               importance_ess=est.extra.get("ess", math.nan), importance_khat=est.extra.get("pareto_khat", math.nan))
    if not reliable:
        out.update(log_volume_unreliable=est.log_volume, log_volume=math.nan, log_volume_stderr=math.nan,
                   log_probability=math.nan, status=STATUS_UNRELIABLE)


def _estimate(problem, estimator: str, eps: float, seed: int, sizes: dict):
    return ESTIMATORS[estimator](problem, eps, generator=torch.Generator().manual_seed(int(seed)), **sizes)


def _probability_cell(out: dict, mdl, x_star, model: str, d: int, eps: float, R: float, R2: float, A: float,
                      domain: str, estimator: str, t0: float, seed: int, sizes: dict, G: float,
                      model_seed: int, lipschitz_pairs: int) -> dict[str, float]:
    """F000-5: log P((z, t) ∈ S_eps) for (z, t) uniform on V = B_R × [-R2, R2] or (z, t) ~ N(0, I).

    Cylinder: Cor 1 bounds (30) and (31)-corrected (linreg) or Cor 2 corrected (ReLU); the density is
    constant on V, so L_g = 0 and there is no tail term; log_volume = log P + log mu(V) = log mu(S_eps ∩ V).
    Thm 3 (T000-8, heuristic constants, spec §6.3) with D2 = V, L_g = 0, C = 0, and for the Gaussian
    with D2 = B_rho(0) and the exact χ² tail (tasks.forging.bounds.thm3_gaussian, spec §6.9). L is
    estimated on the ball about 0 containing D2 (cylinder: radius sqrt(R² + R2²); Gaussian: the
    largest rho), r = nullity at x* (r_min = r_max = r). ReLU nets are not C² (Thm 3 needs A1 with
    V = ∅; Thm 5 needs ν1 of a K1 that is not built here): NaN. Gaussian: log_volume NaN."""
    out["predicted_exponent"] = float(d) if model in ("linreg", "relu1") else out["thm2_exponent"]
    D, r = d + 1, int(out["nullity"])
    zero = torch.zeros(D, dtype=torch.float64)
    radii = np.linspace(0.05, math.sqrt(D) + 8.0, 200)  # Gaussian: candidate radii of D2 = B_rho(0)
    L_radius = math.hypot(R, R2) if domain == "cylinder" else float(radii[-1])
    L = estimate_lipschitz(mdl.loss, mdl.w, zero, L_radius, lipschitz_pairs, torch.Generator().manual_seed(model_seed))
    out["lipschitz_estimate"] = L
    smooth = model != "relu1" and L > 0
    if domain == "cylinder":
        problem = cylinder_problem(mdl.loss, mdl.w, x_star, R, R2)
        log_V = log_ball_volume(d, R) + math.log(2 * R2)
        out["log_ball_volume"] = log_V
        if model == "linreg":
            b30 = fb.cor1_eq30(d, R, R2, eps)
            b31 = fb.cor1_eq31_corrected(d, R, R2, eps, A)
            out.update(log_probability_bound_cor1_eq30=_valid(b30), log_probability_bound_cor1_eq31_corrected=_valid(b31))
            valid = [v for v in (_valid(b30), _valid(b31)) if math.isfinite(v)]
            out["log_probability_bound"] = min(valid) if valid else math.nan
        elif model == "relu1":
            n, v_min, A_rows = _relu_factors(mdl, x_star)
            out["log_probability_bound"] = _valid(fb.cor2_corrected(d, R, R2, eps, n, v_min, A_rows, grad_norm=G))
        if smooth:
            diam_V = 2 * math.hypot(R, R2)
            out["log_probability_bound_thm3"] = _valid(fb.thm3_probability(D, L, r, r, diam_V, eps))
    else:
        problem = gaussian_problem(mdl.loss, mdl.w, x_star)
        log_V = math.nan
        if smooth:
            b, rho = fb.thm3_gaussian(D, L, r, r, eps, radii)
            out.update(log_probability_bound_thm3=_valid(b), thm3_radius=rho if b.valid else math.nan)
    est = _estimate(problem, estimator, eps, seed, sizes)
    _store_estimate(out, est, log_ref=0.0)
    out["log_volume"] += log_V  # NaN if unreliable (then log_volume_unreliable holds the raw one)
    out["log_volume_unreliable"] += log_V
    return _finish(out, t0)


def _finish(out: dict, t0: float) -> dict[str, float]:
    out["wall_time"] = time.perf_counter() - t0
    return {k: float(v) for k, v in out.items()}


def cell_cost(cell: dict) -> float:
    """Rough gradient-evaluation count of a cell (for bundle sizing); 1 for 'exact'."""
    est = cell.get("estimator", "exact")
    if est == "exact":
        return 1.0
    n = float(cell.get("n_samples", 1e5))
    if est == "naive_mc":
        return 2.0 * n
    extra = float(cell.get("n_importance", 2e5)) if est == "subset_importance" else 0.0
    levels = max(1.0, cell.get("d", 2) * math.log10(max(cell.get("A", 1.0) / cell.get("eps", 0.1), 10.0)))
    per_decade = 11.0 if est == "nested_sampling" else 0.9  # NS: 22 iterations of 0.1·N·5 pCN moves
    return (float(cell.get("n_repeats", 10)) * n * (1.0 + per_decade * levels) + extra) * np.sqrt(cell.get("m", 1))
