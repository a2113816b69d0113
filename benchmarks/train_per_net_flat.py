"""Is a net-step as cheap in a stack of 1024 nets as in a stack of 256? (issue 19 target)

One process, one torch thread, the Dask workers' environment: the first 256 nets of a 1024-net
stack and the whole stack train for the same steps, alternately (``--rounds``), eager and compiled
in separate processes. Fresh processes per size (``train_batched.py``) let other users' jobs move
one size and not the other by ±10 % on this shared machine; alternating in one process puts
both sizes under the same load. Reports min and median CPU µs per net-step per size and the
ratio E=1024 / E=256 (≤ 1: no worse), and checks the 256 nets' parameters are the same in both
runs (the chunks never interact). Writes results/train_per_net_flat.json.

    python benchmarks/train_per_net_flat.py [--shape 50 50 100 float64] [--rounds 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(n, d, k, dtype, compile, rounds, steps) -> dict:
    import torch

    from tasks import data, train

    torch.set_num_threads(1)
    net, X, y = data.synthetic_stack(range(1024), d, n, k, dtype=getattr(torch, dtype))
    sched = train.Schedule(lr0=1e-3, period=10**9, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    stacks = {256: (net.select(slice(0, 256)), X[:256].contiguous(), y[:256].contiguous()), 1024: (net, X, y)}
    for args in stacks.values():  # warm-up: every compiled variant of both sizes
        train.train(*args, sched, max_steps=2 * train.gd.STEPS_PER_CALL, compile=compile)
    us, W = {E: [] for E in stacks}, {}
    for _ in range(rounds):
        for E, args in stacks.items():
            c0 = time.process_time()
            W[E] = train.train(*args, sched, max_steps=steps, compile=compile).net.W
            us[E].append((time.process_time() - c0) / (E * steps) * 1e6)
    return {"compile": compile, "cpu_us_per_net_step": us,
            "min": {E: min(v) for E, v in us.items()}, "median": {E: statistics.median(v) for E, v in us.items()},
            "ratio_1024_over_256_min": min(us[1024]) / min(us[256]),
            "ratio_1024_over_256_median": statistics.median(us[1024]) / statistics.median(us[256]),
            "max_param_diff_first_256": float((W[1024][:256] - W[256]).abs().max())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs=4, default=["50", "50", "100", "float64"], metavar=("N", "D", "K", "DTYPE"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--child", choices=["eager", "compiled"])
    a = ap.parse_args(argv)
    n, d, k, dtype = int(a.shape[0]), int(a.shape[1]), int(a.shape[2]), a.shape[3]
    if a.child:
        print(json.dumps(child(n, d, k, dtype, a.child == "compiled", a.rounds, a.steps)))
        return
    from benchmarks.common import write
    from benchmarks.train_batched import worker_env

    rows = {}
    for mode in ("eager", "compiled"):
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--shape", *a.shape, "--rounds", str(a.rounds),
                            "--steps", str(a.steps)], env=worker_env(False), capture_output=True, text=True, check=True)
        rows[mode] = json.loads(p.stdout.strip().splitlines()[-1])
        r = rows[mode]
        print(f"{mode:8s} n{n} d{d} k{k} {dtype}: E=256 {r['min']['256']:.2f} (median {r['median']['256']:.2f}) "
              f"E=1024 {r['min']['1024']:.2f} ({r['median']['1024']:.2f}) us CPU per net-step: "
              f"1024/256 = {r['ratio_1024_over_256_min']:.3f} (median {r['ratio_1024_over_256_median']:.3f}); "
              f"first 256 nets equal to {r['max_param_diff_first_256']:.1e}", flush=True)
    path = write("train_per_net_flat", {"shape": {"n": n, "d": d, "k": k, "dtype": dtype}, "rounds": a.rounds,
                                        "steps": a.steps, "modes": rows,
                                        "target_met": all(r["ratio_1024_over_256_median"] <= 1.02 for r in rows.values())})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
