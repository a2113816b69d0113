"""Batched training (paper 002 §2.2 log-space step): batched == one by one, padding is exact."""

import dataclasses
import math

import numpy as np

import pytest
import torch

from tasks import data, nets, train


def make(E, d, m, k):
    return data.synthetic_stack(range(E), d, m, k)


SCHED = train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=5000)


@pytest.fixture(scope="module")
def batched_run():
    net, X, y = make(5, 12, 16, 32)
    st = train.train(net, X, y, SCHED)
    assert (st.status == train.CONVERGED).all()
    return net, X, y, st


@pytest.mark.parametrize("e", range(5))
def test_batched_equals_one_by_one(batched_run, e):
    net, X, y, st = batched_run
    one = train.train(net.select(slice(e, e + 1)), X[e:e + 1], y[e:e + 1], SCHED)
    assert int(one.iters[0]) == int(st.iters[e])
    torch.testing.assert_close(one.net.W[0], st.net.W[e], rtol=0, atol=1e-10)
    torch.testing.assert_close(one.net.b[0], st.net.b[e], rtol=0, atol=1e-10)
    torch.testing.assert_close(one.net.v[0], st.net.v[e], rtol=0, atol=1e-10)


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


@pytest.mark.parametrize("minibatch", [False, True], ids=["full-batch", "sgd-A4"])
def test_chunked_stack_equals_whole_stack_issue19(minibatch):
    """Chunks of the stack (issue 19, cache-sized kernels) give every net the numbers of one
    whole-stack run, also when resumed from a state and with per-net minibatch streams. Full batch to
    loss 1e-4 (~870 steps, resumed after 140; 1e-8 took twice the steps): every comparison is bit for
    bit, so a chunk given another chunk's nets, state or streams differs after its first step."""
    net, X, y = make(5, 10, 40, 32)
    sched = (train.Schedule(lr0=1e-2, period=10, target_loss=1e-6, max_iters=3000, batch_size=16, sync_every=20)
             if minibatch else dataclasses.replace(SCHED, target_loss=1e-4))

    def gens():
        return [data.seed_streams(s, (10, 40))["batches"] for s in range(5)] if minibatch else None

    whole = train.train(net, X, y, sched, batch_generators=gens(), chunk=5)
    if not minibatch:  # resumed in chunks (the generators would restart, so full batch only)
        part = train.train(net, X, y, sched, chunk=2, max_steps=140)
        chunked = train.train(net, X, y, sched, chunk=2, state=part)
        for p in ("W", "b", "v"):
            torch.testing.assert_close(getattr(chunked.net, p), getattr(whole.net, p), rtol=0, atol=1e-10)
    one = train.train(net, X, y, sched, batch_generators=gens(), chunk=2)
    for p in ("W", "b", "v"):
        torch.testing.assert_close(getattr(one.net, p), getattr(whole.net, p), rtol=0, atol=1e-10)
    for f in train.STATE_FIELDS:
        assert torch.equal(getattr(one, f), getattr(whole, f)), f
    assert (whole.status == train.CONVERGED).all()


def test_auto_chunk_fits_the_cache_on_cpu_only_issue19():
    assert train.auto_chunk(1024, 50, 100, torch.float64, "cpu") == (1 << 20) // (50 * 100 * 8)
    assert train.auto_chunk(4, 50, 100, torch.float64, "cpu") == 4
    assert train.auto_chunk(1024, 50, 100, torch.float64, "meta") == 1024


@pytest.mark.parametrize("E, chunk, expected", [(1024, 26, 16), (1024, 409, 256), (16, 16, 16), (1021, 26, 26)])
def test_even_chunk_for_the_compiled_step_issue19(E, chunk, expected):
    """Compiled step (issue 19): equal chunks where E has a divisor in (chunk/2, chunk], so one shape compiles."""
    assert train.gd.even_chunk(E, chunk) == expected


@pytest.mark.parametrize("sync_every, per_call, expected", [(100, 4, 4), (50, 4, 2), (7, 4, 1), (10**9, 8, 8), (30, 1, 1)])
def test_compiled_blocks_never_straddle_a_sync_point_issue19(sync_every, per_call, expected):
    """Compiled blocks of full-batch steps (issue 19): the largest divisor of sync_every up to the
    steps per call, so the host sees the state at the one-step loop's sync points."""
    assert train.gd.block_size(sync_every, per_call) == expected


@pytest.mark.slow
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


@pytest.mark.parametrize("sched_kw, match", [
    pytest.param(dict(loss="hinge"), "loss", id="unknown-loss"),
    pytest.param(dict(batch_size=4), "generator", id="minibatch-without-generators"),
])
def test_bad_inputs_raise(sched_kw, match):
    net, X, y = make(1, 6, 8, 4)
    with pytest.raises(ValueError, match=match):
        train.train(net, X, y, train.Schedule(**sched_kw))


def padded_stack(sizes, d_pad, m_pad, k_pad, init_scale=2.0):
    """Nets of true sizes (d, m, k), zero-padded to (d_pad, m_pad, k_pad) with a sample mask."""
    E = len(sizes)
    X = torch.zeros(E, m_pad, d_pad, dtype=torch.float64)
    y = torch.ones(E, m_pad, dtype=torch.float64)
    mask = torch.zeros(E, m_pad, dtype=torch.bool)
    stack = []
    for e, (d, m, k) in enumerate(sizes):
        g = data.seed_streams(10 + e, (d, m))
        X[e, :m, :d], y[e, :m] = data.synthetic("sphere", m, d, g)
        mask[e, :m] = True
        stack.append(nets.init_two_layer(d, k, g["init"], init_scale=init_scale, d_pad=d_pad, k_pad=k_pad))
    return nets.stack(stack), X, y, mask


def autograd_mean_loss_grad(net, X, y, mask, loss):
    """∇_θ of L_e = mean_{i valid} ℓ(y_i N_e(x_i)) for every net e, by torch.autograd (linear space)."""
    W, b, v = (p.clone().requires_grad_() for p in (net.W, net.b, net.v))
    q = y * nets.TwoLayer(W, b, v)(X)
    ell = torch.exp(-q) if loss == "exp" else torch.nn.functional.softplus(-q)
    L = (ell * mask).sum(1) / mask.sum(1)
    return torch.autograd.grad(L.sum(), (W, b, v))


@pytest.mark.parametrize("param", ["W", "b", "v"])
@pytest.mark.parametrize("loss", ["exp", "logistic"])
def test_log_space_step_equals_autograd_gradient_step(loss, param):
    """Spec 002 §2.2 (issue 11, defect 3): one hand-written log-space GD step on a padded stack
    of nets moves θ by exactly -lr_e ∇L_e, L_e = mean_i ℓ(q_i), ∇ by autograd, lr_e = exp(log_lr_e)."""
    net, X, y, mask = padded_stack([(5, 9, 12), (3, 6, 7), (4, 4, 9)], d_pad=5, m_pad=9, k_pad=12)
    q = y * net(X)
    assert q[mask].abs().max() < 10 and (q[mask] < 0).any()  # moderate margins, both signs
    sched = train.Schedule(loss=loss, lr0=1.0, target_loss=1e-300, max_iters=10)
    st = train.init_state(net, sched)
    st.log_lr = torch.log(torch.tensor([0.7, 0.05, 2.0], dtype=torch.float64))  # one lr per net
    lr = torch.exp(st.log_lr)
    after = train.train(net, X, y, sched, mask=mask, state=st, max_steps=1)
    assert after.iters.tolist() == [1, 1, 1]
    g = dict(zip("Wbv", autograd_mean_loss_grad(net, X, y, mask, loss)))[param]
    step = getattr(after.net, param) - getattr(net, param)
    expected = -lr.view(-1, *[1] * (g.dim() - 1)) * g
    rel = (step - expected).flatten(1).norm(dim=1) / expected.flatten(1).norm(dim=1)
    assert (rel < 1e-12).all(), f"relative error per net {rel.tolist()}"


COMPILED_CASES = [
    pytest.param([(5, 9, 12), (3, 6, 7), (4, 4, 9), (4, 4, 9)], 5, 9, {}, id="direct-n>d"),
    # the Gram blocks with the exp loss: make test-paper (its graph is a fourth cold compile, ~25-45 CPU s;
    # the Gram path is the logistic case's, the exp loss the direct case's)
    pytest.param([(9, 5, 12), (7, 4, 7), (8, 5, 9), (8, 5, 9)], 9, 5, {}, id="gram-n<=d", marks=pytest.mark.paper),
    pytest.param([(9, 5, 12), (7, 4, 7), (8, 5, 9), (8, 5, 9)], 9, 5,
                 dict(loss="logistic", lr0=0.1, period_fast=2, target_loss=1e-2), id="gram-logistic-converging"),
]


def _compiled_case(sizes, d_pad, m_pad, sched_kw):
    """A case of :data:`COMPILED_CASES`: the padded stack (net 3 dead from the start), its schedule
    and the eager run of 122 steps the compiled forms are compared with."""
    net, X, y, mask = padded_stack(sizes, d_pad=d_pad, m_pad=m_pad, k_pad=12)
    net.b[3] = -1e3
    sched = train.Schedule(**{**dict(lr0=1e-2, period=10, target_loss=1e-8, max_iters=400, sync_every=20), **sched_kw})
    return (net, X, y, mask, sched), train.train(net, X, y, sched, mask=mask, max_steps=122)


def _assert_same_training(got, eager, fields) -> None:
    """Every net's parameters to 1e-12 relative (of the block's largest entry), ``fields`` equal."""
    for p in ("W", "b", "v"):
        ref = getattr(eager.net, p)
        assert float((getattr(got.net, p) - ref).abs().max()) <= 1e-12 * float(ref.abs().max()), p
    for f in fields:
        assert torch.equal(getattr(got, f), getattr(eager, f)), f


def _compiled_forms_eagerly(monkeypatch):
    """Run ``train(..., compile=True)``'s code path without compiling: the block structure of the
    compiled calls, and inside them the forms only a compiled step takes (``is_compiling()`` True:
    the fused margins and gradients, the Gram blocks), in eager torch."""
    from tasks.train import gd

    def eager(fn):
        def call(*a, **kw):
            with monkeypatch.context() as m:
                m.setattr(torch.compiler, "is_compiling", lambda: True)
                return fn(*a, **kw)
        return lambda: call

    monkeypatch.setattr(gd, "compiled_step", eager(gd._step))
    monkeypatch.setattr(gd, "compiled_steps", eager(gd._steps))


@pytest.mark.parametrize("sizes, d_pad, m_pad, sched_kw", [pytest.param(*p.values, id=p.id) for p in COMPILED_CASES])
def test_the_compiled_steps_forms_equal_the_eager_step_without_compiling(monkeypatch, sizes, d_pad, m_pad, sched_kw):
    """Issue 19, in milliseconds: the fused forms and the Gram blocks that only the compiled step
    runs (:func:`_compiled_forms_eagerly`) give every net the eager step's parameters to 1e-12
    relative, the same iterations and statuses (the cases of the compiled test below, whose inductor
    graphs cost tens of CPU s each on a cold cache)."""
    (net, X, y, mask, sched), eager = _compiled_case(sizes, d_pad, m_pad, sched_kw)
    _compiled_forms_eagerly(monkeypatch)
    forms = train.train(net, X, y, sched, mask=mask, max_steps=122, compile=True)
    assert forms.status.tolist()[3] == train.DEAD
    _assert_same_training(forms, eager, ("iters", "status", "separated"))


@pytest.mark.slow
@pytest.mark.parametrize("sizes, d_pad, m_pad, sched_kw", COMPILED_CASES)
def test_compiled_step_equals_eager_step_issue19(sizes, d_pad, m_pad, sched_kw):
    """Issue 19: the step under torch.compile (fused bias + ReLU + margins, out-of-place update)
    gives every net of a padded stack the eager step's parameters to 1e-12 relative and the same
    iterations, statuses and losses (exp loss). Full-batch steps run in compiled blocks of 4 and
    the call's last 2 steps, which fill no block, eagerly. Net 3 is dead from the start: the dead-net
    check before a block at a sync point finds it and runs that block eagerly, marking it dead as
    the eager loop does. Where the padded n ≤ d the blocks carry the pre-activations through the
    Gram matrix X Xᵀ and form W once per block (``gd.use_gram``); the logistic case has its nets
    converge inside blocks (iterations 51-71) on the fast LR period of separated nets (E14). With
    the eager stack equal to one-by-one runs (tests above), batched = one-by-one to 1e-10 holds for
    the compiled step too."""
    assert train.gd.use_gram(m_pad, d_pad) == (m_pad <= d_pad)
    (net, X, y, mask, sched), eager = _compiled_case(sizes, d_pad, m_pad, sched_kw)
    comp = train.train(net, X, y, sched, mask=mask, max_steps=122, compile=True)
    if sched_kw:
        assert comp.status.tolist()[:3] == [train.CONVERGED] * 3 and comp.separated[:3].all()
    assert comp.status.tolist()[3] == train.DEAD and int(comp.iters[3]) == 0
    assert comp.net.W.is_contiguous()
    _assert_same_training(comp, eager, ("iters", "status", "plateau_pos", "separated"))
    torch.testing.assert_close(comp.log_loss, eager.log_loss, rtol=1e-12, atol=0)


@pytest.mark.slow
def test_compile_step_param_reaches_the_training_step_issue19():
    """A config's ``compile_step: true`` trains the train stage's bundle under torch.compile, with
    the eager bundle's nets to 1e-12 relative (the wiring of the kernel test above)."""
    from flows import config
    from flows.experiments import train as train_exp

    def nets(compiled: bool):  # the direct-n>d stack's shapes and schedule: the graph compiled there is reused
        cfg = config.parse({"experiment": "train", "grid": {"d": [{"d": 5, "m": 9, "width": 12},
                                                                   {"d": 3, "m": 6, "width": 7}], "seed": [0, 1]},
                            "params": {"lr0": 1e-2, "lr_period": 10, "target_loss": 1e-8, "max_iters": 122,
                                       "compile_step": compiled}})
        return train_exp.run_bundle(cfg.cells(), "cpu")

    from tasks.train import compile_policy

    compile_policy._compiled_here.clear()  # as in a fresh worker: no shape compiled yet
    eager, auto = nets(False), nets("auto")
    for e, c in zip(eager, nets(True)):
        assert c["iters"] == e["iters"] and c["status"] == e["status"]
        for p in ("W", "b", "v"):
            assert np.abs(c[p] - e[p]).max() <= 1e-12 * np.abs(e[p]).max(), p
    # auto (issue 33): a bundle of a few ms a step never reaches the break-even step count: eager, bit for bit
    for e, a in zip(eager, auto):
        for p in ("W", "b", "v"):
            assert np.array_equal(a[p], e[p]), p
