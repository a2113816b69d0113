"""Timing and profiling helpers of benchmarks/wide_step_variants.py (issue 46): seconds per step
with CUDA events (median of reps), one call's median time, a dense GEMM's FLOP/s, a device copy's
bandwidth, and a torch.profiler kernel table of a step (GEMM vs elementwise vs launch gaps).

    from benchmarks.gpu_timing import copy_bandwidth, gemm_rate, print_profile, profile_steps, sync, timed_call, timed_steps
"""

from __future__ import annotations

import pathlib
import re
import statistics
import time

import torch


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
