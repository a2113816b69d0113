"""Paper 000: subset simulation + importance sampling (``subset_importance``) vs the exact linreg volume.

Spec IDs: P000-13 (rare-event estimators vs T000-2x, down to p = 1e-30 here), F000-3, spec §6 items 5-6.
'SE' is the estimator's stated standard error of the log volume; all seeds fixed.
"""

import math

import numpy as np
import pytest
import torch

from tasks.forging.estimators import subset_simulation
from tasks.forging.problems import ball_problem, slab_problem
from tasks.forging.exact import linreg_log_region_measure, linreg_log_volume
from tasks.forging.estimators.importance import fit_proposal, pareto_khat, subset_importance
from tasks.forging.models import make_model, make_target
from tasks.forging.estimators import ESTIMATORS
from tests.test_forging_estimators import _gen, _linreg

EPS_1E12 = 0.0800274368382336  # d = 10, A = R = 1: forging probability 1e-12 (benchmark setting)
EPS_1E30 = 0.0012590837564593613  # probability 1e-30


@pytest.mark.parametrize("eps,p", [(EPS_1E12, 1e-12), (EPS_1E30, 1e-30)])
def test_P000_13_subset_importance_matches_exact(eps, p):
    """P000-13: at forging probability 1e-12 and 1e-30 (d = 10) the estimate is within 3 stated SE of
    T000-2x, the SE is below 2 % and the budget stays under 1e6 gradient evaluations."""
    model, xs = _linreg(10)
    exact = linreg_log_volume(10, eps, 1.0)
    assert exact - linreg_log_region_measure(10, 1.0, 1.0 + eps) == pytest.approx(math.log(p), abs=1e-6)
    est = subset_importance(slab_problem(model, xs, 1.0, "integrated"), eps, generator=_gen(3), n_samples=500,
                            n_importance=100_000)
    assert 0 < est.log_volume_stderr < 0.02
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est, exact)
    assert est.n_gradient_evals <= 1e6
    assert est.extra["reliable"] and est.extra["n_components"] >= 2  # both antipodal caps (spec §6 item 6)


def test_subset_importance_stated_se_is_calibrated():
    """Over 8 independent seeds at p = 1e-12 the errors in units of the stated SE look standard normal:
    every |z| < 3.5 and mean z² < 3 (an SE that is too small, the failure of light-tailed fits, fails this)."""
    model, xs = _linreg(10)
    exact = linreg_log_volume(10, EPS_1E12, 1.0)
    problem = slab_problem(model, xs, 1.0, "integrated")
    z = np.array([(e.log_volume - exact) / e.log_volume_stderr for e in
                  (subset_importance(problem, EPS_1E12, generator=_gen(20 + s), n_samples=500, n_importance=20_000)
                   for s in range(8))])
    assert np.all(np.abs(z) < 3.5), z
    assert np.mean(z ** 2) < 3.0, z


def test_subset_importance_literal_membership_1e12():
    """Label sampled (membership by the real gradient ∇_w f(w; (z, t)), 2 evaluations per point) at
    probability ~1e-12 (d = 6, eps = 0.01): within 3 SE of exact."""
    model, xs = _linreg(6)
    exact = linreg_log_volume(6, 0.01, 1.0)
    est = subset_importance(slab_problem(model, xs, 1.0, "sampled", eps_max=0.01), 0.01, generator=_gen(4),
                            n_samples=500, n_importance=60_000)
    assert est.log_probability < math.log(1e-11)
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est, exact)


def test_proposal_density_is_normalised():
    """The proposal's density (gnomonic Student-t charts + Jacobian + defensive part) is a density:
    E_q[nominal/q] = 1 within 4 SE, for a fit to samples on two antipodal caps plus a free latent."""
    gen = _gen(5)
    k = 7
    e = torch.zeros(6, dtype=torch.float64)
    e[0] = 1.0
    dirs = e + 0.05 * torch.randn(400, 6, dtype=torch.float64, generator=gen)
    dirs[200:] *= -1
    X = torch.cat([torch.randn(400, 1, dtype=torch.float64, generator=gen) * 0.3 + 1.0,
                   dirs * (1 + torch.rand(400, 1, dtype=torch.float64, generator=gen))], 1)
    prop = fit_proposal(X, ((1, k),), gen)
    assert prop.pi.numel() >= 2
    r = torch.exp(prop.log_ratio(prop.sample(200_000, gen)))
    se = float(r.std()) / math.sqrt(r.numel())
    assert abs(float(r.mean()) - 1.0) < 4 * se, (float(r.mean()), se)


def test_pareto_khat_recovers_tail_shape():
    """Pareto k̂ (PSIS diagnostic): ≈ 0.5 for weights with a Pareto tail of shape 0.5, ≤ 0.2 for
    exponential weights, NaN for fewer than 10 positive weights."""
    rng = np.random.default_rng(0)
    assert pareto_khat(rng.uniform(size=20_000) ** -0.5) == pytest.approx(0.5, abs=0.1)
    assert pareto_khat(rng.exponential(size=20_000)) < 0.2
    assert math.isnan(pareto_khat(np.array([1.0, 2.0, 0.0])))


def test_subset_importance_agrees_with_subset_simulation_on_relu_ball():
    """A one-hidden-layer ReLU net on the ball domain (no exact answer): the two estimators agree
    within 3 combined SE (extra['z_vs_subset_simulation'])."""
    gen = _gen(0)
    model = make_model("relu1", 3, 4, gen)
    xs = make_target(model, 1.0, gen)
    problem = ball_problem(model.loss, model.w, xs, 1.0)
    est = subset_importance(problem, 0.3, generator=_gen(6), n_samples=500, n_importance=40_000)
    assert math.isfinite(est.log_volume) and est.log_volume_stderr > 0
    assert abs(est.extra["z_vs_subset_simulation"]) < 3, est.extra
    ss = subset_simulation(problem, 0.3, generator=_gen(7), n_samples=1000)
    assert abs(est.log_volume - ss.log_volume) < 3 * math.hypot(est.log_volume_stderr, ss.log_volume_stderr)


def test_subset_importance_registered_and_bad_inputs():
    """Registered under its name; bad eps, n_importance or alpha raise ValueError naming the argument."""
    assert ESTIMATORS["subset_importance"] is subset_importance
    model, xs = _linreg(3)
    problem = slab_problem(model, xs, 1.0, "integrated")
    with pytest.raises(ValueError, match="eps"):
        subset_importance(problem, -1.0, generator=_gen(0))
    with pytest.raises(ValueError, match="n_importance"):
        subset_importance(problem, 0.1, generator=_gen(0), n_importance=10)
    with pytest.raises(ValueError, match="alpha"):
        subset_importance(problem, 0.1, generator=_gen(0), alpha=1.0)
