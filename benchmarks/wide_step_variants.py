"""The wide-net GD step (B = 64, d = 784, k = 1e4 and 1e5, fp32, TF32 off; issue 46): where the
time of kktlab's step goes, and variants that remove passes, launches or GEMM FLOPs.

One step of kktlab's log-space GD (tasks/train/gd.py::_step, exp or logistic loss) is two big GEMMs,
H = X Wᵀ (+ b) and Wᵀ += Xᵀ G (about 4·B·d·k FLOP), a thin product with v, and ~12 elementwise
passes over the (B, k) activations. Variants, each timed with CUDA events (median of reps):

  a_kktlab         tasks.train.train(...) as benchmarks/wide_step.py times it (eager; the reference)
  a_kktlab_graph   kktlab's own _step, GRAPH_STEPS steps captured in one CUDA graph            (d)
  ref_torch        this module's plain re-implementation of the same step (eager, mm, no fusion)
  b_fused          the fastest GEMM layout of a measured set (W stored (d,k) or (k,d), activations
                   (B,k) or (k,B), cuBLASLt bias+ReLU epilogue or not), H preallocated (out=), the
                   update in place (addmm_), and the elementwise part (margins, loss weights, G, the
                   b- and v-gradients, the schedule) in ONE torch.compile'd function              (b)
  b_fused_graph    b_fused under one CUDA graph per GRAPH_STEPS steps                           (d)
  c_max_autotune   the whole step under torch.compile(mode="max-autotune-no-cudagraphs")       (c)
  e_kktlab_compiled  tasks.train.train(..., compile=True): kktlab's compiled blocks of 4 steps, which
                   carry the pre-activations through the Gram matrix X Xᵀ (B <= d) and form W once a block
  f_gram{T}        b_fused's kernels carrying H through X Xᵀ for T steps, W formed once per block
                   (eager launches, and _graph: one CUDA graph per block)

Per variant: ms/step, TFLOP/s at the nominal 4·B·d·k FLOP of a step (and at the GEMM FLOP it really
does, for the Gram variants), the fraction of a dense 4096³ fp32 GEMM measured in this run, and the
largest relative parameter difference from (a) after CHECK_STEPS steps from the same init at a
larger LR (1e-2, so the steps move the parameters). Plus a torch.profiler kernel table of kktlab's
step (GEMM vs elementwise vs launch gaps), the GEMM time of every layout candidate alone, and the
floor max(FLOP / GEMM rate, bytes / copy bandwidth).

    python benchmarks/wide_step_variants.py --device cuda --out DIR          # the GPU session's call
    python benchmarks/wide_step_variants.py --device cpu --small --out /tmp/w  # a smoke test of every path
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import sys
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.gpu_probe import nvidia_smi, write_json  # noqa: E402
from tasks import data, nets, train  # noqa: E402
from tasks.nets import log_loss_terms  # noqa: E402
from tasks.train import gd  # noqa: E402

CHECK_STEPS = 8  # steps of the numerical check (two Gram blocks of 4)
CHECK_LR = 1e-2  # the check's LR: each step moves W by ~1e-3 of its size (1e-5 would leave it near its init)
GRAPH_STEPS = 8  # steps per captured CUDA graph (a divisor of the timed step counts)
FIELDS = ("log_lr", "plateau_pos", "iters", "status", "log_loss", "separated")  # TrainState's reassigned fields


# ----------------------------------------------------------------------------------------- helpers
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(run, n: int, dev, reps: int = 3) -> tuple[float, list[float]]:
    """Seconds per step: ``run(n)`` runs n steps; the median of ``reps`` timings (CUDA events on a
    GPU, so host gaps the GPU waits through count)."""
    out = []
    for _ in range(reps):
        sync(dev)
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run(n)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3 / n)
        else:
            t0 = time.perf_counter()
            run(n)
            out.append((time.perf_counter() - t0) / n)
    return statistics.median(out), out


def timed_call(fn, dev, reps: int = 10, warm: int = 2) -> float:
    """Median seconds of one ``fn()`` call."""
    for _ in range(warm):
        fn()
    return timed_steps(lambda n: [fn() for _ in range(n)], 1, dev, reps)[0]


def gemm_rate(dev, n: int, dtype=torch.float32) -> float:
    """FLOP/s of a dense n³ matrix product (random data), median of 10."""
    a, b = (torch.randn(n, n, dtype=dtype, device=dev) for _ in range(2))
    c = torch.empty(n, n, dtype=dtype, device=dev)
    return 2 * n**3 / timed_call(lambda: torch.mm(a, b, out=c), dev, reps=10, warm=3)


def copy_bandwidth(dev, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus written."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).normal_()
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / timed_call(lambda: b.copy_(a), dev, reps=10, warm=2)


def rel_diff(params, ref, start=None) -> dict:
    """Largest |p - p_ref| / max|p_ref| over W, b, v; and relative to the update max|p_ref - p_start|."""
    out = {"max_param_rel_diff_vs_a": 0.0}
    if start is not None:
        out["max_diff_over_update_vs_a"] = 0.0
    for name, p, r in zip("Wbv", params, ref):
        p, r = p.double().cpu(), r.double().cpu()
        d = float((p - r).abs().max())
        out["max_param_rel_diff_vs_a"] = max(out["max_param_rel_diff_vs_a"], d / max(float(r.abs().max()), 1e-300))
        if start is not None:
            upd = float((r - start[name].double().cpu()).abs().max())
            out["max_diff_over_update_vs_a"] = max(out["max_diff_over_update_vs_a"], d / max(upd, 1e-300))
        if not torch.isfinite(p).all():
            out["max_param_rel_diff_vs_a"] = math.inf
    return out


def schedule(lr0: float, loss: str = "exp") -> train.Schedule:
    # as benchmarks/wide_step.py: never converges, never syncs inside a call; LR steps every 100
    return train.Schedule(loss=loss, lr0=lr0, period=100, target_loss=1e-300, max_iters=10**9, sync_every=10**9)


# ----------------------------------------------------------------------------------- the profile
GEMM_RE = re.compile(r"gemm|gemv|cutlass|xmma|cublas|Kernel2|splitK|dot_kernel|triton_tem|_mm_|sm\d\d_|"
                     r"^aten::((b|add|baddb)?mm_?|_addmm_activation)$", re.I)  # the last: CPU op names (smoke test)
REDUCE_RE = re.compile(r"reduce|triton_red|triton_per|softmax|logsumexp|norm_kernel|cub::", re.I)
COPY_RE = re.compile(r"^Memcpy|^Memset|memcpy|memset", re.I)


def category(name: str) -> str:
    if COPY_RE.search(name):
        return "memcpy_memset"
    if GEMM_RE.search(name):
        return "gemm"
    if REDUCE_RE.search(name):
        return "reduction"
    return "elementwise"


def profile_steps(step, n: int, dev, trace: pathlib.Path | None = None) -> dict:
    """torch.profiler over n calls of ``step`` (already warm): per step, the kernels by name (CUDA
    time, count), GEMM / elementwise / reduction / copy time, the GPU-busy time (union of kernel
    intervals) and the launch gaps (host wall minus busy). On a CPU the same table of aten ops."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    unprofiled = timed_steps(lambda k: [step() for _ in range(k)], 4 * n, dev)[0] * 1e6  # us/step, no profiler
    sync(dev)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync(dev)
        wall = time.perf_counter() - t0
    events = list(prof.events())
    kern = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]
    source = "cuda_kernels"
    if not kern:  # CPU run: top-level aten ops stand in for kernels (smoke test of this code)
        source = "cpu_aten_ops"
        kern = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
    by_name: dict[str, list[float]] = {}
    spans = []
    for e in kern:
        dur = e.time_range.end - e.time_range.start
        by_name.setdefault(e.name, []).append(dur)
        spans.append((e.time_range.start, e.time_range.end))
    spans.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    total = sum(sum(v) for v in by_name.values())
    cats: dict[str, float] = {}
    for name, durs in by_name.items():
        cats[category(name)] = cats.get(category(name), 0.0) + sum(durs)
    wall_us = wall * 1e6  # under the profiler (its per-op host overhead included)
    wall_ref = unprofiled * n  # the launch gaps are judged against the step's wall time without the profiler
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
    out = {
        "source": source, "steps": n, "wall_us_per_step": unprofiled, "wall_us_per_step_profiled": wall_us / n,
        "kernel_us_per_step": total / n, "gpu_busy_us_per_step": busy / n,
        "launch_gap_us_per_step": max(wall_ref - busy, 0.0) / n,
        "kernels_per_step": len(kern) / n,
        "fraction_of_wall": {**{c: t / wall_ref for c, t in sorted(cats.items())},
                             "launch_gaps_and_host": max(wall_ref - busy, 0.0) / wall_ref},
        "note": "fractions of the step's wall time without the profiler; kernel times from the profiled run",
        "us_per_step_by_category": {c: t / n for c, t in sorted(cats.items())},
        "top_kernels": [{"name": name[:160], "category": category(name), "us_per_step": sum(d) / n,
                         "calls_per_step": len(d) / n, "us_per_call": sum(d) / len(d),
                         "fraction_of_kernel_time": sum(d) / total if total else None} for name, d in top],
    }
    for key in ("self_cuda_time_total", "self_device_time_total", "self_cpu_time_total"):
        try:
            out["table"] = prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60)
            break
        except Exception:  # noqa: BLE001 - sort key unknown to this torch
            continue
    if trace is not None:
        try:
            prof.export_chrome_trace(str(trace))
            out["chrome_trace"] = trace.name
        except Exception as exc:  # noqa: BLE001
            out["chrome_trace_error"] = str(exc)[:200]
    return out


def print_profile(label: str, p: dict) -> None:
    f = p["fraction_of_wall"]
    print(f"  profile {label} ({p['source']}): wall {p['wall_us_per_step']:.1f} us/step, kernels "
          f"{p['kernel_us_per_step']:.1f} us, busy {p['gpu_busy_us_per_step']:.1f} us, "
          f"{p['kernels_per_step']:.0f} kernels/step; of wall: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in f.items()))
    for k in p["top_kernels"][:8]:
        print(f"    {k['us_per_step']:9.1f} us/step {k['calls_per_step']:4.0f}x  [{k['category']}] {k['name'][:90]}")


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


# ------------------------------------------------------------------------------------------ main
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
            "max_param_rel_diff_vs_a": f"max |p - p_a| / max |p_a| over W, b, v after {CHECK_STEPS} steps at lr "
                                       f"{CHECK_LR} from the same init; max_diff_over_update_vs_a: the same over the "
                                       "largest change of (a)'s parameters in those steps"}}
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


class Shape:
    """One (B, d, k) problem: data, init, the reference (a) and every variant's numbers."""

    def __init__(self, run: Run, B: int, d: int, k: int):
        self.run, self.B, self.d, self.k, self.dev = run, B, d, k, run.dev
        a = run.a
        g = data.seed_streams(0, (d, B))
        X, y = data.synthetic("sphere", B, d, g)
        self.net0 = nets.init_two_layer(d, k, g["init"], dtype=torch.float32, device=self.dev)
        self.X, self.y = X.to(self.dev, torch.float32)[None], y.to(self.dev, torch.float32)[None]
        self.sched, self.check_sched = schedule(a.lr), schedule(CHECK_LR)
        self.flop = 4.0 * B * d * k
        self.steps = a.steps_k1e4 if k <= 20000 else a.steps
        self.steps = max(GRAPH_STEPS, self.steps // (2 * GRAPH_STEPS) * (2 * GRAPH_STEPS))  # graphs, Gram blocks
        self.res = {"B": B, "d": d, "k": k, "dtype": "float32", "steps_timed": self.steps,
                    "nominal_gflop_per_step": self.flop / 1e9, "variants": {}}
        run.payload["shapes"][f"k{k}"] = self.res
        self.ref_params = None
        self.start = {"W": self.net0.W[0], "b": self.net0.b[0], "v": self.net0.v[0]}

    # ---- bookkeeping
    def record(self, name: str, sec_per_step: float, reps: list, params=None, gemm_flop=None, **extra):
        gemm = self.run.payload.get("gemm4096_tflops")
        row = {"ms_per_step": sec_per_step * 1e3, "rep_ms_per_step": [r * 1e3 for r in reps],
               "tflops_nominal": self.flop / sec_per_step / 1e12}
        if gemm:
            row["fraction_of_gemm4096"] = row["tflops_nominal"] / gemm
        if gemm_flop is not None:
            row["gemm_gflop_per_step"] = gemm_flop / 1e9
            row["tflops_actual"] = gemm_flop / sec_per_step / 1e12
            if gemm:
                row["actual_fraction_of_gemm4096"] = row["tflops_actual"] / gemm
        if params is not None and self.ref_params is not None:
            row.update(rel_diff(params, self.ref_params, self.start))
            row["check_steps"], row["check_lr"] = CHECK_STEPS, CHECK_LR
        a_ms = self.res["variants"].get("a_kktlab", {}).get("ms_per_step")
        if a_ms:
            row["speedup_vs_a"] = a_ms / row["ms_per_step"]
        if self.dev.type == "cuda":
            row["peak_gpu_mb_so_far"] = torch.cuda.max_memory_allocated() / 2**20
        row.update(extra)
        self.res["variants"][name] = row
        fr = f", {100 * row['fraction_of_gemm4096']:.0f}% of GEMM" if "fraction_of_gemm4096" in row else ""
        dd = f", check {row['max_param_rel_diff_vs_a']:.1e}" if "max_param_rel_diff_vs_a" in row else ""
        print(f"  k={self.k} {name:24s} {row['ms_per_step']:8.4f} ms/step, {row['tflops_nominal']:6.2f} TFLOP/s"
              f" nominal{fr}{dd}", flush=True)

    # ---- (a) kktlab
    def kktlab(self):
        """(a): train.train as wide_step.py times it; the check's reference params (CHECK_STEPS steps)."""
        ref = train.train(self.net0.clone(), self.X, self.y, self.check_sched, max_steps=CHECK_STEPS).net
        self.ref_params = (ref.W[0], ref.b[0], ref.v[0])
        net = self.net0.clone()
        train.train(net, self.X, self.y, self.sched, max_steps=2)
        s, reps = timed_steps(lambda n: train.train(net, self.X, self.y, self.sched, max_steps=n), self.steps, self.dev)
        self.record("a_kktlab", s, reps, gemm_flop=self.flop)

    def profile(self, trace: bool):
        """Profile kktlab's _step (as train's loop calls it), warm."""
        ks = KktlabStepper(self.net0.clone(), self.X, self.y, self.sched)
        for _ in range(3):
            ks.step()
        path = self.run.out / f"trace_wide_k{self.k}.json" if trace else None
        p = profile_steps(ks.step, self.run.a.profile_steps, self.dev, path)
        self.res["profile_a_kktlab_step"] = p
        print_profile(f"kktlab _step k={self.k}", p)

    def kktlab_graph(self):
        ks = KktlabStepper(self.net0.clone(), self.X, self.y, self.check_sched)
        replay = ks.graphed(GRAPH_STEPS, self.dev)
        for _ in range(CHECK_STEPS // GRAPH_STEPS):
            replay()
        params = [p.clone() for p in ks.params()]
        ks = KktlabStepper(self.net0.clone(), self.X, self.y, self.sched)
        replay = ks.graphed(GRAPH_STEPS, self.dev)
        replay()
        s, reps = timed_steps(lambda n: [replay() for _ in range(n // GRAPH_STEPS)], self.steps, self.dev)
        self.record("a_kktlab_graph", s, reps, params, gemm_flop=self.flop, graph_steps=GRAPH_STEPS)

    # ---- the re-implementation
    def new_state(self, sched, store="dk"):
        return State(self.net0.clone(), self.X, self.y, sched, store)

    def fused_run(self, name, store, act, epi, compiled, gram_T=None, graph=False, extra=None):
        """Check (CHECK_STEPS steps at CHECK_LR vs (a)), then time one configuration."""
        T = gram_T or 1
        gemm_flop = self.flop if not gram_T else (4.0 * self.B * self.d * self.k + (T - 1) * 2.0 * self.B**2 * self.k) / T
        st = self.new_state(self.check_sched, store)
        f = Fused(st, act, epi, compiled, gram_T)
        if graph:
            per = GRAPH_STEPS if not gram_T else T
            replay = capture(lambda: [f.step() for _ in range(per)], self.dev, st.snapshot, st.restore)
            if CHECK_STEPS % per == 0:
                for _ in range(CHECK_STEPS // per):
                    replay()
                params = [p.clone() for p in st.params()]
            else:  # a block longer than the check: the same kernels as the checked f_gram4 variants
                params = None
                extra = dict(extra or {}, check=f"not run: block of {per} steps > {CHECK_STEPS} check steps")
        else:
            for _ in range(CHECK_STEPS):
                f.step()
            f.finish()
            params = [p.clone() for p in st.params()]
        st = self.new_state(self.sched, store)
        f = Fused(st, act, epi, compiled, gram_T)
        if graph:
            per = GRAPH_STEPS if not gram_T else T
            replay = capture(lambda: [f.step() for _ in range(per)], self.dev)
            replay()
            s, reps = timed_steps(lambda n: [replay() for _ in range(n // per)], self.steps, self.dev)
        else:
            for _ in range(2 * T):
                f.step()
            s, reps = timed_steps(lambda n: [f.step() for _ in range(n)], self.steps, self.dev)
        self.record(name, s, reps, params, gemm_flop=gemm_flop,
                    layout={"W_stored": store, "activations": act, "bias_relu_epilogue": f.epi},
                    elementwise_compiled=compiled, gram_block=gram_T, cuda_graph=graph, **(extra or {}))
        return f

    def gemm_candidates(self):
        """Each GEMM of the step alone, in every layout: which one cuBLAS runs fastest here."""
        dev, n, d, k = self.dev, self.B, self.d, self.k
        X = self.X[0]
        Wt = self.net0.W[0].t().contiguous()  # (d,k): store dk
        W = self.net0.W[0].contiguous()  # (k,d): store kd
        b = self.net0.b[0].contiguous()
        Hn = torch.empty(n, k, device=dev)
        Hk = torch.empty(k, n, device=dev)
        Gn = torch.randn(n, k, device=dev) * 1e-3
        Gk = Gn.t().contiguous()
        Wt2, W2 = Wt.clone(), W.clone()
        c = {
            "fwd dk nk mm": lambda: torch.mm(X, Wt, out=Hn),
            "fwd kd nk mm": lambda: torch.mm(X, W.t(), out=Hn),
            "fwd dk nk addmm_relu_lt": lambda: torch._addmm_activation(b, X, Wt, out=Hn),
            "fwd kd nk addmm_relu_lt": lambda: torch._addmm_activation(b, X, W.t(), out=Hn),
            "fwd dk nk baddbmm(kktlab)": lambda: torch.baddbmm(b[None, None], X[None], Wt[None]),
            "fwd kd kn mm": lambda: torch.mm(W, X.t(), out=Hk),
            "fwd dk kn mm": lambda: torch.mm(Wt.t(), X.t(), out=Hk),
            "upd dk nk addmm_": lambda: Wt2.addmm_(X.t(), Gn),
            "upd kd nk addmm_": lambda: W2.addmm_(Gn.t(), X),
            "upd kd kn addmm_": lambda: W2.addmm_(Gk, X),
            "upd dk kn addmm_": lambda: Wt2.addmm_(X.t(), Gk.t()),
            "upd dk nk baddbmm_(kktlab)": lambda: Wt2[None].baddbmm_(X.t()[None], Gn[None]),
        }
        res = {}
        for name, fn in c.items():
            try:
                res[name] = timed_call(fn, dev, reps=10, warm=2) * 1e3
            except Exception as exc:  # noqa: BLE001
                res[name] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
        self.res["gemm_candidates_ms"] = res
        num = {k_: v for k_, v in res.items() if isinstance(v, float)}
        best = {}
        for store in ("dk", "kd"):
            for act in ("nk", "kn"):
                fw = [v for k_, v in num.items() if k_.startswith(f"fwd {store} {act}") and "kktlab" not in k_]
                up = [v for k_, v in num.items() if k_.startswith(f"upd {store} {act}") and "kktlab" not in k_]
                if fw and up:
                    best[(store, act)] = min(fw) + min(up)
        self.best_layout = min(best, key=best.get) if best else ("dk", "nk")
        self.epi_best = num.get(f"fwd {self.best_layout[0]} nk addmm_relu_lt", math.inf) < \
            num.get(f"fwd {self.best_layout[0]} nk mm", math.inf) if self.best_layout[1] == "nk" else False
        gemm_only = min(best.values()) if best else None
        self.res["best_gemm_layout"] = {"W_stored": self.best_layout[0], "activations": self.best_layout[1],
                                        "bias_relu_epilogue": self.epi_best, "fwd_plus_upd_ms": gemm_only}
        gemm = self.run.payload.get("gemm4096_tflops")
        if gemm_only:
            self.res["gemm_only_tflops"] = self.flop / (gemm_only / 1e3) / 1e12
            if gemm:
                self.res["gemm_only_fraction_of_gemm4096"] = self.res["gemm_only_tflops"] / gemm
        print(f"  k={k} GEMMs alone (ms): " + ", ".join(f"{kk}={v:.3f}" if isinstance(v, float) else f"{kk}={v}"
                                                        for kk, v in res.items()), flush=True)
        print(f"  k={k} best layout {self.res['best_gemm_layout']}", flush=True)

    def floor(self):
        """max(GEMM FLOP / measured GEMM rate, bytes / measured copy bandwidth) for one step."""
        gemm, bw = self.run.payload.get("gemm4096_tflops"), self.run.payload.get("copy_gbps")
        n, d, k = self.B, self.d, self.k
        w_bytes = 4 * d * k * 3  # W read (forward), read + written (update)
        act_bytes = 4 * n * k * 3  # H written, read by the fused elementwise pass, G written (then read by the GEMM)
        fl = {"w_and_activation_bytes": w_bytes + act_bytes}
        if gemm:
            fl["compute_ms"] = self.flop / (gemm * 1e12) * 1e3
        if bw:
            fl["memory_ms"] = (w_bytes + act_bytes) / (bw * 1e9) * 1e3
        if gemm and bw:
            fl["floor_ms"] = max(fl["compute_ms"], fl["memory_ms"])
            fl["floor_fraction_of_gemm4096"] = (self.flop / (fl["floor_ms"] / 1e3) / 1e12) / gemm
        self.res["floor"] = fl

    def ref_torch(self):
        self.fused_run("ref_torch", "dk", "nk", False, compiled=False)

    def b_fused(self):
        store, act = self.best_layout
        self.fused_run("b_fused_eager_elementwise", store, act, self.epi_best, compiled=False)
        self.fused_run("b_fused", store, act, self.epi_best, compiled=self.run.a.compile)

    def b_graph(self):
        store, act = self.best_layout
        self.fused_run("b_fused_graph", store, act, self.epi_best, compiled=self.run.a.compile, graph=True)

    def gram(self, T: int, graph: bool):
        store, act = self.best_layout
        self.fused_run(f"f_gram{T}" + ("_graph" if graph else ""), store, act, False, compiled=self.run.a.compile,
                       gram_T=T, graph=graph)

    def profile_best(self):
        """The profile of the fastest non-graph re-implementation (eager launches visible)."""
        v = self.res["variants"]
        cands = [n for n in v if n.startswith(("b_fused", "f_gram")) and not n.endswith("_graph")]
        if not cands:
            return
        name = min(cands, key=lambda n: v[n]["ms_per_step"])
        lay = v[name]["layout"]
        st = self.new_state(self.sched, lay["W_stored"])
        f = Fused(st, lay["activations"], lay["bias_relu_epilogue"], v[name]["elementwise_compiled"], v[name]["gram_block"])
        for _ in range(2 * (v[name]["gram_block"] or 1)):
            f.step()
        p = profile_steps(f.step, max(self.run.a.profile_steps, 2 * (v[name]["gram_block"] or 1)), self.dev)
        p["variant"] = name
        self.res["profile_best_variant"] = p
        print_profile(f"{name} k={self.k}", p)

    def kktlab_compiled(self):
        """(e): tasks.train.train(..., compile=True); the first call's compile time recorded."""
        t0 = time.perf_counter()
        ref = train.train(self.net0.clone(), self.X, self.y, self.check_sched, max_steps=CHECK_STEPS, compile=True).net
        sync(self.dev)
        first = time.perf_counter() - t0
        params = (ref.W[0], ref.b[0], ref.v[0])
        net = self.net0.clone()
        train.train(net, self.X, self.y, self.sched, max_steps=2 * gd.STEPS_PER_CALL, compile=True)
        s, reps = timed_steps(lambda n: train.train(net, self.X, self.y, self.sched, max_steps=n, compile=True),
                              self.steps, self.dev)
        T = gd.block_size(self.sched.sync_every)
        gram = gd.use_gram(self.B, self.d)
        gemm_flop = (4.0 * self.B * self.d * self.k + (T - 1) * 2.0 * self.B**2 * self.k) / T if gram else self.flop
        self.record("e_kktlab_compiled", s, reps, params, gemm_flop=gemm_flop, first_call_s=first, block=T,
                    gram=gram)

    def max_autotune(self):
        """(c): the whole step under torch.compile(mode="max-autotune-no-cudagraphs")."""
        step = torch.compile(whole_step_fn(self.sched, torch.float32, math.log(self.B)),
                             mode="max-autotune-no-cudagraphs", dynamic=False)
        st = self.new_state(self.check_sched, "dk")
        args = lambda st: (st.X, st.S, st.b, st.v, st.y, *st.sched_state())  # noqa: E731
        t0 = time.perf_counter()
        step(*args(st))
        sync(self.dev)
        first = time.perf_counter() - t0
        for _ in range(CHECK_STEPS - 1):
            step(*args(st))
        params = [p.clone() for p in st.params()]
        st = self.new_state(self.sched, "dk")
        for _ in range(2):
            step(*args(st))
        s, reps = timed_steps(lambda n: [step(*args(st)) for _ in range(n)], self.steps, self.dev)
        self.record("c_max_autotune", s, reps, params, gemm_flop=self.flop, compile_first_call_s=first)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--d", type=int, default=784)
    ap.add_argument("--k", type=int, nargs="+", default=[100000, 10000])
    ap.add_argument("--small", action="store_true", help="tiny sizes (B=8, d=16, k=48 32): a smoke test of every path")
    ap.add_argument("--steps", type=int, default=96, help="steps per timing at k > 2e4")
    ap.add_argument("--steps-k1e4", type=int, default=320, help="steps per timing at k <= 2e4")
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-5, help="the timed runs' lr0 (as wide_step.py)")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for everything (default: $STEP_LIMIT_S - 20, which gpu_session_4.sh sets to the step's timeout, else 160.0)")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="no torch.compile anywhere")
    ap.add_argument("--no-max-autotune", dest="max_autotune", action="store_false")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    if a.budget_s is None:
        a.budget_s = float(os.environ["STEP_LIMIT_S"]) - 20 if os.environ.get("STEP_LIMIT_S") else 160.0
    if a.small:
        a.B, a.d, a.k, a.steps, a.steps_k1e4, a.profile_steps = 8, 16, [48, 32], 16, 16, 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    run = Run(a)
    dev = run.dev
    cuda = dev.type == "cuda"

    def refs():
        run.payload["gemm4096_tflops"] = gemm_rate(dev, 4096 if cuda else 512) / 1e12
        run.payload["copy_gbps"] = copy_bandwidth(dev, (1 << 30) if cuda else (1 << 24)) / 1e9
        print(f"dense fp32 GEMM {run.payload['gemm4096_tflops']:.1f} TFLOP/s, D2D copy "
              f"{run.payload['copy_gbps']:.0f} GB/s (read + write)", flush=True)

    run.guard("reference GEMM and copy", 5, refs)
    shapes = {}
    for k in a.k:  # (a) and the cheap, compile-free measurements first, every width
        s = run.guard(f"setup k={k}", 5, lambda k=k: Shape(run, a.B, a.d, k))
        if s is None:
            continue
        shapes[k] = s
        s.floor()
        run.guard(f"a_kktlab k={k}", 3, s.kktlab)
        run.guard(f"profile k={k}", 3, lambda s=s, k=k: s.profile(trace=k == max(a.k)))
        run.guard(f"gemm candidates k={k}", 3, s.gemm_candidates)
        run.guard(f"ref_torch k={k}", 3, s.ref_torch)
        if cuda:
            run.guard(f"a_kktlab_graph k={k}", 3, s.kktlab_graph)
    for k, s in shapes.items():  # (b), (d), Gram: one elementwise compile per configuration and width
        if not hasattr(s, "best_layout"):
            s.best_layout, s.epi_best = ("dk", "nk"), False
        run.guard(f"b_fused k={k}", 25, s.b_fused)
        if cuda:
            run.guard(f"b_fused_graph k={k}", 5, s.b_graph)
        run.guard(f"f_gram4 k={k}", 15, lambda s=s: s.gram(4, False))
        if cuda:
            run.guard(f"f_gram4_graph k={k}", 5, lambda s=s: s.gram(4, True))
            run.guard(f"f_gram16_graph k={k}", 5, lambda s=s: s.gram(16, True))
        run.guard(f"profile best k={k}", 5, s.profile_best)
    if a.compile and shapes:
        widest = max(shapes)  # (e) kktlab's compiled blocks at the widest, (c) max-autotune there, then (e) the rest
        run.guard(f"e_kktlab_compiled k={widest}", 25, shapes[widest].kktlab_compiled)
        if a.max_autotune:  # the widest only: autotuning compiles and times many GEMM kernels
            run.guard(f"c_max_autotune k={widest}", 45 if cuda else 10, shapes[widest].max_autotune)
        for k, s in shapes.items():
            if k != widest:
                run.guard(f"e_kktlab_compiled k={k}", 15, s.kktlab_compiled)
    if cuda:
        run.payload["smi_end"] = nvidia_smi()
    run.save()
    print("\nwide step variants (ms/step | TFLOP/s nominal | % of dense fp32 GEMM | speedup vs a | max rel diff vs a):")
    for k, s in shapes.items():
        for name, r in s.res["variants"].items():
            print(f"  k={k:<7d} {name:26s} {r['ms_per_step']:9.4f} | {r['tflops_nominal']:7.2f} | "
                  f"{100 * r.get('fraction_of_gemm4096', float('nan')):5.0f}% | "
                  f"{r.get('speedup_vs_a', float('nan')):6.2f}x | {r.get('max_param_rel_diff_vs_a', float('nan')):.1e}")
    print(f"wrote {run.json} in {time.perf_counter() - run.t0:.0f} s")


if __name__ == "__main__":
    main()
