"""kktlab's training step against the best simple form of its peer, with cold and warm compiles (issue 33).

For each row (n, d, k, dtype, E) of the grid of benchmarks/train_batched.py (whose ``setup``
builds every method here, so the maths and the warm-ups are the same):

1. **Compile, cold and warm**, for each compiled method (``kktlab_compiled``; the compiled
   ``torch.func`` ensemble unchunked, ``vmap_compiled``, and chunked as kktlab chunks,
   ``vmap_compiled_chunked``): a fresh process with an empty inductor cache
   (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder: a fresh machine or worker) times the first
   compiled call, inductor's import included (**cold**); a second fresh process on the same,
   now populated, folder does it again (**warm**: the next worker on that machine).
2. **Steady state, interleaved in one process**: one process builds all methods (compiling once
   each), then runs ``--rounds`` rounds, each method once per round in a rotated order; the
   minimum CPU time (user + sys: on a shared machine it leaves out the time other jobs held the
   core) and wall time per net-step of each method. Ratios are taken within the process, so the
   machine's drift between processes does not enter them.
3. **Where compile pays**: kktlab's break-even step count (compile seconds over the seconds the
   compiled step saves per step of the E nets, cold and warm), and kktlab's best mode (eager or
   compiled, compile included) against the faster compiled ensemble over runs of
   ``--run-lengths`` steps, each side's compile cold and warm.

Writes benchmarks/results/train_peer.json (``--quick``: train_peer_quick.json).

    python benchmarks/train_peer.py [--quick] [--rounds 3] [--net-steps 10240]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.train_batched import PEERS, setup, worker_env  # noqa: E402

METHODS = ("kktlab", "kktlab_compiled", *PEERS)
COMPILED = ("kktlab_compiled", *PEERS)


def child(a) -> dict:
    """``--child compile``: one method's compile in this fresh process; ``--child steady``: every
    method in this process, interleaved."""
    import torch

    torch.set_num_threads(1)
    if a.child == "compile":
        out = {"method": a.method, "load_avg_1m": os.getloadavg()[0]}
        setup(a, out)
        return out
    from torch._dynamo.utils import counters

    runs, out = {}, {"load_avg_1m_start": os.getloadavg()[0], "compile_in_process_s": {}}
    for m in METHODS:
        rec: dict = {}
        runs[m] = setup(argparse.Namespace(**{**vars(a), "method": m}), rec)
        if "compile_s" in rec:
            out["compile_in_process_s"][m] = rec["compile_s"]
    graphs0 = counters["stats"]["unique_graphs"]
    times = {m: {"wall": [], "cpu": []} for m in METHODS}
    for r in range(a.rounds):
        order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
        for m in order:
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            runs[m]()
            t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            times[m]["wall"].append(t / (a.E * a.steps) * 1e6)
            times[m]["cpu"].append(cpu / (a.E * a.steps) * 1e6)
    out.update(times=times, compiles_while_timed=counters["stats"]["unique_graphs"] - graphs0,
               load_avg_1m_end=os.getloadavg()[0])
    return out


def run_child(kind, method, shape, E, steps, rounds, env) -> dict:
    n, d, k, dtype = shape
    args = [sys.executable, __file__, "--child", kind, "--method", method, "--n", str(n), "--d", str(d),
            "--k", str(k), "--dtype", dtype, "--E", str(E), "--steps", str(steps), "--rounds", str(rounds)]
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        return {"method": method, "error": p.stderr[-1500:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_cpu_s"] = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)  # imports included
    return out


def row(shape, E, a, env, tmp) -> dict:
    n, d, k, dtype = shape
    steps = max(a.min_steps, a.net_steps // E)
    res = {"n": n, "d": d, "k": k, "dtype": dtype, "E": E, "steps": steps, "compile": {}}
    for m in COMPILED:
        cache = os.path.join(tmp, f"inductor_{m}_n{n}d{d}k{k}{dtype}_E{E}")
        e = dict(env, TORCHINDUCTOR_CACHE_DIR=cache)
        cold = run_child("compile", m, shape, E, steps, 1, e)
        warm = run_child("compile", m, shape, E, steps, 1, e)
        res["compile"][m] = {"cold_s": cold.get("compile_s"), "warm_s": warm.get("compile_s"),
                             "cold_process_cpu_s": cold.get("process_cpu_s"),
                             "warm_process_cpu_s": warm.get("process_cpu_s"),
                             "load_avg_1m": [cold.get("load_avg_1m"), warm.get("load_avg_1m")],
                             **({"error": cold.get("error") or warm.get("error")}
                                if "error" in cold or "error" in warm else {})}
    steady = run_child("steady", "all", shape, E, steps, a.rounds, env)
    if "error" in steady:
        res["error"] = steady["error"]
        return res
    res["steady"] = {m: {"us_per_net_step_min": min(t["wall"]), "cpu_us_per_net_step_min": min(t["cpu"]),
                         "cpu_us_per_net_step_all": t["cpu"]} for m, t in steady["times"].items()}
    res["compile_in_process_s"] = steady["compile_in_process_s"]
    res["compiles_while_timed"] = steady["compiles_while_timed"]
    res["load_avg_1m"] = [steady["load_avg_1m_start"], steady["load_avg_1m_end"]]
    analyse(res, a.run_lengths)
    return res


def analyse(res, run_lengths) -> None:
    """Steady ratios, kktlab's break-even step counts and the amortised comparison, in CPU time per
    net-step (compile time is wall time: it is what a run waits for)."""
    st, comp, E = res["steady"], res["compile"], res["E"]
    cpu = {m: st[m]["cpu_us_per_net_step_min"] for m in st}
    best = min(("kktlab", "kktlab_compiled"), key=cpu.get)
    res["steady_ratio"] = {p: cpu[p] / cpu[best] for p in PEERS}  # > 1: kktlab's best mode faster
    res["steady_best_kktlab"] = best
    res["compiled_over_eager"] = cpu["kktlab_compiled"] / cpu["kktlab"]
    saved = (cpu["kktlab"] - cpu["kktlab_compiled"]) * E * 1e-6  # seconds saved per step of the E nets
    res["break_even_steps"] = {c: (comp["kktlab_compiled"][f"{c}_s"] / saved if saved > 0 else None)
                               for c in ("cold", "warm")}
    out = {}
    for c in ("cold", "warm"):
        for steps in run_lengths:
            def per_net(m):
                return cpu[m] + (comp[m][f"{c}_s"] / (E * steps) * 1e6 if m in comp else 0.0)

            mine = {m: per_net(m) for m in ("kktlab", "kktlab_compiled")}
            peer = {m: per_net(m) for m in PEERS}
            bm, bp = min(mine, key=mine.get), min(peer, key=peer.get)
            out[f"{c}_{steps}"] = {"kktlab": bm, "peer": bp, "ratio": peer[bp] / mine[bm],
                                   "ratio_compiled_kktlab_vs_peer": peer[bp] / mine["kktlab_compiled"]}
    res["amortised"] = out


def summary(r) -> str:
    if "error" in r:
        return f"n{r['n']} {r['dtype']} E{r['E']}: error {r['error'][-300:]}"
    c = r["compile"]
    comp = "  ".join(f"{m} compile cold {c[m]['cold_s']:.1f} s warm {c[m]['warm_s']:.1f} s" for m in COMPILED)
    st = "  ".join(f"{m} {v['cpu_us_per_net_step_min']:.2f}" for m, v in r["steady"].items())
    be = r["break_even_steps"]
    am = "  ".join(f"{k}: {v['kktlab']} {v['ratio']:.2f}x {v['peer']}" for k, v in r["amortised"].items())
    return (f"n{r['n']} d{r['d']} k{r['k']} {r['dtype']} E{r['E']}: cpu us/net-step {st}; steady "
            + ", ".join(f"{r['steady_best_kktlab']} {x:.2f}x {p}" for p, x in r["steady_ratio"].items())
            + f"; {comp}; break-even cold {fmt(be['cold'])} warm {fmt(be['warm'])} steps; {am}")


def fmt(x) -> str:
    return "never" if x is None else f"{x:.0f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n=d=50 k=100 float64 at E = 16, 256 and n=d=20 k=32 "
                    "float32 at E = 256 (the rows where the issue saw compile lose)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--E", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--net-steps", type=int, default=10240)
    ap.add_argument("--min-steps", type=int, default=40)
    ap.add_argument("--run-lengths", type=int, nargs="+", default=[1000, 5000, 10_000, 100_000])
    ap.add_argument("--shape", nargs=4, action="append", metavar=("N", "D", "K", "DTYPE"))
    ap.add_argument("--child"), ap.add_argument("--method")
    ap.add_argument("--n", type=int), ap.add_argument("--d", type=int), ap.add_argument("--k", type=int)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--steps", type=int)
    a = ap.parse_args(argv)
    if a.child:
        a.E = a.E[0]
        print(json.dumps(child(a)))
        return
    from benchmarks.common import write

    if a.shape:
        rows_todo = [((int(n), int(d), int(k), dt), E) for n, d, k, dt in a.shape for E in a.E]
    elif a.quick:
        rows_todo = [((50, 50, 100, "float64"), 16), ((50, 50, 100, "float64"), 256), ((20, 20, 32, "float32"), 256)]
    else:
        rows_todo = [(s, E) for s in ((20, 20, 32, "float32"), (50, 50, 100, "float64"), (50, 50, 100, "float32"))
                     for E in a.E]
    env = worker_env(False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, E in rows_todo:
            rows.append(row(shape, E, a, env, tmp))
            print(summary(rows[-1]), flush=True)
    path = write("train_peer_quick" if a.quick else "train_peer",
                 {"rounds": a.rounds, "net_steps": a.net_steps,
                  "env": {k: env.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS",
                                                  "OMP_WAIT_POLICY", "TORCHINDUCTOR_COMPILE_THREADS")},
                  "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
