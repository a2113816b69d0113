"""Timing a bundle of benchmarks/paper_grid_timing.py (issue 46): a bundle-progress reporter that
records (seconds, step) and stops a run at its deadline (Clock, run_timed), the seconds per step
from its marks (slope), a non-negative least-squares fit to extrapolate the shapes not timed
(nnls_fit, predict), and the Nets a reading stage gets from a train bundle (nets_from, untrained_nets).

    from benchmarks.bundle_timing import nets_from, nnls_fit, predict, run_timed, slope, untrained_nets
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from flows import bundle_progress
from storage.nets import Nets
from tasks.cells.nonrobust import n_samples


class Deadline(Exception):
    pass


class Clock:
    """A bundle reporter (flows/bundle_progress.py's interface) that records (seconds, step) at each
    report and raises :class:`Deadline` once past ``deadline`` (a perf_counter time)."""

    active = True
    share = (0, 1, 1)

    def __init__(self, deadline: float):
        self.deadline, self.t0, self.marks, self.total = deadline, time.perf_counter(), [], None

    def __call__(self, steps=None, total=None, loss=None, target=None, **_):
        now = time.perf_counter()
        if steps is not None:
            self.marks.append((now - self.t0, float(steps)))
        if total is not None:
            self.total = float(total)
        if now > self.deadline:
            raise Deadline(f"deadline passed at step {steps}")

    def checkpointed(self):
        pass

    def due(self):
        return False  # a kernel's loss is never read for a report (no host syncs added)

    def within(self, base, steps):
        return lambda done, of: self(steps=base + (done * steps) // max(of, 1))

    @contextlib.contextmanager
    def part(self, before, cells, of):
        yield self


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run_timed(fn, seconds: float, dev):
    """``fn()`` under a Clock with ``seconds`` to go: (result or None, {wall_s, aborted, marks, peak})."""
    clock = Clock(time.perf_counter() + seconds)
    token = bundle_progress._CURRENT.set(clock)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(dev)
    t0 = time.perf_counter()
    res, err = None, None
    try:
        res = fn()
    except Deadline as exc:
        err = str(exc)
    finally:
        bundle_progress._CURRENT.reset(token)
        sync(dev)
    info = {"wall_s": time.perf_counter() - t0, "aborted_at_deadline": err is not None, "deadline_s": seconds}
    if err:
        info["deadline_note"] = err
        done = max((s for _, s in clock.marks), default=0.0)
        if clock.total and done > 0:  # the kernel's own progress count: the whole run at the same pace
            info["progress_at_deadline"] = f"{done:.0f} of {clock.total:.0f}"
            info["wall_s_extrapolated_from_progress"] = info["wall_s"] * clock.total / done
    if dev.type == "cuda":
        info["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return res, info, clock.marks


def slope(marks) -> tuple[float | None, float]:
    """Seconds per step (least squares over the distinct steps after the first report) and the last step."""
    pts = {}
    for t, s in marks:
        pts.setdefault(s, t)
    ss = sorted(pts)
    if len(ss) < 2:
        return None, (ss[-1] if ss else 0.0)
    x = np.array(ss, dtype=float)
    y = np.array([pts[s] for s in ss], dtype=float)
    a = np.polyfit(x, y, 1)[0]
    return float(a), float(ss[-1])


def nnls_fit(rows: list[dict], features, target: str) -> dict:
    """Non-negative least squares of ``target`` on ``features`` (callables of a row) over ``rows``."""
    from scipy.optimize import nnls

    rows = [r for r in rows if r.get(target) is not None]
    if not rows:
        return {"coef": None, "n": 0}
    A = np.array([[f(r) for f in features] for r in rows], dtype=float)
    scale = np.maximum(np.abs(A).max(0), 1e-300)
    coef, _ = nnls(A / scale, np.array([r[target] for r in rows], dtype=float))
    coef = coef / scale
    pred = A @ coef
    return {"coef": coef.tolist(), "n": len(rows),
            "rel_residuals": [float(p / r[target] - 1) if r[target] else None for p, r in zip(pred, rows)]}


def predict(fit: dict, features, row: dict) -> float | None:
    if not fit.get("coef"):
        return None
    return float(sum(c * f(row) for c, f in zip(fit["coef"], features)))


def nets_from(results: list[dict], cells: list[dict], relabel: bool = False) -> Nets:
    """A storage.nets.Nets of a train bundle's packed results (as a reading stage would load them from
    the store). ``relabel``: y := sign(N(x)) on the real samples (every net separates its data)."""
    E = len(results)
    K = max(int(r["width_used"]) for r in results)
    D = max(int(r["d_used"]) for r in results)
    M = max(int(r["m_used"]) for r in results)
    f64 = torch.float64
    W, b, v = torch.zeros(E, K, D, dtype=f64), torch.zeros(E, K, dtype=f64), torch.zeros(E, K, dtype=f64)
    X, y = torch.zeros(E, M, D, dtype=f64), torch.zeros(E, M, dtype=f64)
    for e, r in enumerate(results):
        k, d, m = int(r["width_used"]), int(r["d_used"]), int(r["m_used"])
        W[e, :k, :d], b[e, :k], v[e, :k] = (torch.as_tensor(r[n], dtype=f64) for n in ("W", "b", "v"))
        X[e, :m, :d], y[e, :m] = torch.as_tensor(r["X"], dtype=f64), torch.as_tensor(r["y"], dtype=f64)
    m = torch.tensor([int(r["m_used"]) for r in results])
    mask = torch.arange(M)[None, :] < m[:, None]
    if relabel:
        out = torch.bmm(torch.relu(torch.baddbmm(b.unsqueeze(1), X, W.transpose(1, 2))), v.unsqueeze(-1)).squeeze(-1)
        y = torch.where(out >= 0, 1.0, -1.0).to(f64) * mask
    rng = torch.stack([torch.as_tensor(np.asarray(r["batch_rng_state"]), dtype=torch.uint8) for r in results])
    return Nets(W, b, v, X, y, mask, torch.tensor([int(r["d_used"]) for r in results]), m,
                torch.tensor([int(r["width_used"]) for r in results]), rng, list(cells), [""] * E)


def untrained_nets(cells: list[dict]) -> Nets:
    """The bundle's nets at their init with their data (tasks/cells/nonrobust.py::build): what a
    reading stage's cost does not depend on (the attack's steps are a fixed count)."""
    from tasks.cells import nonrobust as nr

    net, X, y, mask, gens = nr.build(cells)
    res = []
    for e, c in enumerate(cells):
        m, d, k = n_samples(c), c["d"], c["width"]
        res.append({"width_used": k, "d_used": d, "m_used": m, "W": net.W[e, :k, :d], "b": net.b[e, :k],
                    "v": net.v[e, :k], "X": X[e, :m, :d], "y": y[e, :m], "batch_rng_state": gens[e].get_state()})
    return nets_from(res, cells)
