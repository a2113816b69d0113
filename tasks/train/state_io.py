"""Training states on disk and back (checkpoints inside a bundle, ``flows/checkpoint.py``):
the tensors of a :class:`~tasks.train.gd.TrainState`, and the checks a resumed state must pass."""

from __future__ import annotations

import math

import torch

from tasks.nets import TwoLayer, mean_log_loss
from tasks.train.gd import CONVERGED, RUNNING, STATE_FIELDS, STATUS_NAMES, Schedule, TrainState


def state_to_dict(st: TrainState) -> dict[str, torch.Tensor]:
    """The tensors of a state (CPU copies), for a checkpoint."""
    out = {f: getattr(st, f).detach().cpu() for f in STATE_FIELDS}
    out.update(W=st.net.W.detach().cpu(), b=st.net.b.detach().cpu(), v=st.net.v.detach().cpu())
    return out


def state_from_dict(d: dict[str, torch.Tensor], device, dtype) -> TrainState:
    """Inverse of :func:`state_to_dict` on the given device / dtype of the bundle.

    A state written before a field existed (e.g. ``separated``) is refused with ValueError: it
    cannot be continued exactly. (Checkpoint files are keyed on the code, so a sweep never
    finds one of older code; this guards direct loads.)"""
    missing = [f for f in (*STATE_FIELDS, "W", "b", "v") if f not in d]
    if missing:
        raise ValueError(f"training state lacks {missing} (written by an older kktlab?); delete it and "
                         "restart the bundle")
    net = TwoLayer(*(d[k].to(device, dtype) for k in ("W", "b", "v")))
    return TrainState(net=net, **{f: d[f].to(device) for f in STATE_FIELDS})


def check_state(st: TrainState, net: TwoLayer, schedule: Schedule, data: tuple | None = None) -> None:
    """Raise ValueError unless ``st`` can be a state of training ``net`` (the bundle's initial
    stack) under ``schedule``: same shapes, known statuses, iterations within the cap, and every
    net marked converged with a finite loss below the target (a "converged" net whose loss is
    above it was not converged: such a checkpoint is not resumed). With the bundle's ``data``
    (X, y, mask), a converged net's claimed loss is recomputed from its saved weights, as training
    measured it, and must agree (issue 29 item 6: a forged state that claims convergence)."""
    for name in ("W", "b", "v"):
        have, want = getattr(st.net, name).shape, getattr(net, name).shape
        if have != want:
            raise ValueError(f"saved {name} has shape {tuple(have)}, the bundle's is {tuple(want)}")
    for f in STATE_FIELDS:
        if getattr(st, f).shape != (net.E,):
            raise ValueError(f"saved {f} has shape {tuple(getattr(st, f).shape)}, expected ({net.E},)")
    unknown = set(st.status.tolist()) - set(STATUS_NAMES)
    if unknown:
        raise ValueError(f"saved status has unknown values {sorted(unknown)}")
    if bool((st.iters < 0).any()) or bool((st.iters > schedule.max_iters).any()):
        raise ValueError(f"saved iterations outside [0, max_iters={schedule.max_iters}]")
    conv = st.status == CONVERGED
    bad = conv & ~(st.log_loss < math.log(schedule.target_loss))
    if bool(bad.any()):
        e = int(bad.nonzero()[0, 0])
        raise ValueError(f"net {e} is marked converged but its loss exp({float(st.log_loss[e]):.4g}) is not below "
                         f"the target {schedule.target_loss:g}")
    if data is not None and bool(conv.any()):
        X, y, mask = (t.to(st.net.W.device) for t in data)
        q = y.to(st.net.W.dtype) * st.net(X.to(st.net.W.dtype))
        again = mean_log_loss(q, mask, schedule.loss).to(st.log_loss.device)
        off = conv & ~((again - st.log_loss).abs() <= 1e-3 * st.log_loss.abs().clamp_min(1.0))
        if bool(off.any()):
            e = int(off.nonzero()[0, 0])
            raise ValueError(f"net {e} claims converged at loss exp({float(st.log_loss[e]):.4g}) but its saved "
                             f"weights give exp({float(again[e]):.4g})")
    live = (st.status == RUNNING) | conv
    if bool((live & ~st.net.finite().to(live.device)).any()):
        raise ValueError("a running or converged net has non-finite parameters")
