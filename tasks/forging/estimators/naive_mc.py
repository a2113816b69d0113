"""Naive Monte Carlo (spec 000 §6 item 1); on the label-integrated slab problem it is the
Rao-Blackwellised MC of F000-3."""

from __future__ import annotations

import math

import torch

from tasks.forging.estimators.common import VolumeEstimate, check_eps
from tasks.forging.problems import ForgingProblem


def naive_mc(problem: ForgingProblem, eps: float, *, generator: torch.Generator, n_samples: int,
             chunk: int = 1 << 17, **_: object) -> VolumeEstimate:
    """Plain Monte Carlo: volume = exp(log_measure) · mean(W); stderr of the log = SE(mean)/mean."""
    check_eps(problem, eps)
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
