"""Paper 004 exact identities at CI size (spec §5, P004-1 … P004-9, P004-18): Euler identity and the
closed-form residual, merge / split residuals at round-off, Thm 4's far sets, GD invariance, Thm 15,
the split budgets of Thms 5/8/9, App D's algebra and its failure under retraining (X004-6)."""

from __future__ import annotations

import math

import pytest
import torch

from tasks import nets, train
from tasks.cells.nonrobust import build, schedule
from tasks.reconstruct import bounds, constructions as C, objective as O, shift

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_net(k=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(k, d, generator=g, dtype=torch.float64)
    return W, torch.randn(k, generator=g, dtype=torch.float64), torch.randn(k, generator=g, dtype=torch.float64)


def random_set(n=7, d=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return X, y, torch.rand(n, generator=g, dtype=torch.float64) + 0.1


def trained(d, m, k, seed=0, target=1e-6, u=None, shifted_init=False):
    """A small net trained by full-batch GD (logistic loss, growing lr), float64; optionally on x + u
    (then lr 3e-3 growing 2 % per 100 steps to loss 2e-3: the growing-lr schedule kills every neuron
    at ‖x + u‖ ≈ 16, X004-6's conditioning remark)."""
    c = dict(d=d, m=m, alpha=1.0, width=k, seed=seed, data="unit_sphere", labels="sign_x1", init_scale=1.0,
             loss="logistic", lr0=0.05, lr_factor=1.2, lr_period=50, lr_period_fast=0, target_loss=target,
             max_iters=20000, batch_size=5000)
    net, X, y, mask, _ = build([c])
    sched = schedule(c)
    if u is not None:
        X = X + u
        sched = train.Schedule(**{**sched.__dict__, "lr0": 3e-3, "factor": 1.02, "period": 100, "target_loss": 2e-3})
        if shifted_init:
            net = nets.TwoLayer(net.W, shift.bias_transform(net.W, net.b, u[None]), net.v)
    st = train.train(net, X, y, sched, mask=mask)
    assert int(st.status[0]) == train.CONVERGED
    return st.net.W[0], st.net.b[0], st.net.v[0], X[0], y[0], net


@pytest.fixture(scope="module")
def small():
    """n = 20 < d = 30, k = 50 (F004-3's small net)."""
    return trained(30, 20, 50)


@pytest.fixture(scope="module")
def spanning():
    """n = 20 > d = 10, k = 50 (F004-3: data span R^d, σ_d > 0)."""
    return trained(10, 20, 50)


def rel(a, b):
    return float((a - b).norm() / b.norm())


# --- P004-1 ----------------------------------------------------------------------------------

def test_P004_1_euler_identity_and_closed_form_equals_autograd():
    W, b, v = random_net(k=9, d=6)
    X, y, lam = random_set(n=11, d=6)
    R = C.set_residual(W, b, v, X, y, lam)
    theta = torch.cat([W.flatten(), b, v])
    lhs = theta.dot(theta) - theta.dot(R)
    rhs = 2 * (lam * y * C.phi(W, b, v, X)).sum()
    assert abs(float(lhs - rhs)) <= 1e-12 * abs(float(rhs))
    p = [t.clone().requires_grad_(True) for t in (W, b, v)]
    F = (lam * y * (torch.relu(X @ p[0].T + p[1]) @ p[2])).sum()
    g = torch.autograd.grad(F, p)
    auto = theta - torch.cat([t.flatten() for t in g])
    assert rel(R, auto) <= 1e-12


def test_P004_1_surrogate_gradient_equals_haims_double_backward():
    """The attack's ∂L/∂x' from the closed form equals Haim et al.'s create_graph double backward
    through a ReLU with surrogate backward sigmoid(α z) (X004-2, X004-11)."""
    W, b, v = random_net(k=9, d=6)
    X, y, lam = random_set(n=11, d=6)
    alpha = torch.tensor([7.0], dtype=torch.float64)
    x = X.clone().requires_grad_(True)
    L = O.haim(W[None], b[None], v[None], x[None], y[None], lam[None], alpha=alpha,
               lam_min=torch.tensor([0.2], dtype=torch.float64), box=False)
    gx = torch.autograd.grad(L.sum(), x)[0]
    x2 = X.clone().requires_grad_(True)
    p = [t.clone().requires_grad_(True) for t in (W, b, v)]
    Z = x2 @ p[0].T + p[1]
    F = (lam * y / X.shape[0] * (O._relu_surrogate(Z, alpha) @ p[2])).sum()
    g = torch.autograd.grad(F, p, create_graph=True)
    L2 = sum(((t - gt) ** 2).sum() for t, gt in zip(p, g)) + 5 * torch.relu(0.2 - lam).pow(2).sum()
    gx2 = torch.autograd.grad(L2, x2)[0]
    assert abs(float(L.sum().detach() - L2.detach())) <= 1e-12 * float(L2.detach())
    assert rel(gx, gx2) <= 1e-10


# --- P004-2, P004-3 ----------------------------------------------------------------------------

def test_P004_2_merge_keeps_the_residual():
    W, b, v = random_net()
    X, y, lam = random_set()
    X[1] = X[0] + 1e-3 * torch.tensor([1.0, -2.0, 0.5, 0.3, 0.1], dtype=torch.float64)
    y[1] = y[0]
    assert bool((C.pattern(W, b, X[:1]) == C.pattern(W, b, X[1:2])).all())
    X2, y2, lam2 = C.merge(W, b, X, y, lam, 0, 1)
    theta = torch.cat([W.flatten(), b, v]).norm()
    dR = C.set_residual(W, b, v, X2, y2, lam2) - C.set_residual(W, b, v, X, y, lam)
    assert float(dR.norm()) <= 1e-12 * float(theta)
    a = lam[0] / (lam[0] + lam[1])
    ph = C.phi(W, b, v, X[:2])
    assert abs(float(C.phi(W, b, v, X2[-1:])[0] - (a * ph[0] + (1 - a) * ph[1]))) <= 1e-12 * float(ph.abs().max())


@pytest.mark.parametrize("case", ["label", "pattern"])
def test_P004_2_merge_refuses_other_label_or_pattern(case):
    W, b, v = random_net()
    X, y, lam = random_set()
    i2 = 1
    if case == "label":
        X[1], y[1] = X[0], -y[0]
    else:
        i2 = next(i for i in range(1, 7) if y[i] == y[0] and bool((C.pattern(W, b, X[[0, i]]).diff(dim=0) != 0).any()))
    with pytest.raises(ValueError, match=case):
        C.merge(W, b, X, y, lam, 0, i2)


def split_case():
    W, b, v = random_net()
    X, y, lam = random_set()
    nu = torch.tensor([0.3, -0.2, 0.9, 0.1, -0.2], dtype=torch.float64)
    nu = nu / nu.norm()
    a_max, b_max = C.admissible_range(W, b, X[2], nu)
    theta = torch.cat([W.flatten(), b, v]).norm()
    return W, b, v, X, y, lam, nu, a_max, b_max, float(theta)


def test_P004_3_split_keeps_the_residual_and_swapped_multipliers_do_not():
    W, b, v, X, y, lam, nu, a_max, b_max, theta = split_case()
    R0 = C.set_residual(W, b, v, X, y, lam)
    a, bb = 0.7 * a_max, 0.2 * b_max
    good = C.set_residual(W, b, v, *C.split(W, b, X, y, lam, 2, nu, a, bb))
    bad = C.set_residual(W, b, v, *C.split(W, b, X, y, lam, 2, nu, a, bb, swap=True))
    assert float((good - R0).norm()) <= 1e-12 * theta
    assert float((bad - R0).norm()) >= 1e-6 * theta


def test_P004_3_split_beyond_the_range_is_refused_and_changes_the_residual():
    W, b, v, X, y, lam, nu, a_max, b_max, theta = split_case()
    with pytest.raises(ValueError, match="alpha"):
        C.split(W, b, X, y, lam, 2, nu, 1.01 * a_max, 0.5 * b_max)
    a, bb = 1.5 * a_max, 0.5 * b_max  # built by hand past the crossing
    Xs = torch.cat([X, (X[2] + a * nu)[None], (X[2] - bb * nu)[None]])
    ls = torch.cat([lam, (lam[2] * bb / (a + bb))[None], (lam[2] * a / (a + bb))[None]])
    ls[2] = 0
    dR = C.set_residual(W, b, v, Xs, torch.cat([y, y[2:3], y[2:3]]), ls) - C.set_residual(W, b, v, X, y, lam)
    assert float(dR.norm()) >= 1e-8 * theta


# --- P004-4, P004-5 ----------------------------------------------------------------------------

@pytest.mark.parametrize("tau", [1.0, 10.0, 100.0, 1e4])
def test_P004_4_far_kkt_sets_of_thm4(small, tau):
    W, b, v, X, y, _ = small
    We = C.exactify(W, X)
    _, lam = bounds.eps_star(We, b, v, X, y)
    X2, y2, lam2, xhat = C.far_set(X, y, lam, tau)
    theta = float(torch.cat([We.flatten(), b, v]).norm())
    assert C.set_distance(X, X2) > tau
    dR = C.set_residual(We, b, v, X2, y2, lam2) - C.set_residual(We, b, v, X, y, lam)
    assert float(dR.norm()) <= 1e-10 * theta
    phi0 = C.phi(We, b, v, X).repeat(2)
    assert float((C.phi(We, b, v, X2).abs() - phi0.abs()).abs().max()) <= 1e-10 * float(phi0.abs().max())
    assert bool((C.pattern(We, b, X2) == C.pattern(We, b, X).repeat(2, 1)).all())


def test_P004_5_gd_never_moves_weights_orthogonal_to_the_data():
    c = dict(d=30, m=20, alpha=1.0, width=50, seed=3, data="unit_sphere", labels="sign_x1", init_scale=1.0,
             loss="logistic", lr0=0.05, lr_factor=1.2, lr_period=50, lr_period_fast=0, target_loss=1e-6,
             max_iters=20000, batch_size=5000)
    net, X, y, mask, _ = build([c])
    xhat = C.orthogonal_direction(X[0])
    w0 = net.W[0] @ xhat
    st, moved = None, []
    for _ in range(6):  # checkpoints every 300 steps
        st = train.train(net, X, y, schedule(c), mask=mask, state=st, max_steps=300)
        moved.append(float((st.net.W[0] @ xhat - w0).abs().max()))
    assert float((st.net.W[0] - net.W[0]).norm()) > 1  # it did train
    assert max(moved) <= 1e-10 * float(net.W[0].norm())


# --- P004-6 ----------------------------------------------------------------------------------

def test_P004_6_thm15_svd_direction(spanning):
    X = spanning[3]
    nu, sd = C.svd_direction(X)
    proj = X @ nu
    assert float(sd) > 0
    assert float(proj.abs().max()) <= float(sd) * (1 + 1e-12)
    assert abs(float(proj.pow(2).sum()) - float(sd) ** 2) <= 1e-10 * float(sd) ** 2


def test_P004_6_thm15_on_the_F004_1_sphere_data():
    from tasks import data

    g = data.seed_streams(0, salt=(784, 500))
    X, _ = data.synthetic("unit_sphere", 500, 784, g, sign_x1=True)
    nu, sd = C.svd_direction(X)
    assert float(sd) == 0 and float((X @ nu).abs().max()) <= 1e-12


# --- P004-7, P004-8 ----------------------------------------------------------------------------

def test_P004_7_bound_b8_is_sufficient_and_splits_keep_the_pattern(spanning):
    W, b, v, X, y, _ = spanning
    eps, lam = bounds.eps_star(W, b, v, X, y)
    nu, _ = C.svd_direction(X)
    B8 = bounds.b8(W, b, v, X, lam, nu, eps)
    exact = bounds.ranges(W, b, X, nu)
    assert bool((B8 <= exact).all())
    for sign in (1.0, -1.0):
        Z = X + sign * 0.99 * B8.unsqueeze(1) * nu
        assert bool((C.pattern(W, b, Z) == C.pattern(W, b, X)).all())


def test_P004_7_bound_b5_is_sufficient_at_an_exact_w_block(spanning):
    """B5 (corrected, with |v_j|) assumes an exact KKT point: with the W-block residual removed
    (w_j = v_j Σ λ_i y_i σ'_ij x_i, Lemma 11) it is ≤ the exact range at every point; the printed
    B5 (no |v_j|) is recorded, not gated (X004-10)."""
    W, b, v, X, y, _ = spanning
    _, lam = bounds.eps_star(W, b, v, X, y)
    RW, _, _ = O.residual(W[None], b[None], v[None], X[None], y[None], lam[None])
    We = W - RW[0]
    nu, _ = C.svd_direction(X)
    B5 = bounds.b5(We, b, v, X, lam, nu)
    exact = bounds.ranges(We, b, X, nu)
    assert bool((B5 <= exact).all())
    printed = bounds.b5(We, b, v, X, lam, nu, printed=True)
    # the printed bound (no |v_j|) exceeds the corrected one, and so can pass the exact range, only where
    # the neuron attaining B5 has |v_j| > 1 (spec §3.4); how often it passes the range is recorded, not gated
    jstar = ((X @ We.T + b).abs() / v.abs()).argmin(1)
    assert bool(((printed <= B5) | (v.abs()[jstar] > 1)).all())


@pytest.mark.parametrize("l", [0, 5, 11])
def test_P004_8_thm9_prediction_change_and_delta(spanning, l):
    W, b, v, X, y, _ = spanning
    eps, lam = bounds.eps_star(W, b, v, X, y)
    nu, _ = C.svd_direction(X)
    B8 = float(bounds.b8(W, b, v, X, lam, nu, eps)[l])
    t = bounds.thm9(W, b, v, X, y, lam, l, nu, 0.9 * B8, 0.6 * B8, eps)
    assert t.dphi <= t.dphi_bound
    assert t.delta_after <= t.delta_bound


# --- P004-9, P004-18 ---------------------------------------------------------------------------

def test_P004_9_bias_transform_algebra():
    W, b, v = random_net(k=8, d=5)
    X, y, lam = random_set(n=9, d=5)
    u = torch.full((5,), 0.5, dtype=torch.float64)
    b2 = shift.bias_transform(W[None], b[None], u[None])[0]
    ph = C.phi(W, b, v, X)
    assert float((C.phi(W, b2, v, X + u) - ph).abs().max()) <= 1e-12 * float(ph.abs().max())
    RW, Rb, Rv = (t[0] for t in O.residual(W[None], b[None], v[None], X[None], y[None], lam[None]))
    SW, Sb, Sv = (t[0] for t in O.residual(W[None], b2[None], v[None], (X + u)[None], y[None], lam[None]))
    dW, db = (t[0] for t in shift.residual_shift_delta(W[None], b[None], Rb[None], u[None]))
    scale = float(torch.cat([W.flatten(), b, v]).norm()) * float(u.norm())
    assert float((SW - RW - dW).abs().max()) <= 1e-12 * scale
    assert float((Sb - Rb - db).abs().max()) <= 1e-12 * scale
    assert float((Sv - Rv).abs().max()) <= 1e-12 * scale


@pytest.mark.slow
def test_P004_18_retraining_on_shifted_data_is_not_the_bias_transform():
    """X004-6: GD on x + u from the shifted init ≠ the bias-transformed net; the true shifted set is
    farther from KKT under the bias transform (u = 5·1, d = 10). At this CI size the retrained net
    is itself far from KKT (ε*/‖θ‖ ≈ 0.86 against 0.99), so only the direction is gated, not the
    spec's ratio > 2 (measured ≈ 1.15; docs/departures.md)."""
    d = 10
    u = torch.full((d,), 5.0, dtype=torch.float64)
    W, b, v, X, y, _ = trained(d, 20, 20, seed=1)
    W2, b2, v2, Xu, yu, _ = trained(d, 20, 20, seed=1, u=u, shifted_init=True)
    bt = shift.bias_transform(W[None], b[None], u[None])[0]
    th = torch.cat([W.flatten(), bt, v])
    th2 = torch.cat([W2.flatten(), b2, v2])
    dist = float((th / th.norm() - th2 / th2.norm()).norm())
    assert dist > 1e-3
    e_bt, _ = bounds.eps_star(W, bt, v, Xu, yu)
    e_re, _ = bounds.eps_star(W2, b2, v2, Xu, yu)
    assert float(e_bt / th.norm()) > 1.05 * float(e_re / th2.norm())


# --- scoring (spec §2.5) -----------------------------------------------------------------------

def test_scores_random_reference_on_the_sphere_is_1_30():
    """§2.5: the mean of the 5 best of 1000 random unit candidates to 500 points on S^783 is ≈ 1.30."""
    from tasks.cells.reconstruct import random_reference

    assert abs(random_reference(500, 1000, 784, 1.0) - 1.30) <= 0.03


def test_scores_ssim_is_one_on_identical_images_and_falls_with_noise():
    from tasks.reconstruct import score as S

    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 3, 32, 32, generator=g, dtype=torch.float64)
    noise = torch.randn(a.shape, generator=g, dtype=torch.float64)
    same = S.ssim(a, a.clone(), 1.0)
    little, more = S.ssim(a, (a + 0.05 * noise).clamp(0, 1), 1.0), S.ssim(a, (a + 0.3 * noise).clamp(0, 1), 1.0)
    assert same.shape == (3,) and float((same - 1).abs().max()) <= 1e-12
    assert bool((more < little).all()) and float(more.max()) < 0.8 and float(little.min()) > 0.9


def test_scores_unique_best_counts_each_training_point_once():
    from tasks.reconstruct import score as S

    X = torch.eye(6, dtype=torch.float64)[None]  # 6 training points
    Xc = torch.cat([X[:, :1].repeat(1, 5, 1) * 1.01, X[:, 1:] * 1.2], 1)  # 5 copies near x_0, 5 others
    lam = torch.ones(1, 10, dtype=torch.float64)
    sc = S.score_all(Xc, lam, X, torch.ones(1, 6, dtype=torch.bool), torch.ones(1, 6, dtype=torch.float64),
                     torch.tensor([0.1]), 0.05)
    assert abs(float(sc.score5) - 0.01) <= 1e-12  # five copies of one point
    assert abs(float(sc.score5_unique) - (0.01 + 4 * 0.2) / 5) <= 1e-12
    assert int(sc.n_recovered) == 1


def _greedy_reference(D, k):
    """Spec X004-8's greedy one-to-one matching written out independently: every (candidate, point)
    pair sorted by distance (ties by candidate, then point), taken when neither end is used yet."""
    pairs = sorted((float(D[c, p]), c, p) for c in range(D.shape[0]) for p in range(D.shape[1]) if D[c, p] < math.inf)
    used_c, used_p, out = set(), set(), []
    for dist, c, p in pairs:
        if c not in used_c and p not in used_p:
            used_c.add(c), used_p.add(p), out.append(dist)
        if len(out) == k:
            break
    return out


@pytest.mark.parametrize("seed", range(6))
def test_scores_unique_best_is_the_greedy_one_to_one_matching(seed):
    """score5_unique against the sorted-pairs greedy matching, on stacks of random candidate sets
    (points padded to different counts), and on a set where a point's nearest chooser is not the
    candidate the matching gives it."""
    from tasks.reconstruct import score as S

    g = torch.Generator().manual_seed(seed)
    B, l, n, d = 4, 9, 7, 3
    X = torch.randn(B, n, d, generator=g, dtype=torch.float64)
    Xc = X[:, torch.randint(0, n, (l,), generator=g)] + 0.3 * torch.randn(B, l, d, generator=g, dtype=torch.float64)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 5:] = False  # row 1: 5 real points; row 2: 4 (fewer than 5 matchable pairs: NaN)
    mask[2, 4:] = False
    sc = S.score_all(Xc, torch.ones(B, l, dtype=torch.float64), X, mask, torch.ones(B, d, dtype=torch.float64),
                     torch.full((B,), 0.1), 0.3)
    for e in range(B):
        D = torch.cdist(Xc[e], X[e]).masked_fill(~mask[e][None], math.inf)
        ref = _greedy_reference(D, 5)
        if len(ref) < 5:
            assert math.isnan(float(sc.score5_unique[e]))
        else:
            assert abs(float(sc.score5_unique[e]) - sum(ref) / 5) <= 1e-12
    # two candidates whose nearest point is x_0: the second is matched to its next point x_1
    X1 = torch.tensor([[[0.0, 0], [1, 0], [5, 0], [9, 0], [13, 0], [17, 0]]], dtype=torch.float64)
    Xc1 = torch.tensor([[[0.1, 0], [0.4, 0], [5, 0.2], [9, 0.2], [13, 0.2], [30, 0]]], dtype=torch.float64)
    sc1 = S.score_all(Xc1, torch.ones(1, 6, dtype=torch.float64), X1, torch.ones(1, 6, dtype=torch.bool),
                      torch.ones(1, 2, dtype=torch.float64), torch.tensor([0.1]), 0.3)
    assert abs(float(sc1.score5_unique) - (0.1 + 0.6 + 3 * 0.2) / 5) <= 1e-12


def test_P004_14_acceptance_row_reports_recovery_per_radius_and_midpoint_medians():
    """The P004-14 row on a synthetic group: the verdict from the (midpoint) median scores per radius,
    and the recovery counts per radius in its note (spec: "if no recovery, report"); a diverged cell
    (status 2) is left out of both."""
    import numpy as np
    import xarray as xr

    from analysis.acceptance_004 import acceptance

    dims = ("radius", "restart")
    score = np.array([[0.40, 0.50, 0.60, 0.70], [0.3, 0.9, 1.0, 2.0], [9.0, 9.5, 9.6, 9.8]])
    rec = np.array([[2, 2, 1, 2], [0, 0, 1, 0], [0, 0, 0, 0]])
    status = np.ones((3, 4), dtype=np.int8)
    status[1, 0] = 2  # diverged: its score 0.3 and its count are not used
    ds = xr.Dataset({"done": (dims, np.ones((3, 4), bool)), "status": (dims, status), "score5": (dims, score),
                     "objective": (dims, np.ones((3, 4))), "n_recovered": (dims, rec)},
                    coords={"radius": [0.1, 1.0, 10.0], "restart": [0, 1, 2, 3]})
    ds.status.attrs["ok_values"] = [1]
    row = next(r for r in acceptance(ds) if r.spec_id == "P004-14")
    assert row.measured == "argmin r = 0.1 (0.55); r=10: 9.55" and row.verdict == "FAIL"  # argmin not in [0.5, 2]
    assert abs(row.value - 9.55 / 0.55) <= 1e-12
    assert row.note.endswith("r=0.1: 4/4 runs, 7 points; r=1: 1/3 runs, 1 points; r=10: 0/4 runs, 0 points")


def test_stored_medians_are_midpoint_medians_for_even_counts():
    """The medians stored by the cells are the usual (midpoint) median, numpy's, not torch's lower one."""
    import numpy as np

    from tasks.cells import nonrobust
    from tasks.reconstruct import score as S

    t = torch.tensor([4.0, 1.0, 3.0, 10.0], dtype=torch.float64)
    assert float(S.median(t)) == 3.5 == float(np.median(t.numpy())) and float(t.median()) == 3.0
    assert float(nonrobust._median(t)) == 3.5
    assert float(S.median(t[:3])) == 3.0 == float(nonrobust._median(t[:3]))
    assert float(nonrobust._median(torch.tensor([1.0, math.inf]))) == math.inf
    assert math.isnan(float(S.median(t[:0])))
