"""Batched training (paper 002 §2.2 log-space step): batched == one by one, padding is exact."""

import math

import pytest
import torch

from tasks import data, nets, train


def make(E, d, m, k):
    return data.synthetic_stack(range(E), d, m, k)


SCHED = train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=5000)


def test_batched_equals_one_by_one():
    net, X, y = make(5, 12, 16, 32)
    st = train.train(net, X, y, SCHED)
    assert (st.status == train.CONVERGED).all()
    for e in range(5):
        one = train.train(net.select(slice(e, e + 1)), X[e:e + 1], y[e:e + 1], SCHED)
        assert int(one.iters[0]) == int(st.iters[e])
        for a, b in zip((one.net.W, one.net.b, one.net.v), (st.net.W, st.net.b, st.net.v)):
            torch.testing.assert_close(a[0], b[e], rtol=0, atol=1e-10)


def test_padding_is_exact():
    """Zero features, masked samples and all-zero neurons change nothing (spec 002 §7.2)."""
    net, X, y = make(1, 8, 10, 24)
    ref = train.train(net, X, y, SCHED)
    g = data.seed_streams(0, (8, 10))
    padded = nets.init_two_layer(8, 24, g["init"], d_pad=13, k_pad=29)
    Xp = torch.zeros(1, 15, 13, dtype=torch.float64)
    Xp[0, :10, :8] = X[0]
    yp = torch.ones(1, 15, dtype=torch.float64)
    yp[0, :10] = y[0]
    mask = torch.zeros(1, 15, dtype=torch.bool)
    mask[0, :10] = True
    st = train.train(padded, Xp, yp, SCHED, mask=mask)
    assert int(st.iters[0]) == int(ref.iters[0])
    torch.testing.assert_close(st.net.W[0, :24, :8], ref.net.W[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(st.net.v[0, :24], ref.net.v[0], rtol=0, atol=1e-10)
    assert st.net.W[0, 24:].abs().max() == 0 and st.net.W[0, :, 8:].abs().max() == 0


def test_resume_from_state_equals_one_call():
    net, X, y = make(3, 10, 12, 32)
    full = train.train(net, X, y, SCHED)
    part = train.train(net, X, y, SCHED, max_steps=137)
    assert part.running.any()
    rest = train.train(net, X, y, SCHED, state=part)
    torch.testing.assert_close(rest.net.W, full.net.W, rtol=0, atol=0)
    assert torch.equal(rest.iters, full.iters)


def test_reaches_1e30_in_float32_with_log_space_step():
    """Spec A16: the log-space step reaches loss 1e-30 in float32 (no underflow)."""
    net, X, y = make(2, 20, 20, 16)
    net = nets.TwoLayer(net.W.float(), net.b.float(), net.v.float())
    sched = train.Schedule(period=100, period_fast=10, target_loss=1e-30)
    st = train.train(net, X.float(), y.float(), sched)
    assert (st.status == train.CONVERGED).all()
    assert (st.log_loss < math.log(1e-30)).all()
    q = y.float() * st.net(X.float())
    assert (q > 60).all()  # min margin ≈ ln(1e30) = 69


def test_logistic_loss_terms_are_stable():
    q = torch.tensor([-50.0, 0.0, 20.0, 40.0, 200.0], dtype=torch.float64)
    log_l, log_dl = nets.log_loss_terms(q, "logistic")
    ref = torch.log(torch.log1p(torch.exp(-q[:3])))
    torch.testing.assert_close(log_l[:3], ref)
    assert torch.isfinite(log_l).all() and abs(float(log_l[-1]) + 200) < 1e-9
    torch.testing.assert_close(log_dl, torch.log(torch.sigmoid(-q)))


def test_minibatch_sgd_is_deterministic_and_converges():
    net, X, y = make(2, 10, 40, 32)
    sched = train.Schedule(lr0=1e-2, period=10, target_loss=1e-6, max_iters=6000, batch_size=16, sync_every=20)
    runs = []
    for _ in range(2):
        gens = [data.seed_streams(s, (10, 40))["batches"] for s in range(2)]
        runs.append(train.train(net, X, y, sched, batch_generators=gens))
    assert (runs[0].status == train.CONVERGED).all()
    torch.testing.assert_close(runs[0].net.W, runs[1].net.W, rtol=0, atol=0)


def test_dead_network_is_flagged_not_trained():
    net, X, y = make(1, 6, 8, 4)
    dead = nets.TwoLayer(net.W, torch.full_like(net.b, -1e3), net.v)
    st = train.train(dead, X, y, SCHED)
    assert int(st.status[0]) == train.DEAD and int(st.iters[0]) == 0


def test_bad_inputs_raise():
    net, X, y = make(1, 6, 8, 4)
    with pytest.raises(ValueError, match="loss"):
        train.train(net, X, y, train.Schedule(loss="hinge"))
    with pytest.raises(ValueError, match="generator"):
        train.train(net, X, y, train.Schedule(batch_size=4))
