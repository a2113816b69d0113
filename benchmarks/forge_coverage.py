"""Benchmark (issue 41): does forge_net's stated error cover the truth? A coverage table on known answers.

Nets: the ``train_kkt`` nets the synthetic CI chain forged (pipeline-small before issue 39: d = 10, m = 4, width 8,
frozen ±1/√8 output layer, W trained, logistic loss, 3000 GD steps) and smaller ones (d = 3, width 6)
at a larger eps. Per (net, training point, eps) the truth is plain Monte Carlo written here, outside
forge_net's maths: x' uniform in a ball B_r(c) (intersected with the forging domain B_R(0)), the
per-example gradient of softplus(−y f(x')) over W by ``torch.func`` (not forge_net's closed form),
hit if ‖∇ℓ(x') − ∇ℓ(x_i)‖ <= eps ‖∇ℓ(x_i)‖. For d = 3 the ball is the whole domain B_R(0) (no
assumption); for d = 10 it is B_r(x_i) at two radii, and the truth is used only when both agree within
3 standard errors (the set lies inside the smaller one). Then forge_net's estimator
(``subset_importance``, the cell's ``forging_problem``) runs over ``--seeds`` estimator seeds per size
(n_samples, n_importance), and the table gives, per (problem, size): how many results were finite,
how many the estimator marked reliable, the coverage of the stated 95 % interval (|estimate − truth|
<= 1.96·sqrt(SE² + SE_truth²)) over all finite results and over the reliable ones, the spread of the
estimates over seeds against the root-mean-square stated SE, the bias, and the mean ESS.
``reliable_pre_issue41`` counts the results the rule before issue 41 passed (k̂ <= 0.7, or k̂ NaN).

    python benchmarks/forge_coverage.py [--quick] [--seeds 50]

Writes benchmarks/results/forge_coverage.json (every number measured by this run).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from flows import experiments  # noqa: E402
from tasks.cells import forge_net as fn  # noqa: E402
from tasks.forging.estimators import ESTIMATORS  # noqa: E402
from tasks.forging.exact import log_ball_volume  # noqa: E402

DT = torch.float64
Z95 = 1.959963984540054


def train_kkt_nets(d: int, m: int, width: int, seeds) -> list[dict]:
    """The chain's producer, called directly (one bundle)."""
    exp = experiments.get("train_kkt")
    base = {k: p.default for k, p in exp.params.items()}
    cells = [dict(base, d=d, m=m, width=width, epochs=3000, lr=1.0, wd=0.0, init_scale=1e-3, seed=s) for s in seeds]
    return [{k: torch.as_tensor(o[k]) for k in ("W", "b", "v", "X", "y")} for o in exp.run_bundle(cells, "cpu")]


def _loss(W, b, v, x, y):
    return F.softplus(-y * (torch.relu(W @ x + b) @ v))


def mc_truth(net: dict, i: int, eps: float, R: float, centre: torch.Tensor, r: float, n: int, seed: int,
             chunk: int = 100_000) -> dict:
    """log μ{x' ∈ B_r(centre) ∩ B_R(0): ‖∇_W ℓ(x') − ∇_W ℓ(x_i)‖ <= eps ‖∇_W ℓ(x_i)‖} by plain MC, n draws."""
    W, b, v, X, y = (net[k] for k in ("W", "b", "v", "X", "y"))
    d = X.shape[1]
    per_point = vmap(grad(_loss), in_dims=(None, None, None, 0, None))
    g_i = grad(_loss)(W, b, v, X[i], y[i]).flatten()
    gen = torch.Generator().manual_seed(seed)
    hits = 0
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        u = torch.randn(k, d, dtype=DT, generator=gen)
        z = centre + r * torch.rand(k, 1, dtype=DT, generator=gen) ** (1 / d) * u / u.norm(dim=1, keepdim=True)
        G = per_point(W, b, v, z, y[i]).flatten(1)
        hits += int((((G - g_i).norm(dim=1) <= eps * g_i.norm()) & (z.norm(dim=1) < R)).sum())
    p = hits / n
    return {"r": r, "n": n, "hits": hits, "log_volume": float(log_ball_volume(d, r)) + math.log(p) if hits else -math.inf,
            "stderr": math.sqrt((1 - p) / hits) if hits else math.inf}


def problem_truth(net: dict, i: int, eps: float, whole_ball: bool, n: int, radii=(0.35, 0.45)) -> dict:
    X = net["X"]
    R = float(X.norm(dim=1).max())
    if whole_ball:
        t = mc_truth(net, i, eps, R, torch.zeros(X.shape[1], dtype=DT), R, n, seed=1000 + i)
        return dict(t, balls=[t], contained=True, R=R)
    balls = [mc_truth(net, i, eps, R, X[i], r, n, seed=1000 + i) for r in radii]
    a, b = balls
    contained = bool(a["hits"] and b["hits"] and abs(a["log_volume"] - b["log_volume"])
                     <= 3 * math.hypot(a["stderr"], b["stderr"]))
    return dict(a, balls=balls, contained=contained, R=R)


def run_seeds(net: dict, i: int, eps: float, R: float, n_samples: int, n_importance: int, seeds) -> list[dict]:
    W, b, v, X, y = (net[k] for k in ("W", "b", "v", "X", "y"))
    problem, _ = fn.forging_problem(W, b, v, X[i], y[i], frozenset({"W"}), "logistic", R)
    rows = []
    for s in seeds:
        t0 = time.perf_counter()
        est = ESTIMATORS["subset_importance"](problem, eps, generator=torch.Generator().manual_seed(s),
                                              n_samples=n_samples, n_repeats=10, n_importance=n_importance)
        x = est.extra
        khat = x.get("pareto_khat", math.nan)
        pre = x.get("reliable", True) if "pareto_khat" not in x else (not math.isfinite(khat) or khat <= 0.7)
        rows.append({"seed": s, "log_volume": est.log_volume, "stderr": est.log_volume_stderr,
                     "reliable": bool(x.get("reliable", True)) and not x.get("stalled"),
                     "reliable_pre_issue41": bool(pre) and not x.get("stalled"),
                     "stalled": bool(x.get("stalled", False)), "ess": x.get("ess", math.nan), "pareto_khat": khat,
                     "n_gradient_evals": est.n_gradient_evals, "wall_s": time.perf_counter() - t0})
    return rows


def summarise(rows: list[dict], truth: float, truth_se: float) -> dict:
    fin = [r for r in rows if math.isfinite(r["log_volume"]) and math.isfinite(r["stderr"])]

    def covered(r):
        return abs(r["log_volume"] - truth) <= Z95 * math.hypot(r["stderr"], truth_se)

    def part(sel):
        lv = [r["log_volume"] for r in sel]
        out = {"n": len(sel), "covered": sum(bool(covered(r)) for r in sel)}
        out["coverage"] = out["covered"] / len(sel) if sel else math.nan
        out["spread"] = statistics.stdev(lv) if len(lv) > 1 else math.nan
        out["rms_stated_se"] = math.sqrt(statistics.fmean(r["stderr"] ** 2 for r in sel)) if sel else math.nan
        out["spread_over_stated"] = out["spread"] / out["rms_stated_se"] if sel else math.nan
        out["bias"] = statistics.fmean(lv) - truth if sel else math.nan
        out["max_abs_z"] = max(abs(r["log_volume"] - truth) / math.hypot(r["stderr"], truth_se) for r in sel) \
            if sel else math.nan
        return out

    return {"n_seeds": len(rows), "n_finite": len(fin), "n_stalled": sum(r["stalled"] for r in rows),
            "n_reliable": sum(r["reliable"] for r in fin),
            "n_reliable_pre_issue41": sum(r["reliable_pre_issue41"] for r in fin),
            "all_finite": part(fin), "reliable": part([r for r in fin if r["reliable"]]),
            "reliable_pre_issue41": part([r for r in fin if r["reliable_pre_issue41"]]),
            "mean_ess": statistics.fmean(r["ess"] for r in fin if math.isfinite(r["ess"]))
            if any(math.isfinite(r["ess"]) for r in fin) else math.nan,
            "mean_gradient_evals": statistics.fmean(r["n_gradient_evals"] for r in rows),
            "mean_wall_s": statistics.fmean(r["wall_s"] for r in rows)}


# (name, (d, m, width, net seeds), net index, point, eps, truth over the whole ball)
PROBLEMS = [
    ("d10_net0_point1", (10, 4, 8, (0, 1, 2)), 0, 1, 0.3, False),
    ("d10_net1_point3", (10, 4, 8, (0, 1, 2)), 1, 3, 0.3, False),
    ("d10_net2_point1", (10, 4, 8, (0, 1, 2)), 2, 1, 0.3, False),
    ("d3_net0_point1", (3, 4, 6, (0, 1)), 0, 1, 0.5, True),
    ("d3_net0_point3", (3, 4, 6, (0, 1)), 0, 3, 0.5, True),
    ("d3_net1_point2", (3, 4, 6, (0, 1)), 1, 2, 0.5, True),
]
SIZES = [(100, 1000), (100, 10_000)]  # the CI chain's size, then ten times the importance draws
LARGE = (1000, 100_000)  # the experiment's defaults' order (n_samples 1000, n_importance 1e5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50, help="estimator seeds per (problem, size)")
    ap.add_argument("--large-seeds", type=int, default=20, help="seeds at the large size (first problem of each d)")
    ap.add_argument("--mc", type=int, default=2_000_000, help="plain-MC draws per ball")
    ap.add_argument("--quick", action="store_true", help="10 seeds, 2e5 MC draws, no large size")
    ap.add_argument("--out", type=str, default="forge_coverage")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.large_seeds, args.mc = 10, 0, 200_000
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    nets = {}
    table = []
    for name, spec, e, i, eps, whole in PROBLEMS:
        if spec not in nets:
            nets[spec] = train_kkt_nets(*spec)
        net = nets[spec][e]
        t0 = time.perf_counter()
        truth = problem_truth(net, i, eps, whole, args.mc)
        truth["wall_s"] = time.perf_counter() - t0
        sizes = list(SIZES) + ([LARGE] if args.large_seeds and name in ("d10_net0_point1", "d3_net0_point1") else [])
        for n_samples, n_importance in sizes:
            n_seeds = args.large_seeds if (n_samples, n_importance) == LARGE else args.seeds
            rows = run_seeds(net, i, eps, truth["R"], n_samples, n_importance, range(n_seeds))
            summary = summarise(rows, truth["log_volume"], truth["stderr"]) if truth["contained"] else None
            table.append({"problem": name, "d": spec[0], "width": spec[2], "net_seed": spec[3][e], "point": i,
                          "eps": eps, "n_samples": n_samples, "n_repeats": 10, "n_importance": n_importance,
                          "truth": truth, "summary": summary, "runs": rows})
            s = summary or {}
            rel, allf = s.get("reliable", {}), s.get("all_finite", {})
            nan = math.nan
            print(f"{name:17} ns={n_samples:5d} ni={n_importance:6d} "
                  f"truth {truth['log_volume']:8.3f}±{truth['stderr']:.3f} finite {s.get('n_finite')}/{n_seeds} "
                  f"reliable {s.get('n_reliable')} (pre {s.get('n_reliable_pre_issue41')})"
                  f" | all: cover {allf.get('coverage', nan):.2f} spread/SE {allf.get('spread_over_stated', nan):.2f}"
                  f" bias {allf.get('bias', nan):+.3f} | reliable: cover {rel.get('coverage', nan):.2f}"
                  f" spread/SE {rel.get('spread_over_stated', nan):.2f}"
                  f" | pre-41 reliable: cover {s.get('reliable_pre_issue41', {}).get('coverage', nan):.2f}"
                  f" | ESS {s.get('mean_ess', nan):.0f}", flush=True)
    pooled = {}
    for key in ("reliable", "all_finite", "reliable_pre_issue41"):
        parts = [row["summary"][key] for row in table if row["summary"] and row["summary"][key]["n"]]
        n, cov = sum(p_["n"] for p_ in parts), sum(p_["covered"] for p_ in parts)
        pooled[key] = {"n": n, "covered": cov, "coverage": cov / n if n else math.nan}
    for ni in sorted({row["n_importance"] for row in table}):
        parts = [row["summary"]["reliable"] for row in table if row["summary"] and row["n_importance"] == ni]
        n, cov = sum(p_["n"] for p_ in parts), sum(p_["covered"] for p_ in parts)
        pooled[f"reliable_n_importance_{ni}"] = {"n": n, "covered": cov, "coverage": cov / n if n else math.nan}
    print("pooled:", "; ".join(f"{k} {v['covered']}/{v['n']}" for k, v in pooled.items()))
    path = common.write(args.out, {
        "issue": 41, "spec_ids": ["D000-1", "D000-3"], "quick": args.quick,
        "estimator": "subset_importance (forge_net's default) on tasks.cells.forge_net.forging_problem, W trained, "
                     "logistic loss, eps relative to ||grad l(x_i)||",
        "truth": "plain MC in a ball (torch.func per-example gradients): whole domain B_R(0) for d = 3; B_r(x_i) at "
                 "r = 0.35 and 0.45 for d = 10, used only where both agree within 3 SE",
        "coverage": "|estimate - truth| <= 1.959964 * sqrt(SE^2 + SE_truth^2); spread = sd of the estimates over "
                    "seeds; rms_stated_se = sqrt(mean SE^2)",
        "reliable_pre_issue41": "k-hat <= 0.7 or k-hat NaN (the rule before issue 41)",
        "pooled_coverage": pooled, "table": table, "total_wall_s": time.perf_counter() - t_all})
    print(f"total {time.perf_counter() - t_all:.1f}s -> {path}")


if __name__ == "__main__":
    main()
