"""No stored number depends on bundle mates (issue 29 item 2): ``unlearn`` and ``reconstruct`` read
nets, ``train_kkt`` produces them; every stored variable is BIT-identical alone and bundled, so a
cell's ``cell_hash`` is the same whatever bundle recomputes it (measured: a chain run with
bundle_size 1, 3 and 4 stores equal arrays, cell_hash included).

Every random draw of these stages comes from a generator of the cell itself, never from its place
in the bundle or a generator the bundle shares: unlearn's App. E forgotten point (``forget`` = -1)
from ``forget_seed`` and the upstream cell's coordinates, its D_MG test points and retrain init from
the generator states the upstream net stored; reconstruct's candidate inits from (``seed``,
``restart``) at the net's true d. Bit identity holds because no padding enters and no kernel's
answer depends on the batch: producers bundle one true shape (``bundle_key``), readers run each
true shape of their upstream nets as a bundle of its own (``flows.experiments.by_shape``); CPU
softplus is built from exp / log1p (torch's fused one differs in the last bit between its SIMD body
and the scalar tail, tasks/nets/losses.py) and the KKT polish solves each system alone (MKL's
batched gelsd depends on the matrix's place in the batch, tasks/kkt/measure.py). Padded bundles
(the direct ``run_bundle`` of mixed shapes in tests/test_bundle_invariance.py) agree to 1e-12 only.

Tiny train_kkt nets (d <= 24, m <= 8, width <= 12), 100 attack steps: seconds.
"""

from __future__ import annotations

import functools
import os
import pathlib

import numpy as np
import pytest
import torch

from conftest import mismatches
from flows import experiments
from storage.nets import Nets

ROOT = pathlib.Path(__file__).resolve().parents[1]

NOT_INVARIANT = {"wall_s"}  # a timing

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the nets: the cell's (index 1) and two larger bundle mates; each trained alone (upstream invariance
# is tests/test_bundle_invariance.py's)
NETS = {"gauss": [dict(d=24, m=8, width=12, seed=1), dict(d=16, m=6, width=8, seed=0), dict(d=20, m=7, width=10, seed=2)],
        "d_mg": [dict(data="d_mg", d=48, m=8, width=12, seed=1), dict(data="d_mg", d=40, m=6, width=8, seed=0),
                 dict(data="d_mg", d=44, m=7, width=10, seed=2)]}


def defaults(name: str) -> dict:
    return {k: p.default for k, p in experiments.get(name).params.items()}


@functools.cache
def nets(kind: str) -> Nets:
    exp = experiments.get("train_kkt")
    cells = [dict(defaults("train_kkt"), epochs=300, lr=1.0, wd=0.0, init_scale=1e-3, **c) for c in NETS[kind]]
    out = [exp.run_bundle([c], "cpu")[0] for c in cells]
    E, K = len(out), max(len(o["v"]) for o in out)
    D, M = max(int(o["d_used"]) for o in out), max(len(o["y"]) for o in out)
    z = lambda *s: torch.zeros(E, *s, dtype=torch.float64)  # noqa: E731
    W, b, v, X, y = z(K, D), z(K), z(K), z(M, D), z(M)
    for e, o in enumerate(out):
        (k, d), m = np.shape(o["W"]), len(o["y"])
        W[e, :k, :d], b[e, :k], v[e, :k] = (torch.as_tensor(np.asarray(o[n])) for n in ("W", "b", "v"))
        X[e, :m, :d], y[e, :m] = torch.as_tensor(np.asarray(o["X"])), torch.as_tensor(np.asarray(o["y"]))
    size = lambda n: torch.tensor([int(o[n]) for o in out])  # noqa: E731
    m = size("m_used")
    rng = torch.stack([torch.as_tensor(np.asarray(o["batch_rng_state"])) for o in out]).to(torch.uint8)
    return Nets(W, b, v, X, y, torch.arange(M)[None] < m[:, None], size("d_used"), m, size("width_used"), rng,
                cells, [""] * E)


def alone_and_bundled(name: str, kind: str, cells: list[dict], at: list[int]) -> list[tuple[dict, dict]]:
    """Each cell (reading net ``at[i]``) run alone and in the bundle of all ``cells``."""
    exp, n = experiments.get(name), nets(kind)
    bundled = exp.run_bundle(cells, "cpu", inputs=n.select(at))
    return [(exp.run_bundle([c], "cpu", inputs=n.select([e]))[0], r) for c, e, r in zip(cells, at, bundled)]


# case: (upstream nets, the unlearn stage's parameters shared by the bundle)
UNLEARN = {
    "ga random l (App. E)": ("gauss", {"forget": -1}),
    "ga every l (bundle padded in m)": ("gauss", {"forget": -2}),
    "k_ga": ("gauss", {"unlearn_method": "k_ga", "k": 2, "forget": -1}),
    "retrain reference (init redrawn)": ("gauss", {"forget": -1, "ref_retrain": True, "retrain_epochs": 100}),
    "D_MG test points": ("d_mg", {"forget": -1, "test_points": 300}),
}


@pytest.mark.parametrize("case", list(UNLEARN))
def test_unlearn_cell_is_the_same_alone_and_bundled(case):
    kind, shared = UNLEARN[case]
    cells, at = [], []
    for e in (0, 1, 2):  # the middle net's cells sit after another net's: a position-seeded draw differs
        for alpha in (0.5, 1.0):
            cells.append(dict(defaults("unlearn"), **shared, alpha=alpha))
            at.append(e)
    pairs = alone_and_bundled("unlearn", kind, cells, at)
    assert {i: mismatches(a, b, tol=0, skip=NOT_INVARIANT) for i, (a, b) in enumerate(pairs)} == {i: {} for i in range(len(pairs))}
    if shared["forget"] == -1:  # App. E's l is drawn per net (these three draw different ones)
        assert len({tuple(np.nonzero(b["forgotten"])[0]) for _, b in pairs}) > 1
    if shared.get("test_points"):
        assert all(np.isfinite([b["test_acc_before"], b["test_acc_after"]]).all() for _, b in pairs)


def test_unlearn_every_l_bundles_nets_of_different_m():
    """forget = -2 in a bundle padded to a larger m used to fail ('ga' saw empty forget sets past a
    net's own m) and run its cells one by one; now it runs as one bundle."""
    n = nets("gauss")
    assert len(set(n.m.tolist())) == 3
    cell = dict(defaults("unlearn"), forget=-2, alpha=1.0)
    out = experiments.get("unlearn").run_bundle([cell] * 3, "cpu", inputs=n.select([0, 1, 2]))
    assert [o["n_forget_sets"] for o in out] == n.m.tolist()
    assert [len(o["eps_l"]) for o in out] == n.m.tolist()  # the net's own m, not the bundle's


def test_unlearn_activation_mass_counts_the_nets_own_neurons():
    """act_mass = λ_i (1/n) Σ_j σ'_ij over the net's n neurons: a bundle padded to a larger width
    divided by the padded width (0.33 relative error on these nets)."""
    cell = dict(defaults("unlearn"), forget=0)
    (_, _), (alone, bundled) = alone_and_bundled("unlearn", "gauss", [cell, cell], [0, 1])
    assert nets("gauss").width[0] > nets("gauss").width[1]
    for key in ("act_mass_min", "act_mass_max"):
        assert bundled[key] == alone[key], (key, alone[key], bundled[key])


RECON = dict(n_candidates=8, steps=100, lr_x=1e-3, lr_lam=0.05)


def test_reconstruct_cell_is_the_same_alone_and_bundled():
    cells, at = [], []
    for e in (0, 1, 2):
        for radius in (0.1, 1.0):
            for restart in (0, 1):
                cells.append(dict(defaults("reconstruct"), **RECON, radius=radius, restart=restart))
                at.append(e)
    pairs = alone_and_bundled("reconstruct", "gauss", cells, at)
    assert {i: mismatches(a, b, tol=0, skip=NOT_INVARIANT) for i, (a, b) in enumerate(pairs)} == \
        {i: {} for i in range(len(pairs))}
    # the inits are the cell's own: restarts differ, and moved (the attack ran)
    by = {(at[i], c["radius"], c["restart"]): b for i, (c, (_, b)) in enumerate(zip(cells, pairs))}
    assert by[(1, 1.0, 0)]["score5_init"] != by[(1, 1.0, 1)]["score5_init"]
    assert by[(1, 1.0, 0)]["objective"] < by[(1, 1.0, 0)]["objective_init"]


@pytest.mark.parametrize("name, kind, cell", [
    ("unlearn", "gauss", {"forget": -1}),
    ("unlearn", "d_mg", {"forget": -1, "test_points": 300, "ref_retrain": True, "retrain_epochs": 100}),
    ("reconstruct", "gauss", RECON),
], ids=["unlearn", "unlearn_d_mg", "reconstruct"])
def test_cell_hash_is_the_same_alone_and_bundled(name, kind, cell):
    """``cell_hash`` covers every stored variable but timings, the unlearned W and the candidates
    included: equal alone and bundled, for each cell of a bundle of three nets of other shapes."""
    from storage.store import content_hash

    c = dict(defaults(name), **cell)
    pick = lambda r: {k: np.asarray(v) for k, v in r.items() if k not in NOT_INVARIANT}  # noqa: E731
    for alone, bundled in alone_and_bundled(name, kind, [c] * 3, [0, 1, 2]):
        assert content_hash(pick(alone)) == content_hash(pick(bundled))


def check_train_kkt_bit_identical_alone_and_bundled():
    """A net of odd sizes (the tails of SIMD loops) trained beside three others equals it trained
    alone, bit for bit: W, the margins, the hash."""
    from storage.store import content_hash

    exp = experiments.get("train_kkt")
    base = dict(defaults("train_kkt"), epochs=200, d=37, m=11, width=13)
    cells = [dict(base, seed=s) for s in range(4)]
    pick = lambda r: {k: np.asarray(v) for k, v in r.items() if k not in NOT_INVARIANT}  # noqa: E731
    for c, bundled in zip(cells, exp.run_bundle(cells, "cpu")):
        alone = exp.run_bundle([c], "cpu")[0]
        assert mismatches(alone, bundled, tol=0, skip=NOT_INVARIANT) == {}
        assert content_hash(pick(alone)) == content_hash(pick(bundled))


def test_train_kkt_net_is_bit_identical_alone_and_bundled():
    """A producer's bundle is one shape (train_kkt, train / nonrobust: ``bundle_key``). MKL's dgemm
    picks its kernel by its operands' memory alignment, so without conditional numerical
    reproducibility a net at an odd offset in the bundle's (E, 11, 37) X got another X W^T in the
    last bit (2.2e-16 in W after 200 steps). kktlab sets ``MKL_CBWR=AVX2,STRICT`` itself, before
    torch loads MKL: checked in a fresh process whose environment lacks it and which, like the CLI,
    imports kktlab first (removing the setting in kktlab/__init__.py turns this red here)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    code = ("import kktlab, sys; sys.path.insert(0, 'tests'); import test_bundle_invariance_readers as t; "
            "t.check_train_kkt_bit_identical_alone_and_bundled()")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_lone_train_kkt_cell_trains_as_a_stack_of_two(monkeypatch):
    """The rule behind the bit test above for a lone cell (tasks/cells/train_kkt.py: a stack of one
    goes to MKL's plain dgemm, another last bit than the batched one on the AMD EPYC): on CPUs where
    the two agree (the Intel Xeon @ 2.50GHz of stop 56) that test cannot tell the rule is gone, so
    the stack the kernel gets is checked here: two copies of the cell, the second dropped."""
    from tasks.cells import train_kkt

    seen = []
    real = train_kkt.train_fixed_output
    monkeypatch.setattr(train_kkt, "train_fixed_output", lambda W0, *a, **kw: seen.append(W0.shape[0]) or real(W0, *a, **kw))
    base = dict(defaults("train_kkt"), epochs=20, d=7, m=5, width=3)
    assert len(train_kkt.train_cells([base], "cpu")) == 1 and seen == [2]
    assert len(train_kkt.train_cells([base, dict(base, seed=1)], "cpu")) == 2 and seen == [2, 2]


@pytest.mark.requires_services
def test_mkl_cbwr_reaches_the_dask_workers_kktlab_starts(monkeypatch):
    from distributed import Client, LocalCluster

    from deploy.runtime import QUIET_ENV, quiet_env

    monkeypatch.delenv("MKL_CBWR", raising=False)
    quiet_env()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        (got,) = client.run(lambda: os.environ.get("MKL_CBWR")).values()
    assert got == QUIET_ENV["MKL_CBWR"] == "AVX2,STRICT"


@pytest.mark.parametrize("name", ["train_kkt", "train", "nonrobust"])
def test_producers_never_bundle_two_shapes(name):
    exp = experiments.get(name)
    base = defaults(name)
    key = lambda **kw: exp.bundle_key(dict(base, **kw))  # noqa: E731
    assert key(seed=0) == key(seed=1)
    m = 10 if name == "train_kkt" else 20
    assert len({key(d=30, m=m, width=8), key(d=31, m=m, width=8), key(d=30, m=m + 1, width=8),
                key(d=30, m=m, width=9)}) == 4
