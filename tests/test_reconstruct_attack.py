"""Paper 004 at CI size, through the ``reconstruct`` cell (tasks/cells/reconstruct.py, no Prefect):

- a known positive: n = 2 points on S^63 (one per class), width 100, trained to loss 1e-12, near a KKT
  point (ε*/‖θ‖ with σ' ∈ [0, 1] at the kinks 0.006; 0.37 with the spec's step derivative, all of it at
  the kinks); the attack at the spec's defaults (α = 300, λ_min penalty on) recovers both points (a
  candidate within 0.3, spec §2.5) from inits at r = 0.1, and none from r = 1 or 10, where it ends on
  KKT sets as good as the recovered ones (the shape of F004-1, P004-14);
- the spec's CI size (n = 50, loss 1e-7, ε*/‖θ‖ 0.088): the training trajectory (P004-10, P004-11,
  P004-12) and the SAME attack, which reaches candidate sets with an exact-step residual below the
  training set's and recovers no training point at any radius (the paper's "no prior, no leakage"),
  with P004-13 and P004-15 judged at the spec's gates."""

from __future__ import annotations

import math

import pytest
import torch

from tasks import train
from tasks.cells import reconstruct as cell_fn
from tasks.cells.nonrobust import build, schedule
from tasks.reconstruct import attack as atk
from tasks.reconstruct import bounds, constructions as C, score as S

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CELL = dict(d=64, m=50, alpha=1.0, width=100, seed=0, data="unit_sphere", labels="sign_x1", init_scale=0.01,
            loss="logistic", lr0=0.01, lr_factor=1.1, lr_period=100, lr_period_fast=0, target_loss=1e-7,
            max_iters=100000, batch_size=5000)
RADII, RESTARTS = [0.1, 1.0, 10.0], 2
# the known positive (configs/quickstart-reconstruct.yaml, stage "nets"): one point per class
POS = dict(CELL, m=2, lr0=0.05, lr_factor=1.2, lr_period=50, target_loss=1e-12, max_iters=20000)
# one attack setting for both cases (the quickstart's; lambda_min penalty on at its default 0.01)
ATTACK = dict(n_candidates=10, steps=3000, lr_x=5e-5, lr_lam=5e-3)  # alpha: the default 300


def spearman(a, b) -> float:
    ra = torch.tensor(a).argsort().argsort().double()
    rb = torch.tensor(b).argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


@pytest.fixture(scope="module")
def trajectory():
    """Train in chunks; at ~12 log-spaced checkpoints: ε*/‖θ‖ (NNLS), and, once the data are separated
    (margin p > 0), ε* and the median B8 along U_d of the net normalised to margin 1 (θ/√p, the
    max-margin problem's scale: the raw net grows, so its raw ε* grows while ε*/‖θ‖ falls)."""
    net, X, y, mask, _ = build([CELL])
    sched = schedule(CELL)
    marks = sorted({int(round(10 ** e)) for e in torch.linspace(2.3, 4.1, 12).tolist()})
    st, done, rows = None, 0, []
    for t in marks:
        st = train.train(net, X, y, sched, mask=mask, state=st, max_steps=t - done)
        done = t
        W, b, v = st.net.W[0], st.net.b[0], st.net.v[0]
        eps, lam = bounds.eps_star(W, b, v, X[0], y[0])
        p = float((y[0] * C.phi(W, b, v, X[0])).min())
        row = [t, float(eps / st.net.sq_norm()[0].sqrt()), math.nan, math.nan]
        if p > 0:
            s = 1 / math.sqrt(p)
            e1, lam1 = bounds.eps_star(W * s, b * s, v * s, X[0], y[0])
            nu, _ = C.svd_direction(X[0])
            row[2:] = [float(S.median(bounds.b8(W * s, b * s, v * s, X[0], lam1, nu, e1))), float(e1)]
        rows.append(tuple(row))
        if int(st.status[0]) != train.RUNNING:
            break
    if int(st.status[0]) == train.RUNNING:
        st = train.train(net, X, y, sched, mask=mask, state=st)
    return st, X, y, mask, rows


@pytest.mark.slow
def test_P004_10_gd_reaches_loss_1e7_with_full_accuracy(trajectory):
    st, X, y, mask, _ = trajectory
    assert int(st.status[0]) == train.CONVERGED and float(st.log_loss[0]) <= math.log(1e-7)
    assert bool(((y * st.net(X)) > 0).all())


@pytest.mark.slow
def test_P004_11_eps_star_falls_and_euler_ratio_at_the_end(trajectory):
    st, X, y, _, rows = trajectory
    assert len(rows) >= 10
    assert spearman([r[0] for r in rows], [r[1] for r in rows]) < -0.8
    W, b, v = st.net.W[0], st.net.b[0], st.net.v[0]
    _, lam = bounds.eps_star(W, b, v, X[0], y[0])
    p = float((y[0] * C.phi(W, b, v, X[0])).min())
    ratio = 2 * p * float(lam.sum()) / float(st.net.sq_norm()[0])
    assert 0.8 <= ratio <= 1.05


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="P004-12 not observed at CI size: after separation the normalised ε* falls "
                   "(0.47 -> 0.37) but the median B8 falls too (2e-6 -> 4e-8; min_j |z_j(x_i)| shrinks), "
                   "docs/departures.md")
def test_P004_12_split_budget_grows_as_eps_falls(trajectory):
    rows = [r for r in trajectory[4] if not math.isnan(r[3])]
    assert len(rows) >= 5
    assert spearman([r[3] for r in rows], [r[2] for r in rows]) < -0.8


def attack_rows(st, X, y, mask, rows: list[tuple[int, dict]]) -> list[dict]:
    """The ``reconstruct`` cell on rows (net index, cell parameters over the experiment's defaults)."""
    from flows.experiments import reconstruct as rexp

    base = {k: p.default for k, p in rexp.P.items()}
    idx = [e for e, _ in rows]
    E, d, m, k = len(rows), X.shape[2], X.shape[1], st.net.W.shape[1]
    n = lambda val: torch.full((E,), val, dtype=torch.int64)  # noqa: E731
    return cell_fn.run(st.net.W[idx], st.net.b[idx], st.net.v[idx], X[idx], y[idx], mask[idx], n(d), n(m), n(k),
                       [base | c for _, c in rows])


def kink_relaxed_eps(W, b, v, X, y, tol: float = 1e-3):
    """ε/‖θ‖ of θ against (X, y) with the ReLU derivative free in [0, 1] where |z_ij| ≤ tol ‖(w_j, b_j)‖
    (the Clarke subdifferential at a kink; elsewhere the step), an independent scipy computation on the
    explicit Jacobian: min over λ ≥ 0, μ ≥ 0 of
    ‖θ − Σ_i λ_i y_i ∇Φ_step(x_i) − Σ_kinks μ_ij y_i v_j (x_i, 1)_j‖, and the implied
    σ'_ij = μ_ij / λ_i (a valid certificate needs them in [0, 1])."""
    import numpy as np
    from scipy.optimize import lsq_linear

    W, b, v, X, y = (t.numpy() for t in (W, b, v, X, y))
    k, d = W.shape
    Z = X @ W.T + b
    kink = np.abs(Z) <= tol * np.sqrt((W ** 2).sum(1) + b ** 2)[None, :]
    act = (Z > 0) & ~kink
    cols = [np.concatenate([((v * a)[:, None] * x[None, :] * t).ravel(), v * a * t, np.maximum(z, 0) * t])
            for x, t, a, z in zip(X, y, act, Z)]
    pairs = np.argwhere(kink)
    for i, j in pairs:
        gW, gb = np.zeros((k, d)), np.zeros(k)
        gW[j], gb[j] = v[j] * X[i] * y[i], v[j] * y[i]
        cols.append(np.concatenate([gW.ravel(), gb, np.zeros(k)]))
    J, theta = np.stack(cols, 1), np.concatenate([W.ravel(), b, v])
    sol = lsq_linear(J, theta, bounds=(0, np.inf)).x
    lam, mu = sol[: len(X)], sol[len(X):]
    sigma = mu / np.maximum(lam[pairs[:, 0]], 1e-300)
    return float(np.linalg.norm(theta - J @ sol) / np.linalg.norm(theta)), sigma, len(pairs)


def train_positive(seeds):
    cells = [dict(POS, seed=s) for s in seeds]
    net, X, y, mask, _ = build(cells)
    return train.train(net, X, y, schedule(cells[0]), mask=mask), X, y, mask


@pytest.fixture(scope="module")
def positive():
    """The known positive at its cheapest: one net, r = 0.1 and r = 10, two restarts each."""
    st, X, y, mask = train_positive([0])
    rows = [(0, dict(ATTACK, seed=0, radius=r, restart=k)) for r in (0.1, 10.0) for k in range(2)]
    return st, X, y, mask, rows, attack_rows(st, X, y, mask, rows)


def test_P004_known_positive_net_is_near_a_kkt_point_up_to_its_kinks(positive):
    """Loss 1e-12; ε*/‖θ‖ with the spec's step derivative (σ'(0) := 0) is 0.37, all of it at the kinks:
    with σ' ∈ [0, 1] on the (point, neuron) pairs at |z| ≤ 1e-3 ‖(w_j, b_j)‖ (the other class's point
    sits on the kink of every neuron of a class) it is 0.006 (scipy on the explicit Jacobian)."""
    st, X, y, _, _, out = positive
    assert int(st.status[0]) == train.CONVERGED and float(st.log_loss[0]) <= math.log(1e-12)
    step_eps = out[0]["train_eps"]
    relaxed, sigma, n_kinks = kink_relaxed_eps(st.net.W[0], st.net.b[0], st.net.v[0], X[0], y[0])
    assert n_kinks >= 20 and float(sigma.min()) >= 0 and float(sigma.max()) <= 1  # a valid certificate
    assert relaxed <= 0.01 and 0.3 <= step_eps <= 0.45, (relaxed, step_eps)


def test_P004_14_known_positive_recovers_both_points_from_near_inits_and_none_from_far(positive):
    """Every restart from r = 0.1 brings a candidate within 0.3 of each of the two training points (its
    init candidates are ~1 from both: a test that fails if the candidates never move); from r = 10
    none comes within 0.3, and the far candidates stay ~9 away."""
    *_, rows, out = positive
    near = [o for (_, c), o in zip(rows, out) if c["radius"] == 0.1]
    far = [o for (_, c), o in zip(rows, out) if c["radius"] == 10.0]
    assert all(o["status"] == atk.DONE for o in out)
    assert [o["n_recovered"] for o in near] == [2, 2] and max(float(o["point_dist"].max()) for o in near) <= 0.3
    assert min(o["score5_init"] for o in near) >= 0.9  # the init recovers nothing
    assert [o["n_recovered"] for o in far] == [0, 0] and min(float(o["point_dist"].min()) for o in far) >= 5


@pytest.mark.slow
def test_P004_14_known_positive_score_shape_over_radii_and_nets(positive):
    """Two nets × r ∈ {0.1, 0.5, 1, 10} × 2 restarts (the quickstart's first chain): both points recovered
    in every restart from r = 0.1, fewer from r = 0.5, none from r = 1 and 10; the median score (mean of
    the 5 best) grows with r. From r = 1 the candidates end on a KKT set (exact-step residual 0.006 ‖θ‖,
    the net's own kink-relaxed level, and the same objective as the recovered sets) 0.5-1.0 from the
    data: the paper's non-uniqueness. Measured: r = 0.1 → 2 in all 4 rows, r = 0.5, 1, 10 → 0; median
    score 0.51, 0.64, 0.94, 9.6. Net 0's rows at r = 0.1 and 10 are the known positive's (``positive``:
    the same net and rows; a row's numbers do not depend on the other rows of its bundle, nor a net's on
    the nets trained beside it), the other 12 rows run here."""
    st0, X0, y0, mask0, rows0, out0 = positive  # net 0 (seed 0) at r = 0.1 and 10
    st1, X1, y1, mask1 = train_positive([1])
    radii = [0.1, 0.5, 1.0, 10.0]
    more0 = [(0, dict(ATTACK, seed=0, radius=r, restart=k)) for r in (0.5, 1.0) for k in range(2)]
    rows1 = [(0, dict(ATTACK, seed=1, radius=r, restart=k)) for r in radii for k in range(2)]
    rows = rows0 + more0 + rows1
    out = out0 + attack_rows(st0, X0, y0, mask0, more0) + attack_rows(st1, X1, y1, mask1, rows1)
    rec = {r: [o["n_recovered"] for (_, c), o in zip(rows, out) if c["radius"] == r] for r in radii}
    score = {r: float(S.median(torch.tensor([o["score5"] for (_, c), o in zip(rows, out) if c["radius"] == r])))
             for r in radii}
    assert rec[0.1] == [2] * 4 and sum(rec[0.5]) < sum(rec[0.1]) and rec[1.0] == rec[10.0] == [0] * 4, rec
    assert score[0.1] < score[0.5] < score[1.0] < score[10.0], score
    far_kkt = [o for (_, c), o in zip(rows, out) if c["radius"] == 1.0]
    assert max(o["residual_exact_rel"] for o in far_kkt) <= 0.01 < min(float(o["point_dist"].min()) for o in far_kkt)


@pytest.fixture(scope="module")
def attacked(trajectory):
    """The n = 50 net under the known positive's attack (l = 100 candidates)."""
    st, X, y, mask, _ = trajectory
    rows = [(0, dict(ATTACK, n_candidates=100, seed=0, radius=r, restart=k)) for r in RADII for k in range(RESTARTS)]
    out = attack_rows(st, X, y, mask, rows)
    return out, float(st.net.sq_norm()[0]), [c["radius"] for _, c in rows]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="P004-13 not met at CI size (3000 steps): max/min objective 16.7 over "
                   "r <= 1, 22.2 with r = 10, docs/departures.md")
def test_P004_13_every_radius_reaches_the_same_plateau(attacked):
    """Spec gate: max/min of the final objective over radii and restarts ≤ 1.01."""
    out, _, _ = attacked
    obj = torch.tensor([o["objective"] for o in out])
    assert all(o["status"] == atk.DONE for o in out)
    assert float(obj.max() / obj.min()) <= 1.01


@pytest.mark.slow
def test_P004_14_n50_no_training_point_recovered_although_the_attack_finds_kkt_sets(attacked):
    """No prior, no leakage, now with a known positive beside it: from r ≤ 1 the candidates reach an
    exact-step residual below the training set's own ε*/‖θ‖ (so they moved: the init's is ~1), yet
    none comes within 0.3 of a training point at any radius; the median score is smallest at r ≤ 1
    and at r = 10 ≥ 2× that and ≥ 0.9."""
    out, _, radius = attacked
    near = [o for o, r in zip(out, radius) if r <= 1.0]
    assert max(o["residual_exact_rel"] for o in near) < min(o["train_eps"] for o in near) <= 0.1
    assert max(o["n_recovered"] for o in out) == 0
    s = {r: float(S.median(torch.tensor([o["score5"] for o, q in zip(out, radius) if q == r]))) for r in RADII}
    assert s[10.0] >= 2 * min(s.values()) and s[10.0] >= 0.9
    assert min(s.values()) in (s[0.1], s[1.0])


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="P004-15 not observed at CI size: at r = 1 the score std is 0.0070 vs "
                   "10x the objective's relative std 1.47 (docs/departures.md)")
def test_P004_15_scores_differ_across_restarts_although_objectives_agree(attacked):
    out, _, radius = attacked
    sel = [o for o, r in zip(out, radius) if r == 1.0]
    sc, ob = torch.tensor([o["score5"] for o in sel]), torch.tensor([o["objective"] for o in sel])
    assert float(sc.std()) >= 10 * float(ob.std() / ob.mean())


# ---- divergence (issue 39): a diverged attack is stored as not-a-result ------------------------------

def _tiny_net(E: int = 1, k: int = 8, d: int = 5, m: int = 4):
    """A random two-layer net (W, b, v all trained) and m unit points with alternating labels: enough
    for the attack's objective; nothing is trained (each row of the attack is independent)."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(E, k, d, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(E, k, generator=g, dtype=torch.float64)
    v = torch.randn(E, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    X = torch.nn.functional.normalize(torch.randn(E, m, d, generator=g, dtype=torch.float64), dim=-1)
    y = torch.tensor([1.0, -1.0] * (m // 2), dtype=torch.float64).expand(E, m).clone()
    full = lambda x: torch.full((E,), x)  # noqa: E731
    return W, b, v, X, y, torch.ones(E, m, dtype=torch.bool), full(d), full(m), full(k)


def test_diverged_attack_is_stored_as_not_a_result():
    """Two rows of one bundle, one init draw: lr_x 0.01 converges; lr_x 1e4 (forced to diverge) sends the
    candidates to ~1e6 after one step, far past BLOWUP x the data scale (the old code stored it as
    status 1 or 2 with finite distances of that size). Its scores, distances and candidates are NaN
    (integers -1), its status DIVERGED; the init's objective and score are kept and equal the other
    row's; the converged row's distances are those of its own candidates."""
    import numpy as np

    from flows.experiments import reconstruct as rexp

    W, b, v, X, y, mask, d, m, k = _tiny_net()
    cells = [{p: q.default for p, q in rexp.P.items()} | dict(n_candidates=6, steps=60, lr_x=lr, lr_lam=1e-4)
             for lr in (0.01, 1e4)]
    nets = lambda t: t.expand(2, *t.shape[1:]).clone()  # noqa: E731 - the same net for both rows
    ok, bad = cell_fn.run(*(nets(t) for t in (W, b, v, X, y, mask, d, m, k)), cells)
    assert (ok["status"], bad["status"]) == (atk.DONE, atk.DIVERGED)
    for name in cell_fn.NOT_A_RESULT:
        value = np.asarray(bad[name])
        assert (value == -1).all() if value.dtype.kind in "iu" else np.isnan(value).all(), name
    assert bad["objective_init"] == ok["objective_init"] and bad["score5_init"] == ok["score5_init"]
    assert bad["train_eps"] == ok["train_eps"]
    assert float(np.nanmax(bad["objective_trace"])) > 1e3 * bad["objective_init"]  # the trace shows the blow-up
    D = torch.cdist(torch.from_numpy(ok["candidates"]), X[0])  # (candidates, points)
    np.testing.assert_allclose(ok["dist"], D.amin(1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ok["point_dist"], D.amin(0).numpy(), rtol=1e-12)
    assert ok["n_recovered"] == int((D.amin(0) <= cells[0]["rho"]).sum())


def test_diverged_cell_is_judged_against_its_data_scale():
    """One net, one init draw (r = 0.1), lr_x 1: the candidates end at norm ~126 with a finite objective.
    Beside training points of norm 1 (bound 1000) that is a result; beside the same points scaled to
    norm 0.1 (bound BLOWUP x 0.1 = 100) it is DIVERGED, stored as not-a-result."""
    import numpy as np

    from flows.experiments import reconstruct as rexp

    W, b, v, X, y, mask, d, m, k = _tiny_net()
    cell = {p: q.default for p, q in rexp.P.items()} | dict(n_candidates=6, steps=60, lr_x=1.0, lr_lam=1e-4,
                                                           radius=0.1)
    two = lambda t: t.expand(2, *t.shape[1:]).clone()  # noqa: E731
    near, small = cell_fn.run(two(W), two(b), two(v), torch.cat([X, 0.1 * X]), *(two(t) for t in (y, mask, d, m, k)),
                              [cell, cell])
    assert near["status"] == atk.DONE and 100 < float(near["cand_norm"].max()) < 1000
    assert near["objective"] < 1e3 * near["objective_init"]
    assert small["status"] == atk.DIVERGED and np.isnan(small["dist"]).all() and np.isnan(small["score10"])


def test_divergence_rule_bounds_candidates_by_the_data_scale():
    """A finite objective that ends below its init value, but candidates that run away: lr_x 3 on the
    tiny net moves them to norm ~240 at data scale 1; with x_scale 1 (bound 1000) the row is DONE, with
    x_scale 0.1 (bound 100) it is DIVERGED and frozen at the first step past the bound."""
    W, b, v, X, y, *_ = _tiny_net()
    l, D = 4, X.shape[-1]
    x0, lam0 = atk.init_candidates("sphere", l, [D], D, [1.0], [torch.Generator().manual_seed(0)])
    one = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    kw = dict(lr_x=one(3.0), lr_lam=one(1e-4), alpha=one(300.0), lam_min=one(0.01), steps=200)
    yc = atk.candidate_labels(l).expand(1, l)
    free = atk.optimise(W, b, v, x0, lam0, yc, x_scale=one(1.0), **kw)
    top = float(free.x.norm(dim=-1).max())
    assert int(free.status[0]) == atk.DONE and 100 < top < 1000, top
    assert float(free.objective[0]) < float(free.trace[0, 0])  # the objective fell: only the norm rule can tell
    tight = atk.optimise(W, b, v, x0, lam0, yc, x_scale=one(0.1), **kw)
    assert int(tight.status[0]) == atk.DIVERGED
    assert 100 < float(tight.x.norm(dim=-1).max()) < top  # frozen where it first passed 100


@pytest.mark.parametrize("ratio,live", [(atk.BLOWUP**2, True), (atk.BLOWUP**2 * (1 + 1e-9), False),
                                        (math.inf, False), (math.nan, False)])
def test_divergence_rule_objective_above_blowup_squared_times_its_init(ratio, live):
    obj0 = torch.tensor([2.5], dtype=torch.float64)
    x = torch.zeros(1, 3, 2, dtype=torch.float64)
    assert bool(atk.sane(obj0 * ratio, x, obj0, None)[0]) is live
    bound = lambda r: torch.tensor([r], dtype=torch.float64)  # noqa: E731
    assert bool(atk.sane(obj0, x + 2.0, obj0, bound(2 * math.sqrt(2)))[0])  # candidate norms 2√2: at the bound
    assert not bool(atk.sane(obj0, x + 2.0, obj0, bound(2.8))[0])
