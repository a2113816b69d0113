"""The cross-paper chain (issue 27): the typed nets contract refuses every pairing whose reader
cannot read the producer's nets, at config time, naming the field; readers take the trained
blocks, the bias and the forgotten points from the contract."""

from __future__ import annotations

import math

import numpy as np

import pytest
import torch

from core.errors import ConfigError
from flows import config

TRAIN_KKT = {"name": "nets", "experiment": "train_kkt", "grid": {"seed": [0]},
             "params": {"d": 20, "m": 6, "width": 8, "epochs": 10}}
TRAIN = {"name": "nets", "experiment": "train", "grid": {"seed": [0]}, "params": {"d": 5, "width": 8}}
LAZY_RAW = {"name": "nets", "experiment": "lazy_train", "grid": {"seed": [0]},
            "params": {"data": "digits", "variant": "raw", "d": 16, "m": 16}}
ADV_BIAS = {"name": "nets", "experiment": "adv_train", "grid": {"seed": [0]},
            "params": {"data": "digits", "variant": "raw", "d": 16, "m": 16, "bias": "on"}}
UNLEARN = {"name": "gone", "experiment": "unlearn", "from": "nets", "grid": {"alpha": [1.0]}, "params": {"forget": 0}}


def chain(*stages) -> dict:
    return {"name": "pairing", "stages": [dict(s) for s in stages]}


def reader(experiment: str, source: str = "nets", **params) -> dict:
    grid = {"radius": [1.0]} if experiment == "reconstruct" else {"points": ["train"]} \
        if experiment in ("single_step",) else {"eps": [0.3]} if experiment == "forge_net" else \
        {"R": [0.1]} if experiment == "pgd" else {"slack": [1.01]} if experiment == "universal_attack" else \
        {"n_ops": [1]} if experiment == "kkt_constructions" else {"alpha": [1.0]}
    return {"name": "reader", "experiment": experiment, "from": source, "grid": grid, "params": params}


REFUSED = [
    ("train -> single_step (test points)", (TRAIN, reader("single_step", points="test") | {"grid": {"deepfool": [False]}}),
     "stages[1].from", "needs X_test, y_test"),
    ("train -> single_step (training points, then test points)",  # every cell's needs, not the first's
     (TRAIN, reader("single_step") | {"grid": {"points": ["train", "test"]}}), "stages[1].from",
     "needs X_test, y_test"),
    ("train -> pgd (training points, then test points)",
     (TRAIN, reader("pgd", budget="given") | {"grid": {"points": ["train", "test"]}}), "stages[1].from",
     "needs X_test"),
    ("train -> unlearn ref_retrain", (TRAIN, UNLEARN | {"params": {"forget": 0, "ref_retrain": True}}),
     "stages[1].from", "needs nets that trained W or W+b"),  # train -> unlearn ga / identity / k_ga / retrain:
    # admitted (tests/test_unlearn_full.py, tests/test_unlearn_retrain_train.py)
    ("lazy_train -> unlearn retrain", (LAZY_RAW, UNLEARN | {"grid": {"unlearn_method": ["retrain"]}}), "stages[1].from",
     "needs nets of train or train_kkt"),
    ("train_kkt -> universal_attack", (TRAIN_KKT, reader("universal_attack")), "stages[1].from",
     "needs nets that trained W+b+v"),
    ("train_kkt -> kkt_constructions", (TRAIN_KKT, reader("kkt_constructions")), "stages[1].from",
     "needs nets that trained W+b+v"),
    ("train_kkt -> pgd (test points)", (TRAIN_KKT, reader("pgd", budget="given")), "stages[1].from", "needs X_test"),
    ("unlearn forget -2 -> reconstruct", (TRAIN_KKT, UNLEARN | {"params": {"forget": -2}}, reader("reconstruct", "gone")),
     "stages[2].from", "store no single net"),
    ("unlearn -> unlearn", (TRAIN_KKT, UNLEARN, reader("unlearn", "gone") | {"name": "again", "grid": {"k": [1]}}),
     "stages[2].from",
     "without forgotten"),
    ("lazy_train -> unlearn with a retrain reference", (LAZY_RAW, UNLEARN | {"params": {"forget": 0, "ref_retrain": True}}),
     "stages[1].from", "needs nets of train_kkt"),
    ("train_kkt gauss -> unlearn D_MG test points", (TRAIN_KKT, UNLEARN | {"params": {"forget": 0, "test_points": 10}}),
     "stages[1].from", "trained on data d_mg"),
    ("lazy_train -> pgd at the training budget", (LAZY_RAW, reader("pgd", budget="train") | {"grid": {"T2": [5]}}),
     "stages[1].from", "needs R_train"),
    ("adv_train with its fixed bias -> unlearn", (ADV_BIAS, UNLEARN), "stages[1].from",
     "needs b trained or absent, not held fixed at a non-zero value"),
]


@pytest.mark.parametrize("stages, field, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_pairing_names_the_field(stages, field, message):
    with pytest.raises(ConfigError) as err:
        config.parse(chain(*stages))
    assert err.value.field == field
    assert message in err.value.message and "\n" not in str(err.value)


ACCEPTED = [
    ("train_kkt -> unlearn -> reconstruct", (TRAIN_KKT, UNLEARN, reader("reconstruct", "gone"))),
    ("train_kkt -> unlearn -> single_step (training points)", (TRAIN_KKT, UNLEARN, reader("single_step", "gone"))),
    ("train_kkt -> unlearn -> pgd (training points)", (TRAIN_KKT, UNLEARN, reader("pgd", "gone", points="train",
                                                                                   budget="given"))),
    ("train_kkt -> unlearn -> forge_net", (TRAIN_KKT, UNLEARN, reader("forge_net", "gone"))),
    ("lazy_train (bias) -> unlearn", (LAZY_RAW, UNLEARN)),
    ("adv_train (no bias) -> unlearn", (ADV_BIAS | {"params": dict(ADV_BIAS["params"], bias="off")}, UNLEARN)),
    ("train -> reconstruct", (TRAIN, reader("reconstruct"))),
]


@pytest.mark.parametrize("stages", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_accepted_pairing(stages):
    cfg = config.parse(chain(*stages))
    assert cfg.stages[-1].exp.reads == "nets"


OUT_OF_RANGE = [  # (upstream params/grid, unlearn params/grid, field, message): m = 3 unless said
    ({}, {"params": {"forget": 3}}, "stages[1].params.forget",
     "3 is out of range for upstream 'nets' with m = 3 (allowed -2..2: an index l, -1 one random l per net, "
     "-2 every l)"),
    ({}, {"params": {}, "grid": {"alpha": [1.0], "forget": [0, 7]}}, "stages[1].grid.forget",
     "7 is out of range for upstream 'nets' with m = 3 (allowed -2..2"),
    ({"grid": {"seed": [0], "m": [5, 3]}}, {"params": {"forget": 4}}, "stages[1].params.forget",
     "4 is out of range for upstream 'nets' with m = 3 at its smallest (allowed -2..2"),
    ({}, {"params": {"forget": 0, "unlearn_method": "k_ga", "k": 3}}, "stages[1].params.k",
     "3 points forgotten at once leave no retained point of upstream 'nets' with m = 3 (allowed 1..2)"),
    ({"experiment": "lazy_train", "params": {"data": "digits", "variant": "raw", "d": 16, "m": 16, "n_train": 64,
                                             "batch_size": 8}},
     {"params": {"forget": 64}}, "stages[1].params.forget", "64 is out of range for upstream 'nets' with m = 64"),
]


@pytest.mark.parametrize("up, down, field, message", OUT_OF_RANGE, ids=["forget = m", "forget in the grid",
                                                                         "smallest m of a grid", "k = m", "lazy n_train"])
def test_forget_index_past_the_upstream_training_set_is_refused_at_config_time(tmp_path, up, down, field, message):
    """Issue 39: an index to forget outside the upstream's training set is refused when the config is
    loaded (flows.config.load, as ``kktlab run`` and ``--dry-run`` load it), from the upstream's own
    parameters, before anything trains (it used to train, then store failed cells)."""
    import yaml

    train = dict(TRAIN_KKT, params=dict(TRAIN_KKT["params"], m=3)) | up
    if "grid" in up and "m" in up["grid"]:
        train["params"] = {k: v for k, v in train["params"].items() if k != "m"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(chain(train, UNLEARN | down)))
    with pytest.raises(ConfigError) as err:
        config.check_stages(config.load(path))
    assert err.value.field == field and err.value.message.startswith(message), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("forget", [-2, -1, 0, 2])
def test_forget_index_inside_the_upstream_training_set_is_accepted(tmp_path, forget):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(chain(dict(TRAIN_KKT, params=dict(TRAIN_KKT["params"], m=3)),
                                         UNLEARN | {"params": {"forget": forget}})))
    cfg = config.load(path)
    config.check_stages(cfg)
    assert cfg.stages[1].params["forget"] == forget


def test_unlearned_nets_carry_the_upstream_contract():
    cfg = config.parse(chain(LAZY_RAW, UNLEARN))
    (c,) = cfg.stages[1].nets_contracts
    assert c.trained == frozenset({"W", "b"}) and c.output == "frozen" and "forgotten" in c.arrays
    assert c.trainer == "lazy_train"


def _biased_net(seed: int = 0, n: int = 16, d: int = 8, m: int = 12):
    """A lazy-style net with a trained bias (f = Σ_j v_j relu(w_j·x + b_j), v = ±1/√n) and data it
    classifies: labels are the net's own signs."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    b = torch.randn(1, n, generator=g, dtype=torch.float64)
    v = (torch.randint(0, 2, (1, n), generator=g).double() * 2 - 1) / math.sqrt(n)
    X = torch.randn(1, m, d, generator=g, dtype=torch.float64)
    f = (torch.relu(X @ W.transpose(1, 2) + b[:, None]) * v[:, None]).sum(-1)
    return W, b, v, X, torch.sign(f), f


def _unlearn(W, b, v, X, y, train_bias, **cell):
    from tasks.cells.unlearn import unlearn

    c = dict(unlearn_method="ga", alpha=1.0, forget=0, k=1, forget_seed=0, model="two_layer", loss="logistic", tie_tol=1e-9,
             ref_retrain=False, init_scale=1e-5, retrain_lr=1.0, retrain_wd=0.0, retrain_epochs=1, test_points=0,
             mu_a=0.1, mu_scaling="sec6", store_nets=True) | cell
    E, M, D = X.shape
    return unlearn(W, b, v, X, y, torch.ones(E, M, dtype=torch.bool), torch.full((E,), D), torch.full((E,), M),
                   torch.full((E,), W.shape[1]), torch.zeros(E, 8, dtype=torch.uint8), ["net"], [c],
                   train_bias=torch.tensor([train_bias]))[0]


def test_unlearn_measures_a_biased_net_with_its_bias():
    """Issue 28 item 1: the trained net's minimum margin as unlearn reports it is the stored net's
    (with the bias); measured without it, it is another net's (the old bug)."""
    W, b, v, X, y, f = _biased_net()
    stored = float((y * f).min())
    assert _unlearn(W, b, v, X, y, True)["q_min1"] == pytest.approx(stored, rel=1e-12)
    assert abs(_unlearn(W, torch.zeros_like(b), v, X, y, False)["q_min1"] - stored) > 1e-3


def test_unlearned_net_is_stored_with_its_bias_and_forgotten_point():
    """The GA step moves (W, b) together: the stored net's b differs from the trained one, the
    forgotten mask names point 0, and identity hands the net on unchanged."""
    W, b, v, X, y, _ = _biased_net(1)
    ga = _unlearn(W, b, v, X, y, True)
    same = _unlearn(W, b, v, X, y, True, unlearn_method="identity")
    assert ga["nets_stored"] == 1 and list(ga["forgotten"]) == [1] + [0] * (X.shape[1] - 1)
    assert abs(ga["b"] - b[0].numpy()).max() > 1e-6 and abs(ga["W"] - W[0].numpy()).max() > 1e-6
    assert (same["W"] == W[0].numpy()).all() and (same["b"] == b[0].numpy()).all()
    assert _unlearn(W, b, v, X, y, True, forget=-2)["nets_stored"] == 0


def _fixture_o_per_point(m: int = 4, d: int = 8):
    """Fixture O's data (orthonormal rows, alternating labels) with one neuron per point: w_j = √n x_j,
    u_j = y_j/√n, n = m. Every margin is 1 and θ = Σ_i λ_i y_i ∇_W f(x_i) with λ_i = n: an exact KKT
    point of W-only training (paper 001's parametrisation). Unlike spec 001 §6's fixture O (neurons
    that sum a class, a two-dimensional row space), each training point is a row of W here, so the
    weights identify it (in direction) and GA at α = 1 on l removes row l exactly."""
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    X, n = Q[:m], m
    y = torch.tensor([1.0, -1.0] * (m // 2), dtype=torch.float64)
    u = y / math.sqrt(n)
    return math.sqrt(n) * X.clone(), u, X, y


def attack_fixture_o(steps: int, norm_prior: float = 0.0) -> dict:
    """The reconstruction attack (W-only stationarity, the nets contract's trained blocks; 3 restarts of
    2m candidates) on the per-point fixture O before ("trained") and after one GA step at α = 1 on x_0
    ("unlearned"): name -> the cells' outputs. Checks first that GA removed row 0 exactly and that the
    fixture is a KKT point over W only."""
    from tasks.cells import reconstruct as rc
    from tasks.unlearn import METHODS

    W, u, X, y = _fixture_o_per_point()
    m, d = X.shape
    lam = torch.full((1, m), float(m), dtype=torch.float64)
    F = torch.zeros(1, 1, m, dtype=torch.bool)
    F[0, 0, 0] = True
    W_ga = METHODS["ga"](W[None], u[None], X[None], y[None], lam, F, torch.tensor([1.0], dtype=torch.float64))[0, 0, 0]
    assert float(W_ga[0].norm()) < 1e-12 and torch.allclose(W_ga[1:], W[1:])  # row 0 gone exactly
    zero = torch.zeros(m, dtype=torch.float64)  # a KKT point over the trained block W, not over all of θ
    assert float(rc.train_eps(W, zero, u, X, y, torch.tensor([True, False, False]))) < 1e-12
    assert float(rc.train_eps(W, zero, u, X, y, torch.tensor([True, True, True]))) > 0.5
    cells = [dict(seed=0, restart=r, radius=1.0, init="sphere", n_candidates=2 * m, steps=steps, objective="haim",
                  lr_x=0.01, lr_lam=1e-4, lam_min=0.01, alpha=300.0, surrogate=True, box=False, rho=0.3, shift=0.0,
                  norm_prior=norm_prior) for r in range(3)]
    E = len(cells)
    rep = lambda t: t[None].expand(E, *t.shape).clone()  # noqa: E731
    return {name: rc.run(rep(net), torch.zeros(E, m, dtype=torch.float64), rep(u), rep(X), rep(y),
                         torch.ones(E, m, dtype=torch.bool), torch.full((E,), d), torch.full((E,), m),
                         torch.full((E,), m), cells, blocks=torch.tensor([[True, False, False]] * E),
                         forgotten=F[:, 0].expand(E, -1))
            for name, net in (("trained", W), ("unlearned", W_ga))}


def test_known_answer_unlearned_point_is_no_longer_reconstructed():
    """Issue 27's known answer on the per-point fixture O: the reconstruction attack (W-only
    stationarity, the nets contract's trained blocks) finds the direction of x_0 from the trained
    net and not from the net one GA step at α = 1 unlearned it from, while the retained points stay
    found. Measured (3 restarts, 1500 steps): best cosine to x_0 0.87-1.0 before, <= 0.1 after;
    retained points' best over restarts >= 0.7."""
    best = {name: torch.tensor(np.stack([o["point_cos"] for o in out])).amax(0)  # best restart per point
            for name, out in attack_fixture_o(1500).items()}
    assert best["trained"][0] >= 0.85, best
    assert best["unlearned"][0] <= 0.3, best
    assert best["unlearned"][1:].min() >= 0.6 and best["trained"][1:].min() >= 0.6, best


def test_single_step_init_diagnostics_are_on_the_init_net():
    """Issue 28 item 2: f0, gnorm0 and n_flip_W of spec 003 §2.11 are on the init net (W0, b0), not
    on W0 with the trained bias; nets without a stored init give NaN there."""
    from tasks.cells.single_step import attack

    g = torch.Generator().manual_seed(3)
    E, m, d, nt = 2, 16, 6, 5
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    W0, b0, X = r(E, m, d), r(E, m), r(E, nt, d)
    W, b = W0 + 0.3 * r(E, m, d), b0 + 0.5 * r(E, m)
    v = (torch.randint(0, 2, (E, m), generator=g).double() * 2 - 1) / math.sqrt(m)
    y = torch.ones(E, nt, dtype=torch.float64)
    cell = {"single_step_method": "single_step_exact", "deepfool": False}
    out = attack(W, b, v, W0, b0, X, y, torch.full((E,), nt), torch.ones(E), [cell] * E, chunk=nt)
    pre0 = X @ W0.transpose(1, 2) + b0[:, None]
    f0 = (torch.relu(pre0) * v[:, None]).sum(-1)
    g0 = ((pre0 > 0).double() * v[:, None]) @ W0
    flips = ((X @ W.transpose(1, 2) + b[:, None] > 0) != (pre0 > 0)).sum(-1)
    for e in range(E):
        np.testing.assert_allclose(out[e]["f0"], f0[e].numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[e]["gnorm0"], g0[e].norm(dim=-1).numpy(), rtol=1e-12)
        np.testing.assert_array_equal(out[e]["n_flip_W"], flips[e].double().numpy())
    none = attack(W, b, v, None, None, X, y, torch.full((E,), nt), torch.ones(E), [cell] * E, chunk=nt)
    assert np.isnan(none[0]["f0"]).all() and np.isfinite(none[0]["eta_star"]).any()


def test_pgd_random_starts_do_not_depend_on_bundle_mates():
    """Issue 29 item 2: with random starts and restarts, a cell's robust accuracy is the same alone
    and in a bundle (starts seeded per cell and drawn before chunking)."""
    from flows.experiments import pgd
    from storage.nets import Nets

    g = torch.Generator().manual_seed(5)
    E, k, d, M = 3, 12, 4, 30
    W, b = torch.randn(E, k, d, generator=g, dtype=torch.float64), torch.randn(E, k, generator=g, dtype=torch.float64)
    v = torch.randn(E, k, generator=g, dtype=torch.float64)
    X = torch.randn(E, M, d, generator=g, dtype=torch.float64)
    y = torch.sign((torch.relu(X @ W.transpose(1, 2) + b[:, None]) * v[:, None]).sum(-1))
    full = lambda x: torch.full((E,), x)  # noqa: E731
    nets = Nets(W, b, v, X, y, torch.ones(E, M, dtype=torch.bool), full(d), full(M), full(k),
                torch.zeros(E, 8, dtype=torch.uint8), [{"seed": e} for e in range(E)], [""] * E)
    cell = {k: p.default for k, p in pgd.P.items()} | {"points": "train", "budget": "given", "R": 0.3, "T2": 5,
                                                       "restarts": 3, "random_start": True, "chunk": 7}
    together = pgd.run_bundle([cell] * E, "cpu", inputs=nets)
    for e in range(E):
        alone = pgd.run_bundle([cell], "cpu", inputs=nets.select([e]))[0]
        np.testing.assert_array_equal(alone["robust"], together[e]["robust"])
    assert len({float(o["rta"]) for o in together}) > 1 or together[0]["rta"] < 1  # the attack did something


def test_every_producer_declares_what_it_keeps_for_readers(tmp_path):
    """Issue 27 item 3: what a producer keeps beside the nets is declared once
    (``Experiment.nets_arrays``), covers its contract's arrays, is written into its group, and is what
    storage.nets loads; a group made before the attribute falls back to the arrays kktlab kept then."""
    import json

    import zarr

    from flows import experiments
    from storage.nets import LEGACY_NETS_ARRAYS, nets_arrays

    producers = [experiments.get(n) for n in experiments.names() if "nets" in experiments.get(n).produces]
    assert {e.name for e in producers} >= {"train", "train_kkt", "lazy_train", "adv_train", "unlearn"}
    for exp in producers:
        cell = {k: p.default for k, p in exp.params.items()}
        assert exp.nets(cell, None).arrays <= set(exp.nets_arrays), exp.name
        for name, dims in exp.nets_arrays.items():
            if name in exp.variables:  # stored (the rest is rebuilt): the declared dims are the stored ones
                assert tuple(exp.variables[name].dims) == dims, (exp.name, name)
    g = zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=3)
    assert nets_arrays(g) == LEGACY_NETS_ARRAYS
    g.attrs["kktlab_nets_arrays"] = json.dumps({"forgotten": ["sample"]})
    assert nets_arrays(g) == {"forgotten": ("sample",)}
