"""R restarts of the KKT reconstruction attack (paper 004, ``tasks/reconstruct``) stacked as one
problem vs R sequential runs (the reference code's way: one restart per process; here one call per
restart with the same kernel at B = 1, no process start-up counted, so the ratio is a lower bound
on what the reference code pays). Same net, same inits, same ``--steps`` on both sides; equal work
is checked by comparing every restart's final candidates (``max_cand_diff``, float64).
Writes benchmarks/results/reconstruct_restarts.json.

    python benchmarks/reconstruct_restarts.py [--R 8 64] [--steps 50] [--shapes 16,16,20 64,100,100]

Measured (2 shared, busy CPU cores, float64, one torch thread, 50 steps): at d = k = 16, l = 20
stacking wins 29x at R = 64 (per-call overhead dominates; 62x in another run of 100 steps); at the
CI size d = 64, k = l = 100 one row is already compute-bound and stacking gains 1.2x at R = 64
(0.7x in a run of 30 steps: within the noise of a loaded box). See the JSON.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import timed, write  # noqa: E402
from tasks.reconstruct import attack as atk  # noqa: E402


def problem(R, n, d, k, l, device):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(1, k, d, generator=g, dtype=torch.float64) / d ** 0.5
    b = torch.randn(1, k, generator=g, dtype=torch.float64) * 0.1
    v = torch.randn(1, k, generator=g, dtype=torch.float64) / k ** 0.5
    gens = [torch.Generator().manual_seed(r) for r in range(R)]
    x0, lam0 = atk.init_candidates("sphere", l, [d] * R, d, [1.0] * R, gens)
    yc = atk.candidate_labels(l).expand(R, l)
    t = lambda val: torch.full((R,), val, dtype=torch.float64, device=device)  # noqa: E731
    return ([z.expand(R, *z.shape[1:]).to(device) for z in (W, b, v)], x0.to(device), lam0.to(device),
            yc.to(device), dict(lr_x=t(1e-3), lr_lam=t(0.05), alpha=t(300.0), lam_min=t(0.01)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--R", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--shapes", nargs="+", default=["16,16,20", "64,100,100"],
                    help="d,k,l per shape (input dim, width, candidates); default: a small one and the CI size")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    rows = []
    for shape, R in ((sh, R) for sh in args.shapes for R in args.R):
        d, k, l = map(int, shape.split(","))
        (W, b, v), x0, lam0, yc, hp = problem(R, 0, d, k, l, args.device)
        run = lambda s: atk.optimise(W[s], b[s], v[s], x0[s], lam0[s], yc[s], steps=args.steps,  # noqa: E731
                                     **{key: val[s] for key, val in hp.items()})
        run(slice(0, 1))  # warm-up
        t_s, stacked = timed(lambda: run(slice(0, R)), args.device)
        t_q, seq = timed(lambda: [run(slice(r, r + 1)) for r in range(R)], args.device)
        diff = max(float((stacked.x[r] - seq[r].x[0]).abs().max()) for r in range(R))
        row = {"d": d, "k": k, "l": l, "R": R, "steps": args.steps, "stacked_s": t_s, "sequential_s": t_q, "ratio": t_q / t_s,
               "stacked_steps_per_s": args.steps / t_s, "max_cand_diff": diff}
        rows.append(row)
        print(f"d={d} k={k} l={l} R={R}: stacked {t_s:.2f}s, sequential {t_q:.2f}s, ratio {t_q / t_s:.1f}x, max diff {diff:.1e}")
    write("reconstruct_restarts", {"params": vars(args), "rows": rows}, args.device)


if __name__ == "__main__":
    main()
