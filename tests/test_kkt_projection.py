"""The span-projected KKT residual ε_proj (spec 002 §2.11, A1).

What holds: the projection P (on span{x_i}) never changes a margin, so Q and r of the NNLS are
the same and the projected residual² is the full residual² minus ||(I-P)W||². Hence
ε_proj <= ε always, ε_proj = ε exactly when the data span every feature (m >= d, full rank),
and ε_proj < ε when m < d and W has a part off the span (it does at a random init, §2.4).
"""

import functools

import pytest
import torch

from tasks import data, kkt, train
from tasks.kkt.multipliers import span_projected

SCHED = train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=8000)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.cache
def fitted(d: int, m: int):
    net, X, y = data.synthetic_stack(range(2), d=d, m=m, k=16, init_scale=0.1)
    st = train.train(net, X, y, SCHED)
    assert (st.status == train.CONVERGED).all()
    valid = torch.ones_like(y, dtype=torch.bool)
    return st.net, X, y, valid, kkt.kkt_fit(st.net, X, y, valid)


@pytest.mark.parametrize("d,m", [(12, 6), (6, 12), (8, 8)])
def test_projection_leaves_margins_unchanged(d, m):
    net, X, y, valid, _ = fitted(d, m)
    torch.testing.assert_close(kkt.margins(span_projected(net, X, valid), X, y), kkt.margins(net, X, y),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d,m", [(6, 12), (8, 8)])
def test_eps_proj_equals_eps_when_the_data_span_every_feature(d, m):
    net, X, y, valid, fit = fitted(d, m)
    assert torch.equal(span_projected(net, X, valid).W, net.W)
    assert torch.equal(fit.eps_proj, fit.eps)


def test_eps_proj_below_eps_for_m_below_d():
    net, X, y, valid, fit = fitted(12, 6)
    assert (fit.eps_proj < fit.eps).all()
    # residual_proj² = residual² - ||(I-P)θ̂||²: the same NNLS fit, a smaller parameter vector
    q_min = kkt.margins(net, X, y).min(1).values
    hat = net.scaled(1 / torch.sqrt(q_min))
    th2, th2_proj = hat.sq_norm(), span_projected(hat, X, valid).sq_norm()
    torch.testing.assert_close(fit.eps_proj ** 2 * th2_proj, fit.eps ** 2 * th2 - (th2 - th2_proj),
                               rtol=1e-9, atol=1e-9)


def test_projection_ignores_zero_padding():
    net, X, y, valid, _ = fitted(12, 6)
    E, m, d = X.shape
    Xp = torch.zeros(E, m + 3, d + 5, dtype=X.dtype)
    Xp[:, :m, :d] = X
    validp = torch.zeros(E, m + 3, dtype=torch.bool)
    validp[:, :m] = True
    Wp = torch.zeros(E, net.W.shape[1], d + 5, dtype=X.dtype)
    Wp[:, :, :d] = net.W
    proj = span_projected(net, X, valid).W
    projp = span_projected(type(net)(Wp, net.b, net.v), Xp, validp).W
    torch.testing.assert_close(projp[:, :, :d], proj, rtol=1e-12, atol=1e-12)
    assert projp[:, :, d:].abs().max() == 0
