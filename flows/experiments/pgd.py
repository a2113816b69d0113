"""Experiment ``pgd`` (paper 003 §5.2, Fig 4; spec 003 §2.8, §2.10; E4, E5, X1, X3): robust test
accuracy of the nets an ``adv_train`` (or ``lazy_train``) stage stored, under PGD-l2 with the
paper's step ``2.5 R/T2``. By default each net is attacked at the budget it was trained with
(spec §6 #21). With ``points: train`` it attacks the nets' training points instead (any producer,
``unlearn`` included: forgotten and retained points apart). Random starts are seeded per cell (the
attack seed, the upstream cell and R), never by a net's place in its bundle. A net that adv_train
returned untrained (its ``train_status`` 1) is attacked and stored like any other; the report reads
that status beside this group's cells (``storage.query.stage_scalars``) and leaves such cells out of
Fig 4 and E4 / E5, counting them (``analysis.lazy.untrained``). Declaration and wiring only
(``tasks/cells/pgd.py``)."""

from __future__ import annotations


import hashlib

import torch

from core.declare import FRACTION, NONNEG, NetsNeeds, with_domain
from core.errors import UserError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, by_shape, timed
from flows.experiments.single_step import attacked_points, extra_dims, points_word
from flows.bundles import memory_budget
from tasks.attacks import chunk_for
from tasks.cells import pgd as cell_fn

PGD_BLOCKS = 6  # (E, chunk, m) blocks alive in one PGD step (pre-activations, mask, products)

P = {
    "points": Param(str, "test", "the points attacked: the upstream's test set, or its training points",
                    choices=("test", "train")),
    "budget": Param(str, "train", "train: attack at the upstream net's training R (R_train); given: at R",
                    choices=("train", "given")),
    "R": Param(float, 0.2, "PGD budget ||delta|| when budget is 'given'", min=0),
    "T2": Param(int, 100, "PGD steps (paper: 100)", min=1, max=10**5),
    "alpha_factor": Param(float, 2.5, "step alpha = alpha_factor R/T2 (paper: 2.5)", gt=0),
    "restarts": Param(int, 1, "PGD runs; runs after the first start at a random point of the ball (X3)", min=1,
                      max=1000),
    "random_start": Param(bool, False, "random start in the first run too (spec §6 #20: none)"),
    "clip": Param(str, "none", "box after each step: none (unit-norm rows are not images) or unit_box [0,1]",
                  choices=("none", "unit_box")),
    "pgd_step": Param(str, "normalised", "normalised l2 step (spec §6 #15) or the raw gradient as Alg. 1 prints it (X5)",
                      choices=("normalised", "raw")),
    "attack_seed": Param(int, 0, "seed of the random starts", min=0, max=2**31),
    "chunk": Param(int, 0, "test points per chunk; 0: as many as half the free memory allows (spec §7)", min=0,
                   max=10**6),
}
V = {
    "rta": Var("1", "robust test accuracy: y f(x_adv) > 0 at the final PGD iterate (the paper's)", finite=True),
    "rta_strict": Var("1", "correct at x and every PGD iterate (spec §2.10)", finite=True),
    "clean_acc": Var("1", "clean test accuracy", finite=True),
    "R_used": Var("1", "the budget attacked with", finite=True),
    "max_delta": Var("1", "largest ||x_adv - x|| (<= R)", finite=True),
    "robust": Var("1", "1 if the point stayed correct under every restart", dims=("point",)),
    "rta_forgotten": Var("1", "robust accuracy over the points an upstream unlearn stage forgot (NaN: none)"),
    "rta_retained": Var("1", "robust accuracy over the other points"),
    "wall_s": Var("s", "bundle wall time divided by its cells", finite=True),
}
with_domain(V, NONNEG, "R_used", "max_delta", "wall_s")
with_domain(V, FRACTION, "rta", "rta_strict", "clean_acc", "robust", "rta_forgotten", "rta_retained")


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    n = inputs
    ex = n.extra
    if cells[0]["budget"] == "train":
        if "R_train" not in ex:
            raise UserError("pgd budget 'train' needs nets trained with a budget (adv_train); "
                            "set budget: given and R for other nets")
        R = ex["R_train"].double().reshape(-1)
    else:
        R = torch.tensor([float(c["R"]) for c in cells], dtype=torch.float64)
    chunk = cells[0]["chunk"] or chunk_for(len(cells), int(n.W.shape[1]), memory_budget("cpu", 1), PGD_BLOCKS)
    X, y, count, gone = attacked_points(n, cells[0]["points"])
    return cell_fn.attack(n.W, n.b, n.v, X, y, count, R, [dict(c, chunk=chunk) for c in cells],
                          seeds=[cell_seed(c, up, float(r)) for c, up, r in zip(cells, n.cells, R)], forgotten=gone,
                          progress=bundle_progress.for_kernel(bundle_progress.current()))  # PGD steps (issue 30)


def cell_seed(cell: dict, upstream: dict, R: float) -> int:
    """The random-start seed of one cell: its attack seed, the upstream cell it attacks and its budget
    (issue 29 item 2: a cell's numbers never depend on its bundle mates)."""
    key = f"{cell['attack_seed']}|{sorted(upstream.items())!r}|{R!r}"
    return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)


def needs(cell: dict) -> NetsNeeds:
    arrays = {"X_test", "y_test"} if cell["points"] == "test" else set()
    if cell["budget"] == "train":
        arrays.add("R_train")
    return NetsNeeds(arrays=frozenset(arrays), why="points: test reads a test set; budget: train the training "
                     "budget R_train of adv_train (else budget: given and R)")



def describe(params: dict, grid: dict) -> dict[str, str]:
    """``rta`` and ``clean_acc`` say which points were attacked: with ``points: train`` they are
    training accuracies (issue 40), with both values on the grid either, by cell."""
    which = points_word(params, grid)
    return {"rta": f"robust {which} accuracy: y f(x_adv) > 0 at the final PGD iterate (the paper's)",
            "clean_acc": f"clean {which} accuracy"}


def bundle_key(cell: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in cell.items() if k != "R"))


EXPERIMENT = register(Experiment(
    name="pgd",
    figures="analysis.lazy",
    acceptance="analysis.acceptance_003",
    paper="003 Wang, Ullah, Mianjy, Arora: Adversarial robustness is at odds with lazy training",
    description="robust test accuracy under PGD-l2 (step 2.5R/T2, projection every step) on stored nets (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", needs=needs,
    extra_dims=extra_dims, describe=describe,
    summary=("rta", "rta_strict", "clean_acc", "R_used"), spec_ids=("E4", "E5", "X1", "X3", "X5"),
))
