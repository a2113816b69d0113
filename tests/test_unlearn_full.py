"""Unlearning nets with every block trained (issue 39; tasks/cells/unlearn_full.py): paper 001's GA step
over W, b, v with the KKT multipliers of paper 002 / 004's fit, checked against autograd; the
multipliers certify θ at its raw scale (2-homogeneity); identity leaves θ bit for bit; the config
check admits `train`'s nets for identity / ga / k_ga and refuses what needs a frozen output layer."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.cells.unlearn_full import full_step, measure, unlearn_full


def _nets(E=3, n=5, d=4, M=6, seed=0):
    """Random nets and data labelled by the nets' own sign (every margin > 0: feasible)."""
    g = torch.Generator().manual_seed(seed)
    W, b, v = (torch.randn(E, n, d, generator=g, dtype=torch.float64), torch.randn(E, n, generator=g, dtype=torch.float64),
               torch.randn(E, n, generator=g, dtype=torch.float64))
    X = torch.randn(E, M, d, generator=g, dtype=torch.float64)
    f = (torch.relu(X @ W.transpose(1, 2) + b.unsqueeze(1)) * v.unsqueeze(1)).sum(-1)
    return W, b, v, X, torch.sign(f)


def _grad(W, b, v, x):
    """∇_θ N(x; θ) of one net by autograd: (dW, db, dv)."""
    P = [t.clone().requires_grad_(True) for t in (W, b, v)]
    out = (torch.relu(P[0] @ x + P[1]) * P[2]).sum()
    return torch.autograd.grad(out, P)


@pytest.mark.parametrize("blocks", [("W", "b", "v"), ("W", "v")])
def test_step_equals_theta_minus_alpha_lambda_y_grad_by_autograd(blocks):
    W, b, v, X, y = _nets()
    E, M = y.shape
    lam = torch.rand(E, M, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    F = torch.zeros(E, 2, M, dtype=torch.bool)
    F[:, 0, 2] = True  # one point
    F[:, 1, [1, 4]] = True  # two at once (k_ga)
    alphas = torch.tensor([0.5, 1.0], dtype=torch.float64)
    Wh, bh, vh = full_step(W, b, v, X, y, lam, F, alphas, blocks)
    for e in range(E):
        for li in range(2):
            for ai, a in enumerate(alphas):
                want = [W[e].clone(), b[e].clone(), v[e].clone()]
                for i in F[e, li].nonzero().flatten().tolist():
                    for j, gr in enumerate(_grad(W[e], b[e], v[e], X[e, i])):
                        if ("W", "b", "v")[j] in blocks:
                            want[j] = want[j] - a * lam[e, i] * y[e, i] * gr
                for got, w in zip((Wh[e, li, ai], bh[e, li, ai], vh[e, li, ai]), want):
                    torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-13)


def test_multipliers_certify_theta_at_its_raw_scale():
    """N is 2-homogeneous in (W, b, v): the λ fitted at min margin 1 give the same relative residual
    ‖θ − Σ λ_i y_i ∇N(x_i; θ)‖ / ‖θ‖ at the raw scale (so the GA step needs no rescaling of λ)."""
    W, b, v, X, y = _nets(E=2, n=6, d=3, M=5, seed=3)
    W, b, v = 7.0 * W, 7.0 * b, 7.0 * v  # far from min margin 1
    r = measure(W, b, v, X, y, torch.ones_like(y, dtype=torch.bool))
    for e in range(2):
        fit = [W[e].clone(), b[e].clone(), v[e].clone()]
        for i in range(y.shape[1]):
            for j, gr in enumerate(_grad(W[e], b[e], v[e], X[e, i])):
                fit[j] = fit[j] - r["lam"][e, i] * y[e, i] * gr
        rel = math.sqrt(sum(float(t.pow(2).sum()) for t in fit)) / math.sqrt(
            float(W[e].pow(2).sum() + b[e].pow(2).sum() + v[e].pow(2).sum()))
        assert rel == pytest.approx(float(r["eps_rel"][e]), rel=1e-9, abs=1e-12)
        assert bool(r["feasible"][e])


def _cells(method, alphas, forget=0):
    from flows import experiments

    full = {k: p.default for k, p in experiments.get("unlearn").params.items()}
    return [dict(full, unlearn_method=method, alpha=a, forget=forget) for a in alphas]


def _call(W, b, v, X, y, cells, blocks=("W", "b", "v")):
    E, M = y.shape
    keys = ["0"] * len(cells)
    one = lambda t: t[:1].expand(len(cells), *t.shape[1:])  # noqa: E731 - net 0, once per cell
    return unlearn_full(one(W), one(b), one(v), one(X), one(y), torch.ones(len(cells), M, dtype=torch.bool),
                        torch.full((len(cells),), X.shape[2]), torch.full((len(cells),), M),
                        torch.full((len(cells),), W.shape[1]), torch.zeros(len(cells), 8, dtype=torch.uint8),
                        keys, cells, blocks)


def test_identity_stores_theta_and_ga_stores_the_step():
    W, b, v, X, y = _nets()
    ident = _call(W, b, v, X, y, _cells("identity", [1.0]))[0]
    assert torch.equal(torch.as_tensor(ident["W"]), W[0]) and torch.equal(torch.as_tensor(ident["v"]), v[0])
    assert ident["forgotten"].tolist() == [1, 0, 0, 0, 0, 0] and ident["nets_stored"] == 1
    ga = _call(W, b, v, X, y, _cells("ga", [0.5, 1.0]))
    r = measure(W[:1], b[:1], v[:1], X[:1], y[:1], torch.ones_like(y[:1], dtype=torch.bool))
    F = torch.zeros(1, 1, y.shape[1], dtype=torch.bool)
    F[0, 0, 0] = True
    Wh, bh, vh = full_step(W[:1], b[:1], v[:1], X[:1], y[:1], r["lam"], F, torch.tensor([0.5, 1.0]))
    for i, out in enumerate(ga):
        assert torch.equal(torch.as_tensor(out["W"]), Wh[0, 0, i]) and torch.equal(torch.as_tensor(out["v"]), vh[0, 0, i])
        assert out["lam_l"] == pytest.approx(float(r["lam"][0, 0]), rel=1e-12)
        assert out["eps1_rel"] == pytest.approx(float(r["eps_rel"][0]), rel=1e-12)
        assert out["violated"] == 1 << 9 and out["preconditions_met"] == 0 and math.isnan(out["bound_eps"])
    with pytest.raises(ValueError, match="unlearn_method: 'retrain' needs the producer's training"):
        _call(W, b, v, X, y, _cells("retrain", [1.0]))  # (the flow hands it: tests/test_unlearn_retrain_train.py)


def test_config_check_admits_train_nets_for_ga_and_retrain_and_refuses_ref_retrain_in_one_line():
    from core.declare import NetsContract
    from flows.experiments import unlearn

    train_nets = NetsContract(trainer="train", data="unit_sphere")
    for method in ("identity", "ga", "k_ga", "retrain"):
        assert unlearn.needs(_cells(method, [1.0])[0]).refusal(train_nets) == ""
    why = unlearn.needs(_cells("ga", [1.0])[0] | {"ref_retrain": True}).refusal(train_nets)
    assert "W+b" in why and "u frozen" in why and "\n" not in why
    lazy = NetsContract(trainer="lazy_train", trained=frozenset({"W"}), output="frozen")
    assert "needs nets of train or train_kkt" in unlearn.needs(_cells("retrain", [1.0])[0]).refusal(lazy)
