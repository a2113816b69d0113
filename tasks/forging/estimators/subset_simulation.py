"""Subset simulation (Au & Beck 2001; spec 000 §6 item 5a, §6.5-6.6): adaptive pilot for the
levels, then batched fixed-level runs."""

from __future__ import annotations

import math

import torch

from tasks.forging.estimators.common import VolumeEstimate, check_eps, estimate_from_runs, pcn
from tasks.forging.problems import ForgingProblem


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
            prop = pcn(cur_xi[None], torch.tensor([sigma], dtype=torch.float64), generator)[0]
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


def _systematic(surv: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """Systematic resampling of ``n`` indices per row among the True entries of ``surv`` (R, N): each
    survivor gets floor or ceil of n / #survivors copies (all of them seed a chain when they are at most
    n: no mode is dropped by the luck of a multinomial draw, spec §6.6), unbiased (E[copies] = n /
    #survivors). Rows without survivors draw uniformly (their run is dead and ignored)."""
    w = torch.where(surv.any(1, keepdim=True), surv.to(torch.float64), torch.ones_like(surv, dtype=torch.float64))
    c = torch.cumsum(w, 1)
    c = c / c[:, -1:]
    u = (torch.rand(surv.shape[0], 1, dtype=torch.float64, generator=generator)
         + torch.arange(n, dtype=torch.float64)[None]) / n
    return torch.searchsorted(c, u, right=True).clamp_max(surv.shape[1] - 1)


def _gamma(x: torch.Tensor) -> torch.Tensor:
    """Au & Beck (2001) correlation factor γ = 2 Σ_{k<T} (1 - k/T) ρ_k of the chain means, from the
    lag-k autocorrelation ρ_k of x (R, T, chains) along the T chain steps, pooled over chains; (R,)."""
    T = x.shape[1]
    xc = x - x.mean((1, 2), keepdim=True)
    r0 = (xc * xc).mean((1, 2))
    gam = torch.zeros(x.shape[0], dtype=x.dtype)
    for k in range(1, T):
        gam += 2 * (1 - k / T) * (xc[:, :-k] * xc[:, k:]).mean((1, 2))
    return torch.where(r0 > 0, gam / r0.clamp_min(1e-300), torch.zeros_like(gam))


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
       the fraction of points with g <= b_i is recorded, p0·N seeds are drawn from those survivors by
       systematic resampling (every survivor seeds a chain when there are at most p0·N of them, spec
       §6.6: a multinomial draw left ~37 % of them out, so a cap of the slab problem's two antipodal
       caps seen by few survivors could die out and the runs' spread grew: single-run CV 1.18 -> 0.83
       at d = 5, p = 2e-11), and each seed starts a pCN chain of 1/p0 states restricted to {g <= b_i}.
       The last level contributes mean(W(·; eps)).
    With fixed levels and an unbiased resampling this is a Feynman-Kac particle estimate, hence unbiased
    given the pilot's levels whatever they are (the pilot's randomness moves only the runs' variance,
    which their spread measures; the purely adaptive version has an O(CV²) bias, measured ≈ +15% at
    1e-20). Estimate = mean of the runs; stated stderr of the log: see
    :func:`~tasks.forging.estimators.common.estimate_from_runs` (spread of the runs, floored by the
    mean Au-Beck CoV δ² = Σ_i (1 - p_i)/(p_i N)(1 + γ_i) of the runs, γ_i from the lag
    autocorrelation of the level indicators along the chains, times the Student-t factor
    sqrt((R - 1)/(R - 3)); spec §5: CV from >= 10 repetitions). Each run's δ² is ``extra["cov2_au_beck"]``.
    Gradient evaluations include the pilot. If the pilot's level stops decreasing above eps (eps below
    the minimum of g on the domain, e.g. no exact forger inside it), the result is NaN with
    ``extra["stalled"] = True`` and the lowest level reached.

    Returns (estimate, latents (M, k), g (M,)) of the last level's samples of the runs still alive
    (None, None if there are none); ``subset_importance`` fits its proposal to them.
    """
    check_eps(problem, eps)
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
    delta2 = torch.zeros(R, dtype=dt)  # Au-Beck squared CoV of each run (chain correlation included)
    alive = torch.ones(R, dtype=torch.bool)
    chained = False  # whether the current population is made of chains (level 0: independent draws)

    def corr(x: torch.Tensor) -> torch.Tensor:
        return _gamma(x.reshape(R, steps, n_seed)) if chained else torch.zeros(R, dtype=dt)

    for b, sig in zip(levels, sigmas):
        surv = g <= b
        counts = surv.sum(1)
        p_i = counts.to(dt) / N
        log_p += torch.log(p_i)
        delta2 += (1 - p_i) / (p_i.clamp_min(1e-300) * N) * (1 + corr(surv.to(dt)))
        alive &= counts > 0
        if not alive.any():
            break
        # p0·N seeds among the survivors of each run, systematic: every survivor seeds a chain (§6.6)
        sel = _systematic(surv, n_seed, generator)
        cur_xi = torch.gather(xi, 1, sel[..., None].expand(-1, -1, k))
        cur_g, cur_s = torch.gather(g, 1, sel), torch.gather(scale, 1, sel)
        chain = [(cur_xi, cur_g, cur_s)]
        sig_t = torch.full((R,), sig, dtype=dt)
        for _step in range(steps - 1):
            prop = pcn(cur_xi, sig_t, generator)
            pg, ps = ev(prop)
            n_eval += R * n_seed
            acc = pg <= b
            cur_xi = torch.where(acc[..., None], prop, cur_xi)
            cur_g, cur_s = torch.where(acc, pg, cur_g), torch.where(acc, ps, cur_s)
            chain.append((cur_xi, cur_g, cur_s))
        xi, g, scale = (torch.cat(t, 1) for t in zip(*chain))
        chained = True
    W = problem.weight(g, scale, eps)
    W_mean = W.mean(1)
    cv2_W = W.var(1, unbiased=False) / (W_mean * W_mean).clamp_min(1e-300)
    delta2 += torch.where(W_mean > 0, cv2_W / N * (1 + corr(W)), torch.zeros_like(W_mean))
    hits = int((g <= eps)[alive].sum())
    samples = (xi[alive].reshape(-1, k), g[alive].reshape(-1)) if alive.any() else (None, None)
    log_runs = torch.where(alive, log_p + torch.log(W_mean), torch.full_like(log_p, -math.inf))
    evals += n_eval * problem.evals_per_point
    delta2 = torch.where(alive, delta2, torch.full_like(delta2, math.nan))
    extra = {"n_levels": len(levels), "levels": levels, "sigmas": sigmas, "cov2_au_beck": delta2.tolist()}
    return estimate_from_runs("subset_simulation", problem, log_runs, evals, hits, extra, cov2_within=delta2), *samples
