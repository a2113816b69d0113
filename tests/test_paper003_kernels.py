"""Paper 003 kernels (spec 003 §5.3 CI property tests 1-8 and 10): closed-form gradients, Monte
Carlo identities at init, projections, exact single step vs bisection, homogeneity, lazy SGD exit
and shared-trajectory snapshots, PGD ball and monotonicity, the B.4 check, the gradient slope.
Synthetic unit-sphere data with a planted teacher; float64."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.attacks import deepfool, get_attack, pgd_l2, single_step_bisect, single_step_exact
from tasks.nets import TwoLayer
from tasks.nets.lazy import cone_C0, deviation_C0, init_lazy, input_grad, project_ball, project_rows, weight_grad
from tasks.train import lazy_sgd, projected_adv_train


def lazy_stack(E: int, d: int, m: int, *, bias: bool = False, seed: int = 0, dev: float = 0.0) -> tuple[TwoLayer, torch.Tensor]:
    """E nets at init (optionally moved by a random deviation of size dev/√m per neuron) and W0."""
    parts = [init_lazy(d, m, torch.Generator().manual_seed(seed + e), bias=bias) for e in range(E)]
    W0, v, b = (torch.stack(t) for t in zip(*parts))
    U = torch.randn(W0.shape, generator=torch.Generator().manual_seed(seed + 99), dtype=torch.float64)
    U = U / U.norm(dim=-1, keepdim=True) * dev / math.sqrt(m)
    return TwoLayer(W0 + U, b, v), W0


def sphere(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X = X / X.norm(dim=1, keepdim=True)
    teacher = torch.randn(d, generator=g, dtype=torch.float64)
    return X, torch.sign(X @ teacher)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_T1_closed_form_gradients_match_autograd(bias):
    net, _ = lazy_stack(3, 12, 40, bias=bias, dev=5.0)
    X = sphere(7, 12)[0].unsqueeze(0).expand(3, -1, -1).clone().requires_grad_(True)
    f, g = input_grad(net, X)
    (ga,) = torch.autograd.grad(net(X).sum(), X)
    torch.testing.assert_close(g, ga, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f, net(X).detach(), rtol=1e-12, atol=1e-12)
    W = net.W.clone().requires_grad_(True)
    b = net.b.clone().requires_grad_(True)
    c = torch.randn(3, 7, dtype=torch.float64)
    (gW, gb) = torch.autograd.grad((TwoLayer(W, b, net.v)(X.detach()) * c).sum(), (W, b))
    cW, cb = weight_grad(net, X.detach(), c)
    torch.testing.assert_close(cW, gW, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cb, gb, rtol=1e-12, atol=1e-12)


def test_T2_monte_carlo_identities_at_init():
    """E||∇f(x;W0)||² = d/2 and Var f(x;W0) = ||x||²/2 over the init (3 standard errors)."""
    d, m, E = 20, 200, 400
    net, _ = lazy_stack(E, d, m)
    x = torch.full((E, 1, d), 0.7, dtype=torch.float64)  # ||x||² = 9.8
    f, g = input_grad(net, x)
    g2 = g.pow(2).sum(-1).flatten()
    assert abs(g2.mean() - d / 2) < 3 * g2.std() / math.sqrt(E)
    var, se = f.flatten().pow(2).mean(), f.flatten().pow(2).std() / math.sqrt(E)
    assert abs(var - 9.8 / 2) < 3 * se


def test_T3_projections_idempotent_in_ball_identity_inside_columnwise():
    g = torch.Generator().manual_seed(3)
    U = torch.randn(2, 30, 5, generator=g, dtype=torch.float64)
    V = torch.tensor([0.5, 3.0], dtype=torch.float64)
    P = project_ball(U, V)
    assert (P.norm(dim=-1) <= V[:, None] * (1 + 1e-12)).all()
    torch.testing.assert_close(project_ball(P, V), P, rtol=0, atol=1e-15)
    inside = U.norm(dim=-1) <= V[:, None]
    torch.testing.assert_close(P[inside], U[inside], rtol=0, atol=0)
    cos = torch.nn.functional.cosine_similarity(P, U, dim=-1)  # each neuron only rescaled
    torch.testing.assert_close(cos, torch.ones_like(cos), rtol=0, atol=1e-12)
    X = torch.randn(2, 9, 5, generator=g, dtype=torch.float64)
    Xt = X + torch.randn(2, 9, 5, generator=g, dtype=torch.float64)
    Q = project_rows(Xt, X, V)
    assert ((Q - X).norm(dim=-1) <= V[:, None] * (1 + 1e-12)).all()
    torch.testing.assert_close(project_rows(Q, X, V), Q, rtol=0, atol=1e-14)


@pytest.mark.parametrize("d,bias", [(25, False), (196, False), (64, True)], ids=["d25", "d196", "d64-bias"])
def test_T4_exact_step_agrees_with_bisection_and_flips_exactly(d, bias):
    net, _ = lazy_stack(2, d, 300, bias=bias, dev=10.0)
    X = sphere(40, d, seed=d)[0].unsqueeze(0).expand(2, -1, -1).contiguous()
    ex = single_step_exact(net, X, chunk=16)
    bi = single_step_bisect(net, X)
    assert torch.isfinite(ex.t_star).all()
    torch.testing.assert_close(ex.t_star, bi.t_star, rtol=1e-6, atol=0)
    s = torch.sign(ex.f)
    u = -s.unsqueeze(-1) * input_grad(net, X)[1]
    after = s * net(X + ((1 + 1e-6) * ex.t_star).unsqueeze(-1) * u)
    assert (after < 0).all()
    grid = torch.linspace(0, 1 - 1e-6, 100, dtype=torch.float64)
    before = torch.stack([s * net(X + (c * ex.t_star).unsqueeze(-1) * u) for c in grid])
    assert (before > 0).all()


def test_T5_homogeneity_without_bias():
    net, _ = lazy_stack(2, 49, 200, dev=10.0)
    X = sphere(30, 49)[0].unsqueeze(0).expand(2, -1, -1).contiguous()
    a = single_step_exact(net, X)
    b = single_step_exact(net, 3.5 * X)
    torch.testing.assert_close(b.t_star, 3.5 * a.t_star, rtol=1e-9, atol=0)
    rel = lambda r, s: r.t_star * r.gnorm / (s * X).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(rel(b, 3.5), rel(a, 1.0), rtol=1e-9, atol=0)


def test_T6_lazy_sgd_exits_at_the_ball_and_shared_snapshots_equal_separate_runs():
    d, m, E = 16, 64, 3
    parts = [init_lazy(d, m, torch.Generator().manual_seed(e), bias=True) for e in range(E)]
    W0, v, b0 = (torch.stack(t) for t in zip(*parts))
    X, y = sphere(200, d)
    gens = lambda: [torch.Generator().manual_seed(50 + e) for e in range(E)]  # noqa: E731
    C0s = [1.0, 2.0, 3.0]
    run = lazy_sgd(W0, v, b0, X, y, C0s, gens(), lr=0.5, batch_size=16, max_steps=3000)
    assert run.exited.all()
    for j, c0 in enumerate(C0s):
        assert (deviation_C0(run.U[:, j]) <= c0).all()
        one = lazy_sgd(W0, v, b0, X, y, [c0], gens(), lr=0.5, batch_size=16, max_steps=3000)
        assert torch.equal(one.U[:, 0], run.U[:, j]) and torch.equal(one.b[:, 0], run.b[:, j])
        assert torch.equal(one.steps[:, 0], run.steps[:, j])
        # the step after the snapshot leaves the ball: replay it with one more step allowed
        more = lazy_sgd(W0, v, b0, X, y, [1e9], gens(), lr=0.5, batch_size=16, max_steps=int(run.steps[0, j]) + 1)
        assert float(deviation_C0(more.U[:1, 0])) > c0
    assert (run.steps[:, 0] < run.steps[:, 1]).all() and (run.steps[:, 1] < run.steps[:, 2]).all()
    capped = lazy_sgd(W0, v, b0, X, y, [1e9], gens(), lr=0.5, batch_size=16, max_steps=5)
    assert not capped.exited.any() and (capped.steps == 5).all()


def test_T7_pgd_stays_in_ball_and_rta_monotone_in_R():
    d, m = 25, 128
    net, _ = lazy_stack(2, d, m, dev=5.0)
    X, _ = sphere(100, d, seed=7)
    y = torch.sign(net(X.unsqueeze(0).expand(2, -1, -1)))  # the nets' own labels: clean acc 1
    clean = (y * net(X.unsqueeze(0).expand(2, -1, -1)) > 0).double().mean(1)
    rtas = []
    for R in [0.0, 0.05, 0.1, 0.2, 0.4]:
        res = pgd_l2(net, X, y, torch.full((2,), R, dtype=torch.float64), steps=30)
        assert ((res.x_adv - X).norm(dim=-1) <= R * (1 + 1e-6) + 1e-15).all()
        assert (res.robust_strict <= res.robust).all()
        rtas.append(res.robust.double().mean(1))
    rtas = torch.stack(rtas)
    assert (rtas <= clean + 1e-12).all()
    assert (rtas[1:] <= rtas[:-1] + 1 / 100 + 1e-12).all()
    assert (rtas[-1] < rtas[0]).all()


def test_T8_B4_margin_set_at_init():
    """mean_s 1[|w_{s,0}·x| <= V] ≈ 2Φ(V) - 1 for unit x (Lemma B.4's superset)."""
    d, m, V = 30, 20000, 0.3
    _, W0 = lazy_stack(1, d, m)
    x = sphere(5, d)[0]
    frac = ((x @ W0[0].T).abs() <= V).double().mean(1)
    expect = math.erf(V / math.sqrt(2))
    se = math.sqrt(expect * (1 - expect) / m)
    assert ((frac - expect).abs() < 4 * se).all()


def test_T10_gradient_norm_slope_on_random_nets():
    ds = [16, 64, 256]
    norms = []
    for d in ds:
        net, _ = lazy_stack(4, d, 2000, seed=d)
        x = sphere(20, d)[0].unsqueeze(0).expand(4, -1, -1)
        norms.append(input_grad(net, x)[1].norm(dim=-1).mean())
    lx, ly = torch.log(torch.tensor(ds, dtype=torch.float64)), torch.log(torch.stack(norms))
    slope = float(((lx - lx.mean()) * (ly - ly.mean())).sum() / (lx - lx.mean()).pow(2).sum())
    assert 0.45 <= slope <= 0.55


def test_projected_adv_train_stays_in_ball_and_returns_best_iterate():
    d, m, E = 16, 32, 2
    parts = [init_lazy(d, m, torch.Generator().manual_seed(e), bias=False) for e in range(E)]
    W0, v, b = (torch.stack(t) for t in zip(*parts))
    X, y = sphere(96, d, seed=4)
    V = torch.tensor([0.2, 2.0], dtype=torch.float64)
    R = torch.tensor([0.05, 0.05], dtype=torch.float64)
    run = projected_adv_train(W0, v, b, X, y, V, R, [torch.Generator().manual_seed(e) for e in range(E)],
                              T1_max=6, T2=10, batch_size=32, patience=2, beta=1.0)
    assert (run.U.norm(dim=-1) <= V[:, None] * (1 + 1e-12)).all()
    hist = run.hist
    best = torch.nan_to_num(hist, nan=-1.0).amax(1)
    torch.testing.assert_close(run.rta_train, best)
    assert run.rta_train[1] > 0.8 and run.rta_train[1] > run.rta_train[0]  # a wider ball allows more robustness
    assert int(run.best_epoch[1]) == 5  # still improving at round T1_max: the last iterate measured


def test_cone_C0_is_at_most_the_ball_C0_and_scale_invariant():
    net, W0 = lazy_stack(2, 10, 50, dev=3.0)
    c = cone_C0(net.W, W0)
    assert (c <= deviation_C0(net.W - W0) + 1e-9).all()
    torch.testing.assert_close(cone_C0(2.0 * net.W, W0), c, rtol=1e-6, atol=1e-9)


def test_deepfool_flips_no_further_than_needed_and_unknown_attack_is_named():
    net, _ = lazy_stack(2, 36, 200, dev=5.0)
    X = sphere(30, 36)[0].unsqueeze(0).expand(2, -1, -1).contiguous()
    df = deepfool(net, X)
    ex = single_step_exact(net, X)
    assert torch.isfinite(df.norm).all()
    assert (df.norm <= 1.5 * ex.t_star * ex.gnorm).all()
    with pytest.raises(ValueError, match="unknown attack 'fgsm'; allowed:"):
        get_attack("fgsm")
    with pytest.raises(ValueError, match="budget R must be >= 0"):
        pgd_l2(net, X, torch.sign(net(X)), torch.tensor([-0.1, 0.1], dtype=torch.float64))


@pytest.mark.requires_gpu
def test_gpu_fp32_kernels_match_fp64_cpu_oracle_on_8_models():
    net, W0 = lazy_stack(8, 196, 2000, dev=10.0)
    X = sphere(64, 196)[0].unsqueeze(0).expand(8, -1, -1).contiguous()
    torch.backends.cuda.matmul.allow_tf32 = False  # spec 003 §6 #25
    gpu = TwoLayer(*(t.cuda().float() for t in (net.W, net.b, net.v)))
    ref = single_step_exact(net, X)
    got = single_step_exact(gpu, X.cuda().float())
    ok = (ref.t_star - got.t_star.double().cpu()).abs() <= 1e-3 * ref.t_star
    assert ok.double().mean() >= 0.99  # fp32 pre-activations: rare breakpoint reorderings
    torch.testing.assert_close(got.gnorm.double().cpu(), ref.gnorm, rtol=1e-4, atol=0)
    R = torch.full((8,), 0.1, dtype=torch.float64)
    y = torch.sign(net(X))
    a = pgd_l2(net, X, y, R, steps=20)
    b = pgd_l2(gpu, X.cuda().float(), y.cuda().float(), R.cuda().float(), steps=20)
    assert (a.robust != b.robust.cpu()).double().mean() <= 1 / 64


@pytest.mark.requires_gpu
def test_gpu_stacked_lazy_sgd_equals_per_model_runs():
    d, m, E = 64, 512, 4
    parts = [init_lazy(d, m, torch.Generator().manual_seed(e), bias=False, device="cuda") for e in range(E)]
    W0, v, b0 = (torch.stack(t) for t in zip(*parts))
    X, y = sphere(256, d)
    X, y = X.cuda(), y.cuda()
    gens = lambda: [torch.Generator().manual_seed(7 + e) for e in range(E)]  # noqa: E731
    run = lazy_sgd(W0, v, b0, X, y, [2.0], gens(), lr=0.5, batch_size=32, max_steps=2000, train_bias=False)
    for e in range(E):
        one = lazy_sgd(W0[e:e + 1], v[e:e + 1], b0[e:e + 1], X, y, [2.0], [gens()[e]], lr=0.5, batch_size=32,
                       max_steps=2000, train_bias=False)
        assert int(one.steps[0, 0]) == int(run.steps[e, 0])
        torch.testing.assert_close(one.U[0], run.U[e], rtol=1e-10, atol=1e-12)
