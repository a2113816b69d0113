"""What every forging-volume estimator shares: the result type, the eps check, the combination
of independent runs (spec 000 §5)."""

from __future__ import annotations

import dataclasses
import math

import torch

from tasks.forging.problems import ForgingProblem


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



def check_eps(problem: ForgingProblem, eps: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    if eps > problem.eps_max:
        raise ValueError(f"eps={eps} exceeds the problem's eps_max={problem.eps_max} (label range too short)")



def pcn(xi: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Preconditioned Crank-Nicolson proposal (N(0, I)-reversible); sigma broadcast over runs."""
    sig = sigma[:, None, None]
    return torch.sqrt(1 - sig * sig) * xi + sig * torch.randn(xi.shape, dtype=xi.dtype, generator=generator)



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
