"""Paper 000 (forging sets): volume estimators (naive Monte Carlo, subset simulation).

A :class:`ForgingProblem` writes the forging volume as ``exp(log_measure) · E[W(x; eps)]`` with x
drawn from a law given as a map of standard Gaussian latents (so MCMC moves can use the
preconditioned Crank-Nicolson kernel, spec §6.5), a level function g(x) >= 0 (W = 0 where g > eps)
and a weight W:

* ``slab_problem(..., label="integrated")``: Props 2/4 convention (D000-2: z in B_R, label free),
  label integrated out exactly (spec T000-2 generalisation, "Rao-Blackwellised"):
  g(z) = min_s ||G* - s h(z)|| = ||G*|| |sin ∠(G*, h(z))|, W = 2 sqrt(eps² - g²)_+ ||z||/||h(z)||,
  z drawn with density ∝ 1/||z|| on B_R (bounded weights; the uniform law makes d = 2 infinite-variance).
* ``slab_problem(..., label="sampled")``: same volume, label sampled: (z, s) with s = φ(z) - t uniform
  in ±S/||h(z)||, S = ||G*|| + eps_max (contains every forger, spec §6.4(i)); membership tested with
  the real gradient ∇_w f(w; (z, t)) (P000-2). For linreg this is the uniform law on
  U = {||z|| < R, |s| ||z|| <= S} and W is an indicator.
* ``ball_problem``: §4 convention (D000-4): x = (z, t) uniform in D2 = B_R(x*) ⊂ R^{d+1} (or any
  loss / centre), g(x) = ||∇_w f(w; x) - ∇_w f(w; x*)||, W = 1[g <= eps]; ``batch_problem`` is the
  §5 version on D2^m (Eq 41); ``cylinder_problem`` / ``gaussian_problem`` give probabilities (F000-5).

Estimators (registered by name in :data:`tasks.forging_registry.ESTIMATORS`, same signature
``fn(problem, eps, *, generator, n_samples, **options) -> VolumeEstimate``): ``naive_mc`` (plain MC average of W; on the integrated
slab problem it is the Rao-Blackwellised MC of F000-3) and ``subset_simulation`` (adaptive levels
p0 = 0.1, pCN moves seeded from all level samples (spec §6.6), ``n_repeats`` >= 10 independent runs
batched in one tensor; the stated standard error is the CV across runs, spec §5), and
``subset_importance`` (tasks/forging_importance.py: subset simulation as a pilot, then importance
sampling; the one that reaches 1e-30 within 1 % at 1e6 evaluations) and ``nested_sampling``
(tasks/forging_nested.py: the whole log mu(eps) curve per run).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
import torch
from torch.func import grad

from tasks.forging_exact import log_ball_volume, log_sphere_area
from tasks.forging_models import SquaredLossModel, batch_forging_mismatch, feature_grad, grad_w

__all__ = [
    "ForgingProblem", "VolumeEstimate", "slab_problem", "ball_problem", "batch_problem",
    "cylinder_problem", "gaussian_problem", "naive_mc", "subset_simulation", "estimate_from_runs",
    "fit_log_slope", "naive_mc_samples_for",
]

Evaluate = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class ForgingProblem:
    """Volume = exp(log_measure) · E_ξ[W(x(ξ); eps)], ξ ~ N(0, I_latent_dim)."""

    latent_dim: int
    evaluate: Evaluate  # latent (N, k) -> (g (N,), scale (N,)), one batched call
    kind: str  # "indicator": W = scale 1[g <= eps]; "interval": W = scale 2 sqrt(eps² - g²)_+
    log_measure: float
    evals_per_point: int  # gradient evaluations per evaluated point
    eps_max: float = math.inf
    description: str = ""
    # latent blocks [start, stop) that `evaluate` uses only through their direction ξ/||ξ|| (the ball
    # maps below): subset_importance proposes them on the sphere (tasks/forging_importance.py)
    sphere_blocks: tuple[tuple[int, int], ...] = ()

    def weight(self, g: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
        if self.kind == "indicator":
            return torch.where(g <= eps, scale, torch.zeros_like(scale))
        return torch.where(g <= eps, 2.0 * torch.sqrt((eps * eps - g * g).clamp_min(0.0)) * scale,
                           torch.zeros_like(scale))


@dataclasses.dataclass(frozen=True)
class VolumeEstimate:
    """log volume, standard error of the log (delta method), gradient evaluations, diagnostics."""

    method: str
    log_volume: float
    log_volume_stderr: float
    n_gradient_evals: int
    n_hits: int
    log_probability: float  # log E[W] = log_volume - log_measure
    extra: dict = dataclasses.field(default_factory=dict)


# --- laws as maps of Gaussian latents --------------------------------------------------------

def _ndtr(x: torch.Tensor) -> torch.Tensor:
    """Standard normal CDF Φ (erfc form; torch.special.ndtr / (N, 1) shapes are slow on CPU)."""
    return 0.5 * torch.erfc(x.reshape(-1) * -0.7071067811865476).reshape(x.shape)


def _ball_points(xi: torch.Tensor, R: float, radial_power: int) -> torch.Tensor:
    """(ξ0, ξ) -> R Φ(ξ0)^{1/p} ξ/||ξ||: uniform in B_R for p = dim, density ∝ ||z||^{p-dim} else."""
    u = _ndtr(xi[:, :1]).clamp_min(1e-300)
    return R * u ** (1.0 / radial_power) * xi[:, 1:] / xi[:, 1:].norm(dim=1, keepdim=True)


def _check_problem_args(R: float, eps_max: float = 1.0) -> None:
    if not R > 0:
        raise ValueError(f"R must be > 0, got {R!r}")
    if not eps_max > 0:
        raise ValueError(f"eps_max must be > 0, got {eps_max!r}")


def slab_problem(model: SquaredLossModel, x_star: torch.Tensor, R: float, label: str = "integrated",
                 eps_max: float = math.inf) -> ForgingProblem:
    """mu(S_eps ∩ (B_R × R)) of D000-2/D000-3 for a squared-loss model (see module docstring)."""
    _check_problem_args(R, eps_max)
    d = model.d
    if d < 2:
        raise ValueError(f"d must be >= 2 for the slab volume (1/||z|| law), got {d}")
    g_star = grad(model.loss, argnums=0)(model.w, x_star)
    G = float(g_star.norm())
    log_Zq = log_sphere_area(d - 1) + (d - 1) * math.log(R) - math.log(d - 1)  # ∫_{B_R} dz/||z||
    if label == "integrated":
        def evaluate(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = _ball_points(xi, R, d - 1)
            h = feature_grad(model, z)
            hn = h.norm(dim=1)
            proj = (h @ g_star) / hn.clamp_min(1e-300)
            resid = (g_star[None] - proj[:, None] * h / hn.clamp_min(1e-300)[:, None]).norm(dim=1)
            g = torch.where(hn > 0, resid, torch.full_like(hn, G))
            scale = torch.where(hn > 0, z.norm(dim=1) / hn.clamp_min(1e-300), torch.full_like(hn, math.inf))
            return g, scale

        return ForgingProblem(d + 1, evaluate, "interval", log_Zq, 1, math.inf,
                              f"{model.name} slab, label integrated (R={R})", ((1, d + 1),))
    if label != "sampled":
        raise ValueError(f"label must be 'integrated' or 'sampled', got {label!r}")
    if not math.isfinite(eps_max):
        raise ValueError("label='sampled' needs a finite eps_max (it sets the label range S = ||G*|| + eps_max)")
    S = G + eps_max

    def evaluate_joint(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = _ball_points(xi[:, :-1], R, d - 1)
        hn = feature_grad(model, z).norm(dim=1).clamp_min(1e-300)
        s = (2.0 * _ndtr(xi[:, -1]) - 1.0) * S / hn
        t = torch.vmap(model.phi, in_dims=(None, 0))(model.w, z) - s
        g = (grad_w(model, torch.cat([z, t[:, None]], 1)) - g_star).norm(dim=1)  # real gradient (P000-2)
        return g, z.norm(dim=1) / hn

    return ForgingProblem(d + 2, evaluate_joint, "indicator", math.log(2 * S) + log_Zq, 2, eps_max,
                          f"{model.name} slab, label sampled (R={R}, S={S:.4g})", ((1, d + 1),))


def _point_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor, law: Callable, latent_dim: int,
                   log_measure: float, description: str,
                   sphere_blocks: tuple[tuple[int, int], ...] = ()) -> ForgingProblem:
    g_star = grad(loss, argnums=0)(w, x_star)
    per_point = torch.vmap(grad(loss, argnums=0), in_dims=(None, 0))

    def evaluate(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = (per_point(w, law(xi)) - g_star).norm(dim=1)
        return g, torch.ones_like(g)

    return ForgingProblem(latent_dim, evaluate, "indicator", log_measure, 1, math.inf, description, sphere_blocks)


def ball_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor, R: float,
                 center: torch.Tensor | None = None) -> ForgingProblem:
    """mu(S_eps(w, x*) ∩ D2), D2 = B_R(center) ⊂ R^D (default centre x*; D000-4, Thm 2 convention)."""
    _check_problem_args(R)
    c = x_star if center is None else center
    D = c.numel()
    return _point_problem(loss, w, x_star, lambda xi: c + _ball_points(xi, R, D), D + 1,
                          log_ball_volume(D, R), f"ball B_{R}(center) in R^{D}", ((1, D + 1),))


def batch_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor, m: int, B: int, R: float,
                  center: torch.Tensor | None = None) -> ForgingProblem:
    """mu_{md}(S̃_eps ∩ D2^m) of Eq 41 (§5, D000-6): m replacements, each in D2 = B_R(center)."""
    _check_problem_args(R)
    if int(m) != m or m < 1 or int(B) != B or B < m:
        raise ValueError(f"need integers 1 <= m <= B, got m={m!r}, B={B!r}")
    c = x_star if center is None else center
    D = c.numel()
    wrapped = _LossModel(loss, w)

    def evaluate(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        N = xi.shape[0]
        X = c + _ball_points(xi.reshape(N * m, D + 1), R, D)
        g = batch_forging_mismatch(wrapped, x_star, X.reshape(N, m, D), B)
        return g, torch.ones_like(g)

    return ForgingProblem(m * (D + 1), evaluate, "indicator", m * log_ball_volume(D, R), m, math.inf,
                          f"batch m={m}, B={B}, D2=B_{R}(center)^m",
                          tuple((j * (D + 1) + 1, (j + 1) * (D + 1)) for j in range(m)))


@dataclasses.dataclass(frozen=True)
class _LossModel:
    """Minimal adapter so batch_forging_mismatch accepts any (loss, w)."""

    loss: Callable
    w: torch.Tensor


def cylinder_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor, R1: float, R2: float) -> ForgingProblem:
    """P((z, t) ∈ S_eps) for (z, t) uniform on V = B_{R1} × [-R2, R2] (§3.3, F000-5); log_measure = 0."""
    _check_problem_args(R1)
    _check_problem_args(R2)
    d = x_star.numel() - 1

    def law(xi: torch.Tensor) -> torch.Tensor:
        z = _ball_points(xi[:, :-1], R1, d)
        t = R2 * (2.0 * _ndtr(xi[:, -1:]) - 1.0)
        return torch.cat([z, t], 1)

    return _point_problem(loss, w, x_star, law, d + 2, 0.0, f"uniform on B_{R1} x [-{R2}, {R2}]", ((1, d + 1),))


def gaussian_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor) -> ForgingProblem:
    """P(x ∈ S_eps) for x = (z, t) ~ N(0, I) (F000-5); log_measure = 0."""
    return _point_problem(loss, w, x_star, lambda xi: xi, x_star.numel(), 0.0, "standard Gaussian")


# --- estimators ------------------------------------------------------------------------------

def _check_eps(problem: ForgingProblem, eps: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if eps > problem.eps_max:
        raise ValueError(f"eps={eps} exceeds the problem's eps_max={problem.eps_max} (label range too short)")


def naive_mc(problem: ForgingProblem, eps: float, *, generator: torch.Generator, n_samples: int,
             chunk: int = 1 << 17, **_: object) -> VolumeEstimate:
    """Plain Monte Carlo: volume = exp(log_measure) · mean(W); stderr of the log = SE(mean)/mean."""
    _check_eps(problem, eps)
    if int(n_samples) != n_samples or n_samples < 2:
        raise ValueError(f"n_samples must be an integer >= 2, got {n_samples!r}")
    s1 = s2 = 0.0
    hits = 0
    for start in range(0, n_samples, chunk):
        k = min(chunk, n_samples - start)
        g, scale = problem.evaluate(torch.randn(k, problem.latent_dim, dtype=torch.float64, generator=generator))
        W = problem.weight(g, scale, eps)
        s1 += float(W.sum())
        s2 += float((W * W).sum())
        hits += int((g <= eps).sum())
    mean = s1 / n_samples
    var = max(s2 / n_samples - mean * mean, 0.0) * n_samples / (n_samples - 1)
    evals = n_samples * problem.evals_per_point
    if mean <= 0:
        # zero hits: report -inf with the rule-of-three 95% upper bound (valid for indicator W <= 1)
        return VolumeEstimate("naive_mc", -math.inf, math.nan, evals, 0, -math.inf,
                              {"log_upper95": problem.log_measure + math.log(3.0 / n_samples)})
    if not math.isfinite(mean):
        return VolumeEstimate("naive_mc", math.inf, math.nan, evals, hits, math.inf, {"unbounded": True})
    se = math.sqrt(var / n_samples)
    return VolumeEstimate("naive_mc", problem.log_measure + math.log(mean), se / mean, evals, hits, math.log(mean))


def naive_mc_samples_for(p: float, rel_err: float) -> float:
    """Samples naive MC needs for relative standard error ``rel_err`` at hit probability p (analytic,
    binomial variance of the hit fraction): (1 - p)/(p·rel_err²); NaN for p outside (0, 1) or a
    non-finite / non-positive ``rel_err`` (spec §6 item 5: the cost naive MC would need)."""
    if not (0 < p < 1) or not (rel_err > 0 and math.isfinite(rel_err)):
        return math.nan
    return (1.0 - p) / (p * rel_err * rel_err)


def _pcn(xi: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Preconditioned Crank-Nicolson proposal (N(0, I)-reversible); sigma broadcast over runs."""
    sig = sigma[:, None, None]
    return torch.sqrt(1 - sig * sig) * xi + sig * torch.randn(xi.shape, dtype=xi.dtype, generator=generator)


def _levels_pilot(problem: ForgingProblem, eps: float, N: int, n_seed: int, max_levels: int,
                  target_accept: float, generator: torch.Generator) -> tuple[list[float], list[float], int]:
    """Adaptive subset simulation (one run) that only *chooses* the levels b_1 > ... > eps and the pCN
    scale of each level; returns (levels, sigmas, gradient evaluations)."""
    k, steps = problem.latent_dim, N // n_seed
    xi = torch.randn(N, k, dtype=torch.float64, generator=generator)
    g, _ = problem.evaluate(xi)
    evals, sigma, levels, sigmas = N, 0.5, [], []
    for _ in range(max_levels):
        gs, order = torch.sort(g)
        b = float(0.5 * (gs[n_seed - 1] + gs[n_seed]))
        if b <= eps:
            return levels, sigmas, evals * problem.evals_per_point
        # stall: the level stopped decreasing (eps below min g on the domain, or an unreachable set)
        if len(levels) >= 5 and levels[-5] - b < 1e-4 * b:
            break
        levels.append(b)
        cur_xi, cur_g = xi[order[:n_seed]], g[order[:n_seed]]
        chain_xi, chain_g, rates = [cur_xi], [cur_g], []
        for _step in range(steps - 1):
            prop = _pcn(cur_xi[None], torch.tensor([sigma], dtype=torch.float64), generator)[0]
            pg, _ = problem.evaluate(prop)
            evals += n_seed
            acc = pg <= b
            cur_xi, cur_g = torch.where(acc[:, None], prop, cur_xi), torch.where(acc, pg, cur_g)
            chain_xi.append(cur_xi), chain_g.append(cur_g)
            rates.append(float(acc.double().mean()))
            sigma = min(max(sigma * math.exp(rates[-1] - target_accept), 1e-4), 1.0)
        sigmas.append(sigma)  # the scale reached at the end of the level: used by the main runs
        xi, g = torch.cat(chain_xi), torch.cat(chain_g)
    raise _Stalled(levels[-1] if levels else math.nan, evals * problem.evals_per_point)


class _Stalled(Exception):
    def __init__(self, level: float, evals: int):
        super().__init__(level, evals)
        self.level, self.evals = level, evals


def subset_simulation(problem: ForgingProblem, eps: float, *, generator: torch.Generator, n_samples: int = 2000,
                      n_repeats: int = 10, p0: float = 0.1, max_levels: int = 400, target_accept: float = 0.44,
                      **_: object) -> VolumeEstimate:
    """Subset simulation (see :func:`subset_simulation_samples`, which also returns the final samples)."""
    return subset_simulation_samples(problem, eps, generator=generator, n_samples=n_samples, n_repeats=n_repeats,
                                     p0=p0, max_levels=max_levels, target_accept=target_accept)[0]


def subset_simulation_samples(problem: ForgingProblem, eps: float, *, generator: torch.Generator,
                              n_samples: int = 2000, n_repeats: int = 10, p0: float = 0.1, max_levels: int = 400,
                              target_accept: float = 0.44) -> tuple[VolumeEstimate, torch.Tensor | None, torch.Tensor | None]:
    """Subset simulation (Au & Beck 2001) in the unbiased fixed-level form (spec §6.5).

    1. A pilot run (adaptive: each level is the p0-quantile of g, pCN scale adapted towards
       ``target_accept``) fixes the levels b_1 > ... > b_L > eps and a pCN scale per level.
    2. ``n_repeats`` independent runs (one batched tensor) of ``n_samples`` points each: at level i
       the fraction of points with g <= b_i is recorded, p0·N seeds are resampled uniformly from those
       survivors (all of them eligible, spec §6.6), and each seed starts a pCN chain of 1/p0 states
       restricted to {g <= b_i}. The last level contributes mean(W(·; eps)).
    With fixed levels and resampling this is a Feynman-Kac particle estimate, hence unbiased (the
    purely adaptive version has an O(CV²) bias, measured ≈ +15% at 1e-20). Estimate = mean of the
    runs; stated stderr of the log = sd(runs)/(sqrt(R)·mean) (spec §5: CV from >= 10 repetitions).
    Gradient evaluations include the pilot. If the pilot's level stops decreasing above eps (eps below
    the minimum of g on the domain, e.g. no exact forger inside it), the result is NaN with
    ``extra["stalled"] = True`` and the lowest level reached.

    Returns (estimate, latents (M, k), g (M,)) of the last level's samples of the runs still alive
    (None, None if there are none); ``subset_importance`` fits its proposal to them.
    """
    _check_eps(problem, eps)
    if not 0 < p0 < 1:
        raise ValueError(f"p0 must be in (0, 1), got {p0!r}")
    n_seed = int(round(p0 * n_samples))
    if n_seed < 1 or n_samples % n_seed or n_seed == n_samples:
        raise ValueError(f"n_samples ({n_samples}) must be a multiple of p0·n_samples ({n_seed}) and > it")
    if int(n_repeats) != n_repeats or n_repeats < 2:
        raise ValueError(f"n_repeats must be an integer >= 2 (stderr from repetitions), got {n_repeats!r}")
    try:
        levels, sigmas, evals = _levels_pilot(problem, eps, n_samples, n_seed, max_levels, target_accept, generator)
    except _Stalled as st:  # report, do not guess: NaN volume, the level where it stopped
        return VolumeEstimate("subset_simulation", math.nan, math.nan, st.evals, 0, math.nan,
                              {"stalled": True, "min_level": st.level}), None, None
    R, N, k, steps = int(n_repeats), int(n_samples), problem.latent_dim, n_samples // n_seed
    dt = torch.float64

    def ev(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, s = problem.evaluate(xi.reshape(-1, k))
        return g.reshape(xi.shape[:-1]), s.reshape(xi.shape[:-1])

    xi = torch.randn(R, N, k, dtype=dt, generator=generator)
    g, scale = ev(xi)
    n_eval = R * N
    log_p = torch.zeros(R, dtype=dt)
    alive = torch.ones(R, dtype=torch.bool)
    for b, sig in zip(levels, sigmas):
        surv = g <= b
        counts = surv.sum(1)
        log_p += torch.log(counts.to(dt) / N)
        alive &= counts > 0
        if not alive.any():
            break
        # resample p0·N seeds uniformly among the survivors of each run (multinomial; dead runs: any)
        probs = torch.where(alive[:, None], surv.to(dt), torch.ones_like(g))
        sel = torch.multinomial(probs, n_seed, replacement=True, generator=generator)
        cur_xi = torch.gather(xi, 1, sel[..., None].expand(-1, -1, k))
        cur_g, cur_s = torch.gather(g, 1, sel), torch.gather(scale, 1, sel)
        chain = [(cur_xi, cur_g, cur_s)]
        sig_t = torch.full((R,), sig, dtype=dt)
        for _step in range(steps - 1):
            prop = _pcn(cur_xi, sig_t, generator)
            pg, ps = ev(prop)
            n_eval += R * n_seed
            acc = pg <= b
            cur_xi = torch.where(acc[..., None], prop, cur_xi)
            cur_g, cur_s = torch.where(acc, pg, cur_g), torch.where(acc, ps, cur_s)
            chain.append((cur_xi, cur_g, cur_s))
        xi, g, scale = (torch.cat(t, 1) for t in zip(*chain))
    W = problem.weight(g, scale, eps)
    hits = int((g <= eps)[alive].sum())
    samples = (xi[alive].reshape(-1, k), g[alive].reshape(-1)) if alive.any() else (None, None)
    log_runs = torch.where(alive, log_p + torch.log(W.mean(1)), torch.full_like(log_p, -math.inf))
    evals += n_eval * problem.evals_per_point
    extra = {"n_levels": len(levels), "levels": levels, "sigmas": sigmas}
    return estimate_from_runs("subset_simulation", problem, log_runs, evals, hits, extra), *samples


def estimate_from_runs(method: str, problem: ForgingProblem, log_runs: torch.Tensor, evals: int, hits: int,
                       extra: dict) -> VolumeEstimate:
    """Combine R independent runs' log E[W] estimates (spec §5): the mean of the runs in linear
    space, stated stderr of its log = sd(runs) / (sqrt(R) · mean); +inf if a run is unbounded,
    -inf if every run is 0. Adds ``log_runs`` and ``cv_single_run`` to ``extra``."""
    R = log_runs.numel()
    extra["log_runs"] = (log_runs + problem.log_measure).tolist()
    if torch.isposinf(log_runs).any():
        return VolumeEstimate(method, math.inf, math.nan, evals, hits, math.inf, dict(extra, unbounded=True))
    log_mean = float(torch.logsumexp(log_runs, 0)) - math.log(R)
    if not math.isfinite(log_mean):
        return VolumeEstimate(method, -math.inf, math.nan, evals, 0, -math.inf, extra)
    rel = torch.exp(log_runs - log_mean)  # p_r / mean
    se_log = float(rel.std(unbiased=True)) / math.sqrt(R)
    extra["cv_single_run"] = se_log * math.sqrt(R)
    return VolumeEstimate(method, problem.log_measure + log_mean, se_log, evals, hits, log_mean, extra)


def fit_log_slope(eps: np.ndarray, log_volume: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit log mu = slope · log eps + intercept over the finite entries (P000-5, P000-8).

    Returns (slope, intercept, standard error of the slope; nan with < 3 points)."""
    x = np.log(np.asarray(eps, dtype=float))
    y = np.asarray(log_volume, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        raise ValueError("fit_log_slope needs at least two finite (eps, log_volume) points")
    x, y = x[ok], y[ok]
    X = np.stack([x, np.ones_like(x)], 1)
    coef, res, *_ = np.linalg.lstsq(X, y, rcond=None)
    if len(x) < 3:
        return float(coef[0]), float(coef[1]), math.nan
    s2 = float(np.sum((y - X @ coef) ** 2)) / (len(x) - 2)
    se = math.sqrt(s2 / float(np.sum((x - x.mean()) ** 2)))
    return float(coef[0]), float(coef[1]), se
