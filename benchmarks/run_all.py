"""``make bench``: run every benchmark (one process each), then draw one PNG of the ratios.

    python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"

BENCHES = {
    "train_batched": (["--quick"], ["--quick", "--E", "16", "256", "--net-steps", "5120"]),
    "train_peer": ([], ["--quick"]),
    "train_per_net_flat": ([], ["--rounds", "3"]),
    "cstar_kkt": ([], ["--E", "16"]),
    "kernel_alternatives": ([], ["--repeats", "1", "--inner", "1", "--N", "1024", "--pg-iters", "1000"]),
    "forging_rare_event": ([], ["--quick"]),
    "orchestration_overhead": ([], ["--quick", "--big", "1000"]),
    "wide_step": ([], ["--steps", "3"]),
    "chain_overhead": ([], ["--quick"]),
}


def plot(out: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = [], []
    for f in sorted(RESULTS.glob("*.json")):
        d = json.loads(f.read_text())
        dev = d.get("device", {}).get("gpu") or d.get("device", {}).get("device", "cpu")
        if f.stem in ("train_batched", "train_batched_quick"):  # the grid (the other train_batched_* are history)
            for r in d["rows"]:
                vs = r.get("vs_compiled_vmap", {}).get("steady_cpu")  # best kktlab mode, CPU time
                pairs = [("loop / kktlab", r.get("methods", {}).get("loop", {}).get("kktlab_speedup")),
                         (f"{vs.get('peer', 'vmap_compiled')} / {vs['best']}" if vs else "vmap_compiled / kktlab",
                          vs["ratio"] if vs else r.get("methods", {}).get("vmap_compiled", {}).get("kktlab_speedup"))]
                for what, s in pairs:
                    if s:
                        labels.append(f"train n{r['n']} k{r['k']} {r['dtype']} E={r['E']}: {what} ({dev})")
                        values.append(s)
        elif d["benchmark"] == "cstar_kkt":
            for k, r in d["rows"].items():
                labels.append(f"{k} ({dev})"), values.append(r["speedup"])
        elif d["benchmark"] == "orchestration_overhead":
            for r in d["rows"]:
                labels.append(f"orchestration {r['cell_s']:.1f}s cells, {r.get('bundles', '?')} bundles: 1/(1+overhead)")
                values.append(1 / (1 + r["overhead_fraction"]))
        elif d["benchmark"] == "wide_step":
            labels.append(f"wide step: achieved / measured GEMM FLOP/s ({dev})")
            values.append(d["fraction_of_measured_gemm"])
        elif d["benchmark"] == "forging_rare_event":
            for r in d.get("results", []):
                naive = r.get("naive_mc_gradient_evals_for_same_stated_se_analytic")
                if r["estimator"].startswith("subset_simulation") and naive and r.get("n_gradient_evals"):
                    labels.append(f"forging p={r['p']:.0e} {r['estimator']}: naive MC evals (analytic) / evals")
                    values.append(naive / r["n_gradient_evals"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(values) + 1.5))
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.set_xscale("log")
    ax.axvline(1, color="k", lw=0.8)
    ax.set_xlabel("ratio (higher is better; measured, see benchmarks/results/*.json)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the small settings of each benchmark")
    ap.add_argument("--only", nargs="*", default=list(BENCHES))
    a = ap.parse_args(argv)
    failed = []
    for name in a.only:
        full, quick = BENCHES[name]
        cmd = [sys.executable, str(HERE / f"{name}.py"), *(quick if a.quick else full)]
        print("$", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
    print("wrote", plot(RESULTS / "ratios.png"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
