"""KKT diagnostics (spec 002 §2.11): Gram matrix, NNLS, batched == per model."""

import numpy as np
import pytest
import torch
from scipy.optimize import nnls as scipy_nnls

from tasks import data, kkt, train


@pytest.fixture(scope="module")
def trained():
    net, X, y = data.synthetic_stack(range(3), d=12, m=10, k=16, init_scale=0.1)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-12, max_iters=8000))
    assert (st.status == train.CONVERGED).all()
    return st.net, X, y


@pytest.mark.parametrize("q, valid, expected", [
    pytest.param([-3.0, 1.0, 1.05, 2.0], [1, 1, 1, 1], [0, 1, 1, 0], id="one-misclassified"),
    pytest.param([-3.0, -0.5, 1.0, 1.2], [1, 1, 1, 1], [0, 0, 1, 0], id="two-misclassified"),
    pytest.param([1.0, 1.08, 1.2, -1.0], [1, 1, 1, 0], [1, 1, 0, 0], id="padded-negative"),
    pytest.param([0.0, 1.0, 1.1, 5.0], [1, 1, 1, 1], [0, 1, 1, 0], id="zero-margin-is-not-correct"),
    pytest.param([-1.0, -2.0], [1, 1], [0, 0], id="all-misclassified"),
])
def test_margin_set_uses_correct_points_only(q, valid, expected):
    """Spec 002 A14 (issue 11, defect 1): q_min is over correctly classified points, so a
    misclassified point never empties I: I = {i : 0 < q_i <= 1.1 min_{q_l > 0} q_l}."""
    I = kkt.margin_set(torch.tensor([q], dtype=torch.float64), torch.tensor([valid], dtype=torch.bool))
    assert I[0].tolist() == [bool(e) for e in expected]


def test_gram_equals_jacobian_product(trained):
    net, X, y = trained
    e = 1
    W, b, v = net.W[e], net.b[e], net.v[e]

    def margins(W, b, v):
        return y[e] * (torch.relu(X[e] @ W.T + b) @ v)

    J = torch.cat([j.reshape(X.shape[1], -1) for j in torch.autograd.functional.jacobian(margins, (W, b, v))], 1)
    Q = kkt.gram(net, X, y)[e]
    torch.testing.assert_close(Q, J @ J.T, rtol=1e-10, atol=1e-10)


@pytest.fixture(scope="module")
def nnls_problem():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 20, 8, generator=gen, dtype=torch.float64)
    t = torch.randn(3, 20, generator=gen, dtype=torch.float64)
    Q = A.transpose(1, 2) @ A
    r = (A.transpose(1, 2) @ t.unsqueeze(-1)).squeeze(-1)
    lam = kkt.nnls(Q, r, torch.ones(3, 8, dtype=torch.bool), iters=20000)
    return A, t, lam


@pytest.mark.parametrize("e", range(3))
def test_nnls_matches_scipy(nnls_problem, e):
    A, t, lam = nnls_problem
    ref, _ = scipy_nnls(A[e].numpy(), t[e].numpy())
    np.testing.assert_allclose(lam[e].numpy(), ref, atol=1e-7)


def test_nnls_gives_nan_for_an_overflowed_gram_and_leaves_its_bundle_mates_alone(nnls_problem):
    """Issue 39: after a large GA step a net's Gram at min margin ~0 overflows (±inf entries, measured on
    an m = 8 net at α = 1); LAPACK then failed on the whole batch and the unlearn bundle's cells failed.
    Now that net's λ is NaN and the other nets' λ are what they are alone."""
    A, t, lam = nnls_problem
    Q = A.transpose(1, 2) @ A
    r = (A.transpose(1, 2) @ t.unsqueeze(-1)).squeeze(-1)
    s = torch.tensor([0, 1, -1, -1, -1, -1, 1, 1.0], dtype=torch.float64)
    o = torch.outer(s, s)
    Q[1] = torch.where(o != 0, o * torch.inf, torch.zeros_like(o))  # the overflowed Gram's sign pattern
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.eigvalsh(Q[1:2])
    got = kkt.nnls(Q, r, torch.ones(3, 8, dtype=torch.bool), iters=20000)
    assert bool(got[1].isnan().all())
    assert torch.equal(got[[0, 2]], lam[[0, 2]])


@pytest.fixture(scope="module")
def batched_fit(trained):
    net, X, y = trained
    return kkt.kkt_fit(net, X, y, torch.ones_like(y, dtype=torch.bool))


@pytest.mark.parametrize("e", range(3))
def test_kkt_fit_batched_equals_per_model(trained, batched_fit, e):
    net, X, y = trained
    valid = torch.ones_like(y, dtype=torch.bool)
    one = kkt.kkt_fit(net.select(slice(e, e + 1)), X[e:e + 1], y[e:e + 1], valid[e:e + 1])
    torch.testing.assert_close(one.lam[0], batched_fit.lam[e], rtol=0, atol=1e-10)
    torch.testing.assert_close(one.eps[0], batched_fit.eps[e], rtol=0, atol=1e-10)


def test_kkt_residual_is_consistent(trained):
    """ε is the relative residual of the fitted stationarity condition: recompute it directly."""
    net, X, y = trained
    valid = torch.ones_like(y, dtype=torch.bool)
    fit = kkt.kkt_fit(net, X, y, valid)
    e = 0
    q = y[e] * net.select([e])(X[e:e + 1])[0]
    hat = net.select([e]).scaled(1 / torch.sqrt(q.min()).reshape(1))
    W, b, v = hat.W[0].clone().requires_grad_(), hat.b[0].clone().requires_grad_(), hat.v[0].clone().requires_grad_()
    qhat = y[e] * (torch.relu(X[e] @ W.T + b) @ v)
    grads = torch.autograd.grad((fit.lam[e] * qhat).sum(), (W, b, v))
    res = torch.cat([(p - g).flatten() for p, g in zip((W, b, v), grads)]).norm()
    theta = torch.cat([p.flatten() for p in (W, b, v)]).norm()
    assert abs(float((res / theta).detach()) - float(fit.eps[e])) < 1e-6
    assert (fit.eps < 1).all() and (fit.lam >= 0).all()
