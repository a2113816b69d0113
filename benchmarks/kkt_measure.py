"""K1 of spec 001 (kkt_measure) on a whole unlearning sweep: E nets × A step fractions α in one
batched call vs a per-net, per-α loop (what a paper script does), on the same work.

E two-layer nets with a frozen ±1/√n output layer are trained on N(0, I/d) data (full-batch GD,
set-up, not timed); for one forgotten point per net the GA step θ̂(α) is formed for A values of α;
then ε, δ of every θ̂(α) on S∖{l} are measured:
- batched: one ``kkt_measure`` call on the (E, A) stack (NNLS by accelerated projected gradient +
  exact active-set polish, batched);
- loop_kernel: the same kernel called once per (net, α);
- loop_scipy: per (net, α), the explicit p × m gradient matrix and ``scipy.optimize.nnls`` (the
  spec's cross-check, the way a paper script computes it).
- loop_scipy_nnls_only: the same ``nnls`` calls on matrices built beforehand (the peer at its
  best: what scipy itself costs per problem, without the per-problem matrix construction).
The answers are checked equal (max |Δε|) on each run. The methods run ``--repeats`` times,
interleaved in a rotated order in this one process; each time is the minimum over the repeats
(issue 33). numpy's BLAS runs one thread (``OPENBLAS_NUM_THREADS=1`` unless set), as torch does.
Writes benchmarks/results/kkt_measure.json.

    python benchmarks/kkt_measure.py [--E 8] [--A 32] [--d 200] [--m 10] [--n 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy / torch load their BLAS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import timed, write  # noqa: E402
from tasks.data.synthetic import gauss_scaled, labels, seed_streams  # noqa: E402
from tasks.kkt.measure import kkt_measure, relu_grad  # noqa: E402
from tasks.train.fixed_output import init_weights, output_signs, train_fixed_output  # noqa: E402
from tasks.unlearn import METHODS  # noqa: E402


def sweep(E, A, d, m, n, epochs):
    Xs, ys, W0, us = [], [], [], []
    for s in range(E):
        g = seed_streams(s, (d, m))
        Xs.append(gauss_scaled(m, d, g["data"])), ys.append(labels(m, g["labels"]))
        us.append(output_signs(n, g["init"])), W0.append(init_weights(n, d, g["init"], 1e-5))
    X, y, W0, u = map(torch.stack, (Xs, ys, W0, us))
    W = train_fixed_output(W0, u, X, y, torch.ones(E, m, dtype=torch.bool), lr=1.0, wd=1e-5, epochs=epochs).W
    r = kkt_measure(W, u, X, y)
    F = torch.zeros(E, 1, m, dtype=torch.bool)
    F[:, 0, 0] = True
    alphas = torch.linspace(0, 1.5, A, dtype=torch.float64)
    W_hat = METHODS["ga"](W, u, X, y, r.lam / r.c[:, None], F, alphas)[:, 0]  # (E,A,n,d)
    return W_hat, u, X, y, ~F[:, 0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--E", type=int, default=8)
    ap.add_argument("--A", type=int, default=32)
    ap.add_argument("--d", type=int, default=200)
    ap.add_argument("--m", type=int, default=10)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    W_hat, u, X, y, keep = sweep(a.E, a.A, a.d, a.m, a.n, a.epochs)
    args = (u[:, None], X[:, None], y[:, None], keep[:, None])
    kkt_measure(W_hat[:1, :1], u[:1, None], X[:1, None], y[:1, None], keep[:1, None])  # warm-up
    rb = kkt_measure(W_hat, *args)

    def loop_kernel():
        return torch.tensor([[float(kkt_measure(W_hat[e, i], u[e], X[e], y[e], keep[e]).eps) for i in range(a.A)]
                             for e in range(a.E)], dtype=torch.float64)

    from scipy.optimize import nnls

    def problem(e, i):
        W = W_hat[e, i]
        q = y[e] * (torch.relu(X[e] @ W.T) @ u[e])
        c = 1 / q[keep[e]].min()
        S = relu_grad(W, X[e])
        G = (y[e][:, None, None] * u[e][None, :, None] * S[:, :, None] * X[e][:, None, :])[keep[e]]
        return G.reshape(G.shape[0], -1).T.numpy(), (c * W).flatten().numpy()

    def loop_scipy():
        out = torch.zeros(a.E, a.A, dtype=torch.float64)
        for e in range(a.E):
            for i in range(a.A):
                out[e, i] = nnls(*problem(e, i), maxiter=10_000)[1]
        return out

    built = [[problem(e, i) for i in range(a.A)] for e in range(a.E)]

    def loop_scipy_nnls_only():
        return torch.tensor([[nnls(*built[e][i], maxiter=10_000)[1] for i in range(a.A)] for e in range(a.E)],
                            dtype=torch.float64)

    fns = {"batched": lambda: kkt_measure(W_hat, *args).eps, "loop_kernel": loop_kernel, "loop_scipy": loop_scipy,
           "loop_scipy_nnls_only": loop_scipy_nnls_only}
    times, outs = {k: [] for k in fns}, {}
    for r in range(a.repeats):
        names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for k in names:
            t, outs[k] = timed(fns[k])
            times[k].append(t)
    t_batch, t_loop, t_scipy, t_nnls = (min(times[k]) for k in fns)
    e_loop, e_scipy = outs["loop_kernel"], outs["loop_scipy"]
    agree_kernel = float((rb.eps - e_loop).abs().max())
    agree_scipy = float(((rb.eps - e_scipy).abs() / e_scipy).max())
    res = {"E": a.E, "A": a.A, "problems": a.E * a.A, "d": a.d, "m": a.m, "n": a.n, "threads": a.threads,
           "repeats": a.repeats, "times_s": times, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
           "t_batched_s": t_batch, "t_loop_kernel_s": t_loop, "t_loop_scipy_s": t_scipy,
           "t_loop_scipy_nnls_only_s": t_nnls, "ratio_vs_loop_kernel": t_loop / t_batch,
           "ratio_vs_loop_scipy": t_scipy / t_batch, "ratio_vs_scipy_nnls_only": t_nnls / t_batch,
           "us_per_problem": {k: min(v) / (a.E * a.A) * 1e6 for k, v in times.items()},
           "max_abs_diff_eps_vs_loop_kernel": agree_kernel, "max_rel_diff_eps_vs_scipy": agree_scipy}
    print(f"K1 on {a.E} nets x {a.A} alphas (m={a.m}, d={a.d}, n={a.n}): batched {t_batch:.3f} s, "
          f"per-(net, alpha) kernel loop {t_loop:.3f} s ({res['ratio_vs_loop_kernel']:.1f}x), "
          f"per-(net, alpha) scipy nnls on G {t_scipy:.3f} s ({res['ratio_vs_loop_scipy']:.1f}x), "
          f"nnls alone {t_nnls:.3f} s ({res['ratio_vs_scipy_nnls_only']:.1f}x); "
          f"max |d eps| {agree_kernel:.2g}, max rel d eps vs scipy {agree_scipy:.2g}")
    write("kkt_measure", res)
    return res


if __name__ == "__main__":
    main()
