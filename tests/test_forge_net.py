"""Experiment ``forge_net`` (paper 000 Eq 1 on stored nets): the gradient over the trained blocks
against torch.autograd, the estimated forging volume against a dense grid (d = 2), and the cell's
bookkeeping (forgotten / retained points, padding, seeding independent of the bundle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.errors import ConfigError
from flows.experiments import forge_net as exp_mod
from storage.nets import Nets
from tasks.cells import forge_net as fn
from tasks.forging.estimators import ESTIMATORS

DT = torch.float64
ALL = frozenset({"W", "b", "v"})
TRAINED = [frozenset({"W"}), frozenset({"W", "b"}), ALL]  # paper 001, paper 003 (bias variant), papers 002/004


def _net(k: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(k, d, generator=g, dtype=DT), 0.3 * torch.randn(k, generator=g, dtype=DT),
            torch.randn(k, generator=g, dtype=DT))


def autograd_grads(W, b, v, X, y, trained, loss):
    """Per-example ∇_θ ℓ(y f(x)) over the trained blocks (order W, b, v) by torch.autograd: one copy of
    θ per example, so one backward pass gives every per-example gradient (independent of forge_net)."""
    N = X.shape[0]
    p = {n: t.expand(N, *t.shape).clone().requires_grad_(n in trained) for n, t in (("W", W), ("b", b), ("v", v))}
    f = (torch.relu(torch.einsum("nkd,nd->nk", p["W"], X) + p["b"]) * p["v"]).sum(1)
    q = y * f
    ell = F.softplus(-q) if loss == "logistic" else torch.exp(-q)
    grads = torch.autograd.grad(ell.sum(), [p[n] for n in fn.BLOCKS if n in trained])
    return torch.cat([g.reshape(N, -1) for g in grads], 1)


@pytest.mark.parametrize("loss", ["logistic", "exp"])
@pytest.mark.parametrize("trained", TRAINED, ids=lambda t: "+".join(sorted(t)))
def test_loss_grad_over_the_trained_blocks_is_autograds(trained, loss):
    """Eq 1's gradient over the trained blocks only (W; W, b; W, b, v): equal to autograd's to round-off
    (a dropped bias block, a wrong sign or an untrained block included fails here)."""
    W, b, v = _net(5, 3, 0)
    W[0], b[0] = 0.0, 0.0  # a dead neuron (v_0 != 0): ρ'(0) = 0 (spec §6.8), as autograd's relu
    g = torch.Generator().manual_seed(1)
    X = torch.randn(40, 3, generator=g, dtype=DT)
    y = torch.where(torch.rand(40, generator=g, dtype=DT) < 0.5, -1.0, 1.0).to(DT)
    ours = fn.loss_grad(W, b, v, X, y, trained, loss)
    ref = autograd_grads(W, b, v, X, y, trained, loss)
    assert ours.shape == ref.shape == (40, 5 * 3 * ("W" in trained) + 5 * ("b" in trained) + 5 * ("v" in trained))
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-14)


def test_log_grad_norm_survives_a_saturated_margin():
    """log ‖∇ℓ(x_i)‖ is autograd's at a moderate margin, and finite where ∇ℓ underflows (exp loss,
    θ scaled by 60: margin ~1e3, e^-1000 = 0 in float64); the relative level g stays defined (0 at x_i)."""
    W, b, v = _net(4, 2, 0)
    x = torch.tensor([0.6, -0.3], dtype=DT)
    y = torch.sign(torch.relu(W @ x + b) @ v)
    _, lgn = fn.forging_problem(W, b, v, x, y, ALL, "exp", 1.5)
    ref = float(autograd_grads(W, b, v, x[None], y[None], ALL, "exp").norm())
    assert lgn == pytest.approx(math.log(ref), rel=1e-12)
    s = 60.0
    problem, lgn_big = fn.forging_problem(W * s, b * s, v * s, x, y, ALL, "exp", 1.5)
    assert float(autograd_grads(W * s, b * s, v * s, x[None], y[None], ALL, "exp").norm()) == 0.0
    assert math.isfinite(lgn_big) and lgn_big < -745
    xi0 = torch.special.ndtri(torch.tensor([(float(x.norm()) / 1.5) ** 2], dtype=DT))  # latent of x' = x_i
    g, _ = problem.evaluate(torch.cat([xi0, x])[None])
    assert float(g[0]) < 1e-10


def _grid_log_volume(W, b, v, x, y, trained, loss, R, eps, n=1000):
    """log μ{x' ∈ B_R : ‖∇ℓ(x') − ∇ℓ(x)‖ <= eps ‖∇ℓ(x)‖} by the midpoint rule on an n × n grid, gradients
    by autograd (measured: n = 1000 within 0.004 of n = 4000 in log on the nets below)."""
    h = 2 * R / n
    c = -R + h * (torch.arange(n, dtype=DT) + 0.5)
    Z = torch.stack(torch.meshgrid(c, c, indexing="ij"), -1).reshape(-1, 2)
    Z = Z[Z.norm(dim=1) < R]
    gi = autograd_grads(W, b, v, x[None], y[None], trained, loss)[0]
    G = autograd_grads(W, b, v, Z, y.expand(len(Z)), trained, loss)
    return math.log(int(((G - gi).norm(dim=1) <= eps * gi.norm()).sum()) * h * h)


GRID_ERR = 0.01  # allowance for the grid's own error in log (measured <= 0.004 at n = 1000 vs n = 4000)


@pytest.mark.parametrize("estimator,n_samples", [("subset_importance", 1000), ("nested_sampling", 200)])
@pytest.mark.parametrize("trained,eps", [(ALL, 0.1), (frozenset({"W"}), 0.3)], ids=["WbV-eps0.1", "W-eps0.3"])
def test_volume_agrees_with_a_dense_grid_at_d2(estimator, n_samples, trained, eps):
    """Known positive (d = 2, 4 neurons, bias): the estimate of log μ(S_eps ∩ B_R) is within 3 stated
    SE (+ the grid's error) of the dense-grid volume; forging probabilities e^-4.5 and e^-6 (a few levels).
    Measured (generator seed 1): W,b,v eps 0.1: grid -4.046 (n = 4000: -4.043), subset_importance -4.029 ± 0.010,
    nested (200 live) -4.145 ± 0.066; W eps 0.3: grid -2.572, -2.564 ± 0.011, -2.498 ± 0.095. The two
    trained sets differ by 0.7 in log, so a gradient over the wrong blocks fails."""
    W, b, v = _net(4, 2, 3)
    x, y = torch.tensor([0.6, -0.3], dtype=DT), torch.tensor(1.0, dtype=DT)
    R = 1.5
    ref = _grid_log_volume(W, b, v, x, y, trained, "logistic", R, eps)
    problem, _ = fn.forging_problem(W, b, v, x, y, trained, "logistic", R)
    est = ESTIMATORS[estimator](problem, eps, generator=torch.Generator().manual_seed(1), n_samples=n_samples,
                                n_repeats=10, n_importance=20_000)
    assert est.log_probability < -3.5  # a rare-ish event: the estimator had to level
    assert abs(est.log_volume - ref) <= 3 * est.log_volume_stderr + GRID_ERR, (est.log_volume, ref,
                                                                                       est.log_volume_stderr)


def _cell(**over) -> dict:
    return dict({k: p.default for k, p in exp_mod.P.items()}, **over)


def _nets(forgotten=True) -> Nets:
    """Two nets zero-padded into one stack as storage.nets pads them: net 0 d = 3, width 4, m = 5
    (point 3 forgotten); net 1 d = 2, width 3, m = 4 (nothing forgotten)."""
    E, K, D, M = 2, 4, 3, 5
    W, b, v, X, y = torch.zeros(E, K, D, dtype=DT), torch.zeros(E, K, dtype=DT), torch.zeros(E, K, dtype=DT), \
        torch.zeros(E, M, D, dtype=DT), torch.zeros(E, M, dtype=DT)
    for e, (k, d, m) in enumerate(((4, 3, 5), (3, 2, 4))):
        W[e, :k, :d], b[e, :k], v[e, :k] = _net(k, d, 10 + e)
        g = torch.Generator().manual_seed(20 + e)
        X[e, :m, :d] = torch.randn(m, d, generator=g, dtype=DT) / math.sqrt(d)
        y[e, :m] = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0][:m], dtype=DT)
    m = torch.tensor([5, 4])
    extra = {"forgotten": torch.tensor([[0, 0, 0, 1.0, 0], [0, 0, 0, 0, 0]], dtype=DT)} if forgotten else {}
    nets = Nets(W, b, v, X, y, torch.arange(M)[None] < m[:, None], torch.tensor([3, 2]), m, torch.tensor([4, 3]),
                torch.zeros(E, 8, dtype=torch.uint8), [{"seed": 0, "d": 3}, {"seed": 1, "d": 2}], ["", ""], [0, 0],
                extra, {"forgotten": ("sample",)} if forgotten else {})
    return nets


CHEAP = dict(estimator="subset_simulation", n_samples=200, n_repeats=10, points=2, eps=0.3)


def test_forgotten_and_retained_points_reported_apart():
    """Measured: the first ``points`` and every forgotten point; means over each set; NaN elsewhere."""
    out = exp_mod.run_bundle([_cell(**CHEAP)] * 2, inputs=_nets())
    a, b = out
    assert np.isfinite(a["logvol"][[0, 1, 3]]).all() and np.isnan(a["logvol"][[2, 4]]).all()
    assert (a["point_status"][[0, 1, 3]] == 0).all() and np.isfinite(a["logvol_stderr"][[0, 1, 3]]).all()
    assert a["logvol_forgotten"] == a["logvol"][3]
    assert a["logvol_retained"] == pytest.approx(a["logvol"][:2].mean(), rel=1e-15)
    assert (a["n_forgotten"], a["n_retained"], a["n_failed"]) == (1, 2, 0)
    assert b["logvol"].shape == (4,) and np.isfinite(b["logvol"][:2]).all() and np.isnan(b["logvol"][2:]).all()
    assert math.isnan(b["logvol_forgotten"]) and (b["n_forgotten"], b["n_retained"]) == (0, 2)
    # each net measured in its own dimension and data ball: net 1 is d = 2, R = its largest ‖x_i‖
    assert b["R_used"] == pytest.approx(float(_nets().X[1, :4, :2].norm(dim=1).max()))
    from tasks.forging.exact import log_ball_volume
    assert b["log_domain_volume"] == pytest.approx(log_ball_volume(2, b["R_used"]))
    assert a["wall_s"] > 0 and a["n_gradient_evals"] > 0


def test_a_cells_numbers_do_not_depend_on_its_bundle():
    """Net 1 alone (cut to d = 2, width 3) gives exactly its numbers in the padded bundle."""
    both = exp_mod.run_bundle([_cell(**CHEAP)] * 2, inputs=_nets())
    alone = exp_mod.run_bundle([_cell(**CHEAP)], inputs=_nets().select([1]))
    for key in ("logvol", "logvol_stderr", "log_grad_norm"):
        np.testing.assert_array_equal(both[1][key], alone[0][key])


def test_identical_nets_get_identical_estimates_whatever_their_grid_coordinates():
    """Issue 41: the estimator's stream is the net's content, the point and the estimator seed. The same
    net read as two upstream cells with other coordinates (unlearn's identity at alpha 0.5 and 1.0)
    and measuring another number of points gets bit-identical numbers; another estimator seed, or a
    net differing in one bit of one weight, gets other ones (a stream keyed on the upstream cell's
    coordinates fails the first assertion, one keyed on nothing the last two)."""
    base = _nets().select([1])
    base.cells = [{"seed": 0, "d": 2, "unlearn_method": "identity", "alpha": 0.5}]
    other = _nets().select([1])
    other.cells = [{"seed": 7, "d": 2, "unlearn_method": "identity", "alpha": 1.0}]
    a = exp_mod.run_bundle([_cell(**CHEAP)], inputs=base)[0]
    b = exp_mod.run_bundle([_cell(**dict(CHEAP, points=3))], inputs=other)[0]
    assert np.isfinite(a["logvol"][:2]).all()
    for key in ("logvol", "logvol_stderr", "log_grad_norm", "point_status"):
        np.testing.assert_array_equal(a[key][:2], b[key][:2])
    reseeded = exp_mod.run_bundle([_cell(**dict(CHEAP, seed=1))], inputs=base)[0]
    assert (reseeded["logvol"][:2] != a["logvol"][:2]).all()
    np.testing.assert_array_equal(reseeded["log_grad_norm"], a["log_grad_norm"])
    nudged = _nets().select([1])
    nudged.W[0, 0, 0] = torch.nextafter(nudged.W[0, 0, 0], torch.tensor(math.inf, dtype=DT))
    moved = exp_mod.run_bundle([_cell(**CHEAP)], inputs=nudged)[0]
    assert (moved["logvol"][:2] != a["logvol"][:2]).all()


def test_point_generator_keys_on_content_point_and_seed():
    """The stream's key: same content -> same stream (copies, non-contiguous views); the point index,
    the estimator seed, an estimator param, the trained blocks and each array of the net change it;
    ``points`` does not."""
    W, b, v = _net(3, 2, 0)
    X = torch.randn(4, 2, dtype=DT, generator=torch.Generator().manual_seed(5))
    y = torch.tensor([1.0, -1, 1, -1], dtype=DT)
    own = _cell(**CHEAP)

    def draw(own=own, W=W, b=b, v=v, X=X, y=y, trained=ALL, i=0):
        return torch.rand(4, generator=fn.point_generator(own, W, b, v, X, y, trained, i)).tolist()

    ref = draw()
    assert draw(W=W.T.clone().T, X=torch.cat([X, X], 1)[:, :2]) == ref  # non-contiguous views, same bytes
    assert draw(own=dict(own, points=-1)) == ref
    changed = [draw(i=1), draw(own=dict(own, seed=1)), draw(own=dict(own, eps=0.2)), draw(trained=frozenset({"W"})),
               draw(W=W + 1e-12), draw(b=-b), draw(v=v * 2), draw(X=X.flip(0)), draw(y=-y)]
    assert all(c != ref for c in changed) and len({tuple(c) for c in changed}) == len(changed)


ROWS = lambda *on: (lambda: torch.tensor([on, on], dtype=torch.bool))  # noqa: E731 - Nets.trained() form


@pytest.mark.parametrize("given,trained", [(None, ALL), (frozenset({"W"}), {"W"}), (frozenset({"W", "b"}), {"W", "b"}),
                                           (ROWS(True, False, False), {"W"}), (ROWS(True, True, False), {"W", "b"})],
                         ids=["default", "set-W", "set-Wb", "rows-W", "rows-Wb"])
def test_the_trained_blocks_come_from_the_inputs(given, trained):
    """``inputs.trained`` (a frozenset, or the method giving (E, 3) bool rows over W, b, v; default all)
    selects the gradient blocks: log_grad_norm is autograd's over them."""
    nets = _nets().select([1])  # (select builds a new Nets: the attribute is set on the one read)
    if given is not None:
        nets.trained = given
    out = exp_mod.run_bundle([_cell(estimator="naive_mc", n_samples=200, points=1)], inputs=nets)[0]
    ref = autograd_grads(nets.W[0], nets.b[0], nets.v[0], nets.X[0, :1], nets.y[0, :1], trained, "logistic")
    assert out["log_grad_norm"][0] == pytest.approx(math.log(float(ref.norm())), rel=1e-12)


def test_points_minus_one_measures_every_point_and_exp_loss_applies():
    cell = _cell(**dict(CHEAP, points=-1, loss="exp"))
    out = exp_mod.run_bundle([cell], inputs=_nets(forgotten=False).select([1]))[0]
    assert np.isfinite(out["logvol"]).all() and out["n_retained"] == 4 and math.isnan(out["logvol_forgotten"])
    nets = _nets()
    ref = autograd_grads(nets.W[1, :3, :2], nets.b[1, :3], nets.v[1, :3], nets.X[1, :4, :2], nets.y[1, :4], ALL, "exp")
    np.testing.assert_allclose(out["log_grad_norm"], np.log(ref.norm(dim=1).numpy()), rtol=1e-12)


@pytest.mark.parametrize("over,field", [(dict(eps=1.0), "eps"), (dict(n_repeats=5), "n_repeats"),
                                        (dict(estimator="subset_simulation", n_samples=1005), "n_samples")])
def test_config_refusals_name_the_field(over, field):
    with pytest.raises(ConfigError) as err:
        exp_mod.EXPERIMENT.check(_cell(**over))
    assert field in str(err.value)
    exp_mod.EXPERIMENT.check(_cell())


# --- issue 41: the stated error against plain Monte Carlo on known answers ------------------------

Z95 = 1.959963984540054


def _kkt_net(d: int, m: int, width: int, seed: int) -> dict:
    """One net as the synthetic CI chain trained it (pipeline-small before issue 39, train_kkt: frozen ±1/√width
    output layer, W trained, logistic loss, 3000 GD steps from init scale 1e-3), called directly."""
    from flows import experiments

    exp = experiments.get("train_kkt")
    cell = dict({k: p.default for k, p in exp.params.items()}, d=d, m=m, width=width, epochs=3000, lr=1.0, wd=0.0,
                init_scale=1e-3, seed=seed)
    out = exp.run_bundle([cell], "cpu")[0]
    return {k: torch.as_tensor(out[k]) for k in ("W", "b", "v", "X", "y")}


def _mc_log_volume(net: dict, i: int, eps: float, centre: torch.Tensor, r: float, n: int, seed: int):
    """Plain MC, written apart from forge_net: x' uniform in B_r(centre) ∩ B_R(0) (R = the largest ‖x_j‖),
    ∇_W softplus(−y f(x')) = −σ(−q) y (v ⊙ 1[Wx' + b > 0]) x'ᵀ, hit if within eps·‖∇_W ℓ(x_i)‖ of
    ∇_W ℓ(x_i). Returns (log volume, its standard error)."""
    W, b, v, X, y = (net[k] for k in ("W", "b", "v", "X", "y"))
    d, R = X.shape[1], float(X.norm(dim=1).max())

    def grads(Z):
        H = Z @ W.T + b
        q = y[i] * (torch.relu(H) @ v)
        return (-torch.sigmoid(-q) * y[i])[:, None, None] * ((H > 0) * v)[:, :, None] * Z[:, None, :]

    g_i = grads(X[i][None])[0]
    gen = torch.Generator().manual_seed(seed)
    h = 0
    for start in range(0, n, 250_000):
        u = torch.randn(min(250_000, n - start), d, dtype=DT, generator=gen)
        Z = centre + r * torch.rand(u.shape[0], 1, dtype=DT, generator=gen) ** (1 / d) * u / u.norm(dim=1, keepdim=True)
        h += int((((grads(Z) - g_i).flatten(1).norm(dim=1) <= eps * g_i.norm()) & (Z.norm(dim=1) < R)).sum())
    return math.log(h / n) + math.log(math.pi ** (d / 2) / math.gamma(d / 2 + 1) * r ** d), math.sqrt((1 - h / n) / h)


def _seeds(net: dict, i: int, eps: float, n_samples: int, n_importance: int, seeds) -> list:
    W, b, v, X, y = (net[k] for k in ("W", "b", "v", "X", "y"))
    problem, _ = fn.forging_problem(W, b, v, X[i], y[i], frozenset({"W"}), "logistic", float(X.norm(dim=1).max()))
    return [ESTIMATORS["subset_importance"](problem, eps, generator=torch.Generator().manual_seed(s),
                                            n_samples=n_samples, n_repeats=10, n_importance=n_importance)
            for s in seeds]


def test_stated_interval_covers_plain_mc_on_a_small_net(one_torch_thread):
    """Issue 41, coverage on a known answer: a train_kkt net at d = 3 (width 6), point 1, eps = 0.5, whose
    forging volume plain MC over the whole domain B_R gives to ±0.012 (3e6 draws, no assumption on where
    the set lies). Over 20 estimator seeds at n_samples 100, n_importance 10,000, every estimate is
    finite and marked reliable, the stated 95 % interval covers the MC value in >= 18 of 20 and the
    spread over seeds is within 1.5× of the stated SE. Measured (benchmarks/forge_coverage.py, 50 seeds):
    coverage 0.96, spread / rms stated SE 1.01, bias -0.007; these 20 seeds: 19 covered, ratio 0.94. A stated
    SE halved or doubled fails here, as does a biased estimate (the proposal density without its chart
    Jacobian)."""
    net = _kkt_net(3, 4, 6, 0)
    truth, truth_se = _mc_log_volume(net, 1, 0.5, torch.zeros(3, dtype=DT), float(net["X"].norm(dim=1).max()),
                                     3_000_000, seed=1001)
    assert truth_se < 0.015
    ests = _seeds(net, 1, 0.5, 100, 10_000, range(20))
    lv = np.array([e.log_volume for e in ests])
    se = np.array([e.log_volume_stderr for e in ests])
    assert np.isfinite(lv).all() and np.isfinite(se).all()
    assert all(e.extra["reliable"] for e in ests)
    covered = np.abs(lv - truth) <= Z95 * np.hypot(se, truth_se)
    assert covered.sum() >= 18, (truth, lv.round(3).tolist(), se.round(3).tolist())
    ratio = lv.std(ddof=1) / math.sqrt((se ** 2).mean())
    assert 1 / 1.5 <= ratio <= 1.5, ratio


def test_an_estimate_outside_its_interval_is_never_marked_reliable(one_torch_thread):
    """Issue 41 on the synthetic CI chain's setting (pipeline-small before issue 39: train_kkt d = 10, width 8,
    eps = 0.3, W trained, n_samples 100, n_importance 1000): net seed 0, point 1, whose log-volume plain MC
    on B_0.35(x_i) gives to ±0.02 (the benchmark's 2e6 draws: -13.588 ± 0.005, B_0.45 agrees). Over 20
    estimator seeds: none stalls or returns -inf (the level function without g's plateau at 1; before:
    8 of 40 stalled and 8 returned -inf "ok"), several miss the truth by more than their stated 95 %
    interval (800 importance draws, ESS ~18: the stated SE is ~0.6× the spread and the estimates ~0.2
    low), and every one that misses is marked unreliable. The pre-issue-41 rule (Pareto k̂ <= 0.7, or NaN)
    passed 29 of 50 such results, of which 34 % missed."""
    net = _kkt_net(10, 4, 8, 0)
    truth, truth_se = _mc_log_volume(net, 1, 0.3, net["X"][1], 0.35, 200_000, seed=1001)
    assert truth_se < 0.025 and abs(truth - (-13.588)) < 4 * truth_se  # the benchmark's 2e6-draw value
    ests = _seeds(net, 1, 0.3, 100, 1000, range(20))
    assert not any(e.extra.get("stalled") for e in ests)
    lv = np.array([e.log_volume for e in ests])
    se = np.array([e.log_volume_stderr for e in ests])
    assert np.isfinite(lv).all() and np.isfinite(se).all()
    missed = np.abs(lv - truth) > Z95 * np.hypot(se, truth_se)
    assert missed.sum() >= 3  # the starved setting does miss: the check below has something to catch
    reliable = np.array([e.extra["reliable"] for e in ests])
    assert not (missed & reliable).any(), [(float(a), float(s), e.extra.get("ess"), e.extra.get("pareto_khat"))
                                           for a, s, e, m in zip(lv, se, ests, missed & reliable) if m]


def test_a_volume_that_is_not_finite_is_never_ok(monkeypatch):
    """A -inf volume (every subset-simulation run died although the pilot reached eps: x_i is in the
    set) or a NaN SE is point_status 3, never 0, whatever the estimator's flags say; and
    subset_importance flags an all-dead subset simulation itself (reliable False)."""
    from tasks.forging.estimators import VolumeEstimate

    fake = {"value": (-math.inf, math.nan, {})}
    monkeypatch.setitem(fn.ESTIMATORS, "subset_importance",
                        lambda problem, eps, **kw: VolumeEstimate("fake", fake["value"][0], fake["value"][1], 1, 0,
                                                                  fake["value"][0], fake["value"][2]))
    nets = _nets().select([1])
    cell = _cell(estimator="subset_importance", points=1)
    for value, status in [((-math.inf, math.nan, {}), 3), ((-5.0, math.nan, {}), 3), ((-5.0, 0.1, {}), 0),
                          ((-5.0, 0.1, {"reliable": False}), 3), ((math.nan, math.nan, {"stalled": True}), 2)]:
        fake["value"] = value
        out = exp_mod.run_bundle([cell], inputs=nets)[0]
        assert out["point_status"][0] == status, value
        assert (out["n_failed"] == 0) == (status == 0)
        assert np.isfinite(out["logvol"][0]) == (status == 0)
    monkeypatch.undo()
    import tasks.forging.estimators.importance as imp

    dead = VolumeEstimate("subset_simulation", -math.inf, math.nan, 10, 0, -math.inf, {"n_levels": 3})
    monkeypatch.setattr(imp, "subset_simulation_samples", lambda *a, **kw: (dead, None, None))
    problem, _ = fn.forging_problem(*_net(3, 2, 0), torch.tensor([0.6, -0.3], dtype=DT), torch.tensor(1.0, dtype=DT),
                                    ALL, "logistic", 1.5)
    est = imp.subset_importance(problem, 0.3, generator=torch.Generator().manual_seed(0))
    assert est.log_volume == -math.inf and est.extra["reliable"] is False and est.extra["subset_only"]
