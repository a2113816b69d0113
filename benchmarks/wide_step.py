"""Achieved FLOP/s of one wide-net training step (paper 002 kernels) vs the device's GEMM rate.

One GD step on a wide net costs about 4·B·d·k FLOP in its two big GEMMs (forward X Wᵀ and
backward Gᵀ X) plus O(B·k) elementwise work. The reference is a dense GEMM of the same
dtype measured in the same run (and, on a known GPU, the spec-sheet peak).

    python benchmarks/wide_step.py [--B 2000 --d 500 --k 1000] [--dtype float32]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import timed, write  # noqa: E402
from tasks import data, nets, train# noqa: E402

# dense fp32 / fp64 peaks (non-tensor-core fp32, fp64 tensor core) from the vendor data sheets
SPEC_PEAK_TFLOPS = {"H100": {"float32": 67.0, "float64": 67.0}, "H200": {"float32": 67.0, "float64": 67.0}}


def gemm_rate(n: int, dtype, device: str, reps: int = 5) -> float:
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    t, _ = timed(lambda: [a @ b for _ in range(reps)], device)
    return 2 * n**3 * reps / t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    cuda = torch.cuda.is_available()
    ap.add_argument("--B", type=int, default=5000 if cuda else 2000)
    ap.add_argument("--d", type=int, default=1000 if cuda else 500)
    ap.add_argument("--k", type=int, default=8000 if cuda else 1000)
    ap.add_argument("--steps", type=int, default=50 if cuda else 10)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    a = ap.parse_args(argv)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, a.dtype)
    g = data.seed_streams(0, (a.d, a.B))
    X, y = data.synthetic("sphere", a.B, a.d, g)
    net = nets.init_two_layer(a.d, a.k, g["init"], dtype=dtype, device=a.device)
    X, y = X.to(a.device, dtype)[None], y.to(a.device, dtype)[None]
    sched = train.Schedule(lr0=1e-5, period=100, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    train.train(net, X, y, sched, max_steps=2)
    t, _ = timed(lambda: train.train(net, X, y, sched, max_steps=a.steps), a.device)
    flop = 4.0 * a.B * a.d * a.k * a.steps
    achieved = flop / t
    ref = gemm_rate(4096 if a.device == "cuda" else 1024, dtype, a.device)
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else None
    spec = next((v[a.dtype] for key, v in SPEC_PEAK_TFLOPS.items() if gpu and key in gpu), None)
    out = {"shape": {"B": a.B, "d": a.d, "k": a.k, "dtype": a.dtype, "steps": a.steps},
           "step_s": t / a.steps, "achieved_tflops": achieved / 1e12, "gemm_tflops_measured": ref / 1e12,
           "fraction_of_measured_gemm": achieved / ref,
           "spec_peak_tflops": spec, "fraction_of_spec_peak": achieved / (spec * 1e12) if spec else None}
    print(f"wide step B={a.B} d={a.d} k={a.k} {a.dtype} on {gpu or 'cpu'}: {t / a.steps * 1e3:.2f} ms/step, "
          f"{achieved / 1e9:.1f} GFLOP/s = {100 * achieved / ref:.0f}% of a measured dense GEMM ({ref / 1e9:.1f} GFLOP/s)"
          + (f", {100 * out['fraction_of_spec_peak']:.0f}% of the {spec} TFLOP/s spec peak" if spec else ""))
    print(f"wrote {write('wide_step', out, a.device)}")


if __name__ == "__main__":
    main()
