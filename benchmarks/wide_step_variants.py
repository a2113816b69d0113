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
does, for the Gram variants), the fraction of a dense 4096³ fp32 GEMM measured in this run, and how
far its parameter update after CHECK_STEPS steps from the same init is from (a)'s, at an LR picked per
shape where (a) is stable and moves (benchmarks/wide_step_check.py). Plus a torch.profiler kernel table
of kktlab's step (GEMM vs elementwise vs launch gaps), the GEMM time of every layout candidate alone,
and the floor max(FLOP / GEMM rate, bytes / copy bandwidth).

    python benchmarks/wide_step_variants.py --device cuda --out DIR          # the GPU session's call
    python benchmarks/wide_step_variants.py --device cpu --small --out /tmp/w  # a smoke test of every path
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.gpu_probe import nvidia_smi  # noqa: E402
from benchmarks.gpu_timing import (copy_bandwidth, gemm_rate, print_profile, profile_steps, sync,  # noqa: E402
                                   timed_call, timed_steps)
from benchmarks.wide_step_check import (CHECK_LR, CHECK_STEPS, CHECK_TOL, floor, pick_check_lr,  # noqa: E402
                                        print_summary, rel_diff)
from benchmarks.wide_step_kernels import GRAPH_STEPS, Fused, KktlabStepper, Run, State, capture, schedule  # noqa: E402
from benchmarks.wide_step_kernels import whole_step_fn  # noqa: E402
from tasks import data, nets, train  # noqa: E402
from tasks.train import gd  # noqa: E402


class Shape:
    """One (B, d, k) problem: data, init, the reference (a) and every variant's numbers."""

    def __init__(self, run: Run, B: int, d: int, k: int):
        self.run, self.B, self.d, self.k, self.dev = run, B, d, k, run.dev
        a = run.a
        g = data.seed_streams(0, (d, B))
        X, y = data.synthetic("sphere", B, d, g)
        self.net0 = nets.init_two_layer(d, k, g["init"], dtype=torch.float32, device=self.dev)
        self.X, self.y = X.to(self.dev, torch.float32)[None], y.to(self.dev, torch.float32)[None]
        self.sched, self.check_lr = schedule(a.lr), CHECK_LR
        self.check_sched = schedule(self.check_lr)  # replaced by the picked LR in kktlab()
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
            row["check_steps"], row["check_lr"] = CHECK_STEPS, self.check_lr
        a_ms = self.res["variants"].get("a_kktlab", {}).get("ms_per_step")
        if a_ms:
            row["speedup_vs_a"] = a_ms / row["ms_per_step"]
        if self.dev.type == "cuda":
            row["peak_gpu_mb_so_far"] = torch.cuda.max_memory_allocated() / 2**20
        row.update(extra)
        self.res["variants"][name] = row
        fr = f", {100 * row['fraction_of_gemm4096']:.0f}% of GEMM" if "fraction_of_gemm4096" in row else ""
        dd = "" if "update_rel_diff_vs_a" not in row else (
            f", check: update off (a)'s by {row['update_rel_diff_vs_a']:.1e} ({'ok' if row['check_ok'] else 'NOT ok'}"
            f"{'; ' + row['check_invalid'] if 'check_invalid' in row else ''})")
        print(f"  k={self.k} {name:24s} {row['ms_per_step']:8.4f} ms/step, {row['tflops_nominal']:6.2f} TFLOP/s"
              f" nominal{fr}{dd}", flush=True)

    # ---- (a) kktlab
    def kktlab(self):
        """(a): train.train as wide_step.py times it; the check's LR and reference params (CHECK_STEPS steps)."""
        self.check_lr, trials = pick_check_lr(self.net0, self.X, self.y)
        self.check_sched = schedule(self.check_lr)
        self.res["check"] = {"lr": self.check_lr, "steps": CHECK_STEPS, "tol": CHECK_TOL, "lr_trials": trials}
        print(f"  k={self.k} check LR {self.check_lr:g} ({len(trials)} tried)", flush=True)
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
        s.res["floor"] = floor(run.payload, a.B, a.d, k)
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
        widest = max(shapes)  # (e) kktlab's compiled blocks at the widest, then (e) the rest, (c) max-autotune last
        run.guard(f"e_kktlab_compiled k={widest}", 25, shapes[widest].kktlab_compiled)
        for k, s in shapes.items():
            if k != widest:
                run.guard(f"e_kktlab_compiled k={k}", 15, s.kktlab_compiled)
        if a.max_autotune:  # the widest only: autotuning compiles and times many GEMM kernels (81 s on an H100)
            run.guard(f"c_max_autotune k={widest}", 90 if cuda else 10, shapes[widest].max_autotune)
    if cuda:
        run.payload["smi_end"] = nvidia_smi()
    run.save()
    print_summary(shapes)
    print(f"wrote {run.json} in {time.perf_counter() - run.t0:.0f} s")


if __name__ == "__main__":
    main()
