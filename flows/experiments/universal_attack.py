"""Experiment ``universal_attack``: paper 002's measures on nets a ``train`` stage stored (reads
"nets"): margins and margin sets, the universal direction and exact c*, the flipped fractions,
KKT fit, Theorem 4.1's check, Theorem 3.1's robust net. The numbers are ``nonrobust``'s for the
same cells (``tasks/cells/universal_attack.py`` calls ``nonrobust``'s analysis on the loaded
nets; tests/test_chain.py checks it). Declaration and wiring only.

Its group's dims are the train stage's dims followed by its own axes; its per-sample variables
use the train stage's ``sample`` dim.
"""

from __future__ import annotations


from core.declare import NetsNeeds
from flows import bundle_progress
from flows.experiments import Experiment, Var, register, by_shape, timed
from flows.experiments import nonrobust
from tasks.cells import universal_attack as cell_fn

P = {k: nonrobust.P[k] for k in ("slack", "attack", "kkt_max_m")}
TRAINING = ("iters", "status", "log10_loss", "wall_s")
V = {k: v for k, v in nonrobust.V.items() if k not in TRAINING}
V["wall_s"] = Var("s", "bundle analysis wall time divided by the bundle's cells", finite=True)


WHY = "paper 002's KKT fit and Thm 4.1 check are over W, b and v"


def needs(cell: dict) -> NetsNeeds:
    return NetsNeeds(trained=(frozenset({"W", "b", "v"}),), why=WHY)


def bundle_key(cell: dict) -> tuple:
    """One slack and one direction per bundle (nonrobust's analysis takes them from its first cell)."""
    return (("attack", cell["attack"]), ("slack", cell["slack"]))


@timed
@by_shape
def run_bundle(cells: list[dict], device: str = "auto", inputs=None) -> list[dict]:
    """``inputs``: the upstream nets of ``cells``, in order (storage.nets.Nets). Analysis is float64
    on the CPU, as in ``nonrobust``. The bundle reports its analysis steps (mostly the KKT fit's
    iterations, issue 30); a cancel request stops it there."""
    n = inputs
    return cell_fn.attack(n.W, n.b, n.v, n.X, n.y, n.mask, n.d, n.m, n.rng_state, cells,
                          progress=bundle_progress.for_kernel(bundle_progress.current()))


EXPERIMENT = register(Experiment(
    name="universal_attack",
    figures="analysis.nonrobust",
    acceptance="analysis.acceptance_002",
    paper="002 Vardi, Yehudai, Shamir: Gradient methods provably converge to non-robust networks",
    description="smallest universal flip c* along z, margins, KKT fit, Thm 4.1 / 3.1 on stored nets (reads 'nets')",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, reads="nets", needs=needs,
    summary=("m_used", "train_acc", "margin_frac", "gamma", "c_star", "c_star_rel", "kkt_eps"),
    spec_ids=("Fig1a", "Fig1b", "Fig2a", "Fig2b", "E4", "E5", "E6"),
))
