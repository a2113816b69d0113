"""Experiment ``train_kkt``: the first stage of a paper-001 chain (Provable unlearning with gradient
ascent on two-layer ReLU nets; spec 001 F001-1, App. E): nets N(x) = Σ_j u_j σ(w_j·x) with u_j = ±1/√n
frozen and no biases (Eq. 1), or linear predictors (§3), trained by full-batch GD with weight decay
(PyTorch SGD, no momentum), logistic loss, float64; stores the nets as ``train`` does ("nets").

Why a separate producing experiment and not new ``train`` params: ``train`` is paper 002's
log-space GD with an LR schedule, trained biases and output layer; paper 001's fixed output layer,
plain GD with weight decay and its data (unit-norm near-orthogonal, orthonormal, D_MG) would touch
every part of that kernel. The stored variables are ``train``'s, so ``storage.nets.load_nets_at``
reads both. Declaration and wiring only; the maths is ``tasks/cells/train_kkt.py``.

Real data (issue 39): ``data: mnist`` / ``cifar10`` trains on two chosen classes (``class_neg`` -> y = -1,
``class_pos`` -> +1) of the shared training file, m points drawn by the data seed, resized to d and
preprocessed (``preprocess``). Never a copy of the data set (issue 13 item 4): such a cell stores its
rows' indices and the file's checksum (``data_index``, ``data_checksum``) and :func:`rebuild` gives a
reading stage X back. Every net reports ``eps_rel`` (ε/‖cθ‖, NNLS multipliers: its distance from a KKT
point of the margin problem).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from core.declare import FRACTION, NONNEG, NetsContract, with_domain
from core.errors import ConfigError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, timed
from flows.experiments import nonrobust
from flows.experiments import train as train_exp
from tasks.cells import train_kkt as cell_fn
from tasks.data.mixture import SCALINGS

P = {
    "model": Param(str, "two_layer", "two-layer net with frozen ±1/√n output layer (Eq. 1) or linear predictor (§3)",
                   choices=("two_layer", "linear")),
    "data": Param(str, "gauss_scaled", "x ~ N(0, I/d) (App. E), orthonormal rows (F001-2), D_MG (§6, F001-6), "
                  "or real data: MNIST / the CIFAR-10 subset (two classes, class_neg / class_pos)",
                  choices=cell_fn.DATA),
    "class_neg": train_exp.P["class_neg"], "class_pos": train_exp.P["class_pos"],
    "preprocess": train_exp.P["preprocess"],
    "labels": Param(str, "random", "uniform with both classes (A3), balanced, or alternating ±1 (fixture O); "
                    "D_MG labels are the clusters", choices=("random", "balanced", "alternating")),
    "d": Param(int, 1000, "input dimension (MNIST: k² <= 784; CIFAR-10: 3k² <= 3072, images resized)", min=2,
               max=10**6),
    "m": Param(int, 10, "training points", min=2, max=10**5),
    "width": Param(int, 400, "hidden neurons n (ignored for linear)", min=1, max=10**5),
    "seed": Param(int, 0, "draws u, the init and (unless data_seed) the data", min=0, max=2**32 - 1),
    "data_seed": Param(int, -1, "-1: data from seed (fresh per net); >= 0: one shared data set (share_data)",
                       min=-1, max=2**32 - 1),
    "lr": Param(float, 1.0, "GD learning rate (not given in App. E; spec default 1.0)", gt=0, max=1e6),
    "wd": Param(float, 1e-5, "weight decay (App. E: 1e-5)", min=0, max=1e3),
    "epochs": Param(int, 100_000, "full-batch GD steps (App. E: 1e5)", min=1, max=10**8),
    "loss": Param(str, "logistic", "training loss (App. E: binary cross entropy)", choices=("logistic", "exp")),
    "init_scale": Param(float, 1e-5, "multiplier of nn.Linear's default init (App. E: std / 1e5)", gt=0, max=1e6),
    "mu_a": Param(float, 0.1, "D_MG exponent a (spec D001-10, renamed from the paper's α)", min=0, max=1),
    "mu_scaling": Param(str, "sec6", "‖μ_+‖ = d^-a (§6) or d^(a-1/4) (App. D.1), spec A6", choices=SCALINGS),
    "store_nets": Param(bool, True, "store the nets (a later stage reads them)"),
}

V = {
    "m_used": train_exp.V["m_used"], "d_used": train_exp.V["d_used"], "width_used": train_exp.V["width_used"],
    "nets_stored": train_exp.V["nets_stored"], "train_acc": train_exp.V["train_acc"],
    "log10_loss": Var("log10", "final mean training loss, log10 (Thm 2.1 needs L < 1/m)"),
    "q_min": Var("1", "smallest raw training margin y_i N(x_i)"),
    "first_below": Var("epoch", "first epoch (checked every 100) with L < log(2)/m (Thm 2.1); -1 never", "int64"),
    "mu_norm": Var("1", "‖μ_+‖ of D_MG (NaN for other data)"),
    "wall_s": Var("s", "bundle training wall time divided by the bundle's cells", finite=True),
    "eps": Var("l2 norm", "KKT stationarity ε of the trained net at min margin 1, NNLS λ (spec 001 K1; +inf if it "
               "does not interpolate)"),
    "eps_rel": Var("1", "ε / ‖cθ‖: the trained net's distance from a KKT point, scale free (issue 39: <= 0.05 is "
                   "'near KKT')"),
    "delta": Var("1", "complementary slackness δ = max λ_i (q_i - 1) of the trained net"),
    "n_support": Var("1", "support points of the NNLS λ (#{λ_i > 1e-8 max λ})", "int64"),
    "data_index": Var("1", "real data: row of each training point in the training file (MNIST train IDX / CIFAR "
                      "npz); -1 for synthetic data", "int64", dims=("sample",), pad=-1),
    "data_checksum": Var("1", "real data: first 60 bits of the sha256 of the training file (0 for synthetic)",
                         "int64"),
    **{k: train_exp.V[k] for k in ("W", "b", "v", "X", "y")},
    "batch_rng_state": Var("byte", "two torch CPU generator states: the init stream before W0 (retrain from the "
                           "same init) | the D_MG stream before μ_+ (fresh test points)", "uint8", dims=("rng_byte",)),
}
with_domain(V, NONNEG, "mu_norm", "wall_s", "eps", "eps_rel", "n_support")
with_domain(V, FRACTION, "train_acc")


def check(cell: dict) -> None:
    if cell["data"] == "orthonormal" and cell["m"] > cell["d"]:
        raise ConfigError("data", f"'orthonormal' needs m <= d, got m={cell['m']}, d={cell['d']}")
    if cell["data"] not in cell_fn.FILE_DATA:
        return
    from storage import datasets

    if cell["class_neg"] == cell["class_pos"]:
        raise ConfigError("class_pos", f"equals class_neg ({cell['class_neg']}): two different classes are needed")
    if cell["model"] == "linear":
        raise ConfigError("model", f"data '{cell['data']}' trains two-layer nets only")
    k2 = cell["d"] if cell["data"] == "mnist" else cell["d"] // 3
    k, top = math.isqrt(k2), 28 if cell["data"] == "mnist" else 32
    if k * k != k2 or (cell["data"] == "cifar10" and cell["d"] % 3) or k > top:
        form = "k² with k <= 28" if cell["data"] == "mnist" else "3k² with k <= 32 (three channels)"
        raise ConfigError("d", f"data '{cell['data']}' is resized to d = {form}, got {cell['d']}")
    try:
        datasets.check_data("mnist" if cell["data"] == "mnist" else "cifar_vehicles")
    except datasets.DataError as err:
        raise ConfigError("data", str(err)) from None


FILES = {"mnist": "mnist-train", "cifar10": "cifar-train"}


def data_rows(cell: dict) -> dict:
    """A real-data cell's training rows: indices into the training file (:func:`cell_fn.pick_rows`) and
    the file's checksum, which is all the store keeps."""
    from storage import datasets

    name = FILES[cell["data"]]
    rows = cell_fn.pick_rows(cell, datasets.positions(name, (cell["class_neg"],)),
                             datasets.positions(name, (cell["class_pos"],)))
    return {"data_index": rows.astype(np.int64), "data_checksum": datasets.checksum60(name)}


def prepared(cell: dict, rows, checksum: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(X (m, d), y (m,)) of a real-data cell from its file rows (checksum checked), float64."""
    X, y = _prepared(cell["data"], np.asarray(rows, dtype=np.int64).tobytes(), int(checksum), cell["d"],
                     cell["preprocess"], cell["class_pos"])
    return X.clone(), y.clone()


@functools.lru_cache(maxsize=8)
def _prepared(data: str, rows: bytes, checksum: int, d: int, preprocess: str, class_pos: int):
    from storage import datasets

    img, lab = datasets.file_rows(FILES[data], np.frombuffer(rows, dtype=np.int64), checksum)
    return cell_fn.prepare(img, data, d, preprocess), torch.where(lab == class_pos, 1.0, -1.0).double()


def load_datasets(cells: list[dict]) -> tuple[list, list[dict]]:
    """Per cell the prepared (X, y) of real data, or None (synthetic: drawn in the cell), and what to store."""
    sets, prov = [], []
    for c in cells:
        if c["data"] not in cell_fn.FILE_DATA:
            sets.append(None)
            prov.append({"data_index": np.full(c["m"], -1, dtype=np.int64), "data_checksum": 0})
            continue
        p = data_rows(c)
        sets.append(prepared(c, p["data_index"], p["data_checksum"]))
        prov.append(p)
    return sets, prov


def rebuild(cell: dict, read) -> dict:
    """A real-data cell's X from its stored indices (file checksum checked); synthetic cells store X."""
    if cell.get("data") not in cell_fn.FILE_DATA:
        return {}
    rows = read("data_index")[: int(read("m_used"))]
    return {"X": prepared(cell, rows, int(read("data_checksum")))[0].numpy()}


def bundle_key(cell: dict) -> tuple:
    """Seeds stack; the true shape (d, m, width; linear: width 1) is the bundle's own: nothing is
    padded, so a net is bit for bit the same whatever its bundle mates (issue 29 item 2; padding
    changes the order of the kernels' sums: ~1e-16 in W)."""
    shape = (cell["d"], cell["m"], 1 if cell["model"] == "linear" else cell["width"])
    return tuple(sorted((k, v) for k, v in cell.items() if k not in ("seed", "data_seed", "d", "m", "width"))) \
        + (("shape", shape),)


def extra_dims(cells: list[dict]) -> dict[str, int]:
    width = lambda c: 1 if c["model"] == "linear" else c["width"]  # noqa: E731
    return {"hidden": max(width(c) for c in cells), "feature": max(c["d"] for c in cells),
            "sample": max(c["m"] for c in cells), "rng_byte": 2 * cell_fn.RNG_BYTES}


def memory(cell: dict) -> float:
    return float(8 * (cell["m"] * cell["d"] + 4 * cell["width"] * cell["d"] + 4 * cell["m"] * cell["width"]))


@timed
def run_bundle(cells: list[dict], device: str = "auto") -> list[dict]:
    """Train on ``device`` (auto: CUDA when visible; TF32 off), store float64 CPU nets."""
    dev = nonrobust.resolve_device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    # epochs done and the worst net's loss vs Thm 2.1's log(2)/m (``first_below``'s mark), issue 30
    target = math.log10(math.log(2) / max(c["m"] for c in cells))
    progress = bundle_progress.for_kernel(bundle_progress.current(), target=target)
    sets, prov = load_datasets(cells)
    out = [dict(res, **p) for res, p in zip(cell_fn.train_cells(cells, dev, progress=progress, sets=sets), prov)]
    for res, c in zip(out, cells):  # file data: indices and a checksum, never a copy of the data set
        if c["data"] in cell_fn.FILE_DATA:
            res["X"] = res["X"][:0]
    return out


def contract(cell: dict, upstream=None) -> NetsContract:
    """Paper 001 nets: W trained, the output layer frozen (±1/√n; linear: v = 1), no bias (Eq. 1, §3)."""
    return NetsContract(trained=frozenset({"W"}), output="frozen", trainer="train_kkt", data=cell["data"])


EXPERIMENT = register(Experiment(
    name="train_kkt",
    paper="001 Provable unlearning with gradient ascent on two-layer ReLU nets (the training of App. E, as a stage)",
    description="train frozen-output two-layer ReLU nets / linear predictors by GD + weight decay, store the nets",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, check=check, memory=memory,
    memory_fields=("d", "m", "width"), extra_dims=extra_dims, produces=("nets",), nets=contract, rebuild=rebuild,
    points=lambda c: c["m"],
    cost=lambda c: float(c["epochs"] * c["m"] * c["d"] * c["width"]),
    summary=("m_used", "train_acc", "log10_loss", "q_min", "eps_rel"),
    spec_ids=("F001-1", "F001-2", "F001-3", "F001-4", "F001-5", "F001-6"),
))
