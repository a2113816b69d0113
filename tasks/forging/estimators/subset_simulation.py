"""Subset simulation (Au & Beck 2001; spec 000 §6 item 5a, §6.5-6.6): adaptive pilot for the
levels, then batched fixed-level runs."""

from __future__ import annotations

import math

import torch

from tasks.forging.estimators.common import SIGMA_FLOOR, VolumeEstimate, check_eps, estimate_from_runs, pcn
from tasks.forging.problems import ForgingProblem


def _blocks(problem: ForgingProblem) -> list[torch.Tensor]:
    """Latent blocks moved in turn (Metropolis-within-Gibbs, spec §6 item 5(a)): the problem's sphere
    blocks (directions) and the other latents (radii, sampled label), as boolean masks over the k
    latents; one block when the problem has no sphere blocks (or only them). Their conditional spreads
    differ by orders of magnitude deep in the levels: on the label-sampled slab the direction must stay
    within an angle ~b of ±G* while the label latent only needs |ξ_s| >~ 2.3 (spread ~0.4), so one pCN
    scale tuned to the direction (σ ~ b) left the label frozen along the chains (issue 11 item 13)."""
    k = problem.latent_dim
    sph = torch.zeros(k, dtype=torch.bool)
    for a, b in problem.sphere_blocks:
        sph[a:b] = True
    return [sph, ~sph] if sph.any() and not sph.all() else [torch.ones(k, dtype=torch.bool)]


def _moves(blocks: list[torch.Tensor], sig: list[float], acc: list[float]) -> list[torch.Tensor]:
    """The per-coordinate pCN scales (k,) of the moves one level's chains cycle through: one move per
    block, with the blocks the pilot found free (scale at its cap 1, i.e. a fresh draw, accepted >= 90 %
    of the time: g hardly depends on them, e.g. the radius of the linreg slab) redrawn in every move
    instead of spending steps of their own."""
    free = [s >= 1.0 and a >= 0.9 for s, a in zip(sig, acc)]
    base = torch.zeros(blocks[0].shape[0], dtype=torch.float64)
    for m, f in zip(blocks, free):
        base[m] = 1.0 if f else 0.0
    moves = [torch.where(m, torch.full_like(base, s), base) for m, s, f in zip(blocks, sig, free) if not f]
    return moves or [base]


def _levels_pilot(problem: ForgingProblem, eps: float, N: int, n_seed: int, max_levels: int,
                  target_accept: float, generator: torch.Generator
                  ) -> tuple[list[float], list[list[float]], list[list[torch.Tensor]], int]:
    """Adaptive subset simulation (one run) that only *chooses* the levels b_1 > ... > eps and the pCN
    scale of each block (:func:`_blocks`) at each level, each adapted towards ``target_accept`` on the
    steps that move it; returns (levels, scales per level and block, moves per level (:func:`_moves`),
    gradient evaluations)."""
    k, steps = problem.latent_dim, N // n_seed
    blocks = _blocks(problem)
    xi = torch.randn(N, k, dtype=torch.float64, generator=generator)
    g, _ = problem.evaluate(xi)
    evals, sigma, levels, sigmas, moves = N, [0.5] * len(blocks), [], [], []
    for _ in range(max_levels):
        gs, order = torch.sort(g)
        n_below = n_seed
        if gs[n_seed - 1] == gs[n_seed]:
            # the p0-quantile sits on a plateau of g (a tie, e.g. g = 1 on forge_net's all-off cone before
            # its level function took the plateau out): a level at the plateau's value keeps the whole
            # plateau, the next quantile lands on it again and the pilot stalls there, or the runs' next
            # level finds no survivor (issue 41: 8 of 40 seeds stalled at n_samples = 100, 8 returned -inf;
            # the two inspected died at the level after 1.0); the level goes just below the plateau
            # instead, seeded by the points under it (none: it stays at the plateau, the chains explore it)
            n_below = int((gs < gs[n_seed]).sum())
        b = float(0.5 * (gs[n_below - 1] + gs[n_seed])) if n_below else float(gs[n_seed])
        if b <= eps:
            return levels, sigmas, moves, evals * problem.evals_per_point
        # stall: the level stopped decreasing (eps below min g on the domain, or an unreachable set)
        if len(levels) >= 5 and levels[-5] - b < 1e-4 * b:
            break
        levels.append(b)
        seeds = order[torch.arange(n_seed) % n_below] if n_below else order[:n_seed]  # all with g <= b
        cur_xi, cur_g = xi[seeds], g[seeds]
        chain_xi, chain_g, rates = [cur_xi], [cur_g], [[] for _ in blocks]
        for step in range(steps - 1):
            j = step % len(blocks)
            prop = pcn(cur_xi[None], (blocks[j] * sigma[j]).to(torch.float64)[None], generator)[0]
            pg, _ = problem.evaluate(prop)
            evals += n_seed
            acc = pg <= b
            cur_xi, cur_g = torch.where(acc[:, None], prop, cur_xi), torch.where(acc, pg, cur_g)
            chain_xi.append(cur_xi), chain_g.append(cur_g)
            rates[j].append(float(acc.double().mean()))
            sigma[j] = min(max(sigma[j] * math.exp(rates[j][-1] - target_accept), SIGMA_FLOOR), 1.0)
        sigmas.append(list(sigma))  # the scales reached at the end of the level: used by the main runs
        moves.append(_moves(blocks, sigma, [sum(r) / len(r) if r else 0.0 for r in rates]))
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

    1. A pilot run (adaptive: each level is the p0-quantile of g, or just below a plateau of g the
       quantile sits on; pCN scale adapted towards ``target_accept``) fixes the levels
       b_1 > ... > b_L > eps and a pCN scale per level.
    2. ``n_repeats`` independent runs (one batched tensor) of ``n_samples`` points each: at level i
       the fraction of points with g <= b_i is recorded, p0·N seeds are drawn from those survivors by
       systematic resampling (every survivor seeds a chain when there are at most p0·N of them, spec
       §6.6: a multinomial draw left ~37 % of them out, so a cap of the slab problem's two antipodal
       caps seen by few survivors could die out and the runs' spread grew: single-run CV 1.18 -> 0.83
       at d = 5, p = 2e-11), and each seed starts a pCN chain of 1/p0 states restricted to {g <= b_i}.
       The chain steps move the latent blocks of :func:`_blocks` in turn, each with its pilot scale
       (Metropolis-within-Gibbs; every step leaves the restricted law invariant, so unbiasedness holds).
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
        levels, sigmas, moves, evals = _levels_pilot(problem, eps, n_samples, n_seed, max_levels, target_accept,
                                                     generator)
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

    for b, level_moves in zip(levels, moves):
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
        for step in range(steps - 1):
            prop = pcn(cur_xi, level_moves[step % len(level_moves)].expand(R, k), generator)
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
    return estimate_from_runs("subset_simulation", problem, log_runs, evals, hits, extra, cov2_within=delta2,
                              lognormal=True), *samples
