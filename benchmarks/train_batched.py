"""Batched vs one-by-one training of E small two-layer nets (paper 002 kernels), same kernels.

Each configuration trains E nets (d=20, m=20, k=32 by default) once as one stacked problem
(E nets per kernel, ``--steps`` GD steps) and once as a Python loop over the nets with the same
kernel at E = 1 (the per-model loop of research code, ``--loop-steps`` steps per net: fewer,
because the loop is slow). The two sides do NOT run the same number of steps: both times are
divided by their own (nets x steps), and the ratio is of time per net-step. Every step costs
the same (fixed shapes, a schedule that never stops early). Equal work is checked on the timed
loop's own nets: their parameters are compared with a batched run of the same ``--loop-steps``
(``max_param_diff_vs_loop``). Writes benchmarks/results/train_batched.json.

    python benchmarks/train_batched.py [--E 16 256 1024] [--steps 200] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import timed, write  # noqa: E402
from tasks import data, train  # noqa: E402


def setup(E, d, m, k, dtype, device):
    return data.synthetic_stack(range(E), d, m, k, dtype=dtype, device=device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--E", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--loop-steps", type=int, default=50, help="steps per net in the loop baseline")
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--m", type=int, default=20)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    # a schedule that never stops early: every step costs the same on both sides
    sched = train.Schedule(lr0=1e-3, period=10_000, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    rows = []
    for E in args.E:
        net, X, y = setup(E, args.d, args.m, args.k, dtype, args.device)
        train.train(net, X, y, sched, max_steps=3)  # warm-up
        t_b, st = timed(lambda: train.train(net, X, y, sched, max_steps=args.steps), args.device)
        per_b = t_b / (E * args.steps)

        def loop():
            return [train.train(net.select(slice(e, e + 1)), X[e:e + 1], y[e:e + 1], sched,
                                max_steps=args.loop_steps) for e in range(E)]

        t_l, looped = timed(loop, args.device)
        per_l = t_l / (E * args.loop_steps)
        # equal work check on the timed loop's own nets: a batched run of the same loop_steps
        # (untimed) must give the same parameters for every net
        ref = train.train(net, X, y, sched, max_steps=args.loop_steps).net
        max_diff = max(float((getattr(one.net, p)[0] - getattr(ref, p)[e]).abs().max())
                       for e, one in enumerate(looped) for p in ("W", "b", "v"))
        row = {"E": E, "steps": args.steps, "loop_steps": args.loop_steps, "batched_s": t_b, "loop_s": t_l,
               "batched_us_per_net_step": per_b * 1e6, "loop_us_per_net_step": per_l * 1e6,
               "speedup": per_l / per_b, "speedup_is": "ratio of time per net-step (steps differ)",
               "max_param_diff_vs_loop": max_diff}
        rows.append(row)
        print(f"E={E:5d}  batched {per_b * 1e6:8.2f} us/net-step ({args.steps} steps)   loop {per_l * 1e6:8.2f} "
              f"us/net-step ({args.loop_steps} steps/net)   speedup per net-step {per_l / per_b:7.1f}x   "
              f"|d params| vs timed loop {max_diff:.1e}", flush=True)
    target = 5.0 if args.device == "cpu" else 20.0
    big = [r for r in rows if r["E"] >= 256]
    path = write("train_batched", {
        "shape": {"d": args.d, "m": args.m, "k": args.k, "dtype": args.dtype}, "rows": rows,
        "target_speedup_E_ge_256": target,
        "target_met": bool(big) and all(r["speedup"] >= target for r in big)}, args.device)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
