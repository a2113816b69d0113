"""Paper 000: exact linreg volume (T000-2x), bounds (T000-2/4/5) and exact forgers (T000-1/3).

Spec IDs in test names/docstrings: P000-1, P000-3, P000-4, P000-5, P000-6, P000-7, P000-16.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import special

from tasks.forging import bounds as fb
from tasks.forging.exact import (exact_forgers_linreg, exact_forgers_relu, linreg_log_volume,
                                 linreg_log_volume_closed_form, log_ball_volume, remark1_gradient)
from tasks.forging.models import forging_mismatch, make_model, make_target

GRID = list(itertools.product([2, 3, 5, 10], [0.01, 0.3, 1.0, 2.0], [0.5, 1.0, 10.0]))


@pytest.mark.parametrize("d,eps,value", [(2, 1.0, 8.0), (3, 1.0, 2 * math.pi), (2, 0.3, 0.572074),
                                          (3, 0.3, 0.115216), (10, 0.3, 3.46564e-6), (10, 0.01, 5.66724e-21)])
def test_T000_2x_sanity_values(d, eps, value):
    """T000-2x sanity values (R = A = 1) from the spec."""
    assert math.exp(linreg_log_volume(d, eps, 1.0)) == pytest.approx(value, rel=1e-5)


def test_P000_1_closed_form_equals_quadrature():
    """P000-1: closed form = 1-D quadrature to rel 1e-6 over d, eps/A, A."""
    for d, ratio, A in GRID:
        q = linreg_log_volume(d, ratio * A, A, R=1.3)
        c = linreg_log_volume_closed_form(d, ratio * A, A, R=1.3)
        assert abs(math.expm1(q - c)) < 1e-6, (d, ratio, A)
    for ratio in (1 - 1e-4, 1 - 1e-8, 1 - 1e-11, 1 + 1e-9):  # near eps = A (kink of the integrand)
        for d in (2, 10):
            assert abs(linreg_log_volume(d, ratio, 1.0) - linreg_log_volume_closed_form(d, ratio, 1.0)) < 1e-8


def test_log_space_tiny_volumes_are_exact():
    """T000-2x in log space: volumes far below 1e-300 still match the closed form (eps = 1e-40)."""
    for d in (10, 30):
        q, c = linreg_log_volume(d, 1e-40, 1.0), linreg_log_volume_closed_form(d, 1e-40, 1.0)
        assert q < math.log(1e-300) and abs(q - c) < 1e-9
        # small-eps limit mu ≈ 2/(d-1) vol(B_R)/R eps^d / A^{d-1}
        assert q == pytest.approx(math.log(2 / (d - 1)) + log_ball_volume(d) + d * math.log(1e-40), abs=1e-9)


def test_P000_3_bound16_above_exact_and_tight():
    """P000-3: (16) >= exact everywhere; exact/(16) = 2F1(-1/2, (d-1)/2; d/2; A²/eps²) -> 1."""
    for d, ratio, A in GRID:
        for R in (0.5, 1.0, 3.0):
            assert linreg_log_volume(d, ratio * A, A, R) <= fb.prop2_eq16(d, R, ratio * A).log_value + 1e-12
    r = math.exp(linreg_log_volume(2, 2.0, 1.0) - fb.prop2_eq16(2, 1.0, 2.0).log_value)
    assert r >= 0.93 and r == pytest.approx(special.hyp2f1(-0.5, 0.5, 1.0, 0.25), rel=1e-10)
    assert math.exp(linreg_log_volume(5, 1e3, 1.0) - fb.prop2_eq16(5, 1.0, 1e3).log_value) > 0.9999


def test_P000_4_corrected_eq17_holds_paper_eq17_erratum():
    """P000-4: corrected (17) >= exact whenever valid; printed (17) violated at A = 10 (erratum)."""
    n_valid = 0
    for d, ratio, A in GRID:
        for eps in (ratio * A, 1e-3 * A):
            b = fb.prop2_eq17_corrected(d, 1.0, eps, A)
            if b.valid:
                n_valid += 1
                assert linreg_log_volume(d, eps, A) <= b.log_value + 1e-12
    assert n_valid >= 40
    for d, exact, printed in [(2, 6.283e-3, 1.974e-3), (3, 4.189e-5, 2.435e-5)]:
        ex = linreg_log_volume(d, 0.1, 10.0)
        bp = fb.prop2_eq17_paper(d, 1.0, 0.1, 10.0)  # c = π/(2A)
        assert bp.valid and math.exp(ex) == pytest.approx(exact, rel=1e-3)
        assert math.exp(bp.log_value) == pytest.approx(printed, rel=1e-3) and ex > bp.log_value
    for d, ratio, A in itertools.product([2, 3, 5, 10], [0.01, 0.3, 1.0], [0.5, 1.0]):
        assert linreg_log_volume(d, ratio * A, A) <= fb.prop2_eq17_paper(d, 1.0, ratio * A, A).log_value
    assert not fb.prop2_eq17_corrected(3, 1.0, 2.0, 1.0).valid  # eps > A: (17) not applicable


def test_P000_5_exact_slopes():
    """P000-5 (exact): slope of log mu vs log eps is d on eps/A in [1e-3, 1e-2] and 1 on [10, 100]."""
    for d in (2, 3, 5, 10, 20):
        lo = [linreg_log_volume(d, e, 1.0) for e in (1e-3, 1e-2)]
        hi = [linreg_log_volume(d, e, 1.0) for e in (10.0, 100.0)]
        assert (lo[1] - lo[0]) / math.log(10) == pytest.approx(d, abs=0.01)
        assert (hi[1] - hi[0]) / math.log(10) == pytest.approx(1.0, abs=0.01)


def test_P000_6_R_scaling_exact():
    """P000-6 (exact): mu/R^{d-1} independent of R (rel 1e-12); relative volume mu/vol(B_R) ∝ 1/R."""
    for d in (2, 3, 7):
        vals = [linreg_log_volume(d, 0.2, 1.0, R) - (d - 1) * math.log(R) for R in (0.5, 1.0, 4.0)]
        assert max(vals) - min(vals) < 1e-12
        rel = [linreg_log_volume(d, 0.2, 1.0, R) - log_ball_volume(d, R) for R in (1.0, 10.0)]
        assert rel[0] - rel[1] == pytest.approx(math.log(10.0), abs=1e-12)


def test_P000_7_exact_forgers_thin():
    """P000-7: exact forgers (T000-1 linreg α ∈ {0.5, 2, -1.5}; T000-3 ReLU α > 0) have gradient
    mismatch <= 1e-12 (1 + ||∇f(x*)||) while z != x*; points 1e-3 away do not."""
    gen = torch.Generator().manual_seed(0)
    for name, alphas in [("linreg", [0.5, 2.0, -1.5]), ("relu1", [0.5, 2.0, 3.0])]:
        model = make_model(name, 4, 6, gen)
        xs = make_target(model, 1.0, gen)
        a = torch.tensor(alphas, dtype=torch.float64)
        if name == "linreg":
            P = exact_forgers_linreg(model.w, xs[:-1], float(xs[-1]), a)
        else:
            W, v = model.split()
            P = exact_forgers_relu(W, v, xs[:-1], float(xs[-1]), a)
        mis = forging_mismatch(model, xs, P)
        assert (P[:, :-1] - xs[:-1]).norm(dim=1).min() > 0.1
        assert mis.max() <= 1e-12 * (1 + 1.0)
        off = P + 1e-3 * torch.randn(P.shape, dtype=torch.float64, generator=gen)
        assert forging_mismatch(model, xs, off).min() > 1e-6


def test_P000_16_remark1_far_points_same_gradient():
    """P000-16: d = 3, M = 3: ||x - x'|| = 3√2 but gradient difference 0 (equal norms) and
    x' = (0, M + 1, 0) gives a non-zero difference < eps = 1e-3."""
    w = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    x = torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)
    y = torch.tensor([0.0, 3.0, 0.0], dtype=torch.float64)
    y2 = torch.tensor([0.0, 4.0, 0.0], dtype=torch.float64)
    assert float((x - y).norm()) == pytest.approx(3 * math.sqrt(2))
    assert float((remark1_gradient(w, x) - remark1_gradient(w, y)).norm()) == 0.0
    gap = float((remark1_gradient(w, x) - remark1_gradient(w, y2)).norm())
    assert 0 < gap < 1e-3


def test_prop4_counts_and_forms():
    """T000-4: P(n, d) = 2^n for d >= n and <= (d+1)(en/d)^d otherwise; corrected (25) uses
    eps (c eps)^{d-1}/v_min, so it exceeds the printed (25) when c eps < 1 (§6 item 1)."""
    assert math.exp(fb.log_P_nd(5, 7)) == pytest.approx(32.0)
    assert fb.log_P_nd(30, 4) <= math.log(5 * (math.e * 30 / 4) ** 4)
    c = math.asin(0.05) / 0.05  # c* of the smallest active A_i = 1 (inactive rows with A_i = 0 skipped)
    b_c = fb.prop4_eq25_corrected(3, 1.0, 0.05, 8, 0.5, [1.0, 0.0, 2.0], grad_norm=3.0)
    expect = fb.log_K_d(3) + log_ball_volume(3) + fb.log_P_nd(8, 3) + math.log(0.05 / 0.5) + 2 * math.log(c * 0.05)
    assert b_c.valid and b_c.log_value == pytest.approx(expect)
    b_p = fb.prop4_eq25_paper(3, 1.0, 0.05, 8, 1.0, [1.0, 0.0, 2.0], c=c, grad_norm=3.0)
    b_c1 = fb.prop4_eq25_corrected(3, 1.0, 0.05, 8, 1.0, [1.0, 0.0, 2.0], c=c, grad_norm=3.0)
    assert b_c1.log_value - b_p.log_value == pytest.approx(-math.log(c))  # eps(c eps)^{d-1} vs (c eps)^d
    assert not fb.prop4_eq24(3, 1.0, 3.5, 8, 0.5, grad_norm=3.0).valid  # eps >= ||∇f||: infinite volume


def test_local_and_global_bounds_shapes():
    """T000-6/7/11: Lemma 2 exponent d - r/2, Thm 2 exponent (d - r)/2, Eq 47 = Thm 2 with md, L/B."""
    l1, l2 = fb.lemma2_local_paper(4, 1, 10.0, 1e-3), fb.lemma2_local_paper(4, 1, 10.0, 1e-4)
    assert (l1.log_value - l2.log_value) / math.log(10) == pytest.approx(3.5)
    t1, t2 = fb.thm2_global(4, 10.0, 1, 1, 0.0, 1e-3), fb.thm2_global(4, 10.0, 1, 1, 0.0, 1e-4)
    assert (t1.log_value - t2.log_value) / math.log(10) == pytest.approx(1.5) and t1.valid
    assert not fb.thm2_global(4, 10.0, 1, 1, 0.0, 0.1).valid  # eps >= 1/(2L)
    b = fb.batch_eq47(2, 3, 4, 10.0, 1, 2, 0.5, 1e-3)
    assert b.log_value == pytest.approx(fb.thm2_global(6, 2.5, 1, 2, 1.5, 1e-3).log_value)
    # corrected local bound: slab of half-width 2eps/σ_i (one direction) times a ball in the kernel
    lc = fb.lemma2_local_corrected(2, [2.0], 10.0, 1e-3)
    assert math.exp(lc.log_value) == pytest.approx(2 * math.sqrt(2e-3 / 10) * 4e-3 / 2.0)


@pytest.mark.parametrize("call", [
    lambda: linreg_log_volume(3, 0.0, 1.0), lambda: linreg_log_volume(3, -1.0, 1.0),
    lambda: linreg_log_volume(1, 0.1, 1.0), lambda: linreg_log_volume(3, 0.1, 1.0, R=0.0),
    lambda: linreg_log_volume(3, 0.1, 0.0), lambda: linreg_log_volume_closed_form(2, 0.1, 1.0, R=-1),
    lambda: fb.prop2_eq16(1, 1.0, 0.1), lambda: fb.prop2_eq16(3, 0.0, 0.1), lambda: fb.prop2_eq16(3, 1.0, 0.0),
    lambda: fb.prop2_eq17_corrected(3, 1.0, 0.1, -2.0), lambda: fb.prop4_eq24(3, 1.0, 0.1, 0, 1.0),
    lambda: fb.prop4_eq25_corrected(3, 1.0, 0.1, 4, 1.0, [0.0, 0.0]), lambda: fb.thm2_global(3, 1.0, 2, 1, 0.0, 0.1),
    lambda: fb.batch_eq47(2, 5, 4, 1.0, 0, 0, 0.0, 0.1), lambda: fb.canonical_c(2.0, 1.0),
    lambda: exact_forgers_linreg(torch.ones(2), torch.ones(2), 0.0, torch.tensor([0.0])),
])
def test_bad_inputs_raise_value_error(call):
    """Bad inputs (eps <= 0, d < 2 where needed, R <= 0, A <= 0, r out of range, ...) raise ValueError."""
    with pytest.raises(ValueError):
        call()


def test_bad_input_messages_name_the_argument():
    with pytest.raises(ValueError, match="eps"):
        linreg_log_volume(3, 0.0, 1.0)
    with pytest.raises(ValueError, match="d must"):
        fb.prop2_eq16(1, 1.0, 0.1)
    with pytest.raises(ValueError, match="R must"):
        linreg_log_volume(3, 0.1, 1.0, R=-2.0)
    assert np.isfinite(fb.prop2_eq16(2, 1.0, 0.1).log_value)
