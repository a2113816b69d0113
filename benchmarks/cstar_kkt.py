"""Exact c* vs bisection, and batched vs per-model KKT fits / c* (paper 002 measures).

On E trained nets (sphere data, full-batch GD with a fast schedule to loss 1e-8 or 4000 steps;
the training is set-up and not timed; the equality of the answers is checked on each run):
- exact c* (sort breakpoints + cumsum) vs 60-step bisection on the flip predicate;
- c* and KKT NNLS fit for the whole stack at once vs a Python loop over the nets.
Writes benchmarks/results/cstar_kkt.json.

    python benchmarks/cstar_kkt.py [--E 64] [--d 50] [--m 100] [--k 200]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import timed, write  # noqa: E402
from tasks import attacks, data, kkt, nets, train# noqa: E402


def trained_stack(E, d, m, k, device):
    net, X, y = data.synthetic_stack(range(E), d, m, k)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=4000))
    mv = lambda t: t.to(device)  # noqa: E731
    return nets.TwoLayer(mv(st.net.W), mv(st.net.b), mv(st.net.v)), mv(X), mv(y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--E", type=int, default=64)
    ap.add_argument("--d", type=int, default=50)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    net, X, y = trained_stack(a.E, a.d, a.m, a.k, a.device)
    valid = torch.ones_like(y, dtype=torch.bool)
    I = kkt.margin_set(y * net(X), valid)
    z = attacks.margin_direction(net, X, y, I)
    cap = torch.full((a.E,), 20 * math.sqrt(a.d), dtype=X.dtype, device=X.device)
    t_exact, ex = timed(lambda: attacks.c_star_exact(net, X, y, I, z, cap=cap), a.device)
    t_bis, bis = timed(lambda: attacks.c_star_bisection(net, X, y, I, z, cap=cap), a.device)
    fin = torch.isfinite(ex.c_star)
    agree = float((ex.c_star[fin] - bis[fin]).abs().max()) if fin.any() else float("nan")

    def loop_cstar():
        for e in range(a.E):
            s = slice(e, e + 1)
            attacks.c_star_exact(net.select(s), X[s], y[s], I[s], z[s], cap=cap[s])

    t_cloop, _ = timed(loop_cstar, a.device)
    t_kkt, fit = timed(lambda: kkt.kkt_fit(net, X, y, valid), a.device)

    def loop_kkt():
        return [kkt.kkt_fit(net.select(slice(e, e + 1)), X[e:e + 1], y[e:e + 1], valid[e:e + 1]) for e in range(a.E)]

    t_kloop, fits = timed(loop_kkt, a.device)
    kkt_diff = max(float((f.eps[0] - fit.eps[e]).abs()) for e, f in enumerate(fits))
    rows = {
        "exact_vs_bisection": {"exact_s": t_exact, "bisection_s": t_bis, "speedup": t_bis / t_exact,
                               "max_abs_diff": agree},
        "cstar_batched_vs_loop": {"batched_s": t_exact, "loop_s": t_cloop, "speedup": t_cloop / t_exact},
        "kkt_batched_vs_loop": {"batched_s": t_kkt, "loop_s": t_kloop, "speedup": t_kloop / t_kkt,
                                "max_eps_diff": kkt_diff},
    }
    for name, r in rows.items():
        print(f"{name:24s} " + "  ".join(f"{k} {v:.4g}" for k, v in r.items()))
    path = write("cstar_kkt", {"shape": vars(a), "rows": rows}, a.device)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
