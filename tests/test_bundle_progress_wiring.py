"""Issue 30 item 3 beyond ``train`` / ``nonrobust``: every long-running bundle reports its own
progress (steps done of a total, a loss where there is one) through the reporter
``flows.bundle_progress.current()`` gives, and a cancel request raised by that reporter stops the
bundle (it propagates out of ``run_bundle``: no kernel swallows it). Each experiment's
``run_bundle`` runs here at toy sizes (no services) with a recording reporter installed as a bundle's
worker installs its own."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from flows import bundle_progress as rep_mod
from flows import experiments
from storage import bundle_progress as files
from storage.nets import Nets

DT = torch.float64


class Recording(rep_mod.Reporter):
    """A real reporter (files beside a store in tmp_path) that also keeps every report it gets;
    ``every_s=0``: every report is written, so each loss callable a kernel passes is read."""

    def __init__(self, store: str, clock=None):
        self.calls: list[tuple] = []
        super().__init__(store, "g", "k", "test bundle", 1, every_s=0.0, **({"clock": clock} if clock else {}))

    def __call__(self, steps=None, total=None, loss=None, target=None) -> None:
        self.calls.append((steps, total, loss, target))
        super().__call__(steps, total, loss, target)


@contextlib.contextmanager
def installed(rep):
    token = rep_mod._CURRENT.set(rep)
    try:
        yield rep
    finally:
        rep_mod._CURRENT.reset(token)


def cells_of(name: str, **over) -> list[dict]:
    base = {k: p.default for k, p in experiments.get(name).params.items()}
    return [dict(base, **over)]


def toy_nets(E: int = 1, k: int = 6, d: int = 4, m: int = 6, seed: int = 0, **extra) -> Nets:
    """E random two-layer ReLU nets with their training sets (as storage.nets reads them)."""
    g = torch.Generator().manual_seed(seed)
    W, b, v = (torch.randn(E, k, d, generator=g, dtype=DT), 0.1 * torch.randn(E, k, generator=g, dtype=DT),
               torch.randn(E, k, generator=g, dtype=DT))
    X = torch.randn(E, m, d, generator=g, dtype=DT) / math.sqrt(d)
    y = torch.where(torch.arange(m) % 2 == 0, 1.0, -1.0).to(DT).expand(E, m).clone()
    return Nets(W, b, v, X, y, torch.ones(E, m, dtype=torch.bool), torch.full((E,), d), torch.full((E,), m),
                torch.full((E,), k), torch.zeros(E, 8, dtype=torch.uint8), [{"seed": e} for e in range(E)],
                [""] * E, [0] * E, dict(extra), {})


def kkt_nets(epochs: int = 300) -> Nets:
    """One paper-001 net trained by ``train_kkt`` (its init stream kept, so ``unlearn`` can retrain)."""
    cells = cells_of("train_kkt", d=12, m=6, width=8, epochs=epochs)
    res = experiments.get("train_kkt").run_bundle(cells, "cpu")
    t = lambda k: torch.from_numpy(np.asarray(res[0][k]))[None]  # noqa: E731
    m, d, k = 6, 12, 8
    return Nets(t("W"), t("b"), t("v"), t("X"), t("y"), torch.ones(1, m, dtype=torch.bool), torch.tensor([d]),
                torch.tensor([m]), torch.tensor([k]), t("batch_rng_state"), [dict(cells[0])], [""], [0], {}, {})


LAZY = dict(data="digits", d=16, m=32, n_train=64, n_test=32, batch_size=16, C0=1e6, max_steps=40)
ADV = dict(data="digits", d=16, m=32, n_train=64, n_test=32, T1_max=3, T2=5, beta=0.5, batch_size=16, V=10.0,
           R=0.1, patience=5)


def run_lazy_train():
    return experiments.get("lazy_train").run_bundle(cells_of("lazy_train", **LAZY), "cpu"), 40


def run_adv_train():
    return experiments.get("adv_train").run_bundle(cells_of("adv_train", **ADV), "cpu"), 3 * 5


def run_train_kkt():
    cells = cells_of("train_kkt", d=12, m=6, width=8, epochs=350)
    return experiments.get("train_kkt").run_bundle(cells, "cpu"), 350


def run_unlearn_retrain(nets):
    cells = cells_of("unlearn", unlearn_method="retrain", forget=0, retrain_epochs=250, store_nets=False)
    cells = [dict(cells[0], **{k: nets.cells[0][v] for k, v in (("retrain_lr", "lr"), ("retrain_wd", "wd"),
                                                                  ("init_scale", "init_scale"))})]
    return experiments.get("unlearn").run_bundle(cells, "cpu", inputs=nets), 250


def run_reconstruct():
    cells = cells_of("reconstruct", n_candidates=4, steps=30)
    return experiments.get("reconstruct").run_bundle(cells, "cpu", inputs=toy_nets()), 30


def run_pgd():
    cells = cells_of("pgd", points="train", budget="given", R=0.3, T2=6, restarts=2, chunk=4)
    return experiments.get("pgd").run_bundle(cells, "cpu", inputs=toy_nets()), 2 * 2 * 6  # restarts × chunks × T2


def run_single_step():
    cells = cells_of("single_step", points="train", chunk=2)
    return experiments.get("single_step").run_bundle(cells, "cpu", inputs=toy_nets()), 6  # points


def run_forging():
    base = cells_of("forging", model="linreg", d=2, eps=0.3, estimator="naive_mc", n_samples=200)[0]
    cells = [dict(base, seed=s) for s in range(3)]
    return experiments.get("forging").run_bundle(cells, "cpu"), 3


def run_forge_net():
    base = cells_of("forge_net", estimator="naive_mc", n_samples=200, points=2, eps=0.3)[0]
    nets = toy_nets(E=2, k=3, d=2, m=4)
    return experiments.get("forge_net").run_bundle([base, dict(base, points=3)], "cpu", inputs=nets), 2 + 3


def run_forging_sgd():
    cells = [cells_of("forging_sgd", n_updates=5)[0], cells_of("forging_sgd", n_updates=7, seed=1)[0]]
    return experiments.get("forging_sgd").run_bundle(cells, "cpu"), 5 + 7  # SGD updates


def run_calibrate():
    cells = [cells_of("calibrate", n_matmuls=100)[0], cells_of("calibrate", n_matmuls=150, seed=1)[0]]
    return experiments.get("calibrate").run_bundle(cells, "cpu"), 100 + 150  # matmuls


def run_kkt_constructions():  # n < d: Thm 4's far sets too; 2·n_ops + 3 steps per net
    nets = toy_nets(E=2, k=6, d=8, m=4)
    return experiments.get("kkt_constructions").run_bundle(cells_of("kkt_constructions", n_ops=2) * 2, "cpu",
                                                           inputs=nets), 2 * (2 * 2 + 3)


def run_universal_attack():
    """Toy nets labelled by their own sign (they separate their data: the KKT fit runs), their
    minibatch generators' states as ``train`` stores them."""
    from tasks.cells.nonrobust import ANALYSIS_STEPS

    n = toy_nets(E=2)
    y = torch.sign((torch.relu(n.W @ n.X.transpose(1, 2) + n.b[..., None]) * n.v[..., None]).sum(1))
    rng = torch.stack([torch.Generator().manual_seed(e).get_state() for e in range(2)])
    nets = dataclasses.replace(n, y=y, rng_state=rng)
    return experiments.get("universal_attack").run_bundle(cells_of("universal_attack") * 2, "cpu",
                                                          inputs=nets), ANALYSIS_STEPS


# name -> (runner, whether it reports a loss); PREPARE: what a runner reads, made before the test's reporter
PREPARE = {"unlearn_retrain": kkt_nets}
WIRED = {
    "lazy_train": (run_lazy_train, True), "adv_train": (run_adv_train, False), "train_kkt": (run_train_kkt, True),
    "unlearn_retrain": (run_unlearn_retrain, True), "reconstruct": (run_reconstruct, True), "pgd": (run_pgd, False),
    "single_step": (run_single_step, False), "forging": (run_forging, False), "forge_net": (run_forge_net, False),
    "forging_sgd": (run_forging_sgd, False), "calibrate": (run_calibrate, False),
    "kkt_constructions": (run_kkt_constructions, False), "universal_attack": (run_universal_attack, False),
}
# steps only a report from inside the kernel's loop gives (not one per cell or per stage): SGD updates
# 3 and 5 + 3, matmul 64 of each cell, the first split of net 0, FISTA iteration 100 of the KKT fit
INSIDE = {"forging_sgd": {3, 8}, "calibrate": {64, 164}, "kkt_constructions": {2}, "universal_attack": {101}}


def check_reports(calls: list[tuple], total: int, loss: bool) -> None:
    """Steps never go back, reach the total, and the total is the same throughout; finite losses
    when the kernel has one."""
    steps = [s for s, *_ in calls if s is not None]
    assert len(steps) >= 2, calls
    assert steps == sorted(steps) and steps[0] < steps[-1] == total, steps
    assert {t for _, t, *_ in calls if t is not None} == {total}, calls
    losses = [x for *_, x, _ in calls if x is not None]
    if loss:
        assert losses and all(math.isfinite(x) for x in losses), calls
    else:
        assert not losses, calls


@pytest.mark.parametrize("name", list(WIRED))
def test_a_long_bundle_reports_its_steps_of_a_total(name, tmp_path):
    run, loss = WIRED[name]
    args = (PREPARE[name](),) if name in PREPARE else ()
    with installed(Recording(str(tmp_path / "s.zarr"))) as rec:
        results, total = run(*args)
    assert results and all("failed" not in r for r in results)
    check_reports(rec.calls, total, loss)
    [on_disk] = files.read(tmp_path / "s.zarr", "g")  # what the flow and ``kktlab status`` read
    assert on_disk["steps"] == total and on_disk["total"] == total


@pytest.mark.parametrize("name", list(INSIDE))
def test_a_bundle_reports_from_inside_its_kernels_loop(name, tmp_path):
    """forging_sgd, calibrate, kkt_constructions, universal_attack: the kernel's own loop reports (SGD
    updates, matmuls, splits / merges, the KKT fit's FISTA iterations), so the file moves and a cancel
    request is seen within the loop, not only between cells."""
    with installed(Recording(str(tmp_path / "s.zarr"))) as rec:
        WIRED[name][0]()
    assert INSIDE[name] <= {s for s, *_ in rec.calls}, rec.calls


def test_train_kkt_reports_its_loss_against_thm_2_1s_mark(tmp_path):
    with installed(Recording(str(tmp_path / "s.zarr"))) as rec:
        res, _ = run_train_kkt()
    *_, (steps, total, loss, target) = rec.calls
    assert target == pytest.approx(math.log10(math.log(2) / 6))
    assert loss == pytest.approx(res[0]["log10_loss"], abs=1e-12)  # the final report: the (one) net's loss


@pytest.mark.parametrize("name", list(WIRED))
def test_a_cancel_request_stops_the_bundle_from_inside_its_loop(name, tmp_path):
    """The reporter raises BundleCancelled at the first report after a cancel request; it comes out
    of run_bundle (no kernel or experiment swallows it)."""
    run, _ = WIRED[name]
    args = (PREPARE[name](),) if name in PREPARE else ()
    tick = itertools.count(start=1000.0, step=rep_mod.CANCEL_CHECK_S)
    rec = Recording(str(tmp_path / "s.zarr"), clock=lambda: next(tick))
    files.request_cancel(tmp_path / "s.zarr", "g")
    with installed(rec), pytest.raises(rep_mod.BundleCancelled):
        run(*args)
    assert len([c for c in rec.calls if c[0] is not None]) == 1  # stopped at its first report


def test_for_kernel_reads_the_loss_only_when_the_report_is_written(tmp_path):
    """A kernel's loss may cost a device sync: it is read at most once per written report."""
    clock = [0.0]
    rep = rep_mod.Reporter(str(tmp_path / "s.zarr"), "g", "k", every_s=10.0, clock=lambda: clock[0])
    reads = []
    progress = rep_mod.for_kernel(rep, base=5, total=100, target=-3.0)

    def loss():
        reads.append(1)
        return math.log(1e-2)

    for t in range(20):  # 20 reports within one second: none written, no read
        progress(t, 50, loss)
    assert reads == [] and rep.record["steps"] == 24 and rep.record["total"] == 100
    clock[0] = 10.0
    progress(20, 50, loss)
    assert reads == [1] and rep.record["loss"] == pytest.approx(-2.0) and rep.record["target"] == -3.0
    assert rep_mod.for_kernel(rep_mod.current()) is None  # outside a bundle: the kernel does nothing
