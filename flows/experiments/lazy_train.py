"""Experiment ``lazy_train`` (paper 003 §5.1, spec 003 §2.6; E1/E2's training): lazy SGD of
two-layer ReLU nets with a fixed top layer on binary MNIST (0 vs 1) or sklearn digits, stopped at
the lazy-ball exit, one trajectory per (variant, d, m, seed) and a snapshot for every C0 of the
grid. Produces "nets" for ``single_step`` and ``pgd``. Declaration and wiring only; the maths is
``tasks/cells/lazy_train.py``.

Stored per cell (unless ``store_nets: false``): W (hidden, feature) = W0 + U, b, v = a/√m (the
project's TwoLayer form, so ``storage.nets`` reads them), float64, zero-padded, true sizes beside.
Never a copy of the data set (issue 13 item 4): the training and test sets are stored as their rows'
indices in the data file plus the file's checksum, and the init W0 as its seed; :func:`rebuild`
gives a reading stage (or ``kktlab.load_nets``) X, y, X_test, y_test and W0 back, bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from core.declare import NetsContract
from core.errors import ConfigError
from flows import bundle_progress
from flows.experiments import Experiment, Param, Var, register, timed
from storage import datasets
from tasks.cells import lazy_train as cell_fn
from tasks.data.images import RESAMPLE, VARIANTS, side, stratified_split

MNIST_N = {"train": 12665, "test": 2115}
DIGITS_N = 360

DATA = {
    "data": Param(str, "mnist", "binary 0-vs-1 data set: MNIST (shared IDX files) or sklearn digits (spec §5.3)",
                  choices=("mnist", "digits")),
    "variant": Param(str, "unit", "raw pixels in [0,1] (Figs 2/3) or unit-norm rows (Figs 4-6)", choices=VARIANTS),
    "resample": Param(str, "bilinear", "downsampling to k x k: bilinear + antialias (default) or area",
                      choices=RESAMPLE),
    "d": Param(int, 784, "input dimension d = k^2 (k <= 28 MNIST, <= 8 digits)", min=4, max=784),
    "n_train": Param(int, 0, "first n training points of the 0/1 set (0: all 12665 MNIST / 75% digits)", min=0),
    "n_test": Param(int, 0, "first n test points (0: all 2115 MNIST / 25% digits)", min=0),
    "split_seed": Param(int, 0, "digits only: seed of the stratified 75/25 split", min=0, max=2**32 - 1),
    "m": Param(int, 1000, "width m (hidden neurons)", min=1, max=10**6),
    "seed": Param(int, 0, "init W0, a, b0 and the minibatch order (spec §6 #24)", min=0, max=2**32 - 1),
    "dtype": Param(str, "float64", "training precision", choices=("float32", "float64")),
    "store_nets": Param(bool, True, "store nets and data (false: numbers only; no later stage can read them)"),
}
P = {
    **DATA,
    "C0": Param(float, 10.0, "lazy radius C0: snapshot when √m ||W - W0||_{2,∞} first exceeds it", gt=0),
    "bias": Param(str, "auto", "hidden bias: auto = on for raw, off for unit (spec §2.2)", choices=("auto", "on", "off")),
    "lr": Param(float, 0.1, "SGD learning rate (paper: 0.1)", gt=0),
    "batch_size": Param(int, 64, "minibatch (spec §6 #1)", min=1, max=10**6),
    "reduction": Param(str, "mean", "loss reduction over the minibatch (spec §6 #2)", choices=("mean", "sum")),
    "max_steps": Param(int, 200_000, "SGD step cap (spec §6 #1); exited = 0 when reached", min=1, max=10**9),
    "exit_rule": Param(bool, True, "stop at the lazy-ball exit (§5.1); false: train max_steps steps whatever C0 (X4)"),
}


def _v(units, doc, dtype="float64", dims=(), pad=None, finite=False):
    return Var(units, doc, dtype, dims=dims, pad=pad, finite=finite)


V = {
    "exited": _v("1", "1 if the next SGD step left the ball (0: max_steps reached inside)", "int8", finite=True),
    "steps": _v("step", "SGD steps of the returned (last inside) iterate", "int64", finite=True),
    "C0_reached": _v("1", "√m ||W - W0||_{2,∞} of the returned iterate", finite=True),
    "C0_cone": _v("1", "√m min_r max_s ||r w_s - w_s0|| (bias-free nets; NaN with bias)"),
    "V": _v("1", "ball radius C0/√m", finite=True),
    "test_acc": _v("1", "fraction of test points with y f(x) > 0", finite=True),
    "train_acc": _v("1", "fraction of training points with y f(x) > 0", finite=True),
    "train_loss": _v("1", "mean logistic loss on the training set"),
    "m_used": _v("1", "training points n", "int64", finite=True),
    "d_used": _v("1", "true input dimension d", "int64", finite=True),
    "width_used": _v("1", "true width m", "int64", finite=True),
    "n_test_used": _v("1", "test points", "int64", finite=True),
    "nets_stored": _v("1", "1 if the nets and data are stored", "int8", finite=True),
    "wall_s": _v("s", "bundle wall time divided by its cells", finite=True),
    "W": _v("1", "trained first layer W0 + U (zero padded)", dims=("hidden", "feature"), pad=0.0),
    "b": _v("1", "hidden biases (0 without bias)", dims=("hidden",), pad=0.0),
    "v": _v("1", "fixed top layer a_s/√m", dims=("hidden",), pad=0.0),
    "data_index": _v("1", "row of each training point in its file (MNIST train IDX / sklearn digits)", "int64",
                     dims=("sample",), pad=-1),
    "test_index": _v("1", "row of each test point in its file (MNIST t10k IDX / sklearn digits)", "int64",
                     dims=("test_sample",), pad=-1),
    "data_checksum": _v("1", "first 60 bits of the sha256 of the training file (digits: of its arrays)", "int64"),
    "test_checksum": _v("1", "first 60 bits of the sha256 of the test file", "int64"),
    "batch_rng_state": _v("byte", "minibatch-order generator after training", "uint8", dims=("rng_byte",)),
}
RNG_BYTES = int(torch.Generator().get_state().numel())


def sizes(cell: dict) -> tuple[int, int]:
    """(n_train, n_test) of a cell."""
    full = (MNIST_N["train"], MNIST_N["test"]) if cell["data"] == "mnist" else (270, 90)
    return (min(cell["n_train"] or full[0], full[0]), min(cell["n_test"] or full[1], full[1]))


def check(cell: dict) -> None:
    try:
        k = side(cell["d"])
    except ValueError as err:
        raise ConfigError("d", str(err)) from None
    top = 28 if cell["data"] == "mnist" else 8
    if k > top:
        raise ConfigError("d", f"d = {cell['d']} (k = {k}) is larger than the {top} x {top} {cell['data']} images")
    if "batch_size" in cell and cell["batch_size"] > sizes(cell)[0]:
        raise ConfigError("batch_size", f"{cell['batch_size']} is more than the {sizes(cell)[0]} training points")


def extra_dims(cells: list[dict]) -> dict[str, int]:
    stored = [c for c in cells if c.get("store_nets", True)]
    return {"hidden": max([c["m"] for c in stored] or [1]), "feature": max([c["d"] for c in stored] or [1]),
            "sample": max([sizes(c)[0] for c in stored] or [1]), "test_sample": max([sizes(c)[1] for c in stored] or [1]),
            "rng_byte": RNG_BYTES}


def memory(cell: dict) -> float:
    """W0, U, W, the update and snapshots (~8 d x m blocks), the data, a minibatch block."""
    item = 4 if cell["dtype"] == "float32" else 8
    n, nt = sizes(cell)
    return float(item * (8 * cell["d"] * cell["m"] + (n + nt) * cell["d"] + 4 * cell.get("batch_size", 64) * cell["m"]))


def cost(cell: dict) -> float:
    return float(cell["d"] * cell["m"] * min(cell.get("max_steps", 1000), 10**5))


def bundle_key(cell: dict) -> tuple:
    """One trajectory per seed serves every C0 (spec §2.6): bundle by everything but seed and C0."""
    return tuple(sorted((k, v) for k, v in cell.items() if k not in ("seed", "C0")))


def device_of(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


FILES = {"mnist": ("mnist-train", "mnist-test"), "digits": ("digits", "digits")}


def data_rows(cell: dict) -> dict:
    """The file rows of the cell's training and test sets (spec 003 §2.5 / §5.3): the first n (nt)
    0/1 images of the MNIST train (test) file in file order, or digits' seeded stratified split;
    indices into the file and its checksum, which is what the store keeps."""
    n, nt = sizes(cell)
    tr_name, te_name = FILES[cell["data"]]
    if cell["data"] == "mnist":
        tr, te = datasets.positions(tr_name, (0, 1))[:n], datasets.positions(te_name, (0, 1))[:nt]
    else:
        pos = datasets.positions("digits", (0, 1))
        _, lab = datasets.file_rows("digits", pos, datasets.checksum60("digits"))
        a, b = stratified_split(lab * 2 - 1, 0.25, torch.Generator().manual_seed(cell["split_seed"]))
        tr, te = pos[a.numpy()][:n], pos[b.numpy()][:nt]
    return {"data_index": tr, "test_index": te,
            "data_checksum": datasets.checksum60(tr_name), "test_checksum": datasets.checksum60(te_name)}


def prepared(cell: dict, name: str, rows, checksum: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (n, d) of the cell's (variant, d, resample), float64, and labels ±1 (digit 1 -> +1);
    the nets of a reading bundle mostly share them, so they are prepared once."""
    X, y = _prepared(name, np.asarray(rows, dtype=np.int64).tobytes(), int(checksum), cell["variant"], cell["d"],
                     cell["resample"])
    return X.clone(), y.clone()  # the cached ones are never handed out


@functools.lru_cache(maxsize=8)
def _prepared(name: str, rows: bytes, checksum: int, variant: str, d: int, resample: str):
    img, lab = datasets.file_rows(name, np.frombuffer(rows, dtype=np.int64), checksum)
    return cell_fn.prepare(img, {"variant": variant, "d": d, "resample": resample}), (lab * 2 - 1).double()


def load_data(cell: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Training and test rows of the cell's (data, variant, d, resample, n_train, n_test), float64,
    and their provenance (:func:`data_rows`)."""
    prov = data_rows(cell)
    tr_name, te_name = FILES[cell["data"]]
    X, y = prepared(cell, tr_name, prov["data_index"], prov["data_checksum"])
    Xt, yt = prepared(cell, te_name, prov["test_index"], prov["test_checksum"])
    return X, y, Xt, yt, prov


def rebuild(cell: dict, read) -> dict:
    """What a stored cell keeps as indices and seeds, rebuilt bit for bit: X, y, X_test, y_test
    from the data files (checksums checked) and W0 from the seed (drawn on the CPU in float64, cast
    to the training dtype as training did)."""
    tr_name, te_name = FILES[cell["data"]]
    X, y = prepared(cell, tr_name, read("data_index")[: int(read("m_used"))], int(read("data_checksum")))
    Xt, yt = prepared(cell, te_name, read("test_index")[: int(read("n_test_used"))], int(read("test_checksum")))
    W0, _, b0, _ = cell_fn.init_stack([cell["seed"]], cell["d"], cell["m"], cell_fn.has_bias(cell),
                                      getattr(torch, cell["dtype"]), torch.device("cpu"))
    return {"X": X.numpy(), "y": y.numpy(), "X_test": Xt.numpy(), "y_test": yt.numpy(), "W0": W0[0].double().numpy(),
            "b0": b0[0].double().numpy()}


# kept for readers beside the nets (n_test_used stored; the init and the test set rebuilt by rebuild)
NETS_ARRAYS = {"W0": ("hidden", "feature"), "b0": ("hidden",), "X_test": ("test_sample", "feature"),
               "y_test": ("test_sample",), "n_test_used": ()}


def contract(cell: dict, upstream=None) -> NetsContract:
    """Paper 003 lazy nets: W trained, b trained when the variant has a bias (spec 003 §2.2), the top
    layer a/√m frozen; the init (W0, b0) and the test set come back through :func:`rebuild`."""
    trained = {"W", "b"} if cell_fn.has_bias(cell) else {"W"}
    return NetsContract(arrays=frozenset({"W0", "b0", "X_test", "y_test"}), trained=frozenset(trained),
                        output="frozen", trainer="lazy_train", data=cell["data"])


@timed
def run_bundle(cells: list[dict], device: str = "auto") -> list[dict]:
    X, y, Xt, yt, prov = load_data(cells[0])
    progress = bundle_progress.for_kernel(bundle_progress.current())  # SGD steps of max_steps (issue 30)
    out = cell_fn.run(cells, X, y, Xt, yt, device_of(device), progress=progress)
    return [dict(res, **prov) for res in out]


EXPERIMENT = register(Experiment(
    name="lazy_train",
    paper="003 Wang, Ullah, Mianjy, Arora: Adversarial robustness is at odds with lazy training",
    description="lazy SGD to the exit of the ball ||W - W0||_{2,inf} <= C0/sqrt(m), snapshots per C0 (produces nets)",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, cost=cost, check=check, memory=memory,
    memory_fields=("m", "d"), extra_dims=extra_dims, produces=("nets",), rebuild=rebuild, nets=contract,
    points=lambda c: sizes(c)[0],
    nets_arrays=NETS_ARRAYS,
    summary=("test_acc", "exited", "steps", "C0_reached"), spec_ids=("E1", "E2", "E3", "X2", "X6"),
))
