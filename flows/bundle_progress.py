"""The worker side of progress inside a bundle (issue 30 item 3) and of stopping it (item 1).

``run_bundle`` (flows/sweep.py) runs each bundle inside :func:`reporting`, which writes the
bundle's progress file (storage/bundle_progress.py) when it starts and installs a
:class:`Reporter` for the code of the bundle to find with :func:`current`. A training loop calls
it with what it knows (``rep(steps=, total=, loss=, target=)``, log10 losses); the reporter writes
at most every :data:`EVERY_S` seconds, so a fast loop costs a clock read per call. The kernels
in tasks/ only get an optional callable (``tasks.train.train(progress=...)``; the other long
kernels' ``progress(done, of, loss)``, made by :func:`for_kernel`); the files are written here. Outside a bundle (tests, benchmarks) :func:`current` is a reporter that does nothing.

Each report also looks (at most every :data:`CANCEL_CHECK_S` s) for the group's cancel request
(``kktlab cancel``, or the flow process when its run stops): then it raises
:class:`BundleCancelled`, which stops the bundle within seconds on any worker, local or at an
``address``, with its last checkpoint kept, so the rerun resumes. A cancelled bundle is never
stored as failed and never retried (it is a ``UserError``: flows/sweep.py ``compute_cells``)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import time

from core.errors import UserError
from storage import bundle_progress as files

EVERY_S = float(os.environ.get("KKTLAB_PROGRESS_EVERY_S", "10"))  # a bundle's progress file is rewritten at most this often
CANCEL_CHECK_S = 1.0  # a cancel request is looked for at most this often
MIDWAY_ENV = "KKTLAB_GATE_MIDWAY"  # a file: while it exists, a bundle waits once mid-way (:meth:`Reporter.hold`)


class BundleCancelled(UserError):
    """The bundle stopped because its run was cancelled (its checkpoint is kept: rerun to resume)."""


class Reporter:
    """``rep(steps=..., total=..., loss=..., target=...)``: note the bundle's progress (None keeps
    a field as it was); ``rep.checkpointed()``: a checkpoint was just written."""

    active = True

    def __init__(self, store: str, group: str, key: str, name: str = "", cells: int = 0,
                 every_s: float = EVERY_S, clock=time.time):
        self.store, self.group, self.every_s, self.clock = store, group, every_s, clock
        self.path = files.path_for(store, group, key)
        now = clock()
        self.record = {"name": name, "cells": cells, "started": now, "updated": now, "steps": None, "total": None,
                       "loss": None, "target": None, "checkpoint_at": None}
        self.last_write = self.last_check = float("-inf")
        self.held = False
        self.check_cancel()
        self.write()

    share = (0, 1, 1)  # (cells before, cells in, cells of the bundle) of the part running now: :meth:`part`

    @contextlib.contextmanager
    def part(self, before: int, cells: int, of: int):
        """A bundle run as parts (``flows.experiments.by_shape``: one per true shape of its nets),
        each counting its steps from 0: inside, ``(steps, total)`` of a part of ``cells`` of ``of``
        cells after ``before`` cells read as the bundle's, assuming equal steps per cell, so the
        bundle's count never goes back between parts."""
        self.share, old = (before, cells, of), self.share
        try:
            yield self
        finally:
            self.share = old

    def __call__(self, steps=None, total=None, loss=None, target=None) -> None:
        before, cells, of = self.share
        if (before, cells, of) != (0, 1, 1) and total is not None:
            per_cell = float(total) / max(cells, 1)
            steps = None if steps is None else before * per_cell + float(steps)
            total = of * per_cell
        for k, v in (("steps", steps), ("total", total), ("loss", loss), ("target", target)):
            if v is not None:
                v = float(v)
                self.record[k] = int(v) if k in ("steps", "total") else (v if math.isfinite(v) else None)
        self.check_cancel()
        if self.clock() - self.last_write >= self.every_s:
            self.write()
        self.hold()

    def hold(self, poll_s: float = 0.05) -> None:
        """``$KKTLAB_GATE_MIDWAY`` names a file: while it exists, a bundle whose total step count the
        file's text names (any bundle, where it is empty) waits once mid-way (0 < steps < total), after
        writing its progress file and creating ``<file>.reached``; a cancel request still stops it
        there. How a test acts on a bundle mid-computation at a moment it controls (``kktlab cancel``,
        tests/test_served.py), whatever the machine's speed; unset, nothing waits."""
        gate = os.environ.get(MIDWAY_ENV)
        steps, total = self.record["steps"], self.record["total"]
        if self.held or not gate or not os.path.exists(gate) or not steps or not total or steps >= total:
            return
        with contextlib.suppress(OSError, ValueError):
            wanted = open(gate).read().strip()
            if wanted and int(wanted) != total:
                return
        self.held = True
        self.write()
        open(gate + ".reached", "a").close()
        while os.path.exists(gate):
            self.last_check = float("-inf")
            self.check_cancel()
            time.sleep(poll_s)

    def checkpointed(self) -> None:
        self.record["checkpoint_at"] = self.clock()
        self.write()

    def due(self) -> bool:
        """Whether a report now would be written: a kernel's loss (which may read the device, a host
        sync) is read only then (:func:`for_kernel`)."""
        return self.clock() - self.last_write >= self.every_s

    def within(self, base: int, steps: int, total: int | None = None):
        """The callable for one ``train(max_steps=steps)`` call that starts at step ``base`` of
        ``total``: ``(done, of)`` inside the call -> ``steps=base + done/of * steps`` (with its total,
        so that no record says a step without the total it counts towards); the call's ``loss``
        (a callable giving the natural log loss, ``tasks.train.train``'s) is read only when the
        record will be written, so that no written step goes without its loss."""
        def progress(done, of, loss=None):
            log10 = loss() / math.log(10) if loss is not None and self.due() else None
            self(steps=base + (done * steps) // max(of, 1), total=total, loss=log10)

        return progress

    def check_cancel(self) -> None:
        now = self.clock()
        if now - self.last_check < CANCEL_CHECK_S:
            return
        self.last_check = now
        if files.cancel_requested(self.store, self.group):
            raise BundleCancelled(f"run cancelled: group '{self.group}' of {self.store} stopped (rerun to resume)")

    def write(self) -> None:
        self.last_write = self.record["updated"] = self.clock()
        try:
            files.write(self.path, self.record)
        except OSError:  # a progress file never stops a bundle
            pass


class _Quiet:
    """What :func:`current` gives outside a bundle: nothing is written, nothing is checked."""

    active = False

    def __call__(self, **_) -> None:
        pass

    def checkpointed(self) -> None:
        pass

    def due(self) -> bool:
        return False

    def within(self, base: int, steps: int, total: int | None = None):
        return None

    @contextlib.contextmanager
    def part(self, before: int, cells: int, of: int):
        yield self


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("kktlab_bundle_progress", default=_Quiet())


def current():
    """The reporter of the bundle this thread runs (a quiet one outside any)."""
    return _CURRENT.get()


@contextlib.contextmanager
def reporting(target: dict | None, key: str | None, name: str = "", cells: int = 0):
    """Run a bundle with its progress file: ``target`` (store, group) and ``key`` (the bundle's
    result-cache key, which the flow knows too) name it; without them nothing is written."""
    if not target or not key:
        yield _CURRENT.get()
        return
    token = _CURRENT.set(Reporter(target["store"], target["group"], key, name or _task_run_name(), cells))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def _task_run_name() -> str:
    """The bundle's task run name (``nets d=25..50 seed=0..2 (6 cells)``, flows/chain.py), if known."""
    try:
        from prefect.runtime import task_run

        return str(task_run.name or "")
    except Exception:  # noqa: BLE001 - outside a task run
        return ""


def train_report(rep, state, max_iters: int, target_loss: float) -> None:
    """Report a ``tasks.train.TrainState``: the furthest net's step of ``max_iters`` and the worst
    running net's loss vs the target (log10); one host sync, only when ``rep`` is active."""
    if not rep.active:
        return
    import torch

    run = state.running
    worst = torch.where(run, state.log_loss, torch.full_like(state.log_loss, -math.inf)).max() if bool(run.any()) \
        else state.log_loss.max()
    rep(steps=int(state.iters.max()), total=max_iters, loss=float(worst) / math.log(10),
        target=math.log10(target_loss) if target_loss > 0 else None)


def for_kernel(rep, base: int = 0, total: int | None = None, target: float | None = None):
    """The ``progress(done, of, loss=None)`` callable a kernel in tasks/ takes (None outside a bundle:
    the kernel then does nothing). It reports step ``base + done`` of ``total`` (default ``base + of``);
    ``loss``, a callable the kernel passes that gives the natural log of the loss it drives down (it
    may read the device), is called only when the report will be written (at most every
    :data:`EVERY_S` s: a bounded number of host syncs); ``target`` a log10 loss. A cancel request
    raises :class:`BundleCancelled` out of the kernel (it must not swallow it)."""
    if not rep.active:
        return None

    def progress(done, of, loss=None) -> None:
        log10 = loss() / math.log(10) if loss is not None and rep.due() else None
        rep(steps=base + int(done), total=base + int(of) if total is None else total, loss=log10, target=target)

    return progress


def per_cell(steps: list[int]) -> list:
    """One :func:`for_kernel` callable per cell of a bundle whose cells run one after another, cell
    ``i`` taking ``steps[i]`` steps: the bundle's count goes on from cell to cell to their sum."""
    rep = current()
    return [for_kernel(rep, base=sum(steps[:i]), total=sum(steps)) for i in range(len(steps))]
