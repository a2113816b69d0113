"""Exact c* (spec 002 §2.9) vs bisection and brute force; Thm 3.1 robust net; toy example §2.12."""

import math

import pytest
import torch

from tasks import attacks, data, kkt, nets, train
from tasks.cells import nonrobust

F64 = torch.float64


@pytest.fixture(scope="module")
def trained():
    net, X, y = data.synthetic_stack(range(4), d=16, m=24, k=32)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-10, max_iters=6000))
    assert (st.status == train.CONVERGED).all()
    return st.net, X, y


def one_d_net(w, b, v) -> nets.TwoLayer:
    """A 1-D net N(u) = Σ_j v_j relu(w_j u + b_j) as a stack of one (d = 1)."""
    return nets.TwoLayer(torch.tensor(w, dtype=F64).view(1, -1, 1), torch.tensor([b], dtype=F64),
                         torch.tensor([v], dtype=F64))


def along_u(net, x0=0.0):
    """One positive sample at u = x0 and ẑ = -1, so x - y c ẑ = x0 + c: f(c) = N(x0 + c)."""
    X = torch.tensor([[[x0]]], dtype=F64)
    y = torch.ones(1, 1, dtype=F64)
    return X, y, torch.ones_like(y, dtype=torch.bool), -torch.ones(1, 1, dtype=F64)


@pytest.mark.parametrize("w, b, v, c_true", [
    pytest.param([1.0, 2.0], [2.0, 0.1], [1.0, -1.0], 1.9, id="never-toggling-neurons-1.9-u"),
    pytest.param([-1.0, 1.0], [1.0, -2.0], [1.0, -1.0], 2.0, id="zero-plateau-then-negative"),
    pytest.param([-1.0], [1.0], [1.0], math.inf, id="reaches-zero-never-negative"),
    pytest.param([1.0], [-1.0], [-1.0], 1.0, id="zero-until-1-then-negative"),
    pytest.param([1.0, 1.0], [0.0, -3.0], [-1.0, 2.0], 0.0, id="negative-from-0+"),
])
def test_c_star_exact_hand_cases(w, b, v, c_true):
    """f(c) = Σ v_j relu(w_j c + b_j): c* = inf{c > 0 : f(c) < 0} (strict), r = c* for one sample."""
    net = one_d_net(w, b, v)
    X, y, I, z = along_u(net)
    exact = attacks.c_star_exact(net, X, y, I, z)
    assert float(exact.c_star[0]) == pytest.approx(c_true, abs=1e-12)
    assert float(exact.r[0, 0]) == pytest.approx(c_true, abs=1e-12)
    bis = attacks.c_star_bisection(net, X, y, I, z, cap=torch.tensor([10.0], dtype=F64), scan=1000)
    assert float(bis[0]) == pytest.approx(c_true, abs=1e-9)


def random_stack(seed: int, E: int, d: int, k: int, m: int, bias: bool, margin: str, quantized: bool = False):
    """E untrained random nets with Gaussian weights (v of both signs), data, a random unit ẑ and a
    sample set I: the correctly classified points ("correct") or a random subset ("subset"),
    never empty. ``quantized`` rounds every number to a multiple of 1/2 (exact ties, zero plateaus)."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        t = torch.randn(*shape, generator=g, dtype=F64)
        return (2 * t).round() / 2 if quantized else t

    W, v, X = draw(E, k, d), draw(E, k), draw(E, m, d)
    b = draw(E, k) if bias else torch.zeros(E, k, dtype=F64)
    y = torch.where(torch.rand(E, m, generator=g) < 0.5, -1.0, 1.0).to(F64)
    z = draw(E, d)
    z = torch.where(z.norm(dim=1, keepdim=True) > 0, z, torch.ones_like(z))
    z = z / z.norm(dim=1, keepdim=True)
    net = nets.TwoLayer(W, b, v)
    if margin == "correct":
        I = y * net(X) > 0
    else:
        I = torch.rand(E, m, generator=g) < 0.6
    I[~I.any(1), 0] = True
    return net, X, y, I, z


RANDOM_CASES = [
    pytest.param(dict(seed=0, d=1, k=3, m=2, bias=True, margin="correct"), id="d1-k3-m2-bias-correct"),
    pytest.param(dict(seed=1, d=2, k=6, m=4, bias=True, margin="subset"), id="d2-k6-m4-bias-subset"),
    pytest.param(dict(seed=2, d=3, k=10, m=6, bias=False, margin="correct"), id="d3-k10-m6-nobias-correct"),
    pytest.param(dict(seed=3, d=5, k=16, m=8, bias=True, margin="correct"), id="d5-k16-m8-bias-correct"),
    pytest.param(dict(seed=4, d=4, k=8, m=5, bias=False, margin="subset"), id="d4-k8-m5-nobias-subset"),
    pytest.param(dict(seed=5, d=2, k=12, m=3, bias=True, margin="correct", quantized=True), id="d2-k12-m3-quantized"),
]


@pytest.mark.parametrize("case", RANDOM_CASES)
def test_c_star_exact_equals_brute_force_on_random_nets(case):
    """Property test, 50 random untrained nets per case: exact c* == brute-force scan + bisection."""
    net, X, y, I, z = random_stack(E=50, **case)
    cap = torch.full((50,), 20 * math.sqrt(case["d"]), dtype=F64)
    exact = attacks.c_star_exact(net, X, y, I, z, cap=cap).c_star
    brute = attacks.c_star_bisection(net, X, y, I, z, cap=cap, scan=10000)
    bad = ~(torch.isclose(exact, brute, rtol=1e-9, atol=1e-9) | (torch.isinf(exact) & torch.isinf(brute)))
    assert not bad.any(), (f"{int(bad.sum())}/50 nets disagree: nets {bad.nonzero().flatten().tolist()}, "
                           f"exact {exact[bad].tolist()}, brute force {brute[bad].tolist()}")


@pytest.mark.parametrize("case", RANDOM_CASES[:3])
def test_first_roots_equal_brute_force_on_random_nets(case):
    """r_i = inf{c > 0 : f_i(c) < 0} per sample: c* of I = {i} by brute force, every sample of 50 nets."""
    net, X, y, _, z = random_stack(E=50, **case)
    m = X.shape[1]
    r = attacks.first_roots(net, X, y, z)
    rep = torch.arange(50).repeat_interleave(m)
    one = torch.eye(m, dtype=torch.bool).repeat(50, 1)
    cap = torch.full((50 * m,), 20 * math.sqrt(case["d"]), dtype=F64)
    brute = attacks.c_star_bisection(net.select(rep), X[rep], y[rep], one, z[rep], cap=cap, scan=5000).view(50, m)
    r = torch.where(r <= cap.view(50, m), r, torch.full_like(r, math.inf))
    bad = ~(torch.isclose(r, brute, rtol=1e-9, atol=1e-9) | (torch.isinf(r) & torch.isinf(brute)))
    assert not bad.any(), f"{int(bad.sum())}/{50 * m} roots disagree: exact {r[bad].tolist()}, brute {brute[bad].tolist()}"


@pytest.mark.parametrize("scan", [0, 4000], ids=["doubling", "scan"])
@pytest.mark.parametrize("direction", sorted(attacks.DIRECTIONS))
def test_exact_c_star_equals_bisection_on_trained_nets(trained, direction, scan):
    net, X, y = trained
    valid = torch.ones_like(y, dtype=torch.bool)
    I = kkt.margin_set(y * net(X), valid)
    gens = [torch.Generator().manual_seed(i) for i in range(X.shape[0])]
    z = attacks.DIRECTIONS[direction](net, X, y, I, gens)
    cap = torch.full((4,), 20 * math.sqrt(X.shape[2]), dtype=F64)
    exact = attacks.c_star_exact(net, X, y, I, z, cap=cap)
    brute = attacks.c_star_bisection(net, X, y, I, z, cap=cap, scan=scan)
    finite = torch.isfinite(brute)
    assert torch.equal(finite, torch.isfinite(exact.c_star))
    torch.testing.assert_close(exact.c_star[finite], brute[finite], rtol=0, atol=1e-9)


def test_first_roots_match_dense_scan(trained):
    """r_i is the first c with f_i(c) < 0: f_i >= 0 on a fine grid before r_i, < 0 just after."""
    net, X, y = trained
    I = torch.ones_like(y, dtype=torch.bool)
    z = attacks.margin_direction(net, X, y, I)
    r = attacks.first_roots(net, X, y, z)[:2, :5]  # (2, 5) samples
    assert torch.isfinite(r).all()
    grid = torch.linspace(0, 1 - 1e-6, 2001, dtype=F64)
    cs = r.unsqueeze(-1) * grid  # (2, 5, G)
    Xs = X[:2, :5].unsqueeze(2).expand(-1, -1, len(grid), -1).reshape(2, -1, X.shape[2])
    ys = y[:2, :5].unsqueeze(2).expand(-1, -1, len(grid)).reshape(2, -1)
    before = attacks.f_along(net.select([0, 1]), Xs, ys, z[:2], cs.reshape(2, -1))
    assert (before >= 0).all()
    after = attacks.f_along(net.select([0, 1]), X[:2, :5], y[:2, :5], z[:2], r * (1 + 1e-9) + 1e-12)
    assert (after < 0).all()


def test_robust_net_of_theorem_3_1():
    """Thm 3.1 (spec §3 checks a, b): margins exactly 1; no flip below the certified radius."""
    d, m = 200, 8
    g = data.seed_streams(3, (d, m))
    X, y = data.synthetic("sphere", m, d, g)
    Xs, ys = X.unsqueeze(0), y.unsqueeze(0)
    net, rho = nets.robust_net(Xs, ys)
    rho = float(rho[0])
    H = net.pre(Xs)[0]
    torch.testing.assert_close(torch.diagonal(H), torch.ones(m, dtype=torch.float64), rtol=0, atol=1e-9)
    off = H - torch.diag(torch.diagonal(H)) - 10 * torch.eye(m, dtype=torch.float64)
    assert float(off.max()) <= -1 + 1e-9
    torch.testing.assert_close(net(Xs)[0], y, rtol=0, atol=1e-9)
    radius = (1 - rho) * math.sqrt(d) / 2
    gen = torch.Generator().manual_seed(0)
    n_dir = 21  # the margin direction and 20 random ones, as a stack of copies of the net
    Xr, yr = Xs.expand(n_dir, -1, -1), ys.expand(n_dir, -1)
    I = torch.ones_like(yr, dtype=torch.bool)
    z = torch.cat([attacks.margin_direction(net, Xs, ys, I[:1]),
                   attacks.random_direction(net, Xr[1:], yr[1:], I[1:], [gen] * (n_dir - 1))])
    r = attacks.first_roots(net.select([0] * n_dir), Xr, yr, z)
    assert float(r.min()) >= radius - 1e-9


def test_toy_example_section_5_1():
    """Sec. 5.1: the non-robust N' flips every positive x_i with ||z|| = 2√2."""
    d = 10
    X = math.sqrt(d) * torch.eye(d, dtype=torch.float64)
    y = torch.tensor([1.0] * (d // 2) + [-1.0] * (d // 2), dtype=torch.float64)
    net = nets.TwoLayer((X / d).unsqueeze(0), torch.zeros(1, d, dtype=torch.float64), y.unsqueeze(0).clone())
    torch.testing.assert_close(y * net(X.unsqueeze(0))[0], torch.ones(d, dtype=torch.float64))
    z = (4 / d) * X[d // 2:].sum(0)
    assert abs(float(z.norm()) - 2 * math.sqrt(2)) < 1e-12
    out = net((X[: d // 2] + z).unsqueeze(0))[0]
    torch.testing.assert_close(out, -torch.ones(d // 2, dtype=torch.float64))


def test_nonmonotone_case_falls_back_to_exact_scan():
    """Samples whose f_i dips below 0 and comes back: c* != max_i r_i, the exact scan finds it.

    Along u = x + c: f(u) = relu(1-u) - 3relu(u-1) + 6relu(u-1.5) - 6relu(u-3.5) is negative on
    (1, 2) and (5, inf). Sample A (x=0) and B (x=-2.5) are both negative first at c = 7.5.
    """
    W = torch.tensor([[[-1.0], [1.0], [1.0], [1.0]]], dtype=torch.float64)
    b = torch.tensor([[1.0, -1.0, -1.5, -3.5]], dtype=torch.float64)
    v = torch.tensor([[1.0, -3.0, 6.0, -6.0]], dtype=torch.float64)
    net = nets.TwoLayer(W, b, v)
    X = torch.tensor([[[0.0], [-2.5]]], dtype=torch.float64)
    y = torch.ones(1, 2, dtype=torch.float64)
    I = torch.ones_like(y, dtype=torch.bool)
    z = -torch.ones(1, 1, dtype=torch.float64)  # x - y c z = x + c
    exact = attacks.c_star_exact(net, X, y, I, z)
    torch.testing.assert_close(exact.r, torch.tensor([[1.0, 3.5]], dtype=torch.float64))
    assert not bool(exact.simultaneous_at_c0[0])
    assert abs(float(exact.c_star[0]) - 7.5) < 1e-12


def test_misclassified_point_leaves_margin_set_and_c_star_defined(trained):
    """Spec 002 A14 (issue 11, defect 1): one misclassified training point must not empty the
    margin set (q_min over the correctly classified points only), so c* stays finite."""
    net, X, y = trained
    q = y * net(X)
    worst = int(q[0].argmax())
    y_bad = y.clone()
    y_bad[0, worst] *= -1  # net 0 now misclassifies its most confident point
    mask = torch.ones_like(y, dtype=torch.bool)
    cells = [dict(d=X.shape[2], m=X.shape[1], alpha=1.0, width=net.W.shape[1], slack=1.1,
                  attack="margin_direction", kkt_max_m=0, seed=e) for e in range(X.shape[0])]
    gens = [torch.Generator().manual_seed(e) for e in range(X.shape[0])]
    out = nonrobust.analyse(net, X, y_bad, mask, cells, gens)
    assert out[0]["train_acc"] == pytest.approx(1 - 1 / X.shape[1])
    assert out[0]["margin_frac"] > 0 and out[0]["margin_frac_tight"] > 0
    assert math.isfinite(out[0]["c_star"]) and out[0]["c_star"] > 0
    I_ref = kkt.margin_set(q, mask)[0]
    I_ref[worst] = False
    assert torch.equal(kkt.margin_set(y_bad * net(X), mask)[0], I_ref)
