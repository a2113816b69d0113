"""Exact c* (spec 002 §2.9) vs bisection and brute force; Thm 3.1 robust net; toy example §2.12."""

import math

import pytest
import torch

from tasks import attacks, data, kkt, nets, train


@pytest.fixture(scope="module")
def trained():
    net, X, y = data.synthetic_stack(range(4), d=16, m=24, k=32)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-10, max_iters=6000))
    assert (st.status == train.CONVERGED).all()
    return st.net, X, y


def test_exact_c_star_equals_bisection(trained):
    net, X, y = trained
    valid = torch.ones_like(y, dtype=torch.bool)
    I = kkt.margin_set(y * net(X), valid)
    for name, fn in attacks.DIRECTIONS.items():
        gens = [torch.Generator().manual_seed(i) for i in range(X.shape[0])]
        z = fn(net, X, y, I, gens)
        exact = attacks.c_star_exact(net, X, y, I, z)
        bis = attacks.c_star_bisection(net, X, y, I, z, cap=torch.full((4,), 1e4, dtype=torch.float64))
        finite = torch.isfinite(bis)
        assert torch.equal(finite, torch.isfinite(exact.c_star)), name
        torch.testing.assert_close(exact.c_star[finite], bis[finite], rtol=0, atol=1e-6)


def test_first_roots_match_dense_scan(trained):
    """r_i is the first c with f_i(c) <= 0: f_i > 0 on a fine grid before r_i, <= 0 just after."""
    net, X, y = trained
    I = torch.ones_like(y, dtype=torch.bool)
    z = attacks.margin_direction(net, X, y, I)
    r = attacks.first_roots(net, X, y, z)
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    for e in range(2):
        for i in range(5):
            ri = float(r[e, i])
            if not math.isfinite(ri):
                continue
            cs = (grid * ri * 0.999999).unsqueeze(0)
            f = attacks.f_along(net.select([e] * cs.shape[1]), X[e:e + 1, i:i + 1].expand(cs.shape[1], -1, -1),
                               y[e:e + 1, i:i + 1].expand(cs.shape[1], -1), z[e:e + 1].expand(cs.shape[1], -1),
                               cs.T.squeeze(-1))
            assert (f > 0).all()
            after = attacks.f_along(net.select([e]), X[e:e + 1, i:i + 1], y[e:e + 1, i:i + 1], z[e:e + 1],
                                   torch.tensor([ri * (1 + 1e-9) + 1e-12], dtype=torch.float64))
            assert float(after) < 1e-9


def test_robust_net_of_theorem_3_1():
    """Thm 3.1 (spec §3 checks a, b): margins exactly 1; no flip below the certified radius."""
    d, m = 200, 8
    g = data.seed_streams(3, (d, m))
    X, y = data.synthetic("sphere", m, d, g)
    net, rho = nets.robust_net(X, y)
    Xs, ys = X.unsqueeze(0), y.unsqueeze(0)
    H = net.pre(Xs)[0]
    torch.testing.assert_close(torch.diagonal(H), torch.ones(m, dtype=torch.float64), rtol=0, atol=1e-9)
    off = H - torch.diag(torch.diagonal(H)) - 10 * torch.eye(m, dtype=torch.float64)
    assert float(off.max()) <= -1 + 1e-9
    torch.testing.assert_close(net(Xs)[0], y, rtol=0, atol=1e-9)
    radius = (1 - rho) * math.sqrt(d) / 2
    I = torch.ones_like(ys, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    dirs = [attacks.margin_direction(net, Xs, ys, I)] + [
        attacks.random_direction(net, Xs, ys, I, [gen]) for _ in range(20)]
    for z in dirs:
        r = attacks.first_roots(net, Xs, ys, z)
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
