"""Nested sampling (spec 000 §6 item 5(b)): volumes against T000-2x, the whole curve from one run,
its stated and analytic errors, stalls and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.cells.forging import forging_cell
from tasks.forging.problems import ForgingProblem, slab_problem
from tasks.forging.exact import linreg_log_region_measure, linreg_log_volume
from tasks.forging.estimators.nested import nested_sampling
from tasks.forging.estimators import ESTIMATORS

D5_EPS = 0.01  # d = 5, A = R = 1: forging probability 2.0e-11


def test_P000_13_nested_sampling_matches_exact_at_1e11(linreg, torch_gen):
    """P000-13: at probability ~1e-11 the estimate is within 3 stated SE and 15 % of T000-2x; the
    repetition SE is within a factor 3 of the nested-sampling log-error √(c·H/N)."""
    model, xs = linreg(5)
    exact = linreg_log_volume(5, D5_EPS, 1.0)
    assert exact - linreg_log_region_measure(5, 1.0, 1.0 + D5_EPS) < math.log(1e-10)
    est = nested_sampling(slab_problem(model, xs, 1.0, "integrated"), D5_EPS, generator=torch_gen(5), n_samples=500)
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est.log_volume, exact, est.log_volume_stderr)
    assert abs(math.expm1(est.log_volume - exact)) < 0.15
    assert 1 / 3 < est.log_volume_stderr / est.extra["stderr_analytic"] < 3
    assert ESTIMATORS["nested_sampling"] is nested_sampling


def test_nested_sampling_whole_curve_from_one_run(linreg, torch_gen):
    """One run returns log mu(eps') at every level it passed (spec §6 item 5(b)): each curve point is
    within 4 single-run log-errors √(c·H/N) (+0.02) of exact, from eps' ~ 1 down to the target."""
    model, xs = linreg(5)
    problem = slab_problem(model, xs, 1.0, "integrated")
    est = nested_sampling(problem, D5_EPS, generator=torch_gen(6), n_samples=1000)
    ce, cl = np.array(est.extra["curve_eps"]), np.array(est.extra["curve_log_volume"])
    assert len(ce) > 100 and np.all(np.diff(ce) <= 0) and ce[-1] < 2 * D5_EPS and ce[0] > 0.5
    exact = np.array([linreg_log_volume(5, e, 1.0) for e in ce])
    H = np.maximum(problem.log_measure - exact, 0.0)
    alpha = est.extra["n_drop"] / est.extra["n_live"]
    c = alpha / ((1 - alpha) * -math.log1p(-alpha))
    assert np.all(np.abs(cl - exact) < 4 * np.sqrt(c * H / 1000) + 0.02), np.max(np.abs(cl - exact))


def test_nested_sampling_label_sampled_indicator(linreg, torch_gen):
    """The indicator form (label sampled, membership by the real gradient) agrees with exact; it
    gives no curve above the label range's eps_max (= eps here)."""
    model, xs = linreg(3)
    exact = linreg_log_volume(3, 0.1, 1.0)
    est = nested_sampling(slab_problem(model, xs, 1.0, "sampled", eps_max=0.1), 0.1, generator=torch_gen(7), n_samples=500)
    assert est.n_hits > 0 and abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (est.log_volume, exact)
    assert est.extra["curve_eps"] == []  # labels are drawn for forgers up to eps_max = eps only: no curve above


def test_nested_sampling_stalls_when_eps_is_below_min_g(torch_gen):
    """g = 1 + ||ξ||² never goes below 1: asking for eps = 0.5 reports NaN, stalled, and the lowest level."""
    problem = ForgingProblem(latent_dim=2, evaluate=lambda xi: (1 + (xi * xi).sum(1), torch.ones(len(xi), dtype=xi.dtype)),
                             kind="indicator", log_measure=0.0, evals_per_point=1)
    est = nested_sampling(problem, 0.5, generator=torch_gen(0), n_samples=200)
    assert math.isnan(est.log_volume) and est.extra["stalled"]
    assert 1.0 <= est.extra["min_level"] < 1.001


def test_nested_sampling_through_the_forging_cell():
    out = forging_cell(model="linreg", d=3, eps=0.3, label="integrated", estimator="nested_sampling",
                       n_samples=500, n_repeats=10)
    assert out["status"] == 0 and abs(out["log_volume"] - out["log_volume_exact"]) < 3 * out["log_volume_stderr"]


@pytest.mark.parametrize("kw,name", [({"drop": 0.7}, "drop"), ({"n_mcmc": 0}, "n_mcmc"), ({"n_samples": 5}, "n_samples"),
                                     ({"n_repeats": 1}, "n_repeats")])
def test_nested_sampling_bad_inputs(kw, name, linreg, torch_gen):
    model, xs = linreg(3)
    problem = slab_problem(model, xs, 1.0, "integrated")
    with pytest.raises(ValueError, match=name):
        nested_sampling(problem, 0.1, generator=torch_gen(0), **{"n_samples": 100, **kw})


CAL_N, CAL_SEEDS, CI_SEEDS = 200, 40, 20  # d = 5, eps = D5_EPS: forging probability 2.0e-11


@pytest.mark.slow
@pytest.mark.parametrize("n_seeds", [CI_SEEDS, pytest.param(CAL_SEEDS, marks=pytest.mark.paper)],
                         ids=["20-seeds", "40-seeds"])
def test_P000_13_nested_sampling_stated_se_is_calibrated_over_seeds(linreg, torch_gen, n_seeds):
    """The stated SE (spread of 10 runs by the shared rule, floored by the exact-sampling error
    √(cH/N)/√R; :mod:`~tasks.forging.estimators.nested`) is calibrated: over 40 independent seeds at
    d = 5, eps = 0.01 (p = 2.0e-11), N = 200 live points, n_mcmc = 5 (the setting where the spread
    alone was reported at mean z² 1.74, 8/40 beyond 2 SE; 40-45 s on one core) the errors z =
    (estimate - exact)/SE have 0.5 < mean z² < 1.5, at most 4 of 40 beyond 2 SE and mean |z| < 0.95
    (measured 0.87, 1/40, 0.75; the spread alone on these seeds: 0.92, 1/40, 0.77, so these seeds
    do not separate the two: over 200 seeds the spread alone measured 1.18, 12/200, the floor 0.97,
    9/200).

    Design (z ~ N(0, s²) i.i.d., Monte Carlo over 4e5 sets of 40): a correct SE (s = 1) fails with
    probability 8.2 % (mean z² alone: P(chi²_40 > 60) = 2.2 %); an SE understated 1.3× (s = 1.3,
    mean z² 1.69) passes with probability 19.9 % (mean z² alone: P(chi²_40 < 35.5) = 33 %). Forty
    seeds cannot separate 1 from 1.3 better than that; the seeds are fixed (not the ones the floor
    was chosen on), so the outcome is deterministic and the probabilities say how the rule was chosen.

    Sizes: the 40 seeds are the paper-size variant (``make test-paper``). ``make test`` runs the same
    rule on the first 20 of them (measured 0.83, 0/20, 0.78), half the time; by the same Monte Carlo
    (2e5 sets of 20) a correct SE fails with probability 16 %, an SE understated 1.5× passes with
    8 %, 2× with 0.3 %: it catches a grossly understated SE, not a 1.3× one (the 40 seeds' job)."""
    model, xs = linreg(5)
    exact = linreg_log_volume(5, D5_EPS, 1.0)
    problem = slab_problem(model, xs, 1.0, "integrated")
    z = np.array([(e.log_volume - exact) / e.log_volume_stderr for e in
                  (nested_sampling(problem, D5_EPS, generator=torch_gen(3000 + s), n_samples=CAL_N)
                   for s in range(n_seeds))])
    assert 0.5 < np.mean(z * z) < 1.5, z
    assert np.sum(np.abs(z) > 2) <= 0.1 * n_seeds, z
    assert np.mean(np.abs(z)) < 0.95, z
