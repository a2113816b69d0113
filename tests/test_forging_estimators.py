"""Paper 000: volume estimators vs the exact linreg volume, bounds vs measured volumes.

Spec IDs: P000-2, P000-5, P000-6, P000-8, P000-10, P000-13, P000-14, F000-3, F000-4.
All seeds fixed; 'SE' is the estimator's stated standard error of the log volume.
"""

import math

import numpy as np
import pytest
import torch

from tasks.forging import bounds as fb
from tasks.cells.forging import forging_cell
from tasks.forging.estimators import naive_mc, naive_mc_samples_for, subset_simulation
from tasks.forging.problems import cylinder_problem, slab_problem
from tasks.forging.slopes import fit_log_slope
from tasks.forging.exact import linreg_log_region_measure, linreg_log_volume, log_ball_volume
from tasks.forging.models import make_model
from tasks.forging.estimators import ESTIMATORS


@pytest.mark.parametrize("label,n", [("sampled", 400_000), ("integrated", 200_000)])
@pytest.mark.parametrize("d,eps", [(2, 0.3), (2, 2.0), (3, 0.3), (3, 2.0)])
def test_P000_2_naive_mc_matches_exact(d, eps, label, n, linreg, torch_gen):
    """P000-2: naive MC with the label sampled (uniform on U, real-gradient membership) and the
    Rao-Blackwellised MC (label integrated) agree with T000-2x within 3 SE (MC has many hits)."""
    model, xs = linreg(d)
    exact = linreg_log_volume(d, eps, 1.0)
    est = naive_mc(slab_problem(model, xs, 1.0, label, eps_max=eps), eps, generator=torch_gen(d), n_samples=n)
    assert est.n_hits > 1000
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr, (label, est, exact)
    assert est.log_volume_stderr < 0.02


@pytest.mark.parametrize("d,eps,factor", [(10, 0.3, 0.2), (6, 0.01, 0.5), (10, 0.01, 1.0)])
def test_P000_13_subset_simulation_matches_exact(d, eps, factor, linreg, torch_gen):
    """P000-13: subset simulation (10 repetitions) vs exact within 3 stated SE and within 20% (1e-6),
    50% (d=6, probability ~1e-12) and a factor 2 (mu = 5.7e-21), with the gradient-evaluation count."""
    model, xs = linreg(d)
    exact = linreg_log_volume(d, eps, 1.0)
    log_p = exact - linreg_log_region_measure(d, 1.0, 1.0 + eps)
    est = subset_simulation(slab_problem(model, xs, 1.0, "integrated"), eps, generator=torch_gen(1), n_samples=2000)
    assert est.log_volume_stderr > 0 and abs(est.log_volume - exact) < 3 * est.log_volume_stderr
    assert abs(math.expm1(est.log_volume - exact)) < factor if factor < 1 else abs(est.log_volume - exact) < math.log(2)
    assert 0 < est.n_gradient_evals <= 1e7
    if d == 6:
        assert log_p < math.log(1e-11)  # the test really goes down to probability ~1e-12


def test_subset_simulation_literal_membership_1e12(linreg, torch_gen):
    """Subset simulation on the label-sampled law (membership tested with ∇_w f(w; (z, t)) itself)
    at forging probability ~1e-12 (d = 6, eps = 0.01): within 3 SE of exact."""
    model, xs = linreg(6)
    exact = linreg_log_volume(6, 0.01, 1.0)
    est = subset_simulation(slab_problem(model, xs, 1.0, "sampled", eps_max=0.01), 0.01, generator=torch_gen(2),
                            n_samples=2000)
    assert est.log_probability < math.log(1e-11)
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr


def test_P000_13_benchmark_setting_1e12_within_3se(linreg, torch_gen):
    """P000-13 at the benchmark's setting (d = 10, forging probability p = 1e-12 of
    benchmarks/forging_rare_event.py): subset simulation within 3 stated SE of T000-2x, <= 2e5 evaluations."""
    eps = 0.0800274368382336  # eps_for_probability(10, 1, 1, 1e-12), recomputed below
    model, xs = linreg(10)
    exact = linreg_log_volume(10, eps, 1.0)
    assert exact - linreg_log_region_measure(10, 1.0, 1.0 + eps) == pytest.approx(math.log(1e-12), abs=1e-6)
    est = subset_simulation(slab_problem(model, xs, 1.0, "integrated"), eps, generator=torch_gen(11), n_samples=1000)
    assert 0 < est.log_volume_stderr < 0.5
    assert abs(est.log_volume - exact) < 3 * est.log_volume_stderr
    assert est.n_gradient_evals <= 2e5


CAL_D, CAL_EPS, CAL_N, CAL_SEEDS = 5, 0.01, 500, 50  # forging probability 2.0e-11
SE_SEEDS = 120  # the stated-SE test's seeds (its docstring: why 120)


@pytest.mark.slow
def test_P000_13_stated_se_is_calibrated_over_seeds(linreg, torch_gen):
    """The stated SE (spec §5, CV over 10 repetitions, floored by the Au-Beck within-run CoV, Student-t
    factor) is calibrated: over 120 independent seeds at d = 5, eps = 0.01 (p = 2.0e-11, N = 500, ~12 s)
    the errors z = (estimate - exact)/SE have mean z² < 1.5, at most 16 of 120 (13 %) beyond 2 SE and
    mean |z| < 0.97. Measured on an Intel Xeon: 1.31, 14/120, 0.90 with kktlab's MKL_CBWR=AVX2,STRICT;
    1.01, 9/120, 0.80 without it.

    The estimator is biased low by about 0.4 SE (mean z -0.54 and -0.36 on those two runs; 150 other
    seeds: mean error -0.08 ± 0.03 in log at a stated SE of 0.35, the skew of a linear mean of 10
    lognormal-like runs, while the pooled runs are unbiased): a known limit (issue 41), which the rule
    allows. Design (z ~ N(b, s²) i.i.d., the joint rule simulated over 200,000 sets): a correct SE (s = 1)
    fails with probability 0.15 % at b = 0 and 3.7 % at b = -0.4; an SE understated 1.3× (mean z² 1.69)
    passes with probability 14.5 % at b = 0 and 4.3 % at b = -0.4. The seeds are fixed, but MKL's code
    path (AMD EPYC or Intel Xeon, MKL_CBWR) changes the chains' last bits, so each machine draws the 120
    runs afresh: the former rule of 50 seeds (mean z² < 1.5, 5 beyond 2 SE; false alarm 5.6 % at b = 0)
    passed on AMD EPYC and failed on an Intel Xeon (mean z² 1.55, 6/50 beyond 2 SE)."""
    model, xs = linreg(CAL_D)
    exact = linreg_log_volume(CAL_D, CAL_EPS, 1.0)
    assert exact - linreg_log_region_measure(CAL_D, 1.0, 1.0 + CAL_EPS) == pytest.approx(math.log(2.0e-11), abs=0.05)
    problem = slab_problem(model, xs, 1.0, "integrated")
    z = np.array([(e.log_volume - exact) / e.log_volume_stderr for e in
                  (subset_simulation(problem, CAL_EPS, generator=torch_gen(1000 + s), n_samples=CAL_N)
                   for s in range(SE_SEEDS))])
    assert np.mean(z * z) < 1.5, z
    assert np.sum(np.abs(z) > 2) <= 16, z
    assert np.mean(np.abs(z)) < 0.97, z


CAL_SAMPLED_N, CI_SEEDS = 2000, 20  # spec §6 item 5(a): N >= 2000 per level


@pytest.mark.slow
@pytest.mark.parametrize("n_seeds", [CI_SEEDS, pytest.param(CAL_SEEDS, marks=pytest.mark.paper)],
                         ids=["20-seeds", "50-seeds"])
def test_P000_13_stated_se_is_calibrated_label_sampled(linreg, torch_gen, n_seeds):
    """Label-sampled law (membership by the real gradient, P000-2) at d = 5, eps = 0.01 (p = 2.0e-11),
    N = 2000 per level (spec §6 item 5(a)), 50 independent seeds (~40 s on one core): mean z² < 1.5,
    at most 5 of 50 beyond 2 SE, mean |z| < 0.95, and the mean log error within ±0.1 (measured 0.70,
    1/50, 0.67, -0.050; 1.23, 3/50, 0.84, -0.041 when first written). Same design as the
    integrated-label test above: a correct SE fails with probability 5.6 %, an SE understated 1.3×
    passes with probability 17.5 %.

    Sizes: the 50 seeds are the paper-size variant (``make test-paper``). ``make test`` runs the same
    rule on the first 20 of them (measured 0.82, 1/20, 0.72, -0.072), 40 % of the time; over 2e5 sets
    of 20 i.i.d. z a correct SE fails with probability 16 %, an SE understated 1.5× passes with 8 %, 2×
    with 0.3 %: it catches a grossly understated SE or a biased estimate, not a 1.3× one (the 50 seeds' job).

    At N = 500 the runs of this law are roughly lognormal with sd(log) ≈ 1 (IQR of the log runs 1.32
    after the block moves of :func:`~tasks.forging.estimators.subset_simulation._blocks`, 1.88 before):
    for such runs no SE from 10 repetitions is calibrated (mean z² >= 1.55 even for exactly lognormal
    runs, see :func:`~tasks.forging.estimators.common.estimate_from_runs`), measured 1.76 (1.73 before)."""
    model, xs = linreg(CAL_D)
    exact = linreg_log_volume(CAL_D, CAL_EPS, 1.0)
    problem = slab_problem(model, xs, 1.0, "sampled", eps_max=CAL_EPS)
    err, se = np.array([(e.log_volume - exact, e.log_volume_stderr) for e in
                        (subset_simulation(problem, CAL_EPS, generator=torch_gen(1000 + s), n_samples=CAL_SAMPLED_N)
                         for s in range(n_seeds))]).T
    z = err / se
    assert np.mean(z * z) < 1.5, z
    assert np.sum(np.abs(z) > 2) <= 0.1 * n_seeds, z
    assert np.mean(np.abs(z)) < 0.95, z
    assert abs(np.mean(err)) < 0.1, err


def test_block_moves_free_the_label_latent(linreg, torch_gen):
    """On the label-sampled slab the chains move the directions and the other latents (radius, label)
    in turn, each with its own pCN scale: at the deepest level the label's scale stays >= 0.1 (its
    conditional spread ~0.4) while the directions' follows the level (~b); the free radius is redrawn
    in every move instead of taking steps of its own."""
    from tasks.forging.estimators.subset_simulation import _blocks, _moves

    model, xs = linreg(5)
    problem = slab_problem(model, xs, 1.0, "sampled", eps_max=0.01)
    blocks = _blocks(problem)
    assert [b.nonzero().flatten().tolist() for b in blocks] == [[1, 2, 3, 4, 5], [0, 6]]
    est = subset_simulation(problem, 0.01, generator=torch_gen(3), n_samples=500)
    sig_dir, sig_rest = est.extra["sigmas"][-1]
    assert sig_dir < 0.05 and sig_rest > 0.1
    moves = _moves(blocks, [0.02, 1.0], [0.4, 1.0])  # second block free: folded into the first move
    assert len(moves) == 1 and moves[0].tolist() == [1.0, 0.02, 0.02, 0.02, 0.02, 0.02, 1.0]
    assert len(_blocks(slab_problem(model, xs, 1.0, "integrated"))) == 2


def test_subset_simulation_stated_se_parts(linreg, torch_gen):
    """The stated SE = max(spread of the runs, spread of their logs, Au-Beck within-run CoV, Cox's
    lognormal SE) · sqrt((R-1)/(R-3)); every live run's Au-Beck δ² is positive and finite."""
    model, xs = linreg(3)
    est = subset_simulation(slab_problem(model, xs, 1.0, "integrated"), 0.01, generator=torch_gen(9), n_samples=500)
    x = est.extra
    assert all(0 < d2 < math.inf for d2 in x["cov2_au_beck"])
    parts = (x["stderr_spread"], x["stderr_log_spread"], x["stderr_within"], x["stderr_lognormal"])
    s = float(np.std(x["log_runs"], ddof=1))
    assert x["stderr_lognormal"] == pytest.approx(math.sqrt(s**2 / 10 + s**4 / 18))
    assert est.log_volume_stderr == pytest.approx(max(parts) * math.sqrt(9 / 7))


def test_systematic_resampling_keeps_every_survivor():
    """Seeds for the next level: every survivor is chosen when there are at most p0·N of them (spec §6.6:
    no cap dropped by the luck of a multinomial draw); copies are balanced (floor or ceil)."""
    from tasks.forging.estimators.subset_simulation import _systematic

    gen = torch.Generator().manual_seed(0)
    surv = torch.rand(200, 100, generator=gen) < 0.07
    surv[:, 3] = True
    sel = _systematic(surv, 10, gen)
    assert bool(torch.gather(surv, 1, sel).all())
    counts = torch.zeros(surv.shape, dtype=torch.long).scatter_add_(1, sel, torch.ones_like(sel))
    cmin = torch.where(surv, counts, 10**6).min(1).values
    cmax = torch.where(surv, counts, -1).max(1).values
    few = surv.sum(1) <= 10
    assert few.any() and (~few).any()
    assert bool((cmin[few] >= 1).all()) and bool((cmax - cmin)[few].le(1).all())
    assert bool(cmax[~few].le(1).all())  # more survivors than seeds: distinct ones


def test_naive_mc_cost_is_analytic_binomial(linreg, torch_gen):
    """The benchmark's naive-MC cost (1-p)/(p·rel²) inverts naive MC's own stated SE: on the
    label-sampled linreg slab (W an indicator) n samples give relative SE rel with n = (1-p)/(p·rel²)
    to within 2%; undefined inputs give NaN."""
    assert naive_mc_samples_for(1e-30, 0.1) == pytest.approx(1e32)
    assert math.isnan(naive_mc_samples_for(1e-6, math.nan)) and math.isnan(naive_mc_samples_for(0.0, 0.1))
    model, xs = linreg(3)
    est = naive_mc(slab_problem(model, xs, 1.0, "sampled", eps_max=0.3), 0.3, generator=torch_gen(8), n_samples=50_000)
    p_hat = math.exp(est.log_probability)
    assert 1e-3 < p_hat < 0.5
    assert naive_mc_samples_for(p_hat, est.log_volume_stderr) == pytest.approx(50_000, rel=0.02)


def test_P000_5_estimated_slope_is_d(linreg, torch_gen):
    """P000-5 (estimators): fitted small-eps slope of subset-simulation log volumes ≈ d within 5%."""
    d = 3
    model, xs = linreg(d)
    problem = slab_problem(model, xs, 1.0, "integrated")
    eps = np.array([1e-3, 3e-3, 1e-2])
    logv = [subset_simulation(problem, float(e), generator=torch_gen(i), n_samples=2000).log_volume
            for i, e in enumerate(eps)]
    slope, _, _ = fit_log_slope(eps, np.array(logv))
    assert slope == pytest.approx(d, rel=0.05)


def test_P000_6_R_scaling_estimated(linreg, torch_gen):
    """P000-6 (estimators): mu/R^{d-1} at R = 1 and R = 2.5 agree within 4 SE (RB MC)."""
    model, xs = linreg(3)
    vals = []
    for R in (1.0, 2.5):
        e = naive_mc(slab_problem(model, xs, R, "integrated"), 0.2, generator=torch_gen(3), n_samples=200_000)
        vals.append((e.log_volume - 2 * math.log(R), e.log_volume_stderr))
    assert abs(vals[0][0] - vals[1][0]) < 4 * math.hypot(vals[0][1], vals[1][1])


@pytest.mark.parametrize("est,label,n", [("naive_mc", "sampled", 100_000), ("subset_simulation", "integrated", 1000)])
@pytest.mark.parametrize("eps", [0.02, 0.1, 0.5])
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("model_name,width", [("linreg", 0), ("relu1", 2), ("relu1", 8)])
def test_measured_volumes_below_paper_bounds(model_name, width, d, eps, est, label, n):
    """F000-3/F000-4, P000-3/4/10: every measured volume (SS and MC) is below Prop 2 (16)/(17)-corrected
    (linreg) or Prop 4 (24)/(25)-corrected (ReLU) whenever their hypotheses hold (eps < ||∇f(x*)||);
    a volume that is not finite is the reported ReLU unbounded case (status 1) or naive MC without a
    hit (-inf, nothing to compare), not a failure."""
    out = forging_cell(model=model_name, d=d, eps=eps, width=width, estimator=est, label=label, n_samples=n, seed=4)
    if not np.isfinite(out["log_volume"]):
        assert (out["log_volume"] == math.inf and out["status"] == 1.0) or \
            (out["log_volume"] == -math.inf and est == "naive_mc" and out["n_hits"] == 0), out
        return
    bounds = [out[key] for key in ("log_bound_eq16", "log_bound_eq17_corrected", "log_bound") if np.isfinite(out[key])]
    assert bounds, out  # the comparison is not vacuous
    assert out["log_volume"] - 3 * out["log_volume_stderr"] <= min(bounds)


def test_P000_10_relu_unbounded_and_nullity():
    """P000-10: ReLU with eps >= ||∇f(x*)||_F and n < d reports an infinite volume (status 1) instead
    of a number; r >= 1 at a generic x* (homogeneity direction)."""
    out = forging_cell(model="relu1", d=4, width=2, eps=1.5, A=1.0, estimator="subset_simulation", n_samples=1000)
    assert out["log_volume"] == math.inf and out["status"] == 1.0 and math.isnan(out["log_bound"])
    ok = forging_cell(model="relu1", d=4, width=2, eps=0.5, A=1.0, estimator="naive_mc", n_samples=20_000)
    assert math.isfinite(ok["log_volume"]) and ok["status"] == 0.0
    assert ok["nullity"] >= 1


@pytest.mark.parametrize("model_name,d", [("linreg", 2), ("tanh1", 2)])
def test_P000_8_general_smooth_slopes(model_name, d):
    """P000-8: on D2 = B_R(x*) ⊂ R^{d+1}, the fitted small-eps slope is >= (D - r)/2 (Thm 2) and,
    for linreg and a tanh net, ≈ D - r within 10% (tube around the exact-forging set)."""
    eps = np.array([1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    outs = [forging_cell(model=model_name, d=d, width=3, eps=float(e), domain="ball", estimator="subset_simulation",
                         n_samples=2000, seed=5 + i) for i, e in enumerate(eps)]
    slope, _, _ = fit_log_slope(eps, np.array([o["log_volume"] for o in outs]))
    r = outs[0]["nullity"]
    assert slope >= outs[0]["thm2_exponent"] == (d + 1 - r) / 2
    assert slope == pytest.approx(outs[0]["tube_exponent"], rel=0.1), (model_name, slope, r)


@pytest.mark.parametrize("eps", [0.1, 0.3])
@pytest.mark.parametrize("d", [2, 3])
def test_P000_14_probability_bound_uniform_cylinder(d, eps, linreg, torch_gen):
    """P000-14 / F000-5: P((z, t) ∈ S_eps) under the uniform law on B_2 × [-4, 4] (L_g = 0, no tail)
    (estimated by subset simulation) is below Cor 1 (30) and, when valid, (31)-corrected."""
    model, xs = linreg(d)
    prob = cylinder_problem(model.loss, model.w, xs, 2.0, 4.0)
    est = subset_simulation(prob, eps, generator=torch_gen(6), n_samples=1000)
    assert est.n_hits > 0 and est.log_volume > -40
    b30 = fb.cor1_eq30(d, 2.0, 4.0, eps)
    b31 = fb.cor1_eq31_corrected(d, 2.0, 4.0, eps, 1.0)
    assert est.log_volume <= b30.log_value and (not b31.valid or est.log_volume <= b31.log_value)


def test_naive_mc_zero_hits_reports_upper_bound(linreg, torch_gen):
    """Naive MC at a tiny probability sees no hits: -inf with a rule-of-three upper bound (F000-5 marks)."""
    model, xs = linreg(10)
    est = naive_mc(slab_problem(model, xs, 1.0, "sampled", eps_max=0.01), 0.01, generator=torch_gen(7), n_samples=10_000)
    assert est.n_hits == 0 and est.log_volume == -math.inf
    assert est.extra["log_upper95"] > linreg_log_volume(10, 0.01, 1.0)


@pytest.mark.parametrize("eps", [0.0, 0.5])  # 0.5: beyond eps_max of the label range
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimators_reject_bad_eps(name, eps, linreg, torch_gen):
    """ESTIMATORS share one signature; eps <= 0 or beyond the problem's eps_max raises ValueError naming eps."""
    model, xs = linreg(3)
    problem = slab_problem(model, xs, 1.0, "sampled", eps_max=0.1)
    with pytest.raises(ValueError, match="eps"):
        ESTIMATORS[name](problem, eps, generator=torch_gen(0), n_samples=1000)


def test_estimators_registry_and_bad_inputs(linreg, torch_gen):
    """Bad n_samples / p0 / R / d raise ValueError naming the argument."""
    assert set(ESTIMATORS) >= {"naive_mc", "subset_simulation"}
    model, xs = linreg(3)
    problem = slab_problem(model, xs, 1.0, "sampled", eps_max=0.1)
    with pytest.raises(ValueError, match="p0"):
        subset_simulation(problem, 0.05, generator=torch_gen(0), n_samples=1000, p0=1.5)
    with pytest.raises(ValueError, match="n_samples"):
        naive_mc(problem, 0.05, generator=torch_gen(0), n_samples=1)
    with pytest.raises(ValueError, match="R must"):
        slab_problem(model, xs, 0.0)
    with pytest.raises(ValueError, match="d must"):
        slab_problem(make_model("linreg", 1, 0, torch_gen(0)), torch.zeros(2, dtype=torch.float64), 1.0)
    assert log_ball_volume(3) == pytest.approx(math.log(4 * math.pi / 3))


def test_subset_simulation_levels_step_below_a_plateau_of_the_level_function():
    """Issue 41: where g is constant on a region holding more than the p0-quantile (ties: forge_net's
    g = 1 on the all-off cone), the pilot's level goes just below the plateau, seeded by the points
    under it, instead of sitting at the plateau's value (which kept the plateau in every run's population
    and starved the next level: runs died, or the pilot stalled there). Problem: ξ ~ N(0, I_2),
    g = 1 on {ξ1 < 0} (half the mass), exp(1.5 − ξ2) on {ξ1 >= 0, ξ2 > 1.5} (3.3 %), 2 + ξ1² elsewhere;
    P(g <= eps) = Φ̄(1.5 − log eps)/2 exactly. Every level is off the plateau value and the estimate at
    eps = 0.1 (p = 3.6e-5) is within 3 stated SE of the exact one."""
    from tasks.forging.problems import ForgingProblem

    def evaluate(xi):
        g = torch.where(xi[:, 0] < 0, torch.ones_like(xi[:, 0]),
                        torch.where(xi[:, 1] > 1.5, torch.exp(1.5 - xi[:, 1]), 2 + xi[:, 0] ** 2))
        return g, torch.ones_like(g)

    problem = ForgingProblem(2, evaluate, "indicator", 0.0, 1, math.inf, "plateau at g = 1")
    eps = 0.1
    exact = math.log(0.5 * 0.5 * math.erfc((1.5 - math.log(eps)) / math.sqrt(2)))
    est = subset_simulation(problem, eps, generator=torch.Generator().manual_seed(3), n_samples=100, n_repeats=10)
    levels = est.extra["levels"]
    assert not est.extra.get("stalled") and levels[0] < 1 and all(b != 1.0 for b in levels), levels
    assert abs(est.log_volume - exact) <= 3 * est.log_volume_stderr, (est.log_volume, exact, est.log_volume_stderr)


@pytest.mark.parametrize("lognormal, lo, hi", [(True, 0.88, 1.0), (False, 0.0, 0.75)])
def test_runs_with_a_wide_lognormal_spread_state_an_error_that_covers_them(lognormal, lo, hi):
    """Subset simulation's runs are products of ~60 level probabilities at p = 1e-60: lognormal, with
    sd(log run) ≈ 2.4 (benchmarks/forge_coverage_linreg.py). The log of the mean of 10 of them then
    falls ~0.8 below log E on average; Cox's lognormal standard error as a floor (``lognormal``, what
    subset_simulation passes) makes the stated 95 % interval cover log E in 89 % of 2000 draws of exactly
    lognormal runs (on the benchmark's subset-simulation runs 90-98 % per problem, 50 seeds each), where
    the spread-of-runs error alone covers it in 69 %."""
    from types import SimpleNamespace

    from tasks.forging.estimators.common import estimate_from_runs

    mu, s, R, reps = -138.0, 2.4, 10, 2000
    truth = mu + s * s / 2  # log E[run]
    g = torch.Generator().manual_seed(0)
    problem = SimpleNamespace(log_measure=0.0)
    hit = 0
    for _ in range(reps):
        log_runs = mu + s * torch.randn(R, generator=g, dtype=torch.float64)
        est = estimate_from_runs("subset_simulation", problem, log_runs, 0, 1, {}, lognormal=lognormal)
        hit += abs(est.log_volume - truth) <= 1.959964 * est.log_volume_stderr
    assert lo <= hit / reps <= hi
