"""Experiment ``nonrobust``: paper 002 (Vardi, Yehudai, Shamir): max-margin two-layer ReLU
nets flip under a small universal perturbation along ẑ ∝ Σ_{i∈I} y_i x_i. Declaration and
wiring only; the maths of a bundle is ``tasks/cells/nonrobust.py``.

Cells that differ only in seed, d, m and width share one bundle (zero-padded, see the cell
module). Minibatch cells (m > batch_size) are not padded in m.

Departures from spec 002 (README "Departures from the specs"): E8's trajectory run is not
implemented (only the Thm 3.1 net's radius and c* are stored, so E8 is not in ``spec_ids``);
E6's sphere-data part is not configured. Followed as the spec resolves them: the margin set is
over correctly classified points (A14), Thm 4.1 is checked on the slack-1.01 set (A13), the
fast period (E14) switches on full-data separation.
"""

from __future__ import annotations

import math
import time

import torch

from core.errors import ConfigError
from flows import bundle_progress
from flows import checkpoint as checkpoint_io
from flows.experiments import Experiment, Param, Var, register
from tasks import attacks, data, nets, train
from tasks.cells import nonrobust as cell_fn
from tasks.cells.nonrobust import n_samples
from tasks.train.compile_policy import CompilePolicy

M_MAX = 10**8  # most training samples m (given, or round(d^alpha))
P = {
    "data": Param(str, "sphere", "input distribution (spec §2.7, A11)", choices=tuple(data.DISTRIBUTIONS)),
    "labels": Param(str, "random", "i.i.d. uniform labels (paper) or exactly balanced (theory regime); "
                    "sign_x1: balanced with y = sign(x_1) (paper 004 F004-1)", choices=("random", "balanced", "sign_x1")),
    "d": Param(int, 100, "input dimension", min=2, max=10**6),
    "alpha": Param(float, 1.0, "sample size m = round(d^alpha) when m is 0 (Fig. 1a)", gt=0, max=4),
    "m": Param(int, 0, "sample size; 0 means round(d^alpha)", min=0, max=M_MAX),
    "width": Param(int, 1000, "hidden neurons k", min=1, max=10**6),
    "seed": Param(int, 0, "one seed draws data, labels, init and batch order (spec A8)", min=0, max=2**32 - 1),
    "loss": Param(str, "exp", "training loss", choices=("exp", "logistic")),
    "lr0": Param(float, 1e-5, "initial learning rate", gt=0),
    "lr_factor": Param(float, 1.1, "LR multiplier per period", min=1.0),
    "lr_period": Param(int, 100, "iterations per LR plateau (paper: 100)", min=1, max=10**9),
    "lr_period_fast": Param(int, 0, "period once the data are separated (spec E14); 0 keeps lr_period", min=0),
    "target_loss": Param(float, 1e-30, "stop when the full-data mean loss is below this", gt=0, max=1),
    "max_iters": Param(int, 150_000, "iteration cap (spec A15)", min=1, max=10**9),
    "batch_size": Param(int, 5000, "SGD batch (full batch when m <= batch_size)", min=1, max=M_MAX),
    "init_scale": Param(float, 1.0, "multiplier of the PyTorch default init (spec E13)", gt=0),
    "dtype": Param(str, "float64", "training precision (analysis is always float64)", choices=("float32", "float64")),
    "compile_step": Param(bool, False, "run the training step under torch.compile: equal to eager to ~1e-15, "
                          "25-85 s of compiling per process and shape with an empty cache (6-11 s warm); auto: "
                          "compile only once the eager steps run would have paid for it (break-even rule, "
                          "tasks/train/compile_policy.py; benchmarks/README.md, issues 19, 33)",
                          choices=(False, True, "auto")),
    "slack": Param(float, 1.1, "margin set I = {q_i <= slack · q_min} (paper: 1.1)", min=1.0),
    "attack": Param(str, "margin_direction", "universal direction", choices=tuple(attacks.DIRECTIONS)),
    "kkt_max_m": Param(int, 4000, "fit KKT multipliers only when m <= this (NNLS is O(m²))", min=0, max=M_MAX),
}

V = {
    "m_used": Var("1", "number of training samples m", "int64", finite=True),
    "iters": Var("1", "training iterations taken", "int64", finite=True),
    "status": Var("1", ", ".join(f"{k} {v}" for k, v in train.STATUS_NAMES.items()), "int8",
                  ok=(train.CONVERGED,), finite=True, labels=tuple(train.STATUS_NAMES.items())),
    "log10_loss": Var("log10", "final full-data mean loss, log10"),
    "train_acc": Var("1", "fraction of training samples with y N(x) > 0"),
    "q_min": Var("1", "smallest margin y_i N(x_i) (raw parameters)"),
    "q_ratio": Var("1", "q_max / q_min (Lemma C.1: -> 1)"),
    "gamma": Var("1", "normalized margin q_min / ||theta||^2"),
    "margin_frac": Var("1", "|I_margin| / m, 10% slack (Fig. 2a)"),
    "n_off_margin": Var("1", "m - |I_margin| (Fig. 2b)", "int64"),
    "c_star": Var("l2 norm", "smallest c flipping all margin samples along the attack direction (Fig. 1)"),
    "c_star_rel": Var("1", "c_star / sqrt(d)"),
    "c_star_rel_norm": Var("1", "c_star / median ||x_i|| (spec A11)"),
    "simultaneous": Var("1", "1 if c_star = max_i r_i (no non-monotone sample)", "int8"),
    "frac_all_flipped": Var("1", "fraction of all samples flipped at c_star"),
    "r_median": Var("l2 norm", "median over I of the per-sample first flip r_i"),
    "r_min": Var("l2 norm", "smallest per-sample first flip r_i over I"),
    "margin_frac_tight": Var("1", "|I| / m at slack 1.01 (spec A13: the exact margin set of Cor 4.1)"),
    "kkt_eps": Var("1", "KKT stationarity residual / ||theta_hat|| (spec §2.11); NaN when not fitted "
                  "(m > kkt_max_m, or the net does not separate its data)"),
    "kkt_eps_proj": Var("1", "KKT residual with W projected on span{x_i} (spec §2.11)"),
    "kkt_support": Var("1", "|{i : lambda_i > 0}|, the NNLS support (spec A13); -1 when not fitted", "int64"),
    "kkt_delta": Var("1", "complementary slackness sum lambda_i (q_hat_i - 1)"),
    "kkt_sum_lam_ratio": Var("1", "sum lambda / (||theta_hat||^2 / 2), 1 at a KKT point"),
    "balance_err": Var("1", "sum_j |v_j^2 - ||w_j||^2 - b_j^2| / ||theta||^2"),
    "theory_p": Var("1", "max_{i!=j in I} |<x_i, x_j>| over the slack-1.01 margin set I (Thm 4.1 / Cor 4.1)"),
    "theory_c_bal": Var("1", "class balance min(|I+|,|I-|)/|I| (Thm 4.1 c)"),
    "theory_c_prime": Var("1", "|I| (p+1)/(d+1); Thm 4.1 needs <= 1/3"),
    "theory_z_norm": Var("l2 norm", "||z|| of Thm 4.1's explicit z = (eta1+eta2) sum y_l x_l"),
    "theory_max_pos": Var("1", "max_{I+} N_hat(x - z); Thm 4.1: <= -1"),
    "theory_min_neg": Var("1", "min_{I-} N_hat(x + z); Thm 4.1: >= 1"),
    "robust_radius": Var("l2 norm", "certified radius (1-rho) sqrt(d)/2 of the Thm 3.1 net"),
    "robust_c_star": Var("l2 norm", "c_star of the Thm 3.1 net along the same direction"),
    "wall_s": Var("s", "bundle training wall time divided by the bundle's cells", finite=True),
    "q_sample": Var("1", "per-sample margins y_i N(x_i) (NaN past m)", dims=("sample",)),
    "r_sample": Var("l2 norm", "per-sample first flip r_i along the direction (NaN outside I)", dims=("sample",)),
    "margin_tight_sample": Var("1", "1 if the sample is in the slack-1.01 margin set (-1 past m)", "int8", dims=("sample",)),
    "lam_sample": Var("1", "NNLS KKT multiplier of each sample of the normalised net (NaN past m or unfitted)",
                      dims=("sample",)),
}


def check(cell: dict) -> None:
    m = n_samples(cell)
    if m > M_MAX:
        raise ConfigError("alpha", f"gives m = round(d^alpha) = {m:.3g} samples (d = {cell['d']}); at most {M_MAX:.0e}")
    if m < 2:
        raise ConfigError("m" if cell["m"] else "alpha", f"gives m = {m} samples; need at least 2")
    if cell["data"] == "orthogonal" and m > cell["d"]:
        raise ConfigError("data", f"'orthogonal' needs m <= d, got m={m}, d={cell['d']}")
    if cell["lr_period_fast"] > cell["lr_period"]:
        raise ConfigError("lr_period_fast", "must not exceed lr_period (0 turns it off)")


def bundle_key(cell: dict) -> tuple:
    shape_free = {k: v for k, v in cell.items() if k not in ("seed", "d", "alpha", "m", "width")}
    m = n_samples(cell)
    minibatch = m if m > cell["batch_size"] else 0  # minibatch cells are not padded in m
    # one true shape per bundle (issue 29 item 2): nothing is padded, so a cell's values are bit for
    # bit the same whatever its bundle mates (padding changes the order of the kernels' sums)
    return tuple(sorted(shape_free.items())) + (("minibatch_m", minibatch), ("shape", (cell["d"], m, cell["width"])))


def cost(cell: dict) -> float:
    return float(n_samples(cell) * cell["d"] * cell["width"])


def memory(cell: dict) -> float:
    """Peak bytes of one cell: data, parameters, ~6 activation-sized (batch x width) buffers,
    the (m x m) KKT Gram matrix (float64 analysis)."""
    m, d, k = n_samples(cell), cell["d"], cell["width"]
    item = 4 if cell["dtype"] == "float32" else 8
    batch = min(m, cell["batch_size"])
    gram = 3 * m * m * 8 if m <= cell["kkt_max_m"] else 0
    return float(item * (m * d + 2 * k * d + 6 * batch * k) + gram)


def extra_dims(cells: list[dict]) -> dict[str, int]:
    return {"sample": max(n_samples(c) for c in cells)}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def start_training(cells: list[dict], device: str, checkpoint: str | None, datasets: list | None,
                   extra: dict | None = None):
    """What both training paths (:func:`train_bundle`, ``train.train_logged``) start from: the device
    (TF32 off on CUDA: it perturbs margins by ~1e-3 relative, spec A16), the bundle's stack on the
    CPU ``(net, X, y, mask, gens)``, its schedule, the checkpointed state if one can be resumed
    (``extra`` receives the checkpoint's extra tensors) and the stack on the device ``(net, X, y, mask)``."""
    dev = resolve_device(device)
    dtype = getattr(torch, cells[0]["dtype"])
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    net, X, y, mask, gens = cell_fn.build(cells, datasets)
    sched = cell_fn.schedule(cells[0])
    check = lambda st: train.check_state(st, net, sched, (X, y, mask))  # noqa: E731 - this bundle's, as trained
    state = checkpoint_io.load(checkpoint, dev, dtype, gens, check, extra=extra) if checkpoint else None
    on_dev = (nets.TwoLayer(*(t.to(dev, dtype) for t in (net.W, net.b, net.v))), X.to(dev, dtype), y.to(dev, dtype),
              mask.to(dev))
    return (net, X, y, mask, gens), sched, state, on_dev


def train_bundle(cells: list[dict], device: str = "auto", checkpoint: str | None = None,
                 checkpoint_every_s: float = 60.0, max_chunks: int | None = None, datasets: list | None = None):
    """Train a bundle as one stacked problem, in chunks, checkpointing every
    ``checkpoint_every_s`` seconds (and after the last of ``max_chunks`` chunks)."""
    (net, X, y, mask, gens), sched, state, (net_dev, Xd, yd, maskd) = start_training(cells, device, checkpoint,
                                                                                       datasets)
    last_save, chunks, rep = time.monotonic(), 0, bundle_progress.current()  # in-bundle progress (issue 30)
    policy = compile_policy(cells, Xd, net_dev)
    while state is None or bool(state.running.any()):
        base, steps = (0 if state is None else int(state.iters.max())), cell_fn.chunk_steps(cells, sched)
        comp, t_piece = policy.choose(base, sched.max_iters - base), time.perf_counter()
        state = train.train(net_dev, Xd, yd, sched, mask=maskd, batch_generators=gens, state=state,
                            max_steps=steps, compile=comp, progress=rep.within(base, steps, sched.max_iters))
        policy.record(time.perf_counter() - t_piece, int(state.iters.max()) - base, comp)
        bundle_progress.train_report(rep, state, sched.max_iters, sched.target_loss)
        chunks += 1
        stop = max_chunks is not None and chunks >= max_chunks
        if checkpoint and (stop or time.monotonic() - last_save >= checkpoint_every_s):
            checkpoint_io.save(checkpoint, state, gens)
            last_save = time.monotonic()
        if stop:
            break
    return state, (net, X, y, mask, gens)


def compile_policy(cells: list[dict], X: torch.Tensor, net: nets.TwoLayer) -> CompilePolicy:
    """The bundle's ``compile_step`` (true, false or auto: the break-even rule) for its stack's shape."""
    return CompilePolicy(cells[0].get("compile_step", False), (str(X.device), X.dtype, tuple(X.shape), net.W.shape[1]))


def train_then(measure, cells: list[dict], device: str = "auto", checkpoint: str | None = None,
               datasets: list | None = None) -> list[dict]:
    """Train the bundle (resuming from ``checkpoint`` if one exists), then ``measure(net, X, y, mask,
    cells, gens)`` the float64 CPU nets; each cell's result gets its training numbers."""
    t0 = time.perf_counter()
    st, (_, X, y, mask, gens) = train_bundle(cells, device, checkpoint, datasets=datasets)
    wall = time.perf_counter() - t0
    net = nets.TwoLayer(*(t.detach().to("cpu", torch.float64) for t in (st.net.W, st.net.b, st.net.v)))
    results = measure(net, X, y, mask, cells, gens)
    for e, res in enumerate(results):
        res.update(iters=int(st.iters[e]), status=int(st.status[e]),
                   log10_loss=float(st.log_loss[e]) / math.log(10), wall_s=wall / len(cells))
    return results


def run_bundle(cells: list[dict], device: str = "auto", checkpoint: str | None = None) -> list[dict]:
    """Train the bundle, then measure everything in float64 (``tasks.cells.nonrobust.analyse``)."""
    return train_then(cell_fn.analyse, cells, device, checkpoint)


EXPERIMENT = register(Experiment(
    name="nonrobust",
    figures="analysis.nonrobust",
    acceptance="analysis.acceptance_002",
    paper="002 Vardi, Yehudai, Shamir: Gradient methods provably converge to non-robust networks",
    description="train two-layer ReLU nets to loss 1e-30; smallest universal flip c* along z (Fig. 1, 2)",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=bundle_key, cost=cost, check=check, memory=memory,
    memory_fields=("d", "m", "alpha", "width"),
    checkpoints=True,
    extra_dims=extra_dims,
    summary=("m_used", "status", "iters", "train_acc", "margin_frac", "gamma", "c_star", "c_star_rel", "kkt_eps"),
    # E8 is left out: only its comparison part (robust_radius, robust_c_star) is stored, no
    # trajectory run from the Thm 3.1 net (README "Departures from the specs")
    spec_ids=("Fig1a", "Fig1b", "Fig2a", "Fig2b", "E4", "E5", "E6", "E13", "E14"),
))
