"""Paper 000: the §3.3 / §4-§6 bound functions of tasks/forging/bounds.py against hand-computed values.

Each expected number is written out from the paper's formula (spec T000-5, T000-7, T000-8,
T000-11, T000-12) with small inputs, using only ``math``; none calls the function under test.
Spec IDs: T000-5 (Cor 1-2), T000-6 (Lemma 2), T000-7 (Thm 2, Remark 5), T000-8 (Thm 3),
T000-11 (Eq 47), T000-12 (Thm 4-5, App I Eq 106), P000-14.
"""

import math

import pytest

from tasks.forging import bounds as fb

PI, E = math.pi, math.e


def _thm3_hand():
    # d = 3, L = 2, r_min = r_max = 1, diam D2 = 2, eps = 0.01, L_g = 0.5, C = 0.2, t0 = 1.5, ω = 2:
    # (8 sqrt(9L/2))^d = 24^3, (¼ sqrt(2/L))^{r_min} = 0.25, e^{L_g diam} = e, Γ(5/2)/(2 π^{3/2}),
    # eps^{(d - r_max)/2} = 0.01; tail C e^{-t0^ω} = 0.2 e^{-2.25}
    main = 24 ** 3 * 0.25 * E * (0.75 * math.sqrt(PI)) / (2 * PI ** 1.5) * 0.01
    return main + 0.2 * math.exp(-2.25)


def _cor2_hand():
    # d = 3, R1 = 1, R2 = 2, eps = 0.05, n = 4, v_min = 0.5, A_rows = (1, 0, 2), ||∇f|| = 3,
    # L_g = 0.1, C = 0.3, ω = 1.  P(4, 3) = 1 + 4 + 6 + 4 = 15, vol(B_1) = 4π/3 in R^3.
    # (24): 2d/(d-1) vol/R P ε/v_min = 3 (4π/3) 15 (0.1)
    b24 = 3 * (4 * PI / 3) * 15 * 0.1
    # (25) corrected: K_3 = 4·3 Γ(3/2)/(√π 2² Γ(1)) = 1.5; c = asin(ε/min active A_i)/ε, A_min = 1
    c = math.asin(0.05) / 0.05
    b25 = 1.5 * (4 * PI / 3) * 15 * 0.1 * (c * 0.05) ** 2
    mu = min(b24, b25)
    # Lemma 6: e^{L_g diam V} mu / mu(V) + C e^{-t0 ω}, diam V = 2 sqrt(1 + 4), mu(V) = (4π/3)·4, t0 = 1
    return math.exp(0.1 * 2 * math.sqrt(5)) * mu / ((4 * PI / 3) * 4) + 0.3 * math.exp(-1.0)


def _remark5_hand():
    # d = 4, L = 3, r = 1, diam = 2, eps = 1e-3: (sqrt(π d)/2) (144 L d diam²/(π e))^{d/2} eps^{(d-r)/2}
    return math.sqrt(4 * PI) / 2 * (144 * 3 * 4 * 4 / (PI * E)) ** 2 * 1e-3 ** 1.5


def _thm2_hand():
    # d = 2, L = 2, r_min = 0, r_max = 1, vol(D2) = π (unit disc), eps = 0.01:
    # ½ (8·3)² · 1 · π · Γ(2) π^{-1} · 0.01^{1/2} = 28.8
    return 0.5 * 24 ** 2 * PI * 1.0 / PI * 0.1


def _thm5_hand():
    # Thm 3 at d = 2, L = 2, r_min = 0, r_max = 1, diam = 2, eps = 0.01, L_g = 0.5, C = 0.1, t0 = 1,
    # ω = 2, plus e^{L_g diam} ν1 / vol(D2) with ν1 = 0.3, vol(D2) = π (Eq 51)
    thm3 = 24 ** 2 * E * 1.0 / (2 * PI) * 0.1 + 0.1 * math.exp(-1.0)
    return thm3 + E * 0.3 / PI


def _batch_hand():
    # Eq 47, d = 1, m = 2, B = 2, L = 4, r_min = 0, r_max = 1, vol(D2) = 2 ([-1, 1]), eps = 0.01:
    # md = 2, L/B = 2: ½ (8·3)² · vol² = 4 · Γ(2) π^{-1} · 0.01^{(2-1)/2}
    return 0.5 * 576 * 4 / PI * 0.1


def _lemma2_paper_hand():
    # d = 3, r = 1, L = 8, eps = 1e-3, C(r, d) = 2^r: 4^{d-r} 2^r (sqrt(2/L))^r eps^{d - r/2}
    return 16 * 2 * 0.5 * 1e-3 ** 2.5


def _lemma2_corrected_hand():
    # d = 3, σ = (2, 0.5) (r = 1), L = 8, eps = 1e-3: vol_1(B_ρ) = 2ρ, ρ = sqrt(2 eps/L); Π 4 eps/σ_i
    rho = math.sqrt(2e-3 / 8)
    return 2 * rho * (4e-3 / 2) * (4e-3 / 0.5)


CASES = [
    ("thm3", lambda: fb.thm3_probability(3, 2.0, 1, 1, 2.0, 0.01, L_g=0.5, C=0.2, t0=1.5, omega=2.0), _thm3_hand, True),
    ("cor2", lambda: fb.cor2_corrected(3, 1.0, 2.0, 0.05, 4, 0.5, [1.0, 0.0, 2.0], grad_norm=3.0, L_g=0.1, C=0.3,
                                       omega=1.0), _cor2_hand, True),
    ("remark5", lambda: fb.remark5_bound(4, 3.0, 1, 2.0, 1e-3), _remark5_hand, True),
    ("thm2", lambda: fb.thm2_global(2, 2.0, 0, 1, math.log(PI), 0.01), _thm2_hand, True),
    ("thm4", lambda: fb.thm4_global(2, 2.0, 0, 1, math.log(PI), 0.01, xi=0.2), _thm2_hand, True),
    ("thm4_xi_small", lambda: fb.thm4_global(2, 2.0, 0, 1, math.log(PI), 0.01, xi=0.05), _thm2_hand, False),
    ("thm5", lambda: fb.thm5_probability(2, 2.0, 0, 1, 2.0, math.log(PI), 0.01, xi=0.2, nu1=0.3, L_g=0.5, C=0.1,
                                         t0=1.0, omega=2.0), _thm5_hand, True),
    ("eq47", lambda: fb.batch_eq47(1, 2, 2, 4.0, 0, 1, math.log(2.0), 0.01), _batch_hand, True),
    ("cor1_eq30", lambda: fb.cor1_eq30(2, 1.0, 1.0, 0.1), lambda: 2 / (1 * 1 * 1) * 0.1, True),
    ("lemma2_paper", lambda: fb.lemma2_local_paper(3, 1, 8.0, 1e-3), _lemma2_paper_hand, True),
    ("lemma2_corrected", lambda: fb.lemma2_local_corrected(3, [2.0, 0.5], 8.0, 1e-3), _lemma2_corrected_hand, True),
]


@pytest.mark.parametrize("name,call,hand,valid", CASES, ids=[c[0] for c in CASES])
def test_bound_equals_hand_computed_value(name, call, hand, valid):
    b = call()
    assert math.exp(b.log_value) == pytest.approx(hand(), rel=1e-12)
    assert b.valid is valid


@pytest.mark.parametrize("call", [
    lambda: fb.thm3_probability(3, 2.0, 1, 1, 2.0, 0.3),      # eps >= 1/(2L) = 0.25
    lambda: fb.remark5_bound(4, 3.0, 1, 2.0, 0.2),            # eps >= 1/6
    lambda: fb.thm5_probability(2, 2.0, 0, 1, 2.0, 0.0, 0.3, xi=1.0, nu1=0.1),
    lambda: fb.cor2_corrected(3, 1.0, 2.0, 3.5, 4, 0.5, [1.0], grad_norm=3.0),  # eps >= ||∇f||: infinite
])
def test_bound_flags_failed_hypotheses(call):
    assert not call().valid


def test_thm3_exponent_is_d_minus_r_max_over_2():
    """T000-8: log P decreases with slope (d - r_max)/2 in log eps (no tail)."""
    a, b = fb.thm3_probability(5, 3.0, 1, 2, 4.0, 1e-3), fb.thm3_probability(5, 3.0, 1, 2, 4.0, 1e-5)
    assert (a.log_value - b.log_value) / math.log(100) == pytest.approx(1.5)


@pytest.mark.parametrize("n0,n1,d,R,xi", [(2, 1, 3, 1.0, 0.1), (3, 0, 2, 2.0, 0.05), (1, 2, 4, 1.5, 0.2)])
def test_appI_nu1_bound_hand(n0, n1, d, R, xi):
    """App I Eq 106: H = n0 + n1 2^{n0} slabs of half-width ξ through 0, each at most a (d-1)-disc
    of radius R times 2ξ, minus the H - 1 extra counts of the ξ-ball at the origin."""
    H = n0 + n1 * 2 ** n0
    disc = PI ** ((d - 1) / 2) * R ** (d - 1) / math.gamma((d + 1) / 2)
    ball = PI ** (d / 2) * xi ** d / math.gamma(d / 2 + 1)
    assert fb.appI_nu1_bound(n0, n1, d, R, xi) == pytest.approx(2 * xi * H * disc - (H - 1) * ball, rel=1e-12)


def test_appI_first_case_by_hand():
    """n0 = 2, n1 = 1, d = 3, R = 1, ξ = 0.1: H = 6, ν1 < 1.2π - 5 (4π/3)(0.001) = 1.2π - π/150."""
    assert fb.appI_nu1_bound(2, 1, 3, 1.0, 0.1) == pytest.approx(1.2 * PI - PI / 150, rel=1e-12)


@pytest.mark.parametrize("call", [
    lambda: fb.appI_nu1_bound(0, 1, 3, 1.0, 0.1), lambda: fb.appI_nu1_bound(2, -1, 3, 1.0, 0.1),
    lambda: fb.appI_nu1_bound(2, 1, 3, 1.0, 0.0), lambda: fb.thm5_probability(2, 2.0, 0, 1, 2.0, 0.0, 0.01, 0.2, 0.0),
    lambda: fb.remark5_bound(4, 3.0, 1, 0.0, 1e-3), lambda: fb.thm3_probability(3, 0.0, 1, 1, 2.0, 0.01),
    lambda: fb.cor2_corrected(3, 1.0, -2.0, 0.05, 4, 0.5, [1.0]),
])
def test_bound_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()
