"""Where the stacked training step's time goes (issue 19), in one process, one torch thread.

1. Bias folded into W (a column of ones in X) against the bias broadcast inside ``baddbmm``: the
   forward X Wᵀ + b and the update W += Gᵀ X, b += Σ_n G, on one cache-sized chunk of nets
   (``train.auto_chunk``), also with the folded width padded to a multiple of 8, and without bias.
2. torch.profiler's self-CPU time per op of ``train.train`` (eager and ``compile=True``) over a
   few steps of the whole stack (chunked), grouped as the README quotes it.

CPU time of the process (``time.process_time``), minimum over interleaved rounds. Writes
benchmarks/results/train_step_parts.json.

    python benchmarks/train_step_parts.py [--E 256] [--n 50 --d 50 --k 100 --dtype float64]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def cpu_us(fn, reps):
    c0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - c0) / reps * 1e6


def fold_variants(C, n, d, k, dt, rounds=6, reps=30):
    X, W, b, G = (torch.randn(C, *s, dtype=dt) for s in ((n, d), (k, d), (k,), (n, k)))
    Xa, Wa = torch.cat([X, torch.ones(C, n, 1, dtype=dt)], 2), torch.cat([W, b[..., None]], 2)
    dp = (d + 1 + 7) // 8 * 8
    Xp, Wp = torch.zeros(C, n, dp, dtype=dt), torch.zeros(C, k, dp, dtype=dt)
    Xp[..., :d + 1], Wp[..., :d + 1] = Xa, Wa

    def upd_sep():
        W.baddbmm_(G.transpose(1, 2), X, alpha=1e-12)
        b.add_(G.sum(1), alpha=1e-12)

    fns = {"forward_bias_broadcast": lambda: torch.baddbmm(b.unsqueeze(1), X, W.transpose(1, 2)),
           "forward_folded": lambda: torch.bmm(Xa, Wa.transpose(1, 2)),
           "forward_folded_pad8": lambda: torch.bmm(Xp, Wp.transpose(1, 2)),
           "forward_no_bias": lambda: torch.bmm(X, W.transpose(1, 2)),
           "update_separate": upd_sep,
           "update_folded": lambda: Wa.baddbmm_(G.transpose(1, 2), Xa, alpha=1e-12),
           "update_folded_pad8": lambda: Wp.baddbmm_(G.transpose(1, 2), Xp, alpha=1e-12)}
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            best[name] = min(best[name], cpu_us(fn, reps))
    return {name: us / C for name, us in best.items()}  # µs per net


def profile(E, n, d, k, dt, steps, compile):
    from torch.profiler import ProfilerActivity, profile as prof

    from tasks import data, train

    net, X, y = data.synthetic_stack(range(E), d, n, k, dtype=dt)
    sched = train.Schedule(lr0=1e-3, period=10**9, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    train.train(net, X, y, sched, max_steps=2 * train.gd.STEPS_PER_CALL, compile=compile)  # every variant compiles
    c0 = time.process_time()
    train.train(net, X, y, sched, max_steps=steps, compile=compile)
    us = (time.process_time() - c0) / (E * steps) * 1e6
    with prof(activities=[ProfilerActivity.CPU]) as p:
        train.train(net, X, y, sched, max_steps=steps, compile=compile)
    ev = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    tot = sum(e.self_cpu_time_total for e in ev)
    top = {e.key[:60]: {"self_cpu_frac": e.self_cpu_time_total / tot, "calls": e.count} for e in ev[:12]}
    return {"cpu_us_per_net_step_unprofiled": us, "top_ops": top}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--E", type=int, default=256)
    ap.add_argument("--n", type=int, default=50), ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--k", type=int, default=100), ap.add_argument("--dtype", default="float64")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from benchmarks.common import write
    from tasks import train

    dt = getattr(torch, a.dtype)
    C = train.auto_chunk(a.E, a.n, a.k, dt, "cpu")
    fold = fold_variants(C, a.n, a.d, a.k, dt)
    for name, us in fold.items():
        print(f"{name:24s} {us:7.2f} us CPU per net (chunk {C})")
    A, B = torch.randn(1024, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    gemm = 2 * 1024**3 / min(cpu_us(lambda: torch.mm(A, B), 3) for _ in range(4)) * 1e6 / 1e9
    flop = 4 * a.n * a.d * a.k + 4 * a.n * a.k
    print(f"dense 1024^2 GEMM {gemm:.1f} GFLOP/s CPU time")
    prof = {mode: profile(a.E, a.n, a.d, a.k, dt, a.steps, mode == "compiled") for mode in ("eager", "compiled")}
    for mode, r in prof.items():
        r["gflops"] = flop / r["cpu_us_per_net_step_unprofiled"] / 1e3
        r["fraction_of_gemm"] = r["gflops"] / gemm
        print(f"{r['fraction_of_gemm']:.0%} of GEMM", mode, f"{r['cpu_us_per_net_step_unprofiled']:.1f} us CPU per net-step;",
              ", ".join(f"{k} {v['self_cpu_frac']:.0%}" for k, v in list(r["top_ops"].items())[:6]))
    write(f"train_step_parts_n{a.n}d{a.d}k{a.k}{a.dtype}_E{a.E}",
          {"shape": vars(a), "chunk": C, "load_avg_1m_end": os.getloadavg()[0],
           "gemm_gflops_cpu": gemm, "fold_us_cpu_per_net": fold, "profile": prof})


if __name__ == "__main__":
    main()
