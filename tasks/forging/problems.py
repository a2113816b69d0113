"""Paper 000 (forging sets): forging problems, the volumes the estimators of ``estimators/`` measure.

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

Estimators (registered by name in :data:`tasks.forging.estimators.ESTIMATORS`, same signature
``fn(problem, eps, *, generator, n_samples, **options) -> VolumeEstimate``): ``naive_mc`` (plain MC average of W; on the integrated
slab problem it is the Rao-Blackwellised MC of F000-3) and ``subset_simulation`` (adaptive levels
p0 = 0.1, pCN moves seeded from all level samples (spec §6.6), ``n_repeats`` >= 10 independent runs
batched in one tensor; the stated standard error is the CV across runs, spec §5), and
``subset_importance`` (tasks/forging_importance.py: subset simulation as a pilot, then importance
sampling; the one that reaches 1e-30 within 1 % at 1e6 evaluations) and ``nested_sampling``
(estimators/nested.py: the whole log mu(eps) curve per run).
"""

from __future__ import annotations
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch.func import grad

from tasks.forging.exact import log_ball_volume, log_sphere_area
from tasks.forging.models import SquaredLossModel, batch_forging_mismatch, feature_grad, grad_w
from tasks.forging.symmetry import LatentSymmetry, flip, swap

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
    # maps below): subset_importance proposes them on the sphere (tasks/forging/estimators/importance.py)
    sphere_blocks: tuple[tuple[int, int], ...] = ()
    # latent maps that may leave g and W unchanged (candidates: subset_importance keeps the ones that do
    # on its pilot's samples and fits its proposal to their images too, issue 41 "every mode"; the
    # antipodal flip of each sphere block is always a candidate, tasks/forging/estimators/modes.py)
    symmetries: tuple[LatentSymmetry, ...] = ()

    def weight(self, g: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
        if self.kind == "indicator":
            return torch.where(g <= eps, scale, torch.zeros_like(scale))
        return torch.where(g <= eps, 2.0 * torch.sqrt((eps * eps - g * g).clamp_min(0.0)) * scale,
                           torch.zeros_like(scale))


# --- laws as maps of Gaussian latents --------------------------------------------------------

def ndtr(x: torch.Tensor) -> torch.Tensor:
    """Standard normal CDF Φ (erfc form; torch.special.ndtr / (N, 1) shapes are slow on CPU)."""
    return 0.5 * torch.erfc(x.reshape(-1) * -0.7071067811865476).reshape(x.shape)


def _ball_points(xi: torch.Tensor, R: float, radial_power: int) -> torch.Tensor:
    """(ξ0, ξ) -> R Φ(ξ0)^{1/p} ξ/||ξ||: uniform in B_R for p = dim, density ∝ ||z||^{p-dim} else."""
    u = ndtr(xi[:, :1]).clamp_min(1e-300)
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
                              f"{model.name} slab, label integrated (R={R})", ((1, d + 1),),
                              (flip(d + 1, range(1, d + 1), "mirror z -> -z"),))
    if label != "sampled":
        raise ValueError(f"label must be 'integrated' or 'sampled', got {label!r}")
    if not math.isfinite(eps_max):
        raise ValueError("label='sampled' needs a finite eps_max (it sets the label range S = ||G*|| + eps_max)")
    S = G + eps_max

    def evaluate_joint(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = _ball_points(xi[:, :-1], R, d - 1)
        hn = feature_grad(model, z).norm(dim=1).clamp_min(1e-300)
        s = (2.0 * ndtr(xi[:, -1]) - 1.0) * S / hn
        t = torch.vmap(model.phi, in_dims=(None, 0))(model.w, z) - s
        g = (grad_w(model, torch.cat([z, t[:, None]], 1)) - g_star).norm(dim=1)  # real gradient (P000-2)
        return g, z.norm(dim=1) / hn

    # mirror (z, s) -> (-z, -s): s h(z) unchanged when h is odd (linreg: h(z) = z)
    return ForgingProblem(d + 2, evaluate_joint, "indicator", math.log(2 * S) + log_Zq, 2, eps_max,
                          f"{model.name} slab, label sampled (R={R}, S={S:.4g})", ((1, d + 1),),
                          (flip(d + 2, range(1, d + 2), "mirror (z, s) -> (-z, -s)"),))


def _point_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor, law: Callable, latent_dim: int,
                   log_measure: float, description: str,
                   sphere_blocks: tuple[tuple[int, int], ...] = (),
                   symmetries: tuple[LatentSymmetry, ...] = ()) -> ForgingProblem:
    g_star = grad(loss, argnums=0)(w, x_star)
    per_point = torch.vmap(grad(loss, argnums=0), in_dims=(None, 0))

    def evaluate(xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = (per_point(w, law(xi)) - g_star).norm(dim=1)
        return g, torch.ones_like(g)

    return ForgingProblem(latent_dim, evaluate, "indicator", log_measure, 1, math.inf, description, sphere_blocks,
                          symmetries)


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

    k = D + 1  # the m replacement points are exchangeable: swapping two is a candidate symmetry
    return ForgingProblem(m * k, evaluate, "indicator", m * log_ball_volume(D, R), m, math.inf,
                          f"batch m={m}, B={B}, D2=B_{R}(center)^m",
                          tuple((j * k + 1, (j + 1) * k) for j in range(m)),
                          tuple(swap(m * k, (j * k, (j + 1) * k), ((j + 1) * k, (j + 2) * k),
                                     f"swap points {j}, {j + 1}") for j in range(m - 1)))


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
        t = R2 * (2.0 * ndtr(xi[:, -1:]) - 1.0)
        return torch.cat([z, t], 1)

    return _point_problem(loss, w, x_star, law, d + 2, 0.0, f"uniform on B_{R1} x [-{R2}, {R2}]", ((1, d + 1),),
                          (flip(d + 2, range(1, d + 2), "mirror (z, t) -> (-z, -t)"),))


def gaussian_problem(loss: Callable, w: torch.Tensor, x_star: torch.Tensor) -> ForgingProblem:
    """P(x ∈ S_eps) for x = (z, t) ~ N(0, I) (F000-5); log_measure = 0."""
    D = x_star.numel()
    return _point_problem(loss, w, x_star, lambda xi: xi, D, 0.0, "standard Gaussian", (),
                          (flip(D, range(D), "mirror x -> -x"),))
