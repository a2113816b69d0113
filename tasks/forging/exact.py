"""Paper 000 (forging sets): exact quantities for linear regression, in log space.

Spec IDs: D000-2 (volume convention), T000-1 (Prop 1, exact forgers), T000-2x (exact volume),
T000-13 (Remark 1), Remark 11 (d = 1 bound, documented extra).

Volume convention (D000-2, App B): ``mu(S_eps ∩ B_R)`` is the (d+1)-dim measure of
``{(z, t) in S_eps : ||z|| < R}`` with the label ``t`` unrestricted.

Exact volume (T000-2x, derived from the App B proof): for fixed ``z != 0`` the admissible
labels form one interval of length ``2 sqrt(eps² - A² sin²θ)_+ / ||z||`` (θ = angle(z, a)),
so in spherical coordinates

    mu = (2 R^{d-1} / (d-1)) |S^{d-2}| ∫_0^π sqrt(eps² - A² sin²θ)_+ sin^{d-2}θ dθ.

:func:`linreg_log_volume` evaluates the θ-integral by 1-D quadrature after the substitution
``sin θ = (eps/A) u`` (eps < A) or ``u = sin θ`` (eps >= A), which factors the tiny powers
``eps (eps/A)^{d-1}`` out analytically, so ``log mu`` is exact even when mu ≈ 1e-300 or below.
:func:`linreg_log_volume_closed_form` is the hypergeometric closed form (reference, P000-1).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import special

__all__ = [
    "log_ball_volume",
    "log_sphere_area",
    "linreg_log_volume",
    "linreg_log_volume_closed_form",
    "linreg_log_region_measure",
    "exact_forgers_linreg",
    "exact_forgers_relu",
    "remark1_gradient",
    "remark11_bound_d1",
]


def _check_pos(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.floating, np.integer)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_dim(name: str, d: int, minimum: int) -> None:
    if int(d) != d or d < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {d!r}")


def log_ball_volume(d: int, R: float = 1.0) -> float:
    """log vol(B_R) in R^d = log(π^{d/2} R^d / Γ(d/2 + 1)) (§1.3)."""
    _check_dim("d", d, 1)
    _check_pos("R", R)
    return 0.5 * d * math.log(math.pi) + d * math.log(R) - special.gammaln(0.5 * d + 1.0)


def log_sphere_area(k: int) -> float:
    """log |S^k| = log(2 π^{(k+1)/2} / Γ((k+1)/2)), area of the unit sphere in R^{k+1} (§1.3)."""
    _check_dim("k", k, 0)
    return math.log(2.0) + 0.5 * (k + 1) * math.log(math.pi) - special.gammaln(0.5 * (k + 1))


def _log_theta_integral(d: int, eps: float, A: float) -> float:
    """log ∫_0^π sqrt(eps² - A² sin²θ)_+ sin^{d-2}θ dθ by quadrature (T000-2x)."""
    from scipy import integrate  # here: every run imports this module with the experiments, few integrate (~0.5 s)

    opts = dict(epsabs=0.0, epsrel=1e-12, limit=500)
    if eps < A * (1.0 - 1e-12):  # within 1e-12 of eps = A both branches agree to ~1e-11 relative
        # sin θ = (eps/A) u on each cap [0, θ0] and [π-θ0, π]:
        # = 2 eps (eps/A)^{d-1} ∫_0^1 u^{d-2} sqrt(1-u²) / sqrt(1 - q u²) du,  q = (eps/A)².
        q = (eps / A) ** 2
        if q < 0.5:
            f = lambda u: u ** (d - 2) * math.sqrt(1.0 + u) / math.sqrt(1.0 - q * u * u)  # noqa: E731
            J, _ = integrate.quad(f, 0.0, 1.0, weight="alg", wvar=(0.0, 0.5), **opts)
        else:  # u = sin φ; 1 - q sin²φ = cos²φ + δ sin²φ (δ = 1 - q exactly): kink of width sqrt(δ) at π/2
            delta = (A - eps) * (A + eps) / (A * A)
            f = lambda p: math.sin(p) ** (d - 2) * math.cos(p) ** 2 / math.sqrt(  # noqa: E731
                math.cos(p) ** 2 + delta * math.sin(p) ** 2)
            J, _ = integrate.quad(f, 0.0, math.pi / 2, points=[math.pi / 2 - min(1.0, 20 * math.sqrt(delta))], **opts)
        return math.log(2.0 * eps) + (d - 1) * math.log(eps / A) + math.log(J)
    # eps >= A: every direction admits labels; u = sin θ on [0, π/2], doubled by symmetry:
    # = 2 eps ∫_0^1 u^{d-2} sqrt(1 - k u²) / sqrt(1 - u²) du,  k = (A/eps)² <= 1.
    k = min(1.0, (A / eps) ** 2)
    g = lambda u: u ** (d - 2) * math.sqrt(1.0 - k * u * u) / math.sqrt(1.0 + u)  # noqa: E731
    J, _ = integrate.quad(g, 0.0, 1.0, weight="alg", wvar=(0.0, -0.5), **opts)
    return math.log(2.0 * eps) + math.log(J)


def linreg_log_volume(d: int, eps: float, A: float, R: float = 1.0) -> float:
    """Exact log mu(S_eps ∩ B_R) for linear regression by 1-D quadrature (T000-2x, Eq 57).

    ``A = ||a|| = |xᵀw - y| ||x||`` is the norm of the target gradient (Prop 2). Requires d >= 2.
    """
    _check_dim("d", d, 2)
    _check_pos("eps", eps)
    _check_pos("A", A)
    _check_pos("R", R)
    return (
        math.log(2.0 / (d - 1))
        + (d - 1) * math.log(R)
        + log_sphere_area(d - 2)
        + _log_theta_integral(int(d), float(eps), float(A))
    )


def _log_hyp2f1(a: float, b: float, c: float, z: float) -> float:
    val = special.hyp2f1(a, b, c, z)
    if not (np.isfinite(val) and val > 0):
        import mpmath

        return float(mpmath.log(mpmath.hyp2f1(a, b, c, z)))
    return math.log(val)


def linreg_log_volume_closed_form(d: int, eps: float, A: float, R: float = 1.0) -> float:
    """Closed form of T000-2x (reference for P000-1), log space.

    eps <= A: mu = 2/(d-1) vol(B_R)/R eps^d / A^{d-1} 2F1(1/2, (d-1)/2; d/2+1; eps²/A²);
    eps >= A: mu = 2d/(d-1) vol(B_R)/R eps 2F1(-1/2, (d-1)/2; d/2; A²/eps²).
    """
    _check_dim("d", d, 2)
    _check_pos("eps", eps)
    _check_pos("A", A)
    _check_pos("R", R)
    base = log_ball_volume(d, R) - math.log(R)
    if eps <= A:
        return (
            math.log(2.0 / (d - 1)) + base + d * math.log(eps) - (d - 1) * math.log(A)
            + _log_hyp2f1(0.5, 0.5 * (d - 1), 0.5 * d + 1.0, (eps / A) ** 2)
        )
    return (
        math.log(2.0 * d / (d - 1)) + base + math.log(eps)
        + _log_hyp2f1(-0.5, 0.5 * (d - 1), 0.5 * d, (A / eps) ** 2)
    )


def linreg_log_region_measure(d: int, R: float, s_max: float) -> float:
    """log mu(U), U = {(z, s): ||z|| < R, |s| ||z|| <= s_max} (the sampling region of P000-2).

    mu(U) = 2 s_max ∫_{B_R} dz/||z|| = (2d/(d-1)) vol(B_R)/R s_max; with s_max = A + eps it
    contains S_eps ∩ B_R (||s z|| <= ||a|| + eps) and has the shape of bound (16).
    """
    _check_dim("d", d, 2)
    _check_pos("R", R)
    _check_pos("s_max", s_max)
    return math.log(2.0 * d / (d - 1)) + log_ball_volume(d, R) - math.log(R) + math.log(s_max)


def exact_forgers_linreg(w: torch.Tensor, x: torch.Tensor, y: float, alphas: torch.Tensor) -> torch.Tensor:
    """Points of S_0 (T000-1, Eq 12-15): z = α x, t = α c - A_res/α, c = xᵀw, A_res = xᵀw - y.

    Returns (len(alphas), d+1) rows (z, t). Each has (zᵀw - t) z = A_res x exactly; α != 0.
    """
    if torch.any(alphas == 0):
        raise ValueError("alphas must be non-zero")
    c = x @ w
    a_res = c - y
    z = alphas[:, None] * x[None, :]
    t = alphas * c - a_res / alphas
    return torch.cat([z, t[:, None]], dim=1)


def exact_forgers_relu(W: torch.Tensor, v: torch.Tensor, x: torch.Tensor, y: float,
                       alphas: torch.Tensor) -> torch.Tensor:
    """Exact forgers of a one-hidden-layer ReLU net (T000-3, Eq 22-23): z = α x with α > 0
    (keeps the activation pattern; ReLU is 1-homogeneous), t = α c - A_res/α, c = vᵀρ(Wx)."""
    if torch.any(alphas <= 0):
        raise ValueError("alphas must be > 0 for the ReLU exact forgers (activation pattern)")
    c = v @ torch.relu(W @ x)
    a_res = c - y
    z = alphas[:, None] * x[None, :]
    t = alphas * c - a_res / alphas
    return torch.cat([z, t[:, None]], dim=1)


def remark1_gradient(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """∇_w f for Remark 1 (T000-13): f(w; x) = ¼||w||² + exp(-||x||²) 1ᵀw  ⇒  w/2 + exp(-||x||²) 1.
    Two far-apart points with large norm have almost the same gradient (P000-16)."""
    return 0.5 * w + torch.exp(-(x * x).sum(-1, keepdim=True)) * torch.ones_like(w)


def remark11_bound_d1(R: float, eps: float) -> float:
    """Remark 11 (d = 1, 2-D ball in (z, t); documented extra, not used by the tests):
    log of 2c sqrt(R² - c²) + 2R² arcsin(c/R) + 4 eps ln(R/c), c = min(R, eps/R)."""
    _check_pos("R", R)
    _check_pos("eps", eps)
    c = min(R, eps / R)
    val = 2 * c * math.sqrt(max(R * R - c * c, 0.0)) + 2 * R * R * math.asin(c / R) + 4 * eps * math.log(R / c)
    return math.log(val)
