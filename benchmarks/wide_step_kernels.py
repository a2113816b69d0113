"""The GD step of benchmarks/wide_step_variants.py (issue 46) re-implemented at E = 1, and its
harness (the check against (a) is benchmarks/wide_step_check.py): the timed runs' schedule, one net's
state as plain device tensors (State), the elementwise part as one (compiled) function (make_ew,
get_ew), the step as 2 GEMMs + that function, optionally carried through the Gram matrix (Fused), the
whole step for max-autotune (whole_step_fn), CUDA-graph capture (capture, KktlabStepper.graphed), and
the run's budget and JSON (Run).

    from benchmarks.wide_step_kernels import Fused, KktlabStepper, Run, State, capture, whole_step_fn
"""

from __future__ import annotations

import math
import pathlib
import time
import traceback

import torch

from benchmarks.gpu_probe import nvidia_smi, write_json
from benchmarks.wide_step_check import CHECK_STEPS, CHECK_TOL, MIN_UPDATE_REL
from tasks import nets, train
from tasks.nets import log_loss_terms
from tasks.train import gd

GRAPH_STEPS = 8  # steps per captured CUDA graph (a divisor of the timed step counts)
FIELDS = ("log_lr", "plateau_pos", "iters", "status", "log_loss", "separated")  # TrainState's reassigned fields


def schedule(lr0: float, loss: str = "exp") -> train.Schedule:
    # as benchmarks/wide_step.py: never converges, never syncs inside a call; LR steps every 100
    return train.Schedule(loss=loss, lr0=lr0, period=100, target_loss=1e-300, max_iters=10**9, sync_every=10**9)


# ---------------------------------------------------------------- the step, re-implemented (E = 1)
class State:
    """One net's parameters and schedule state as plain device tensors, every update in place
    (addresses fixed: CUDA graphs replay on them). ``store``: W kept as Wᵀ (d,k) row-major, i.e.
    kktlab's ``as_columns`` layout ("dk"), or as W (k,d) ("kd")."""

    def __init__(self, net: nets.TwoLayer, X, y, sched: train.Schedule, store: str = "dk"):
        dev, f64 = X.device, torch.float64
        self.X, self.y, self.sched, self.store = X[0].contiguous(), y[0].contiguous(), sched, store
        W = net.W[0]
        self.S = W.t().contiguous() if store == "dk" else W.contiguous().clone()
        self.b, self.v = net.b[0].clone(), net.v[0].clone()
        self.log_lr = torch.tensor(math.log(sched.lr0), dtype=f64, device=dev)
        self.plateau_pos = torch.zeros((), dtype=torch.int64, device=dev)
        self.iters = torch.zeros((), dtype=torch.int64, device=dev)
        self.status = torch.zeros((), dtype=torch.int8, device=dev)
        self.log_loss = torch.zeros((), dtype=f64, device=dev)
        self.separated = torch.zeros((), dtype=torch.bool, device=dev)
        self.log_m = math.log(self.X.shape[0])
        self.gram = self.X @ self.X.t()  # (n,n), the Gram variants' H update

    @property
    def Wt(self):  # (d,k) view
        return self.S if self.store == "dk" else self.S.t()

    def sched_state(self):
        return (self.log_lr, self.plateau_pos, self.iters, self.status, self.log_loss, self.separated)

    def params(self):
        return (self.Wt.t(), self.b, self.v)

    def tensors(self):
        return [self.S, self.b, self.v, *self.sched_state()]

    def snapshot(self):
        return [t.clone() for t in self.tensors()]

    def restore(self, snap):
        for t, s in zip(self.tensors(), snap):
            t.copy_(s)


def make_ew(sched: train.Schedule, dtype, log_m: float, act: str, epilogue: bool, accumulate: bool):
    """The elementwise part of one step, from the GEMM's output to G, in place on b, v and the
    schedule state (spec 002 §2.2 as tasks/train/gd.py::_step computes it, full batch, no padding):
    margins q, log-space loss weights g, G = 1[h > 0] g vᵀ, the b- and v-gradients, the LR plateau.
    ``act``: "nk" (H is (n,k)) or "kn" (H is (k,n)); ``epilogue``: H is already relu(X Wᵀ + b)
    (cuBLASLt's bias+ReLU epilogue), else H = X Wᵀ without b; ``accumulate``: also Gsum += G."""
    loss, log_target = sched.loss, math.log(sched.target_loss)
    log_tiny, log_factor, period, max_log_lr = math.log(torch.finfo(dtype).tiny), math.log(sched.factor), \
        sched.period, sched.max_log_lr
    nk = act == "nk"

    def ew(H, b, v, y, log_lr, plateau_pos, iters, status, log_loss, separated, Gsum=None):
        bb, vv = (b, v) if nk else (b[:, None], v[:, None])
        A = H if epilogue else torch.relu(H + bb)
        q = y * (A * vv).sum(1 if nk else 0)
        log_l, log_dl = log_loss_terms(q, loss)
        lse = torch.logsumexp(log_l, 0)
        log_L = lse.to(torch.float64) - log_m
        running = status == gd.RUNNING
        log_loss.copy_(torch.where(running, log_L, log_loss))
        separated.copy_(torch.where(running, (q > 0).all(), separated))
        st = status.masked_fill(running & (log_L < log_target), gd.CONVERGED)
        st = st.masked_fill((st == gd.RUNNING) & ~torch.isfinite(log_L), gd.DIVERGED)
        run = st == gd.RUNNING
        log_w = log_dl - lse + (log_lr + log_L).to(q.dtype)
        keep = run & (log_w > log_tiny)
        g = y * torch.where(keep, torch.exp(log_w), torch.zeros_like(log_w))
        gg = g[:, None] if nk else g[None, :]
        Sg = (A > 0).to(A.dtype) * gg
        G = Sg * vv
        red = 0 if nk else 1
        dv = (A * gg).sum(red)
        db = Sg.sum(red) * v
        b.add_(db)
        v.add_(dv)
        if Gsum is not None:
            Gsum.add_(G)
        it = plateau_pos + run.to(plateau_pos.dtype)
        iters.add_(run.to(iters.dtype))
        bump = run & (it >= period)
        log_lr.copy_(torch.where(bump, (log_lr + log_factor).clamp_max(max_log_lr), log_lr))
        plateau_pos.copy_(it.masked_fill(bump, 0))
        status.copy_(st)
        return G

    return ew


_EW: dict = {}


def get_ew(sched, dtype, log_m, act, epilogue, accumulate, compiled: bool):
    """One (compiled) elementwise function per configuration, shared by the check and the timing
    runs (the check's schedule differs only in its LR, a tensor: no recompile)."""
    key = (sched.loss, sched.period, sched.factor, dtype, log_m, act, epilogue, accumulate, compiled)
    if key not in _EW:
        fn = make_ew(sched, dtype, log_m, act, epilogue, accumulate)
        _EW[key] = torch.compile(fn, dynamic=False) if compiled else fn
    return _EW[key]


class Fused:
    """One GD step as 2 GEMMs + one elementwise function: ``layout`` = (store, act, epilogue).
    ``gram_T``: carry H through X Xᵀ for T steps and form W once per block (H += X Xᵀ G, Gsum += G;
    at the block's end Wᵀ += Xᵀ Gsum), exact in exact arithmetic (X W_{t+1}ᵀ = X W_tᵀ + X Xᵀ G_t)."""

    def __init__(self, st: State, act: str, epilogue: bool, compiled: bool, gram_T: int | None = None):
        self.st, self.act, self.epi, self.T = st, act, epilogue and act == "nk" and not gram_T, gram_T
        n, k = st.X.shape[0], st.b.shape[0]
        shape = (n, k) if act == "nk" else (k, n)
        self.H = torch.empty(shape, dtype=st.X.dtype, device=st.X.device)
        self.Gsum = torch.zeros(shape, dtype=st.X.dtype, device=st.X.device) if gram_T else None
        self.ew = get_ew(st.sched, st.X.dtype, st.log_m, act, self.epi, bool(gram_T), compiled)
        self.i = 0  # step within the Gram block

    def fwd(self):
        st = self.st
        if self.act == "nk":
            if self.epi:
                torch._addmm_activation(st.b, st.X, st.Wt, out=self.H)
            else:
                torch.mm(st.X, st.Wt, out=self.H)
        else:
            torch.mm(st.Wt.t(), st.X.t(), out=self.H)

    def upd(self, G):
        st = self.st
        st.Wt.addmm_(st.X.t(), G if self.act == "nk" else G.t())

    def ew_call(self):
        st = self.st
        return self.ew(self.H, st.b, st.v, st.y, *st.sched_state(), *((self.Gsum,) if self.T else ()))

    def step(self):
        if not self.T:
            self.fwd()
            self.upd(self.ew_call())
            return
        if self.i == 0:
            self.fwd()
        G = self.ew_call()
        self.i += 1
        if self.i < self.T:
            if self.act == "nk":
                self.H.addmm_(self.st.gram, G)  # H += X Xᵀ G
            else:
                self.H.addmm_(G, self.st.gram)  # Hᵀ += Gᵀ X Xᵀ (X Xᵀ symmetric)
        else:
            self.finish()

    def finish(self):
        """Form W from the block's steps so far (a no-op without Gram or at a block's start)."""
        if self.T and self.i:
            self.upd(self.Gsum)
            self.Gsum.zero_()
            self.i = 0


def whole_step_fn(sched, dtype, log_m):
    """The whole step as one function (for torch.compile's max-autotune): H = X Wᵀ, the elementwise
    part, Wᵀ += Xᵀ G in place."""
    ew = make_ew(sched, dtype, log_m, "nk", False, False)

    def step(X, Wt, b, v, y, log_lr, plateau_pos, iters, status, log_loss, separated):
        H = X @ Wt
        G = ew(H, b, v, y, log_lr, plateau_pos, iters, status, log_loss, separated)
        Wt.addmm_(X.t(), G)

    return step


# ------------------------------------------------------------------------------ CUDA graph helpers
def capture(body, dev, snapshot=None, restore=None):
    """``body`` (which runs some steps in place) captured as one CUDA graph after a warm-up on a side
    stream; ``snapshot``/``restore`` undo the warm-up's steps (so a check starts where it should).
    Returns graph.replay."""
    snap = snapshot() if snapshot else None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    if restore:
        restore(snap)
    torch.cuda.synchronize()
    return g.replay


class KktlabStepper:
    """kktlab's own ``_step`` on a TrainState, as tasks.train.train's full-batch loop calls it."""

    def __init__(self, net, X, y, sched):
        E, m, _ = X.shape
        self.X, self.y, self.sched = X, y, sched
        self.mask = torch.ones(E, m, dtype=torch.bool, device=X.device)
        self.log_m = torch.log(self.mask.sum(1).to(torch.float64))
        self.st = train.init_state(net, sched)
        self.st.net.W = gd.as_columns(self.st.net.W)

    def step(self):
        gd._step(self.st, self.X, self.y, self.mask, self.sched, check_stop=True, check_dead=False,
                 log_m=self.log_m, padded=False)

    def params(self):
        n = self.st.net
        return (n.W[0], n.b[0], n.v[0])

    def graphed(self, steps: int, dev):
        st = self.st
        static = {f: getattr(st, f) for f in FIELDS}

        def body():
            for f in FIELDS:
                setattr(st, f, static[f])
            for _ in range(steps):
                self.step()
            for f in FIELDS:  # the outputs (graph-pool tensors) back into the inputs: the next replay goes on
                static[f].copy_(getattr(st, f))
            for f in FIELDS:
                setattr(st, f, static[f])

        tensors = lambda: [st.net.W, st.net.b, st.net.v, *static.values()]  # noqa: E731
        snapshot = lambda: [t.clone() for t in tensors()]  # noqa: E731

        def restore(snap):
            for t, s in zip(tensors(), snap):
                t.copy_(s)

        return capture(body, dev, snapshot, restore)


# ----------------------------------------------------------------------- the run: budget and JSON
class Run:
    def __init__(self, a):
        self.a = a
        self.dev = torch.device(a.device)
        self.t0 = time.perf_counter()
        self.out = pathlib.Path(a.out)
        self.json = self.out / f"wide_step_variants_{self.dev.type}.json"
        self.payload = {"args": vars(a), "shapes": {}, "errors": [], "skipped": [], "metric_notes": {
            "tflops_nominal": "4*B*d*k FLOP per step (the two big GEMMs) over the step's time",
            "tflops_actual": "the GEMM FLOP the variant really does per step (Gram variants: fewer)",
            "fraction_of_gemm4096": "tflops_nominal over a dense 4096^3 fp32 GEMM (TF32 off) timed in this run",
            "max_param_rel_diff_vs_a": f"max |p - p_a| / max |p_a| over W, b, v after {CHECK_STEPS} steps at the "
                                       "shape's check lr (shapes.*.check: the largest of a ladder at which (a) is "
                                       "stable and moves) from the same init; max_diff_over_update_vs_a: the same "
                                       "over the largest change of (a)'s parameters in those steps (inf: the "
                                       "variant's parameters are not finite)",
            "update_rel_diff_vs_a": "||(p - p0) - (p_a - p0)|| / ||p_a - p0|| over W, b, v (Frobenius): how far the "
                                    "variant's update is from (a)'s; check_ok: <= "
                                    f"{CHECK_TOL:g}, (a) finite and moved by >= {MIN_UPDATE_REL:g} of ||p0|| "
                                    "(ref_update_rel)"}}
        if self.dev.type == "cuda":
            self.payload["smi_start"] = nvidia_smi()

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def save(self):
        self.payload["elapsed_s"] = time.perf_counter() - self.t0
        write_json(self.json, "wide_step_variants", self.payload, str(self.dev))

    def guard(self, label: str, need_s: float, fn):
        """Run ``fn`` if ``need_s`` seconds of the budget are left; record errors; save after."""
        if self.left() < need_s:
            print(f"[skip] {label}: {self.left():.0f} s left, needs ~{need_s:.0f} s", flush=True)
            self.payload["skipped"].append(f"{label} (budget: {self.left():.0f} s left, needs ~{need_s:.0f} s)")
            return None
        t = time.perf_counter()
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - one variant's failure never stops the others
            traceback.print_exc()
            self.payload["errors"].append(f"{label}: {type(exc).__name__}: {str(exc)[:400]}")
            res = None
        print(f"[{label}] {time.perf_counter() - t:.1f} s (left {self.left():.0f} s)", flush=True)
        self.save()
        return res
