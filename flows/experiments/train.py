"""Experiment ``train``: the first stage of a paper-002 chain (spec 002 §2.2: log-space GD of
two-layer ReLU nets to loss 1e-30), storing each trained net and its training set so a later
stage (``universal_attack``, reading "nets") measures them. Declaration and wiring only: the
training is ``nonrobust``'s (``flows/experiments/nonrobust.py::train_bundle``, same parameters,
same bundles, same checkpoints), the packing ``tasks/cells/train.py``.

Stored per cell: status, iters, log10_loss, train_acc, m_used, the true sizes d_used and
width_used, and (unless ``store_nets: false``, e.g. for very wide nets) W (hidden, feature),
b, v (hidden), X (sample, feature), y (sample), float64, zero-padded to the group's largest
sizes; ``batch_rng_state`` is the minibatch generator after training.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from core.errors import ConfigError
from flows import bundle_progress
from flows import checkpoint as checkpoint_io
from core.declare import NetsContract
from flows.experiments import Experiment, Param, Var, nonrobust, register
from tasks import data as synthetic
from tasks import nets, train
from tasks.cells import train as cell_fn
from tasks.cells.nonrobust import chunk_steps, n_samples
from tasks.cells.train_kkt import PREPROCESS

CIFAR = "cifar_vehicles"  # paper 004 F004-2: CIFAR-10 vehicles (+1) vs animals (-1), storage/datasets.py
MNIST = "mnist"  # issue 39: two MNIST digits, rows drawn and prepared as train_kkt's (flows/experiments/train_kkt.py)

TRAIN_PARAMS = ("data", "labels", "d", "alpha", "m", "width", "seed", "loss", "lr0", "lr_factor", "lr_period",
                "lr_period_fast", "target_loss", "max_iters", "batch_size", "init_scale", "dtype", "compile_step")
P = {k: nonrobust.P[k] for k in TRAIN_PARAMS}
P["data"] = Param(str, "sphere", nonrobust.P["data"].doc + f"; {CIFAR}: CIFAR-10 vehicles vs animals, m/2 "
                  "per class from the start of the training split, minus their mean (paper 004 F004-2; d = 3072)"
                  f"; {MNIST}: two MNIST digits (class_neg -> -1, class_pos -> +1), m/2 each drawn by the seed, "
                  "resized to d = k² and preprocessed as train_kkt's (issue 39)",
                  choices=(*synthetic.DISTRIBUTIONS, CIFAR, MNIST))
P["class_neg"] = Param(int, 0, "real data: the class labelled -1 (MNIST digit / CIFAR-10 class)", min=0, max=9)
P["class_pos"] = Param(int, 1, "real data: the class labelled +1", min=0, max=9)
P["preprocess"] = Param(str, "center_unit", "real data, after the resize to d: minus the training set's mean then "
                        "unit rows, unit rows, or raw pixels in [0, 1]", choices=PREPROCESS)
P["store_nets"] = Param(bool, True, "store each trained net and its training set (false: numbers only, "
                        "e.g. for very wide nets; no later stage can read them)")
P["log_points"] = Param(int, 0, "log the training trajectory (loss, margin, ||theta||, eps*/||theta|| by NNLS, "
                        "#margin points, Euler ratio) at this many geometric steps 1..max_iters (paper 004 P004-10/11; "
                        "full batch only; 0: off, nothing more stored)", min=0, max=1000)
RNG_BYTES = int(torch.Generator().get_state().numel())

V = {
    "status": nonrobust.V["status"],
    "iters": nonrobust.V["iters"],
    "log10_loss": nonrobust.V["log10_loss"],
    "train_acc": nonrobust.V["train_acc"],
    "m_used": nonrobust.V["m_used"],
    "d_used": Var("1", "true input dimension d of the net (the feature dim is padded past it)", "int64", finite=True),
    "width_used": Var("1", "true width k of the net (the hidden dim is padded past it)", "int64", finite=True),
    "nets_stored": Var("1", "1 if W, b, v, X, y hold this cell's net and data (store_nets), 0 if not", "int8",
                       finite=True),
    "wall_s": nonrobust.V["wall_s"],
    "W": Var("1", "trained first-layer weights w_j (zero past width_used, d_used)", dims=("hidden", "feature"), pad=0.0),
    "b": Var("1", "trained biases b_j (zero past width_used)", dims=("hidden",), pad=0.0),
    "v": Var("1", "trained output weights v_j (zero past width_used)", dims=("hidden",), pad=0.0),
    "X": Var("1", "training points x_i (zero past m_used, d_used); not stored (fill) for data read from a file "
             "(cifar_vehicles, mnist: data_index and data_checksum instead; the experiment's rebuild gives X back)",
             dims=("sample", "feature"), pad=0.0),
    "y": Var("1", "training labels y_i in {-1, 1} (zero past m_used)", dims=("sample",), pad=0.0),
    "data_index": Var("1", "index of each training point in the CIFAR-10 training split (data: cifar_vehicles; "
                      "-1 for synthetic data)", "int64", dims=("sample",)),
    "data_checksum": Var("1", "first 60 bits of the sha256 of the data file read (CIFAR-10, MNIST; 0 for synthetic "
                         "data)", "int64"),
    "eps_rel": Var("1", "eps*/||theta|| of the trained net: its distance from a KKT point of the max-margin problem "
                   "(NNLS over W, b, v, paper 004 §2.3; issue 39: what unlearn's eps1_rel of the same net reads)",
                   domain=(0.0, None)),
    "n_margin": Var("1", "margin points of that fit: #{lambda_i > 1e-6 max lambda}", "int64"),
    **{f"traj_{k}": Var(*spec, dims=("log_step",)) for k, spec in {
        "iter": ("1", "training step of each logged point (geometric; NaN past the end of training)"),
        "log10_loss": ("log10", "full-data mean loss at that step, log10"),
        "margin": ("1", "margin p = min_i y_i Phi(x_i) (raw parameters)"),
        "theta_norm": ("l2 norm", "||theta||"),
        "eps_rel": ("1", "eps*/||theta||, eps* = min_{lambda>=0} ||theta - sum lambda_i y_i grad Phi(x_i)|| (NNLS, "
                    "paper 004 §2.3; P004-11: falls)"),
        "n_margin": ("1", "margin points: #{lambda_i > 1e-6 max lambda} of the NNLS multipliers"),
        "euler": ("1", "h p sum(lambda) / ||theta||^2 with the NNLS lambda, h = 2 (1 at a KKT point, P004-11)"),
    }.items()},
    "batch_rng_state": Var("byte", "state of the net's minibatch-order generator after training (torch CPU "
                           "Generator.get_state); random_direction continues this stream", "uint8",
                           dims=("rng_byte",)),
}


def extra_dims(cells: list[dict]) -> dict[str, int]:
    stored = [c for c in cells if c.get("store_nets", True)]
    return {"hidden": max([c["width"] for c in stored] or [1]), "feature": max([c["d"] for c in stored] or [1]),
            "sample": max([n_samples(c) for c in stored] or [1]), "rng_byte": RNG_BYTES,
            "log_step": max(len(cell_fn.log_marks(c["max_iters"], c["log_points"])) for c in cells)}


def check(cell: dict) -> None:
    """nonrobust's checks; for CIFAR also d = 3072, an even m, and the data file present."""
    nonrobust.check(cell)
    if cell["log_points"] and n_samples(cell) > cell["batch_size"]:
        raise ConfigError("log_points", f"the logged trajectory needs full-batch training (m = {n_samples(cell)} > "
                          f"batch_size = {cell['batch_size']})")
    if cell["data"] == MNIST:
        from flows.experiments import train_kkt  # (it imports this module)

        train_kkt.check(dict(cell, model="two_layer"))  # two classes, d = k² <= 28², the file present
    if cell["data"] != CIFAR:
        return
    from storage import datasets

    if cell["d"] != 3072:
        raise ConfigError("d", f"data '{CIFAR}' has d = 3072 (32x32x3 pixels), got {cell['d']}")
    if n_samples(cell) % 2:
        raise ConfigError("m", f"data '{CIFAR}' takes m/2 per class: m must be even, got {n_samples(cell)}")
    if not datasets.cifar_path().is_file():
        raise ConfigError("data", f"'{CIFAR}' needs the CIFAR-10 file {datasets.cifar_path()}, which is missing "
                          "(set KKTLAB_DATA to the folder holding cifar10/)")


def load_datasets(cells: list[dict]) -> tuple[list, list[dict]]:
    """Per cell: the (X, y) read from a file (CIFAR cells) or None, and the provenance to store."""
    from storage import datasets

    out, prov = [], []
    for c in cells:
        if c["data"] == MNIST:
            from flows.experiments import train_kkt

            rows = train_kkt.data_rows(dict(c, data_seed=-1))
            out.append(train_kkt.prepared(c, rows["data_index"], rows["data_checksum"]))
            prov.append(rows)
            continue
        if c["data"] != CIFAR:
            out.append(None)
            prov.append({"data_index": np.full(n_samples(c), -1, dtype=np.int64), "data_checksum": 0})
            continue
        X, y, idx, _, digest = datasets.cifar_vehicles_animals(n_samples(c) // 2)
        out.append((X, y))
        prov.append({"data_index": idx.numpy().astype(np.int64), "data_checksum": int(digest[:15], 16)})
    return out, prov


def memory(cell: dict) -> float:
    return nonrobust.memory(dict(cell, kkt_max_m=0))  # no KKT fit here


def run_bundle(cells: list[dict], device: str = "auto", checkpoint: str | None = None) -> list[dict]:
    """Train the bundle exactly as ``nonrobust`` does (resuming from ``checkpoint``), then keep the
    nets: float64 on the CPU, at their true sizes."""
    sets, prov = load_datasets(cells)
    if cells[0]["log_points"]:  # one bundle, one log_points (bundle_key)
        out = train_logged(cells, device, checkpoint, sets)
    else:
        out = nonrobust.train_then(lambda net, X, y, mask, cells, gens: with_kkt(cell_fn.pack(net, X, y, cells, gens),
                                                                                  net, X, y, mask, cells),
                                   cells, device, checkpoint, datasets=sets)
    out = [dict(res, **p) for res, p in zip(out, prov)]
    for res, c in zip(out, cells):  # file data: indices and a checksum, never a copy of the data set
        if c["data"] in (CIFAR, MNIST):
            res["X"] = res["X"][:0]
    return out


def retrain(cells: list[dict], drop: torch.Tensor, like: torch.Tensor, device: str = "cpu"):
    """Issue 39's ``retrain`` reference for these nets: each net of ``cells`` (its cell as run) trained again
    from the same init and data with the same schedule, on its training set without the points ``drop``
    (R,M) marks (full batch: ``nonrobust.start_training``'s stack with those points masked out, one stacked
    problem per training bundle key). Returns W (R,k,d), b, v (R,k) float64 on the CPU, zero-padded to
    ``like``'s (k, d)."""
    R, (k, d) = len(cells), like.shape[-2:]
    W, b, v = torch.zeros(R, k, d, dtype=torch.float64), torch.zeros(R, k, dtype=torch.float64), \
        torch.zeros(R, k, dtype=torch.float64)
    groups: dict = {}
    for r, c in enumerate(cells):
        if n_samples(c) > c["batch_size"]:
            raise ValueError(f"retrain: the upstream net trained by minibatch SGD (m = {n_samples(c)} > batch_size "
                             f"{c['batch_size']}); without a point its epochs are another schedule")
        groups.setdefault(nonrobust.bundle_key(c), []).append(r)
    for rows in groups.values():
        part = [cells[r] for r in rows]
        sets, _ = load_datasets(part)
        (_, _, _, mask, gens), sched, _, (net, X, y, maskd) = nonrobust.start_training(part, device, None, sets)
        keep = maskd & ~drop[rows, : mask.shape[1]].to(maskd.device)
        st = train.train(net, X, y, sched, mask=keep, batch_generators=gens)
        kk, dd = st.net.W.shape[1:]
        W[rows, :kk, :dd] = st.net.W.detach().to("cpu", torch.float64)
        b[rows, :kk] = st.net.b.detach().to("cpu", torch.float64)
        v[rows, :kk] = st.net.v.detach().to("cpu", torch.float64)
    return W, b, v


def with_kkt(out: list[dict], net, X, y, mask, cells: list[dict]) -> list[dict]:
    """Each cell's result with its trained net's distance from a KKT point (``eps_rel``, ``n_margin``:
    :func:`tasks.cells.train.trajectory_point`'s NNLS fit, once, at the end of training)."""
    row = cell_fn.trajectory_point(net, X, y, mask, cells[0]["loss"], torch.zeros(len(cells)))
    for e, res in enumerate(out):
        res.update(eps_rel=float(row["eps_rel"][e]), n_margin=int(row["n_margin"][e]))
    return out


def rebuild(cell: dict, read) -> dict:
    """A CIFAR or MNIST cell's training rows from its stored indices, checksum checked (the file it was
    trained on); synthetic cells store their X and rebuild nothing."""
    from storage import datasets

    rows = read("data_index")[: int(read("m_used"))]
    if cell.get("data") == MNIST and len(rows) and rows[0] >= 0:
        from flows.experiments import train_kkt

        return {"X": train_kkt.prepared(cell, rows, int(read("data_checksum")))[0].numpy()}
    if cell.get("data") != CIFAR or not len(rows) or rows[0] < 0:
        return {}
    return {"X": datasets.cifar_rows(rows, int(read("data_checksum"))).numpy()}


def train_logged(cells: list[dict], device: str, checkpoint: str | None, sets: list,
                 checkpoint_every_s: float = 60.0) -> list[dict]:
    """Train as ``nonrobust.train_bundle`` does (full batch: the same GD steps, so the same nets; with
    ``compile_step`` equal to ~1e-16, the steps to a mark that fill no compiled block running eagerly), stopping
    at the geometric marks of ``cell_fn.log_marks`` to log the trajectory (``cell_fn.trajectory_point``);
    the rows so far are saved with the checkpoint, so a killed bundle resumes with them."""
    t0 = time.perf_counter()
    saved: dict = {}
    (_, X, y, _, gens), sched, state, (net_dev, Xd, yd, maskd) = nonrobust.start_training(
        cells, device, checkpoint, sets, extra=saved)
    marks = cell_fn.log_marks(sched.max_iters, cells[0]["log_points"])
    rows = {k: saved.get(k, torch.full((len(cells), len(marks)), math.nan, dtype=torch.float64))
            for k in cell_fn.TRAJECTORY}
    if state is not None and any(tuple(r.shape) != (len(cells), len(marks)) for r in rows.values()):
        state, rows = None, {k: torch.full((len(cells), len(marks)), math.nan, dtype=torch.float64)
                             for k in cell_fn.TRAJECTORY}  # a checkpoint without its trajectory: start again
    done = 0 if state is None else int(state.iters.max())
    last_save, piece, rep = time.monotonic(), chunk_steps(cells, sched), bundle_progress.current()
    policy = nonrobust.compile_policy(cells, Xd, net_dev)
    for i, t in enumerate(marks):
        if t <= done:
            continue
        was_running = torch.ones(len(cells), dtype=torch.bool) if state is None else state.running.cpu()
        while done < t and (state is None or bool(state.running.any())):  # pieces as the unlogged path's
            step = min(t, (done // piece + 1) * piece)
            comp, t_piece = policy.choose(done, sched.max_iters - done), time.perf_counter()
            state = train.train(net_dev, Xd, yd, sched, mask=maskd, state=state, max_steps=step - done,
                                compile=comp, progress=rep.within(done, step - done, sched.max_iters))
            policy.record(time.perf_counter() - t_piece, int(state.iters.max()) - done, comp)
            done = step
            bundle_progress.train_report(rep, state, sched.max_iters, sched.target_loss)
            if checkpoint and done < t and time.monotonic() - last_save >= checkpoint_every_s:
                checkpoint_io.save(checkpoint, state, gens, extra=rows)  # a kill between marks loses <= a piece
                last_save = time.monotonic()
        done = t
        row = cell_fn.trajectory_point(state.net, Xd, yd, maskd, sched.loss, state.iters)
        for k, val in row.items():  # a net that stopped before the previous mark logs nothing more
            rows[k][:, i] = torch.where(was_running, val.cpu(), rows[k][:, i])
        if checkpoint and time.monotonic() - last_save >= checkpoint_every_s:
            checkpoint_io.save(checkpoint, state, gens, extra=rows)
            last_save = time.monotonic()
    state.status = torch.where(state.running & (state.iters >= sched.max_iters),
                               torch.tensor(train.MAX_ITERS, dtype=state.status.dtype, device=state.status.device),
                               state.status)
    wall = time.perf_counter() - t0
    cpu = nets.TwoLayer(*(t.detach().to("cpu", torch.float64) for t in (state.net.W, state.net.b, state.net.v)))
    out = with_kkt(cell_fn.pack(cpu, X, y, cells, gens), cpu, X, y, maskd.cpu(), cells)
    for e, res in enumerate(out):
        res.update(iters=int(state.iters[e]), status=int(state.status[e]),
                   log10_loss=float(state.log_loss[e]) / math.log(10), wall_s=wall / len(cells),
                   **{f"traj_{k}": rows[k][e].numpy() for k in cell_fn.TRAJECTORY})
    return out


def contract(cell: dict, upstream=None) -> NetsContract:
    """Paper 002 / 004 nets: W, b and v all trained (spec 002 §2.2, spec 004 §2.1)."""
    return NetsContract(trainer="train", data=cell["data"])


EXPERIMENT = register(Experiment(
    name="train",
    paper="002 Vardi, Yehudai, Shamir (the training of nonrobust, as a stage)",
    description="train two-layer ReLU nets to loss 1e-30 and store them (stage 1 of a chain; then universal_attack)",
    params=P, variables=V, run_bundle=run_bundle, bundle_key=nonrobust.bundle_key, cost=nonrobust.cost,
    check=check, memory=memory, memory_fields=("d", "m", "alpha", "width"), checkpoints=True,
    extra_dims=extra_dims, produces=("nets",), rebuild=rebuild, nets=contract,
    summary=("m_used", "status", "iters", "log10_loss", "train_acc"),
))
