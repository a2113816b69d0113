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

EPS_1E12 = 0.0800274368382336  # d = 10, A = R = 1: forging probability 1e-12 (benchmark setting)
EPS_1E30 = 0.0012590837564593613  # probability 1e-30


@pytest.mark.parametrize("eps,p", [(EPS_1E12, 1e-12), (EPS_1E30, 1e-30)])
def test_P000_13_subset_importance_matches_exact(eps, p, linreg, torch_gen):
    """P000-13: at forging probability 1e-12 and 1e-30 (d = 10) the estimate is within 3 stated SE of
    T000-2x, the SE is below 2 % and the budget stays under 1e6 gradient evaluations."""
    model, xs = linreg(10)
    exact = linreg_log_volume(10, eps, 1.0)
    assert exact - linreg_log_region_measure(10, 1.0, 1.0 + eps) == pytest.approx(math.log(p), abs=1e-6)
    est = subset_importance(slab_problem(model, xs, 1.0, "integrated"), eps, generator=torch_gen(3), n_samples=500,
                            n_importance=100_000)
    assert 0 < est.log_volume_stderr < 0.02
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est, exact)
    assert est.n_gradient_evals <= 1e6
    assert est.extra["reliable"] and est.extra["n_components"] >= 2  # both antipodal caps (spec §6 item 6)


IMP_CAL_SEEDS = 50


@pytest.mark.slow
def test_subset_importance_stated_se_is_calibrated(linreg, torch_gen):
    """The stated SE is calibrated: over 50 independent seeds at p = 1e-12 (d = 10, N = 500,
    n_importance = 20 000, ~15 s on one core) the errors z = (estimate - exact)/SE have mean z² < 1.5,
    at most 5 of 50 beyond 2 SE, mean |z| < 0.95 and every |z| < 3.5 (measured 0.89, 1/50, 0.75, max
    2.60; the 8-seed rule before, mean z² < 3, passed an SE understated 1.7×).

    Design as tests/test_forging_estimators.py::test_P000_13_stated_se_is_calibrated_over_seeds
    (z ~ N(0, s²) i.i.d.): a correct SE fails with probability ~6 %, an SE understated 1.3× passes
    with probability ~17 %; the seeds are fixed, so the outcome is deterministic."""
    model, xs = linreg(10)
    exact = linreg_log_volume(10, EPS_1E12, 1.0)
    problem = slab_problem(model, xs, 1.0, "integrated")
    z = np.array([(e.log_volume - exact) / e.log_volume_stderr for e in
                  (subset_importance(problem, EPS_1E12, generator=torch_gen(20 + s), n_samples=500, n_importance=20_000)
                   for s in range(IMP_CAL_SEEDS))])
    assert np.all(np.abs(z) < 3.5), z
    assert np.mean(z ** 2) < 1.5, z
    assert np.sum(np.abs(z) > 2) <= 0.1 * IMP_CAL_SEEDS, z
    assert np.mean(np.abs(z)) < 0.95, z


def test_subset_importance_literal_membership_1e12(linreg, torch_gen):
    """Label sampled (membership by the real gradient ∇_w f(w; (z, t)), 2 evaluations per point) at
    probability ~1e-12 (d = 6, eps = 0.01): within 3 SE of exact."""
    model, xs = linreg(6)
    exact = linreg_log_volume(6, 0.01, 1.0)
    est = subset_importance(slab_problem(model, xs, 1.0, "sampled", eps_max=0.01), 0.01, generator=torch_gen(4),
                            n_samples=500, n_importance=60_000)
    assert est.log_probability < math.log(1e-11)
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est, exact)


def test_proposal_density_is_normalised(torch_gen):
    """The proposal's density (gnomonic Student-t charts + Jacobian + defensive part) is a density:
    E_q[nominal/q] = 1 within 4 SE, for a fit to samples on two antipodal caps plus a free latent."""
    gen = torch_gen(5)
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


def test_subset_importance_agrees_with_subset_simulation_on_relu_ball(torch_gen):
    """A one-hidden-layer ReLU net on the ball domain (no exact answer): the two estimators agree
    within 3 combined SE (extra['z_vs_subset_simulation'])."""
    gen = torch_gen(0)
    model = make_model("relu1", 3, 4, gen)
    xs = make_target(model, 1.0, gen)
    problem = ball_problem(model.loss, model.w, xs, 1.0)
    est = subset_importance(problem, 0.3, generator=torch_gen(6), n_samples=500, n_importance=40_000)
    assert math.isfinite(est.log_volume) and est.log_volume_stderr > 0
    assert abs(est.extra["z_vs_subset_simulation"]) < 3, est.extra
    ss = subset_simulation(problem, 0.3, generator=torch_gen(7), n_samples=1000)
    assert abs(est.log_volume - ss.log_volume) < 3 * math.hypot(est.log_volume_stderr, ss.log_volume_stderr)


def test_subset_importance_registered_and_bad_inputs(linreg, torch_gen):
    """Registered under its name; bad eps, n_importance or alpha raise ValueError naming the argument."""
    assert ESTIMATORS["subset_importance"] is subset_importance
    model, xs = linreg(3)
    problem = slab_problem(model, xs, 1.0, "integrated")
    with pytest.raises(ValueError, match="eps"):
        subset_importance(problem, -1.0, generator=torch_gen(0))
    with pytest.raises(ValueError, match="n_importance"):
        subset_importance(problem, 0.1, generator=torch_gen(0), n_importance=10)
    with pytest.raises(ValueError, match="alpha"):
        subset_importance(problem, 0.1, generator=torch_gen(0), alpha=1.0)


@pytest.mark.parametrize("reliable", [True, False])
def test_cell_keeps_unreliable_estimates_out(reliable):
    """An estimate flagged unreliable (Pareto k̂ > 0.7) is stored with status 3, reliable = 0 and NaN
    log_volume / stderr / log_probability, its raw value in log_volume_unreliable (so seed means in
    analysis/forging.py never average it in); a reliable one is stored as it is."""
    from tasks.cells.forging import OUTPUTS, STATUS_UNRELIABLE, _store_estimate
    from tasks.forging.estimators import VolumeEstimate

    est = VolumeEstimate("subset_importance", -50.0, 0.01, 1000, 10, -52.0, {"reliable": reliable, "pareto_khat": 0.9})
    out = dict.fromkeys(OUTPUTS, math.nan)
    _store_estimate(out, est, log_ref=2.0)
    if reliable:
        assert out["log_volume"] == -50.0 and out["log_probability"] == -52.0 and out["reliable"] == 1.0
        assert out["status"] == 0.0 and math.isnan(out["log_volume_unreliable"])
    else:
        assert math.isnan(out["log_volume"]) and math.isnan(out["log_volume_stderr"]) and math.isnan(out["log_probability"])
        assert out["status"] == STATUS_UNRELIABLE and out["reliable"] == 0.0 and out["log_volume_unreliable"] == -50.0
