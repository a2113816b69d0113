"""Tests that tell (issue 40): the survivors of the round's mutations of the readers' per-point
forgotten / retained split, their medians, the duplicate-free score, App. E's random l, the batched
content hash and the suite's own xfail markers. Each test names the mutant ids of
benchmarks/mutations.yaml it kills, and checks values against closed forms or loops written out.

The attack fixture is a net that is linear everywhere, f(x) = relu(w·x + b) − relu(−w·x − b) = w·x + b
with w = (3, 4), b = 0.5: ‖∇f‖ = 5 at every x, the exact flipping step is t* = |f|/‖∇f‖² and
‖δ*‖ = t*‖∇f‖ = |f|/5, the distance to the boundary; PGD-l2 at budget R flips exactly the points
closer than R. Six points at distances 1, 2, …, 6 on alternating sides."""

from __future__ import annotations

import ast
import math
import pathlib

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIST = torch.arange(1.0, 7.0, dtype=torch.float64)  # distance of point i to the boundary: i + 1


def _linear_nets(E: int = 2):
    """(W, b, v, X, y): E copies of the linear net and its six points, y = sign f(x)."""
    W = torch.tensor([[3.0, 4.0], [-3.0, -4.0]], dtype=torch.float64).expand(E, 2, 2).clone()
    b = torch.tensor([0.5, -0.5], dtype=torch.float64).expand(E, 2).clone()
    v = torch.tensor([1.0, -1.0], dtype=torch.float64).expand(E, 2).clone()
    side = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64)
    t = side * DIST - 0.1  # x = t (0.6, 0.8): f = 5t + 0.5 = 5 side dist
    X = (t[:, None] * torch.tensor([0.6, 0.8], dtype=torch.float64)).expand(E, 6, 2).clone()
    return W, b, v, X, side.expand(E, 6).clone()


# net 0: six real points, 0 and 3 forgotten; net 1: five real points (5 is padding, marked forgotten
# to check that padding never counts), 4 forgotten
N_TEST = torch.tensor([6, 5])
FORGOTTEN = torch.tensor([[True, False, False, True, False, False], [False, False, False, False, True, True]])


def test_single_step_medians_split_forgotten_and_retained_points_of_delta_star():
    """Kills i040-single-step-split-swapped, i040-single-step-delta-drops-gnorm,
    i040-single-step-lower-median: ‖δ*‖ = t*‖∇f‖ = the distance, its midpoint median over the
    forgotten and over the retained real points: net 0 {1, 4} -> 2.5, {2, 3, 5, 6} -> 4.0 (torch's lower
    median 3); net 1 {5} -> 5, {1, 2, 3, 4} -> 2.5 (lower 2); the median t* over all real points
    3.5/5 and 3/5 (lower: 3/5 and 3/5)."""
    from tasks.cells.single_step import attack

    W, b, v, X, y = _linear_nets()
    cell = {"single_step_method": "single_step_exact", "deepfool": False}
    out = attack(W, b, v, None, None, X, y, N_TEST, torch.ones(2), [cell] * 2, chunk=6, forgotten=FORGOTTEN)
    np.testing.assert_allclose(out[0]["eta_star"], (DIST / 5).numpy(), rtol=1e-12)  # t* = |f|/‖∇f‖² = 5 dist/25
    np.testing.assert_allclose(out[0]["gnorm"], np.full(6, 5.0), rtol=1e-12)
    for e, (forgotten, retained) in enumerate([(2.5, 4.0), (5.0, 2.5)]):
        assert out[e]["med_delta_forgotten"] == pytest.approx(forgotten, rel=1e-12), e
        assert out[e]["med_delta_retained"] == pytest.approx(retained, rel=1e-12), e
    assert out[0]["med_eta_star"] == pytest.approx(3.5 / 5, rel=1e-12)  # (3 + 4)/2 of the six distances / 5
    assert out[1]["med_eta_star"] == pytest.approx(3 / 5, rel=1e-12)
    assert out[0]["med_delta_rel"] == pytest.approx(float(np.median((DIST / X[0].norm(dim=-1)).numpy())), rel=1e-12)


def test_single_step_median_is_the_midpoint_for_an_even_count():
    """Kills i040-single-step-lower-median: ``_median`` of (4, 1, 3, 2) is 2.5 (numpy's), not torch's 2;
    NaN and inf are left out, an empty selection is NaN."""
    from tasks.cells.single_step import _median

    t = torch.tensor([[4.0, 1.0, 3.0, 2.0, math.inf, math.nan], [5.0, 1.0, 2.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    keep = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    assert _median(t, keep).tolist() == [2.5, 3.0]
    assert math.isnan(float(_median(t, torch.zeros(2, 6, dtype=torch.bool))[0]))


def test_pgd_robust_accuracy_of_forgotten_and_retained_points_apart():
    """Kills i040-pgd-retained-counts-forgotten: at R = 3.5 exactly the points at distance 4, 5, 6 stay
    correct. Net 0, the point at distance 1 forgotten: forgotten 0, retained {2, 3, 4, 5, 6} -> 3/5 (all
    six: 1/2); net 1, the point at distance 5 forgotten (and the padding): forgotten 1, retained
    {1, 2, 3, 4} -> 1/4 (all five real points: 2/5)."""
    from flows.experiments.pgd import P
    from tasks.cells.pgd import attack

    W, b, v, X, y = _linear_nets()
    gone = FORGOTTEN.clone()
    gone[0, 3] = False  # net 0: only the point at distance 1
    cell = dict({k: p.default for k, p in P.items()}, T2=10, chunk=6)
    out = attack(W, b, v, X, y, N_TEST, torch.full((2,), 3.5, dtype=torch.float64), [cell] * 2, seeds=[0, 1],
                 forgotten=gone)
    np.testing.assert_array_equal(out[0]["robust"], (DIST > 3.5).double().numpy())
    for e, want in enumerate([(0.5, 0.0, 0.6), (0.4, 1.0, 0.25)]):  # rta, rta_forgotten, rta_retained
        assert (out[e]["rta"], out[e]["rta_forgotten"], out[e]["rta_retained"]) == pytest.approx(want, rel=1e-12), e
    assert out[0]["clean_acc"] == 1.0 and out[0]["max_delta"] == pytest.approx(3.5, rel=1e-12)


def test_reconstruct_point_recovery_summaries_of_forgotten_and_retained_points():
    """Kills i040-reconstruct-split-swapped: per training point the distance and cosine of its best
    candidate (loops below), then the forgotten and the retained points' means and recovered fractions
    (ρ = 0.3); padding never counts."""
    from tasks.cells.reconstruct import point_recovery

    X = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [-1.0, 0.5]]] * 2, dtype=torch.float64)
    Xc = torch.tensor([[[1.1, 0.0], [0.0, 1.0], [2.0, 2.5]]] * 2, dtype=torch.float64)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    gone = torch.tensor([[True, False, False, False], [False, False, True, True]])
    out = point_recovery(Xc, X, mask, gone, 0.3)
    for e in range(2):
        pts = [i for i in range(4) if mask[e, i]]
        dist = {i: min(math.dist(X[e, i].tolist(), c.tolist()) for c in Xc[e]) for i in pts}
        cos = {i: max(float(X[e, i] @ c / (X[e, i].norm() * c.norm())) for c in Xc[e]) for i in pts}
        split = {"forgotten": [i for i in pts if gone[e, i]], "retained": [i for i in pts if not gone[e, i]]}
        for name, sel in split.items():
            assert float(out[f"dist_{name}"][e]) == pytest.approx(sum(dist[i] for i in sel) / len(sel), rel=1e-12)
            assert float(out[f"cos_{name}"][e]) == pytest.approx(sum(cos[i] for i in sel) / len(sel), rel=1e-12)
            assert float(out[f"recovered_{name}"][e]) == sum(dist[i] <= 0.3 for i in sel) / len(sel), (e, name)
    assert (float(out["recovered_forgotten"][0]), float(out["recovered_retained"][0])) == (1.0, 0.0)


def test_score5_unique_is_nan_with_fewer_than_five_training_points():
    """Kills i040-score5-unique-fewer-pairs: with n = 2 training points (quickstart-reconstruct) only two
    one-to-one pairs exist: the duplicate-free 5-best is NaN, never the mean of two pairs; score5 (over
    candidates) is the mean of the 5 smallest candidate distances; with five points it is the matching's."""
    from tasks.reconstruct import score as S

    X = torch.tensor([[[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0], [20.0, 0.0]]], dtype=torch.float64)
    Xc = X[:, [0, 0, 1, 2, 3, 4]] + torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64)[None, :, None] * \
        torch.tensor([1.0, 0.0], dtype=torch.float64)
    lam = torch.ones(1, 6, dtype=torch.float64)
    two = S.score_all(Xc, lam, X[:, :2], torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 2, dtype=torch.float64),
                      torch.tensor([0.1]), 0.3)
    assert math.isnan(float(two.score5_unique))
    five_best = 0.1 + 0.2 + 0.3 + math.hypot(0.4, 10) + math.hypot(0.5, 10)  # c3, c4 nearest to x_0, x_1
    assert float(two.score5) == pytest.approx(five_best / 5, rel=1e-12)
    five = S.score_all(Xc, lam, X, torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 2, dtype=torch.float64),
                       torch.tensor([0.1]), 0.3)
    assert float(five.score5_unique) == pytest.approx((0.1 + 0.3 + 0.4 + 0.5 + 0.6) / 5, rel=1e-12)


def test_app_e_draws_one_l_per_net_from_its_own_upstream_cell():
    """Kills i040-app-e-l-shared, i040-app-e-l-ignores-the-net: ``forget`` = -1 draws l per net from
    ``forget_seed`` and the upstream cell's coordinates: eight nets of one m draw more than one l, each
    net's l is the one it draws alone, and the forget mask holds exactly that point."""
    from tasks.cells.unlearn import forget_sets

    c = {"forget": -1, "k": 1, "forget_seed": 0, "forget_set": ""}
    keys = [f"seed={i}" for i in range(8)]
    m = torch.full((8,), 10)
    F, anchors, ok = forget_sets(c, m, keys)
    alone = [int(forget_sets(c, m[:1], [k])[1][0, 0]) for k in keys]
    assert anchors[:, 0].tolist() == alone and bool(ok.all())
    assert len(set(alone)) > 1, alone
    assert F[:, 0].nonzero()[:, 1].tolist() == alone and int(F.sum()) == 8
    other = [int(forget_sets(dict(c, forget_seed=1), m[:1], [k])[1][0, 0]) for k in keys]
    assert other != alone  # the seed enters the draw too


def test_batched_content_hashes_equal_the_per_cell_hash_for_every_kind_of_value():
    """Kills i040-content-hashes-scalar-shape: ``content_hashes`` (one row of bytes per cell) and
    ``content_hash`` (cell by cell, a scalar seen as shape (1,)) agree on scalars of each dtype, vectors
    and matrices; a changed scalar changes only its cell's hash; timings are not hashed."""
    from storage.hashing import content_hash, content_hashes

    n = 3
    vals = {"c_star": np.array([0.5, np.nan, np.inf]), "iters": np.array([3, 4, 5], dtype=np.int64),
            "ok": np.array([True, False, True]), "status": np.array([1, 2, 1], dtype=np.int8),
            "q_sample": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
            "W": np.arange(n * 6, dtype=np.float64).reshape(n, 2, 3), "wall_s": np.array([1.0, 2.0, 3.0])}
    per_cell = [content_hash({k: a[i] for k, a in vals.items()}) for i in range(n)]
    assert content_hashes(vals).tolist() == per_cell and len(set(per_cell)) == n
    scalars = {k: vals[k] for k in ("c_star", "iters", "ok", "status")}
    assert content_hashes(scalars).tolist() == [content_hash({k: a[i] for k, a in scalars.items()}) for i in range(n)]
    edited = dict(vals, iters=np.array([3, 4, 6], dtype=np.int64), wall_s=np.zeros(3))
    assert content_hashes(edited).tolist()[:2] == per_cell[:2] and content_hashes(edited)[2] != per_cell[2]


def _xfails(path: pathlib.Path):
    """(line, keyword names) of every ``pytest.mark.xfail(...)`` call in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "xfail":
            yield node.lineno, {k.arg: k.value for k in node.keywords}


def test_every_strict_xfail_names_the_failure_it_expects():
    """Kills i040-xfail-without-raises: a strict xfail without ``raises=`` counts any crash (a
    TypeError of a renamed argument) as the expected failure; each must name the exception."""
    bad = [f"{path.name}:{line}" for path in sorted((ROOT / "tests").glob("test_*.py")) for line, kw in _xfails(path)
           if isinstance(kw.get("strict"), ast.Constant) and kw["strict"].value is True and "raises" not in kw]
    assert not bad, f"strict xfail without raises= at {bad}"
