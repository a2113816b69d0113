"""The mutation catalogue (benchmarks/mutations.yaml, issue 28 item 12) stays applicable, and the
kernels' maths against closed forms or independent computations (autograd, per-neuron loops, scipy)
where the fast suite let mutants of benchmarks/mutations.py survive. Each test names the mutant ids
it kills."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch
import yaml

from tasks.kkt.measure import kkt_measure, relu_grad, residual
from tasks.unlearn import bounds as bnd
from tasks.unlearn import references as ref
from tasks.unlearn.fixtures import fixture_o

ROOT = pathlib.Path(__file__).resolve().parents[1]
CATALOGUE = yaml.safe_load((ROOT / "benchmarks" / "mutations.yaml").read_text())["mutants"]
M, D, N = 6, 16, 8  # fixture O: m points, d dims, n neurons


@pytest.fixture(autouse=True)
def _float64():
    """float64 tensors in this module's tests (spec N3), the default restored after each test."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# ---- the catalogue itself ------------------------------------------------------------------------

def test_catalogue_has_at_least_40_mutants_over_all_five_papers():
    ids = [m["id"] for m in CATALOGUE]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert {i.split("-")[0] for i in ids} >= {"p000", "p001", "p002", "p003", "p004"}


@pytest.mark.parametrize("m", CATALOGUE, ids=[m["id"] for m in CATALOGUE])
def test_catalogue_old_snippet_occurs_exactly_once(m):
    src = (ROOT / m["file"]).read_text()
    assert src.count(m["old"]) == 1, f"{m['id']}: old snippet occurs {src.count(m['old'])} times in {m['file']}"
    assert m["new"] != m["old"] and m["why"] and m["tests"]
    for t in m["tests"]:
        assert (ROOT / t.split("::")[0]).is_file(), f"{m['id']}: no test file {t}"


# ---- paper 001 -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fix_o():
    W, u, X, y = fixture_o(M, D, N, torch.Generator().manual_seed(0))
    return W[None], u[None], X[None], y[None]


@pytest.mark.parametrize("s", [0.5, 2.0, 3.0])
def test_inherited_multipliers_take_the_new_nets_scale(fix_o, s):
    """Kills p001-inherited-rescale-inverted, p001-inherited-not-rescaled. Fixture O is an exact KKT
    point at margin 1 (c = 1, λ = n/n_y = 2). For θ̂ = sθ the inherited certificate is the raw λ
    times c_new = 1/s (spec K1), so λ = 2/s and ε = ‖θ − θ/s‖ = |1 − 1/s| √(2m)."""
    W, u, X, y = fix_o
    r = kkt_measure(W, u, X, y)
    assert float(r.c) == pytest.approx(1.0, abs=1e-12)
    ri = kkt_measure(s * W, u, X, y, method="inherited", lam_inherit=r.lam, c_inherit=r.c)
    assert torch.allclose(ri.lam, torch.full_like(ri.lam, 2 / s), atol=1e-10)
    assert float(ri.eps) == pytest.approx(abs(1 - 1 / s) * math.sqrt(2 * M), rel=1e-9)


def test_dynamics_multipliers_have_the_least_squares_scale(fix_o):
    """Kills p001-dynamics-scale: 'dynamics' fits one scale s to λ ∝ −ℓ'(q), the s minimising
    ‖cθ − s Σ g_i y_i ∇N(x_i)‖; any other scale (±5 %, ±20 %) gives a larger residual."""
    W, u, X, y = fix_o
    Wp = W + 0.03 * torch.randn(W.shape, generator=torch.Generator().manual_seed(1))
    r = kkt_measure(Wp, u, X, y, method="dynamics")
    assert bool(r.feasible) and float(r.eps) > 0
    S = relu_grad(Wp, X)
    Wc = Wp * r.c[..., None, None]
    assert float(residual(Wc, u, X, y, S, r.lam).flatten(-2).norm()) == pytest.approx(float(r.eps), rel=1e-12)
    for f in (0.8, 0.95, 1.05, 1.2):
        assert float(residual(Wc, u, X, y, S, f * r.lam).flatten(-2).norm()) > float(r.eps) * (1 + 1e-9), f


def test_fixed_net_equals_the_per_neuron_formula():
    """Kills p001-fixed-net-constant, p001-fixed-net-sign: spec K3, w̃_j = ŵ_j + |u_j| Λ_j c
    Σ_{k∈retain} sign(⟨x_k, w_j⟩) x_k, c = min(ε_d/(2mn), 0.01), by a loop over neurons."""
    g = torch.Generator().manual_seed(3)
    m, d, n = 5, 7, 4
    W, W_hat, X = (torch.randn(*s, generator=g) for s in ((n, d), (n, d), (m, d)))
    u = torch.tensor([0.5, -0.5, 0.5, -0.5])
    lam_S = torch.rand(n, generator=g) + 0.5
    retain = torch.tensor([True, False, True, True, True])
    for eps_d in (0.01, 100.0):  # c = 2.5e-4 and c capped at 0.01
        c = min(eps_d / (2 * m * n), 0.01)
        want = W_hat.clone()
        for j in range(n):
            delta = sum(torch.sign(X[k] @ W[j]) * X[k] for k in range(m) if retain[k])
            want[j] += abs(float(u[j])) * float(lam_S[j]) * c * delta
        got = ref.fixed_net(W_hat, u, X, W, lam_S, retain, torch.tensor(eps_d), torch.tensor(float(m)),
                            torch.tensor(float(n)))
        assert torch.allclose(got, want, atol=1e-13), eps_d


@pytest.mark.parametrize("m,n,k,eps1,delta1,eps_d", [(10, 64, 1, 0.05, 0.02, 0.005), (40, 8, 1, 0.3, 0.7, 0.01),
                                                    (30, 16, 3, 0.1, 0.1, 0.002)])
def test_two_layer_bounds_equal_the_spec_formulas(m, n, k, eps1, delta1, eps_d):
    """Kills p001-delta-bound-constant: spec T001-3 (k = 1) / T001-4 (k > 1) typed from the spec."""
    b = bnd.bounds("two_layer", m, n, k, eps1, delta1, eps_d, 0.0, 0.0)
    if k == 1:
        assert b.delta_stated == pytest.approx(delta1 + 9 * eps_d * delta1 / (m - 9 * eps_d) + 22.6 * eps_d / m, rel=1e-12)
        assert b.eps_stated == pytest.approx(eps1 + 9 * eps_d * eps1 / (m - 9 * eps_d) + 23 * eps_d / math.sqrt(m),
                                             rel=1e-12)
        assert b.tau_stated == pytest.approx(82 * eps_d / m, rel=1e-12)
    else:
        assert b.delta_stated == pytest.approx(delta1 + 9 * eps_d * delta1 / (k - 9 * eps_d) + 22.6 * k * eps_d / m,
                                               rel=1e-12)
    gam = 9 * k * eps_d / (m * n)
    den = m / k - 9 * eps_d
    proof = delta1 * (1 + 9 * eps_d / den) + (184 * k * eps_d / m + 183.6 * k * eps_d / m) / (1 - gam)
    assert b.delta_proof == pytest.approx(proof, rel=1e-12)
    assert b.eps == pytest.approx(eps1 + 9 * eps_d * eps1 / den + 23 * k * eps_d / math.sqrt(m), rel=1e-12)


@pytest.mark.parametrize("m,k", [(10, 1), (20, 3)])
def test_linear_bounds_equal_the_spec_formulas(m, k):
    """Kills p001-linear-eps-bound: spec T001-1 / T001-2: ε = ε1 + ε1 ε_d/(m/k − ε_d),
    δ (proof) = δ1 + δ1 ε_d/(m/k − ε_d) + 7.2 k ε_d/m."""
    eps1, delta1, eps_d = 0.2, 0.1, 0.05
    b = bnd.bounds("linear", m, 1, k, eps1, delta1, eps_d, 0.0, 0.0)
    assert b.eps == pytest.approx(eps1 + eps1 * eps_d / (m / k - eps_d), rel=1e-12)
    assert b.delta_proof == pytest.approx(delta1 + delta1 * eps_d / (m / k - eps_d) + 7.2 * k * eps_d / m, rel=1e-12)


def test_phi_precondition_is_eps_d_over_4mn_for_two_layer_nets():
    """Kills p001-phi-precondition: Assumption 2.3 / D001-9, two-layer nets need φ ≤ ε_d/(4mn)."""
    m, n, eps_d = 10, 16, 0.01
    at = bnd.bounds("two_layer", m, n, 1, 0.1, 0.1, eps_d, 0.0, eps_d / (4 * m * n))
    above = bnd.bounds("two_layer", m, n, 1, 0.1, 0.1, eps_d, 0.0, 2 * eps_d / (4 * m * n))
    assert at.preconditions_met and not at.violated
    assert above.violated == ("phi <= eps_d/(4mn)",) and not above.preconditions_met
    lin = bnd.bounds("linear", m, 1, 1, 0.1, 0.1, eps_d, 0.0, 2 * eps_d / (4 * m * n))
    assert lin.preconditions_met  # linear: φ ≤ ε_d/(4m) holds


def test_data_stats_by_hand():
    """Kills p001-psi-offset: ψ̂ = max |‖x_i‖² − 1|, φ̂ = max_{i≠j} |⟨x_i, x_j⟩| on three points."""
    X = torch.tensor([[1.2, 0.0, 0.0], [0.3, 0.9, 0.0], [0.0, 0.0, -1.0]])
    s = bnd.data_stats(X[None], torch.ones(1, 3, dtype=torch.bool), 4)
    assert float(s["psi"]) == pytest.approx(max(abs(1.44 - 1), abs(0.09 + 0.81 - 1), 0.0), rel=1e-12)
    assert float(s["phi"]) == pytest.approx(0.36, rel=1e-12)
    assert float(s["eps_d_two_layer"]) == pytest.approx(4 * 3 * 4 * 0.36, rel=1e-12)


def test_log_loss_derivative_term_equals_autograd():
    """Kills p000-log-loss-derivative: log|ℓ'(q)| for ℓ(q) = log(1 + e^{−q}) (spec N4)."""
    from tasks.nets.losses import log_loss_terms

    q = torch.linspace(-5, 25, 13, requires_grad=True)
    (dl,) = torch.autograd.grad(torch.nn.functional.softplus(-q).sum(), q)
    assert torch.allclose(log_loss_terms(q.detach(), "logistic")[1], dl.abs().log(), atol=1e-12)


def _unlearn_cell_on_fixture_o(s: float, alpha: float):
    from flows.experiments import unlearn as exp
    from tasks.cells.train_kkt import RNG_BYTES
    from tasks.cells.unlearn import unlearn

    W, u, X, y = fixture_o(M, D, N, torch.Generator().manual_seed(0))
    one = lambda x: torch.tensor([x])  # noqa: E731
    cell = dict({k: p.default for k, p in exp.P.items()}, unlearn_method="ga", forget=0, k=1, alpha=alpha, test_points=0,
                ref_retrain=False, store_nets=True)
    out = unlearn((s * W)[None], torch.zeros(1, N), u[None], X[None], y[None], torch.ones(1, M, dtype=torch.bool),
                  one(D), one(M), one(N), torch.zeros(1, 2 * RNG_BYTES, dtype=torch.uint8), ["a"], [cell])
    return W, u, X, y, out[0]


@pytest.mark.parametrize("s,alpha", [(3.0, 1.0), (0.5, 0.7)])
def test_unlearn_cell_ga_step_is_alpha_lambda_l_times_the_margin_gradient(s, alpha):
    """Kills p001-cell-multiplier-scale, p001-cell-multiplier-unscaled: the cell's stored net after GA on
    point l = 0 equals θ − α λ_l ∇_θ(y_l N(x_l; θ)) (paper 001 Eq 3), with θ = s·θ_O and λ_l at the
    scale of θ: fixture O's λ = 2 at margin 1, so λ_l = 2s (θ = Σ λ y ∇N, ∇N 0-homogeneous); the
    gradient by autograd."""
    W, u, X, y, res = _unlearn_cell_on_fixture_o(s, alpha)
    theta = (s * W).clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(y[0] * (torch.relu(theta @ X[0]) * u).sum(), theta)
    want = s * W - alpha * (2 * s) * grad
    assert res["lam_l"] == pytest.approx(2.0, rel=1e-9)  # the rescaled net's λ_l (margin 1)
    got = torch.as_tensor(res["W"])
    # fixture O puts half the neurons exactly at their kink at x_0 (w_j·x_0 = 0 in exact arithmetic,
    # ±1e-17 after rounding, whose sign depends on the BLAS kernel): either one-sided derivative is a
    # valid step there; everywhere else the step is Eq 3's
    kink = (s * W @ X[0]).abs() < 1e-12
    assert kink.any() and (~kink).any()
    assert torch.allclose(got[~kink], want[~kink], atol=1e-10)
    active = s * W - alpha * (2 * s) * y[0] * u.unsqueeze(-1) * X[0]
    for j in torch.nonzero(kink).ravel().tolist():
        assert torch.allclose(got[j], s * W[j], atol=1e-10) or torch.allclose(got[j], active[j], atol=1e-10)


def test_unlearn_cell_eps_d_is_4mn_phi():
    """Kills p001-eps-d-constant: the cell's ε_d = 4 m n φ̂ (spec D001-9) on fixture O's points tilted so
    that φ̂ > 0; φ̂ by a loop over pairs."""
    from flows.experiments import unlearn as exp
    from tasks.cells.train_kkt import RNG_BYTES
    from tasks.cells.unlearn import unlearn

    W, u, X, y = fixture_o(M, D, N, torch.Generator().manual_seed(0))
    X = X + 0.01 * torch.randn(X.shape, generator=torch.Generator().manual_seed(5))
    phi = max(abs(float(X[i] @ X[j])) for i in range(M) for j in range(M) if i != j)
    one = lambda x: torch.tensor([x])  # noqa: E731
    cell = dict({k: p.default for k, p in exp.P.items()}, unlearn_method="ga", forget=0, k=1, alpha=1.0, test_points=0,
                ref_retrain=False, store_nets=False)
    res = unlearn(W[None], torch.zeros(1, N), u[None], X[None], y[None], torch.ones(1, M, dtype=torch.bool),
                  one(D), one(M), one(N), torch.zeros(1, 2 * RNG_BYTES, dtype=torch.uint8), ["a"], [cell])[0]
    assert res["phi"] == pytest.approx(phi, rel=1e-12)
    assert res["eps_d"] == pytest.approx(4 * M * N * phi, rel=1e-12)


# ---- paper 002 -------------------------------------------------------------------------------------

def _net(E=1, k=5, d=4, seed=0):
    from tasks.nets import TwoLayer

    g = torch.Generator().manual_seed(seed)
    return TwoLayer(torch.randn(E, k, d, generator=g), torch.randn(E, k, generator=g),
                    torch.randn(E, k, generator=g))


def test_balance_error_by_hand():
    """Kills p002-balance-bias-sign: Σ_j |v_j² − ‖w_j‖² − b_j²| / ‖θ‖² (spec 002 §2.3)."""
    from tasks.kkt.theory import balance_error

    net = _net(E=2)
    for e in range(2):
        num = sum(abs(float(net.v[e, j] ** 2 - net.W[e, j] @ net.W[e, j] - net.b[e, j] ** 2)) for j in range(5))
        den = float(net.W[e].pow(2).sum() + net.b[e].pow(2).sum() + net.v[e].pow(2).sum())
        assert float(balance_error(net)[e]) == pytest.approx(num / den, rel=1e-12)


def test_theory_check_constants_by_hand():
    """Kills p002-eta1, p002-eta2-factor: App. C on the set I, p = max_{i≠j∈I} |⟨x_i,x_j⟩|,
    c = min(|I+|,|I−|)/|I|, c' = |I|(p+1)/(d+1), η1 = (p+1)/(d − |I|p),
    η2 = 2(cc'+1)(d+1)/(|I| c (d − |I|p)), z = (η1+η2) Σ_{l∈I} y_l x_l."""
    from tasks.kkt.theory import theory_check

    g = torch.Generator().manual_seed(2)
    d, m = 30, 6
    X = torch.randn(1, m, d, generator=g) / math.sqrt(d)
    y = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, 1.0]])
    I = torch.tensor([[True, True, True, False, True, False]])
    idx = [0, 1, 2, 4]
    p = max(abs(float(X[0, i] @ X[0, j])) for i in idx for j in idx if i != j)
    nI, c = 4, 1 / 4
    cp = nI * (p + 1) / (d + 1)
    eta1 = (p + 1) / (d - nI * p)
    eta2 = 2 * (c * cp + 1) * (d + 1) / (nI * c * (d - nI * p))
    z = (eta1 + eta2) * sum(float(y[0, i]) * X[0, i] for i in idx)
    t = theory_check(_net(d=d, k=8), X, y, I)
    assert float(t.p) == pytest.approx(p, rel=1e-12) and float(t.c_prime) == pytest.approx(cp, rel=1e-12)
    assert float(t.eta1) == pytest.approx(eta1, rel=1e-12) and float(t.eta2) == pytest.approx(eta2, rel=1e-12)
    assert float(t.z_norm) == pytest.approx(float(z.norm()), rel=1e-12)


def test_normalized_margin_and_margin_direction_by_hand():
    """Kills p002-normalized-margin, p002-margin-direction: γ = min_i q_i/‖θ‖² over the valid points;
    the margin direction is Σ_{l∈I} y_l x_l / ‖·‖ (points outside I left out)."""
    from tasks.attacks.directions import margin_direction
    from tasks.kkt.margins import margins, normalized_margin

    net = _net(d=4)
    g = torch.Generator().manual_seed(4)
    X = torch.randn(1, 5, 4, generator=g)
    y = torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0]])
    valid = torch.tensor([[True, True, False, True, True]])
    q = margins(net, X, y)
    want = min(float(q[0, i]) for i in range(5) if valid[0, i]) / float(net.sq_norm()[0])
    assert float(normalized_margin(net, q, valid)[0]) == pytest.approx(want, rel=1e-12)
    s = sum(float(y[0, i]) * X[0, i] for i in range(5) if valid[0, i])
    assert torch.allclose(margin_direction(net, X, y, valid)[0], s / s.norm(), atol=1e-13)


# ---- paper 003 -------------------------------------------------------------------------------------

def test_t_lin_is_abs_f_over_squared_input_gradient_norm():
    """Kills p003-t-lin: t_lin = |f(x)|/‖∇_x f(x)‖² (spec 003 §2.7), the gradient by autograd; on a net
    with one active neuron along the ray the exact step t* equals t_lin (h is linear there)."""
    from tasks.attacks.single_step import single_step_exact

    net = _net(E=2, k=6, d=5, seed=7)
    X = torch.randn(2, 9, 5, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
    f = net(X)
    (gx,) = torch.autograd.grad(f.sum(), X)
    r = single_step_exact(net, X.detach())
    assert torch.allclose(r.t_lin, f.detach().abs() / gx.pow(2).sum(-1), rtol=1e-10)
    from tasks.nets import TwoLayer

    one = TwoLayer(torch.tensor([[[3.0, 4.0]]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]))
    x = torch.tensor([[[1.0, 1.0]]])  # f = 2(7.5) = 15, ∇f = 2(3, 4), ‖∇f‖² = 100
    r1 = single_step_exact(one, x)
    assert float(r1.t_lin) == pytest.approx(0.15, rel=1e-12) and float(r1.t_star) == pytest.approx(0.15, rel=1e-9)


def test_deepfool_on_one_neuron_overshoots_the_exact_boundary_distance():
    """Kills p003-deepfool-overshoot: on f = relu(w·x + b) − relu(−w·x − b) = w·x + b (linear) DeepFool's
    first step reaches the boundary exactly, distance |f|/‖∇f‖ = (w·x + b)/‖w‖ = 7.5/5, and the
    perturbation returned is (1 + overshoot) times that step."""
    from tasks.attacks.deepfool import deepfool
    from tasks.nets import TwoLayer

    net = TwoLayer(torch.tensor([[[3.0, 4.0], [-3.0, -4.0]]]), torch.tensor([[0.5, -0.5]]), torch.tensor([[1.0, -1.0]]))
    x = torch.tensor([[[1.0, 1.0]]])
    r = deepfool(net, x, overshoot=0.02)
    assert float(r.norm) == pytest.approx(1.02 * 7.5 / 5.0, rel=1e-9)
    assert torch.allclose(r.delta[0, 0], -1.02 * 7.5 / 5.0 * torch.tensor([0.6, 0.8]), atol=1e-9)


def test_c0_reached_and_logistic_dloss_by_hand():
    """Kills p003-c0-reached, p003-logistic-dloss: C0 = √m max_s ‖u_s‖ (spec 003 §2.3);
    ℓ'(z) for ℓ(z) = softplus(−z) by autograd (§2.4)."""
    from tasks.nets.lazy import deviation_C0, logistic_dloss

    U = torch.tensor([[[3.0, 4.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]])
    assert float(deviation_C0(U)[0]) == pytest.approx(math.sqrt(4) * 5.0, rel=1e-12)
    z = torch.linspace(-6, 6, 9, requires_grad=True)
    (dl,) = torch.autograd.grad(torch.nn.functional.softplus(-z).sum(), z)
    assert torch.allclose(logistic_dloss(z.detach()), dl, atol=1e-14)


# ---- paper 004 -------------------------------------------------------------------------------------

def _small_004(seed=0, k=5, d=3, n=4):
    g = torch.Generator().manual_seed(seed)
    W, b, v = torch.randn(k, d, generator=g), torch.randn(k, generator=g), torch.randn(k, generator=g)
    X = torch.randn(n, d, generator=g)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0])
    lam = torch.rand(n, generator=g) + 0.1
    nu = torch.randn(d, generator=g)
    return W, b, v, X, y, lam, nu / nu.norm()


def test_b8_gamma_and_thm9_bound_by_hand():
    """Kills p004-b8-drops-eps, p004-gamma-abs, p004-thm9-drops-eps: B8(i) = min_j |z_j(x_i)| /
    (ε + γ|v_j|Σλ), γ = max_i |⟨x_i, ν⟩| (Thm 8 Eq 7), and Thm 9's ΔΦ bound α Σ_j |v_j|(ε + γ|v_j|Σλ),
    with a ν whose largest projection is negative."""
    from tasks.reconstruct.bounds import b8, gamma, thm9

    W, b, v, X, y, lam, _ = _small_004()
    nu = -X[0] / X[0].norm()  # ⟨x_0, ν⟩ = −‖x_0‖
    gam = max(abs(float(X[i] @ nu)) for i in range(4))
    assert float(gamma(X, nu)) == pytest.approx(gam, rel=1e-12)
    eps = 0.7
    want = [min(abs(float(W[j] @ X[i] + b[j])) / (eps + gam * abs(float(v[j])) * float(lam.sum())) for j in range(5))
            for i in range(4)]
    assert torch.allclose(b8(W, b, v, X, lam, nu, eps), torch.tensor(want), rtol=1e-12)
    t = thm9(W, b, v, X, y, lam, 1, nu, 1e-4, 1e-4, eps)
    per = sum(abs(float(v[j])) * (eps + gam * abs(float(v[j])) * float(lam.sum())) for j in range(5))
    assert t.dphi_bound == pytest.approx(1e-4 * per, rel=1e-12)


def test_eps_star_equals_scipy_nnls_on_the_explicit_jacobian():
    """Kills p004-euler-factor: ε* = min_{λ≥0} ‖θ − Σ λ_i y_i ∇_θΦ(x_i)‖ (spec 004 §2.3) by scipy's
    nnls on the autograd Jacobian."""
    import numpy as np
    from scipy.optimize import nnls

    from tasks.reconstruct.bounds import eps_star

    W, b, v, X, y, _, _ = _small_004(seed=1)
    theta = torch.cat([W.flatten(), b, v]).requires_grad_(True)
    cols = []
    for i in range(4):
        Wt, bt, vt = theta[:15].view(5, 3), theta[15:20], theta[20:]
        (gi,) = torch.autograd.grad(y[i] * (torch.relu(Wt @ X[i] + bt) @ vt), theta)
        cols.append(gi.numpy())
    _, res = nnls(np.stack(cols, 1), theta.detach().numpy())
    e, lam = eps_star(W, b, v, X, y)
    assert float(e) == pytest.approx(res, rel=1e-6, abs=1e-10)


def test_haim_objective_equals_autograd_residual():
    """Kills p004-haim-scale, p004-lam-min-penalty: Haim's objective (spec 004 §2.4) = ‖θ − Σ_i (λ_i/l)
    y'_i ∇_θΦ(x'_i)‖² (autograd gradients, exact step) + 5 Σ relu(λ_min − λ_i)²."""
    from tasks.reconstruct.objective import haim

    W, b, v, _, _, _, _ = _small_004(seed=2)
    g = torch.Generator().manual_seed(9)
    l = 4
    Xc = torch.randn(l, 3, generator=g)
    yc = torch.tensor([-1.0, -1.0, 1.0, 1.0])
    lam = torch.tensor([0.5, 0.01, 1.5, -0.2])
    lam_min = 0.05
    theta = torch.cat([W.flatten(), b, v]).requires_grad_(True)
    R = theta.detach().clone()
    for i in range(l):
        Wt, bt, vt = theta[:15].view(5, 3), theta[15:20], theta[20:]
        (gi,) = torch.autograd.grad(torch.relu(Wt @ Xc[i] + bt) @ vt, theta)
        R -= float(lam[i] / l * yc[i]) * gi
    want = float(R.pow(2).sum()) + 5 * sum(max(lam_min - float(x), 0.0) ** 2 for x in lam)
    got = haim(W[None], b[None], v[None], Xc[None], yc[None], lam[None], alpha=None, lam_min=torch.tensor([lam_min]),
               box=False)
    assert float(got[0]) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("k", [1, 2])
def test_sequential_ga_is_scaled_by_alpha(fix_o, k):
    """Kills p001-sequential-ga-ignores-alpha: spec F001-4, each of the k sequential steps is
    θ ← θ − α λ_r y_r ∇N(x_r; θ): α = 0 returns θ, and with one point (k = 1) every α equals the
    single GA step (Eq 3); with k = 2 on fixture O (orthonormal points of opposite labels, so the
    second step's gradient is taken where the first step left the pattern of x_2 unchanged) it equals
    k-GA's simultaneous step."""
    from tasks.unlearn import METHODS

    W, u, X, y = fix_o
    r = kkt_measure(W, u, X, y)
    lam = r.lam / r.c.unsqueeze(-1)
    forget = torch.zeros(1, 1, M, dtype=torch.bool)
    forget[0, 0, 2:2 + k] = True
    alphas = torch.tensor([0.0, 0.3, 1.0, 1.4])
    seq = METHODS["sequential_ga"](W, u, X, y, lam, forget, alphas)
    sim = METHODS["k_ga"](W, u, X, y, lam, forget, alphas)
    assert torch.allclose(seq[0, 0, 0], W[0], atol=0)
    assert not torch.allclose(seq[0, 0, 2], W[0], atol=1e-3)
    assert torch.allclose(seq, sim, atol=1e-12)
