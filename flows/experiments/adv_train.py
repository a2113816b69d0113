"""Experiment ``adv_train`` (paper 003 §5.2 and Algorithm 1; spec 003 §2.9; E4, E5, X1): projected
adversarial training confined to ``B_{2,∞}(W0, V)`` with PGD-l2 examples of budget R, on unit-norm
binary MNIST or digits. Produces "nets" for ``pgd`` (and ``single_step``); ``train_status`` marks a
cell whose training returned the init. Declaration and wiring only (``tasks/cells/adv_train.py``);
data as in ``lazy_train``."""

from __future__ import annotations


from core.declare import NetsContract
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, timed
from flows.experiments import lazy_train as lazy
from flows.bundles import memory_budget
from tasks.attacks import chunk_for
from tasks.cells import adv_train as cell_fn

P = {
    **lazy.DATA,
    "V": Param(float, 0.316, "lazy radius V = C0/√m of the projection (Fig 4 left: 10/√1000)", gt=0),
    "R": Param(float, 0.2, "PGD budget ||delta|| used in training", min=0),
    "bias": Param(str, "off", "hidden bias (§5.2: none)", choices=("auto", "on", "off")),
    "T1_max": Param(int, 50, "PGD + SGD rounds at most (spec §6 #18)", min=1, max=10**5),
    "T2": Param(int, 100, "PGD steps (paper: 100)", min=1, max=10**5),
    "T2_train": Param(int, 0, "PGD steps in training if not T2 (0: T2; the cheaper E5 uses 20)", min=0, max=10**5),
    "beta": Param(float, 0.01, "SGD step (paper: 0.01)", gt=0),
    "batch_size": Param(int, 64, "minibatch (spec §6 #19)", min=1, max=10**6),
    "reduction": Param(str, "sum", "loss reduction (Alg. 1 line 9: sum)", choices=("mean", "sum")),
    "projection": Param(str, "step", "project after every step (§5.2 text) or once per epoch (line 11)",
                        choices=("step", "epoch")),
    "pgd_step": Param(str, "normalised", "training PGD step: normalised l2 (spec §6 #15) or raw gradient (Alg. 1 "
                      "line 4 as printed; X5)", choices=("normalised", "raw")),
    "patience": Param(int, 1, "rounds without a robust-train-accuracy increase before stopping", min=1, max=10**4),
}
P["variant"] = Param(str, "unit", "unit-norm rows (§5.2) or raw pixels", choices=lazy.P["variant"].choices)
V = {k: lazy.V[k] for k in ("m_used", "d_used", "width_used", "n_test_used", "nets_stored", "wall_s", "W", "b", "v",
                            "data_index", "test_index", "data_checksum", "test_checksum", "batch_rng_state",
                            "C0_reached")}
V.update({
    "rta_train": Var("1", "robust training accuracy of the returned (best) iterate", finite=True),
    "best_epoch": Var("1", "round of the returned iterate (0 = W0)", "int64", finite=True),
    "epochs": Var("1", "SGD epochs run", "int64", finite=True),
    # Issue 28 item 9: an untrained net must not feed E4's "RTA ≈ 0" as a lazy-trained one. Groups made
    # before this variable hold no such array (or, resumed, the fill -1 in old cells): readers fall back
    # on best_epoch == 0 (analysis/lazy.py: untrained).
    "train_status": Var("1", f"{cell_fn.TRAINED} trained, {cell_fn.RETURNED_INIT} returned the init: the "
                        "returned iterate is W0 (best round 0, e.g. a patience stop with robust train accuracy 0 "
                        "at W0 and after one epoch); figures and E4/E5 rows leave status-1 nets out and count "
                        "them", "int8", ok=(cell_fn.TRAINED,), finite=True),
    "rta_train_hist": Var("1", "robust training accuracy of W_{t-1} per round (NaN after the stop)", dims=("epoch",)),
    "C0": Var("1", "V √m", finite=True),
    "clean_acc": Var("1", "clean test accuracy of the returned net", finite=True),
    "R_train": Var("1", "training budget R", finite=True),
    "V_train": Var("1", "training radius V", finite=True),
})


def extra_dims(cells: list[dict]) -> dict[str, int]:
    return {**lazy.extra_dims(cells), "epoch": max([c["T1_max"] for c in cells] or [1])}


def memory(cell: dict) -> float:
    """lazy_train's, plus the PGD copies of the training set and (n x m) pre-activations in chunks."""
    n, _ = lazy.sizes(cell)
    item = 4 if cell["dtype"] == "float32" else 8
    return lazy.memory(dict(cell, max_steps=1)) + item * (3 * n * cell["d"] + 3 * min(n, 4096) * cell["m"])


def cost(cell: dict) -> float:
    n, _ = lazy.sizes(cell)
    return float(4 * n * cell["d"] * cell["m"] * (cell["T2"] + 1) * min(cell["T1_max"], 20))


def bundle_key(cell: dict) -> tuple:
    """Stack the (V, R, seed) cells of one (data, variant, d, m, ...) (spec §7 "Bundle by shape")."""
    return tuple(sorted((k, v) for k, v in cell.items() if k not in ("seed", "V", "R")))


@timed
def run_bundle(cells: list[dict], device: str = "auto") -> list[dict]:
    X, y, Xt, yt, prov = lazy.load_data(cells[0])
    dev = lazy.device_of(device)
    chunk = chunk_for(len(cells), cells[0]["m"], memory_budget(dev.type, 1), 6)  # spec §7: chunk the PGD
    progress = bundle_progress.for_kernel(bundle_progress.current())  # PGD steps of all rounds (issue 30)
    out = cell_fn.run(cells, X, y, Xt, yt, dev, chunk=min(chunk, 4096), progress=progress)
    return [dict(res, **prov) for res in out]


def contract(cell: dict, upstream=None) -> NetsContract:
    """Alg. 1's nets: W trained inside B_{2,inf}(W0, V); the bias (if any: its non-zero init b0) and a/√m
    stay fixed (§5.2)."""
    return NetsContract(arrays=frozenset({"W0", "b0", "X_test", "y_test", "R_train", "V_train"}),
                        trained=frozenset({"W"}), output="frozen", trainer="adv_train", data=cell["data"],
                        fixed=frozenset({"b"}) if cell_fn.has_bias(cell) else frozenset())


EXPERIMENT = register(Experiment(
    name="adv_train",
    paper="003 Wang, Ullah, Mianjy, Arora: Adversarial robustness is at odds with lazy training",
    description="projected adversarial training in B_{2,inf}(W0, V) against PGD-l2 of budget R (Alg. 1; produces nets)",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, cost=cost, check=lazy.check,
    memory=memory, memory_fields=("m", "d"), extra_dims=extra_dims, produces=("nets",), rebuild=lazy.rebuild,
    nets=contract, nets_arrays=dict(lazy.NETS_ARRAYS, R_train=(), V_train=()), points=lambda c: lazy.sizes(c)[0],
    summary=("rta_train", "clean_acc", "epochs", "C0_reached", "train_status"), spec_ids=("E4", "E5", "X1", "X5"),
))
