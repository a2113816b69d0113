"""Paper 000 (forging sets): the paper's upper bounds, each as ``Bound(log_value, valid, label)``.

``log_value`` is the natural log of the bound; ``valid`` says whether the hypotheses hold for the
given inputs (the value is still returned so it can be plotted). Where the paper misprints a
bound the spec (§6) asks for both: functions named ``*_paper`` are the printed formula
(labelled "paper (erratum)"), ``*_corrected`` what the paper's own proof supports.

Spec IDs: T000-2 (Prop 2: Eq 16, 17), T000-4 (Prop 4: Eq 24, 25, P(n, d)), T000-5 (Cor 1-2, Lemma 6),
T000-6 (Lemma 2 and its corrected local bound), T000-7 (Thm 2, Remark 5), T000-8 (Thm 3),
T000-11 (§5 batch, Eq 47), T000-12 (Thm 4-5, App I Eq 106).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import special

from tasks.forging.exact import log_ball_volume

__all__ = [
    "Bound", "log_K_d", "canonical_c", "log_P_nd",
    "prop2_eq16", "prop2_eq17_paper", "prop2_eq17_corrected",
    "prop4_eq24", "prop4_eq25_paper", "prop4_eq25_corrected",
    "cor1_eq30", "cor1_eq31_corrected", "cor2_corrected",
    "lemma2_local_paper", "lemma2_local_corrected",
    "thm2_global", "remark5_bound", "thm3_probability", "thm3_gaussian", "batch_eq47", "thm4_global", "thm5_probability",
    "appI_nu1_bound",
]


@dataclasses.dataclass(frozen=True)
class Bound:
    """log of an upper bound, whether its hypotheses hold, and which formula it is."""

    log_value: float
    valid: bool
    label: str


def _pos(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _dim(name: str, d: int, minimum: int = 2) -> int:
    if int(d) != d or d < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (the bound needs it), got {d!r}")
    return int(d)


def log_K_d(d: int) -> float:
    """log K_d, K_d = 4d Γ(d/2) / (sqrt(π) (d-1)² Γ((d-1)/2)) (Eq 17)."""
    d = _dim("d", d)
    return (math.log(4 * d) + special.gammaln(d / 2) - 0.5 * math.log(math.pi)
            - 2 * math.log(d - 1) - special.gammaln((d - 1) / 2))


def canonical_c(eps: float, A: float) -> float:
    """c* = arcsin(eps/A)/eps, the smallest admissible c in [1/A, π/(2A)] (eps <= A; T000-2)."""
    eps, A = _pos("eps", eps), _pos("A", A)
    if eps > A:
        raise ValueError(f"canonical c needs eps <= A, got eps={eps}, A={A}")
    return math.asin(eps / A) / eps


def log_P_nd(n: int, d: int) -> float:
    """log P(n, d) = log Σ_{k=0}^{d} C(n, k): number of ReLU activation patterns (Eq 24, Remark 4)."""
    if int(n) != n or n < 1:
        raise ValueError(f"n (width) must be an integer >= 1, got {n!r}")
    _dim("d", d, 1)
    k = np.arange(0, min(n, d) + 1)
    logc = special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
    return float(special.logsumexp(logc))


def _log_vol_over_R(d: int, R: float) -> float:
    return log_ball_volume(d, R) - math.log(R)


# --- Prop 2 (linear regression) --------------------------------------------------------------

def prop2_eq16(d: int, R: float, eps: float) -> Bound:
    """Eq 16: mu(S_eps ∩ B_R) <= 2d/(d-1) vol(B_R)/R eps (d >= 2, a != 0)."""
    d, R, eps = _dim("d", d), _pos("R", R), _pos("eps", eps)
    return Bound(math.log(2 * d / (d - 1)) + _log_vol_over_R(d, R) + math.log(eps), True, "Prop 2 (16)")


def _eq17_c(eps: float, A: float, c: float | None, default_largest: bool) -> tuple[float, bool]:
    if c is None:
        c = math.pi / (2 * A) if default_largest else (canonical_c(eps, A) if eps <= A else math.pi / (2 * A))
    c = _pos("c", c)
    in_range = 1 / A * (1 - 1e-12) <= c <= math.pi / (2 * A) * (1 + 1e-12)
    # Hypothesis eps/A < sin(c eps); equality is allowed at c* (spec T000-2: "holds with equality").
    hyp = eps <= A and c * eps <= math.pi / 2 * (1 + 1e-12) and eps / A <= math.sin(min(c * eps, math.pi / 2)) * (1 + 1e-12)
    return c, bool(in_range and hyp)


def prop2_eq17_paper(d: int, R: float, eps: float, A: float, c: float | None = None) -> Bound:
    """Eq 17 as printed ("paper (erratum)"): K_d vol(B_R)/R (c eps)^d.

    Default c = π/(2A), the largest admissible c (the most favourable reading of the printed
    formula). Spec §6 item 1 / P000-4: this is *below* the exact volume for large A.
    """
    d, R, eps, A = _dim("d", d), _pos("R", R), _pos("eps", eps), _pos("A", A)
    c, ok = _eq17_c(eps, A, c, default_largest=True)
    return Bound(log_K_d(d) + _log_vol_over_R(d, R) + d * math.log(c * eps), ok, "Prop 2 (17) paper (erratum)")


def prop2_eq17_corrected(d: int, R: float, eps: float, A: float, c: float | None = None) -> Bound:
    """Eq 17 corrected (spec T000-2 / §6.1): K_d vol(B_R)/R eps (c eps)^{d-1}; default c = c*.

    App B integrates eps θ^{d-2} over [0, c eps], giving eps (c eps)^{d-1}; the paper misprints (c eps)^d.
    Not applicable for eps > A (then θ0 = π/2; use (16)).
    """
    d, R, eps, A = _dim("d", d), _pos("R", R), _pos("eps", eps), _pos("A", A)
    c, ok = _eq17_c(eps, A, c, default_largest=False)
    return Bound(log_K_d(d) + _log_vol_over_R(d, R) + math.log(eps) + (d - 1) * math.log(c * eps),
                 ok, "Prop 2 (17) corrected")


# --- Prop 4 (one-hidden-layer ReLU) -----------------------------------------------------------

def _relu_hyp(eps: float, grad_norm: float | None) -> bool:
    # Extra hypothesis (spec T000-4, §6.4): eps < ||∇f(x*)||_F, else the all-off cone forges with
    # every label and the volume is infinite.
    return grad_norm is None or eps < grad_norm


def prop4_eq24(d: int, R: float, eps: float, n: int, v_min: float, grad_norm: float | None = None) -> Bound:
    """Eq 24: 2d/(d-1) vol(B_R)/R P(n, d) eps / v_min, v_min = min_{v_i != 0} |v_i| (statement form;
    the proof's 1/max|v_i| is a typo, spec §6.10). Valid only if eps < ||∇f(x*)||_F."""
    d, R, eps, v_min = _dim("d", d), _pos("R", R), _pos("eps", eps), _pos("v_min", v_min)
    val = math.log(2 * d / (d - 1)) + _log_vol_over_R(d, R) + log_P_nd(n, d) + math.log(eps / v_min)
    return Bound(val, _relu_hyp(eps, grad_norm), "Prop 4 (24)")


def _eq25_c(eps: float, A_rows: Sequence[float], c: float | None, largest: bool) -> tuple[float, float, bool]:
    A_act = [float(a) for a in A_rows if a > 0]  # min over active rows only (spec §6.10)
    if not A_act:
        raise ValueError("A_rows must contain at least one row with A_i > 0")
    A_min = min(A_act)
    c_val, ok = _eq17_c(eps, A_min, c, default_largest=largest)
    return c_val, A_min, ok


def prop4_eq25_paper(d: int, R: float, eps: float, n: int, v_min: float, A_rows: Sequence[float],
                     c: float | None = None, grad_norm: float | None = None) -> Bound:
    """Eq 25 as printed ("paper (erratum)"): K_d vol(B_R)/R (c/v_min)^d P(n, d) eps^d, c = π/(2 min A_i)."""
    d, R, eps, v_min = _dim("d", d), _pos("R", R), _pos("eps", eps), _pos("v_min", v_min)
    c, _, ok = _eq25_c(eps, A_rows, c, largest=True)
    val = log_K_d(d) + _log_vol_over_R(d, R) + d * math.log(c * eps / v_min) + log_P_nd(n, d)
    return Bound(val, ok and _relu_hyp(eps, grad_norm), "Prop 4 (25) paper (erratum)")


def prop4_eq25_corrected(d: int, R: float, eps: float, n: int, v_min: float, A_rows: Sequence[float],
                         c: float | None = None, grad_norm: float | None = None) -> Bound:
    """Eq 25 corrected (spec T000-4): K_d vol(B_R)/R P(n, d) (eps/v_min) (c eps)^{d-1}, c = c*(min A_i)."""
    d, R, eps, v_min = _dim("d", d), _pos("R", R), _pos("eps", eps), _pos("v_min", v_min)
    c, _, ok = _eq25_c(eps, A_rows, c, largest=False)
    val = (log_K_d(d) + _log_vol_over_R(d, R) + log_P_nd(n, d) + math.log(eps / v_min)
           + (d - 1) * math.log(c * eps))
    return Bound(val, ok and _relu_hyp(eps, grad_norm), "Prop 4 (25) corrected")


# --- Cor 1-2 (probability, §3.3, Lemma 6) -----------------------------------------------------

def _lemma6(log_mu_bound: float, d: int, R1: float, R2: float, L_g: float, C: float, omega: float) -> float:
    """log of e^{L_g diam V} mu/mu(V) + C e^{-t0 ω}, V = B_{R1} × [-R2, R2], t0 = min(R1, R2) (spec §6.9)."""
    if L_g < 0 or C < 0 or omega < 0:
        raise ValueError("L_g, C and omega must be >= 0")
    diam = 2 * math.sqrt(R1 * R1 + R2 * R2)
    log_muV = log_ball_volume(d, R1) + math.log(2 * R2)
    main = L_g * diam + log_mu_bound - log_muV
    t0 = min(R1, R2)
    if C == 0:
        return main
    return float(np.logaddexp(main, math.log(C) - t0 * omega))


def cor1_eq30(d: int, R1: float, R2: float, eps: float, L_g: float = 0.0, C: float = 0.0,
              omega: float = 1.0) -> Bound:
    """Eq 30 (Cor 1) with the proven tail C e^{-t0 ω}: e^{L_g diam V} d/((d-1) R1 R2) eps + tail."""
    R1, R2 = _pos("R1", R1), _pos("R2", R2)
    b = prop2_eq16(d, R1, eps)
    return Bound(_lemma6(b.log_value, d, R1, R2, L_g, C, omega), True, "Cor 1 (30)")


def cor1_eq31_corrected(d: int, R1: float, R2: float, eps: float, A: float, L_g: float = 0.0,
                        C: float = 0.0, omega: float = 1.0) -> Bound:
    """Eq 31 (Cor 1) with the ε(cε)^{d-1} correction and t0-tail."""
    R1, R2 = _pos("R1", R1), _pos("R2", R2)
    b = prop2_eq17_corrected(d, R1, eps, A)
    return Bound(_lemma6(b.log_value, d, R1, R2, L_g, C, omega), b.valid, "Cor 1 (31) corrected")


def cor2_corrected(d: int, R1: float, R2: float, eps: float, n: int, v_min: float, A_rows: Sequence[float],
                   grad_norm: float | None = None, L_g: float = 0.0, C: float = 0.0, omega: float = 1.0) -> Bound:
    """Cor 2 (one-layer ReLU): Lemma 6 applied to min((24), (25)-corrected), t0-tail (§6.9)."""
    R1, R2 = _pos("R1", R1), _pos("R2", R2)
    b24 = prop4_eq24(d, R1, eps, n, v_min, grad_norm)
    b25 = prop4_eq25_corrected(d, R1, eps, n, v_min, A_rows, grad_norm=grad_norm)
    best = min(b24.log_value, b25.log_value) if b25.valid else b24.log_value
    return Bound(_lemma6(best, d, R1, R2, L_g, C, omega), b24.valid, "Cor 2 corrected")


# --- §4 local / global bounds (heuristic constants, see spec §6.2-6.3) ------------------------

def lemma2_local_paper(d: int, r: int, L: float, eps: float) -> Bound:
    """Lemma 2 as printed with C(r, d) := 2^r (worst case): 4^{d-r} 2^r (sqrt(2/L))^r eps^{d - r/2}.
    Needs eps < 1/(2L). Drops the singular values of M0 (spec §6.2)."""
    d, L, eps = _dim("d", d, 1), _pos("L", L), _pos("eps", eps)
    if not 0 <= r <= d:
        raise ValueError(f"r must be in [0, d], got {r}")
    val = (d - r) * math.log(4) + r * math.log(2) + 0.5 * r * math.log(2 / L) + (d - r / 2) * math.log(eps)
    return Bound(val, eps < 1 / (2 * L), "Lemma 2 paper")


def lemma2_local_corrected(d: int, sigmas: Sequence[float], L: float, eps: float) -> Bound:
    """Corrected local bound (spec T000-6): vol_r(B_{ρ_eps}) Π_{i=1}^{d-r} (4 eps/σ_i), ρ_eps = sqrt(2 eps/L),
    σ_i the non-zero singular values of M0(x*) (r = d - len(sigmas))."""
    d, L, eps = _dim("d", d, 1), _pos("L", L), _pos("eps", eps)
    sig = np.asarray(sigmas, dtype=float)
    if sig.size > d or np.any(sig <= 0):
        raise ValueError("sigmas must be the (positive) non-zero singular values, at most d of them")
    r = d - sig.size
    rho = math.sqrt(2 * eps / L)
    val = (log_ball_volume(r, rho) if r > 0 else 0.0) + float(np.sum(np.log(4 * eps / sig)))
    return Bound(val, eps < 1 / (2 * L), "Lemma 2 corrected")


def _thm2_core(D: int, L: float, r_min: int, r_max: int, log_vol_D2: float, eps: float) -> float:
    return (-math.log(2) + D * math.log(8 * math.sqrt(4.5 * L)) + r_min * math.log(0.25 * math.sqrt(2 / L))
            + log_vol_D2 + special.gammaln(D / 2 + 1) - (D / 2) * math.log(math.pi) + (D - r_max) / 2 * math.log(eps))


def thm2_global(d: int, L: float, r_min: int, r_max: int, log_vol_D2: float, eps: float) -> Bound:
    """Thm 2: ½ (8 sqrt(9L/2))^d (¼ sqrt(2/L))^{r_min} vol(D2) Γ(d/2+1) π^{-d/2} eps^{(d - r_max)/2}.

    ``valid`` checks eps < 1/(2L) only; the cover hypothesis ("every centre forges x*") essentially
    never holds (spec §6.3), so this is a heuristic reference curve with the right exponent.
    """
    d, L, eps = _dim("d", d, 1), _pos("L", L), _pos("eps", eps)
    if not 0 <= r_min <= r_max <= d:
        raise ValueError(f"need 0 <= r_min <= r_max <= d, got r_min={r_min}, r_max={r_max}, d={d}")
    return Bound(_thm2_core(d, L, r_min, r_max, log_vol_D2, eps), eps < 1 / (2 * L), "Thm 2 (heuristic)")


def remark5_bound(d: int, L: float, r: int, diam: float, eps: float) -> Bound:
    """Remark 5: mu <~ (sqrt(π d)/2) (144 L d diam² / (π e))^{d/2} eps^{(d-r)/2}."""
    d, L, diam, eps = _dim("d", d, 1), _pos("L", L), _pos("diam", diam), _pos("eps", eps)
    val = 0.5 * math.log(math.pi * d) - math.log(2) + d / 2 * math.log(144 * L * d * diam ** 2 / (math.pi * math.e)) \
        + (d - r) / 2 * math.log(eps)
    return Bound(val, eps < 1 / (2 * L), "Remark 5 (heuristic)")


def thm3_probability(d: int, L: float, r_min: int, r_max: int, diam_D2: float, eps: float, L_g: float = 0.0,
                     C: float = 0.0, t0: float = 0.0, omega: float = 1.0) -> Bound:
    """Thm 3: (8 sqrt(9L/2))^d (¼ sqrt(2/L))^{r_min} e^{L_g diam} Γ(d/2+1)/(2 π^{d/2}) eps^{(d-r_max)/2}
    + C e^{-t0^ω} (§4.2 tail form, spec §6.9)."""
    d, L, eps = _dim("d", d, 1), _pos("L", L), _pos("eps", eps)
    if not 0 <= r_min <= r_max <= d:
        raise ValueError(f"need 0 <= r_min <= r_max <= d, got r_min={r_min}, r_max={r_max}, d={d}")
    if L_g < 0 or C < 0 or t0 < 0 or omega < 0 or diam_D2 < 0:
        raise ValueError("L_g, C, t0, omega and diam_D2 must be >= 0")
    main = _thm2_core(d, L, r_min, r_max, 0.0, eps) + L_g * diam_D2
    val = main if C == 0 else float(np.logaddexp(main, math.log(C) - t0 ** omega))
    return Bound(val, eps < 1 / (2 * L), "Thm 3 (heuristic)")


def thm3_gaussian(D: int, L: float, r_min: int, r_max: int, eps: float,
                  radii: Sequence[float]) -> tuple[Bound, float]:
    """Thm 3 for x ~ N(0, I_D) (F000-5, Gaussian half of P000-14): (Bound, radius rho used).

    The paper gives no (C, ω) for the Gaussian; spec §6.9 / T000-8 (resolution): D2 = B_rho(0), so
    g = ||x||²/2 is rho-Lipschitz on D2 (L_g = rho), diam D2 = 2 rho, t0 = rho, and the proof of Thm 3
    uses P2 only at t = t0 (P(x ∉ D2) <= C e^{-t0^ω}); that tail is replaced by the exact value it
    bounds, P(||x|| >= rho) = χ²_D.sf(rho²). Every rho gives a bound; the smallest over ``radii`` is
    returned. ``L`` must hold on the largest ball (the value grows with L, so one L for all rho is
    conservative). ``valid``: eps < 1/(2L) (the cover hypothesis never holds: heuristic, §6.3)."""
    from scipy.stats import chi2

    rho = np.asarray(radii, dtype=float)
    if rho.size == 0 or np.any(rho <= 0):
        raise ValueError("radii must be a non-empty list of numbers > 0")
    main = np.array([thm3_probability(D, L, r_min, r_max, 2 * x, eps, L_g=x).log_value for x in rho])
    vals = np.logaddexp(main, chi2.logsf(rho * rho, D))
    i = int(np.argmin(vals))
    return Bound(float(vals[i]), eps < 1 / (2 * L), "Thm 3 Gaussian (heuristic)"), float(rho[i])


def batch_eq47(d: int, m: int, B: int, L: float, r_min: int, r_max: int, log_vol_D2: float, eps: float) -> Bound:
    """§5 Eq 47: Thm 2 with d -> md, L -> L/B, vol(D2) -> vol(D2)^m (cover radius sqrt(2Bε/L))."""
    if int(m) != m or m < 1 or int(B) != B or B < m:
        raise ValueError(f"need integers 1 <= m <= B, got m={m}, B={B}")
    L = _pos("L", L)
    md = m * _dim("d", d, 1)
    b = thm2_global(md, L / B, r_min, r_max, m * log_vol_D2, eps)
    return Bound(b.log_value, b.valid, "§5 (47) (heuristic)")


def thm4_global(d: int, L: float, r_min: int, r_max: int, log_vol_D2: float, eps: float, xi: float) -> Bound:
    """Thm 4 (a.e. smooth): same value as Thm 2, forging set restricted to the ρ_ε-net of K1;
    needs eps < min(1/(2L), (L/2) ξ²) (Remark 8)."""
    b = thm2_global(d, L, r_min, r_max, log_vol_D2, eps)
    xi = _pos("xi", xi)
    return Bound(b.log_value, eps < min(1 / (2 * L), L / 2 * xi * xi), "Thm 4 (heuristic)")


def thm5_probability(d: int, L: float, r_min: int, r_max: int, diam_D2: float, log_vol_D2: float, eps: float,
                     xi: float, nu1: float, L_g: float = 0.0, C: float = 0.0, t0: float = 0.0,
                     omega: float = 1.0) -> Bound:
    """Thm 5 (Eq 51): Thm 3 plus e^{L_g diam D2} ν1 / vol(D2)."""
    b = thm3_probability(d, L, r_min, r_max, diam_D2, eps, L_g, C, t0, omega)
    extra = L_g * diam_D2 + math.log(_pos("nu1", nu1)) - log_vol_D2
    return Bound(float(np.logaddexp(b.log_value, extra)), eps < min(1 / (2 * L), L / 2 * xi * xi),
                 "Thm 5 (heuristic)")


def appI_nu1_bound(n0: int, n1: int, d: int, R: float, xi: float) -> float:
    """App I Eq 106 (two-layer leaky ReLU, D2 = B_R): ν1 < 2ξ H π^{(d-1)/2} R^{d-1}/Γ((d+1)/2)
    - (H - 1) π^{d/2} ξ^d / Γ(d/2+1), H = n0 + n1 2^{n0} hyperplanes. Returns the bound (not log)."""
    d, R, xi = _dim("d", d, 1), _pos("R", R), _pos("xi", xi)
    if int(n0) != n0 or n0 < 1 or int(n1) != n1 or n1 < 0:
        raise ValueError(f"need integer widths n0 >= 1 and n1 >= 0, got n0={n0!r}, n1={n1!r}")
    H = n0 + n1 * 2 ** n0
    return (2 * xi * H * math.pi ** ((d - 1) / 2) * R ** (d - 1) / special.gamma((d + 1) / 2)
            - (H - 1) * math.pi ** (d / 2) * xi ** d / special.gamma(d / 2 + 1))
