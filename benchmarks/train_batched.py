"""The stacked training step (paper 002 kernels) against what a researcher would otherwise write.

A grid of shapes (n samples, d features, k width) x E nets x dtype. Every row trains the same E
nets on the same data for the same number of full-batch GD steps (constant LR, exp loss: the
log-space step of tasks/train/gd.py is then plain GD, θ ← θ - lr ∇L) with each method:

- ``kktlab``: ``tasks.train.train`` (stacked, chunked to the cache on the CPU);
- ``kktlab_compiled``: the same with ``compile=True`` (blocks of ``gd.STEPS_PER_CALL`` steps per
  compiled call; compile time reported apart and amortised like the compiled ensemble's);
- ``kktlab_whole``: the same with the whole stack in one kernel call (``chunk=E``);
- ``loop``: a Python loop over nets, each an ``nn.Module`` (Linear + ReLU + Linear) with
  ``torch.optim.SGD`` and autograd;
- ``vmap``: a ``torch.func`` ensemble (``vmap(grad(loss))`` over stacked parameters);
- ``vmap_compiled``: the same step under ``torch.compile`` (compile time reported apart, and
  amortised over ``--amortise-steps`` steps in ``us_per_net_step_amortised``);
- ``vmap_compiled_chunked``: the compiled ensemble run in kktlab's own chunks of nets
  (``auto_chunk`` + ``even_chunk``, each chunk all its steps before the next: the best simple form
  of the peer, issue 33); kktlab is compared with the faster of the two compiled ensembles;
- ``gemm``: a dense (1024 x 1024) GEMM of the row's dtype, the reference rate, and the step's own
  two batched GEMMs alone (``step_gemms_gflops``: the most the step can reach at that shape).

Each method runs in a fresh process per repeat (``--repeats``, methods interleaved in a rotated
order), one torch thread, under the environment kktlab gives its Dask workers
(``deploy.runtime.QUIET_ENV`` + ``OMP_NUM_THREADS=1``; ``--bare-env`` drops the allocator
settings). Rows report min and median time per net-step, wall and CPU time (user + sys of the
process: on a shared machine it leaves out the time other jobs held the core), GFLOP/s (4ndk + 4nk FLOP per net-step),
the fraction of the GEMM rate measured in the same row, peak RSS, minor page faults per step,
the load average, and the largest parameter difference of each method from ``kktlab`` over all
nets. Writes benchmarks/results/train_batched.json (``--quick``: train_batched_quick.json).

    python benchmarks/train_batched.py [--quick] [--repeats 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("kktlab", "kktlab_compiled", "kktlab_whole", "loop", "vmap", "vmap_compiled", "vmap_compiled_chunked")
PEERS = ("vmap_compiled", "vmap_compiled_chunked")  # the compiled ensembles kktlab is compared with
LR = 1e-3


def flops_per_net_step(n, d, k):
    return 4 * n * d * k + 4 * n * k  # two (n,d,k) GEMMs (forward H, backward G^T X), two thin ones for v


def child(a) -> dict:
    """One method, one repeat, in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    out = {"method": a.method, "load_avg_1m": os.getloadavg()[0]}
    if a.method == "gemm":
        A, B = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        torch.mm(A, B)
        ts, cs = [], []
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            torch.mm(A, B)
            ts.append(time.perf_counter() - t0), cs.append(time.process_time() - c0)
        out["gflops"] = 2 * 1024**3 / min(ts) / 1e9
        out["gflops_cpu"] = 2 * 1024**3 / min(cs) / 1e9
        # the step's own two GEMMs alone (forward X W^T, update G^T X), chunked like kktlab: the
        # rate the step could reach if everything else were free at this shape
        from tasks import train

        c = train.auto_chunk(a.E, a.n, a.k, dtype, "cpu")
        X, W, G = (torch.randn(c, *s, dtype=dtype) for s in ((a.n, a.d), (a.k, a.d), (a.n, a.k)))
        reps = max(3, 2000 // c)
        ts, cs = [], []
        for _ in range(6):
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(reps):
                torch.bmm(X, W.transpose(1, 2))
                W.baddbmm_(G.transpose(1, 2), X, alpha=1e-12)
            ts.append(time.perf_counter() - t0), cs.append(time.process_time() - c0)
        out["step_gemms_gflops"] = 4 * a.n * a.d * a.k * c * reps / min(ts[1:]) / 1e9
        out["step_gemms_gflops_cpu"] = 4 * a.n * a.d * a.k * c * reps / min(cs[1:]) / 1e9
        return out
    run = setup(a, out)
    from torch._dynamo.utils import counters

    graphs0 = counters["stats"]["unique_graphs"]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    res = run()
    t = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out["compiles_while_timed"] = counters["stats"]["unique_graphs"] - graphs0
    if isinstance(res, list):  # loop
        res = tuple(torch.stack(t) for t in zip(*res))
    elif not isinstance(res, tuple):
        res = (res.W, res.b, res.v)
    torch.save(tuple(r.contiguous() for r in res), a.params_out)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)  # excludes time descheduled by other users
    E, steps = a.E, a.steps
    out.update(seconds=t, us_per_net_step=t / (E * steps) * 1e6, cpu_us_per_net_step=cpu / (E * steps) * 1e6,
               faults_per_step=(r1.ru_minflt - r0.ru_minflt) / steps, peak_rss_mb=r1.ru_maxrss / 1024)
    return out


def setup(a, out: dict):
    """Method ``a.method``'s training of the row's E nets for ``a.steps`` steps, as a function of no
    arguments, after its warm-up (compiled methods: their compile, timed into ``out["compile_s"]``,
    inductor's import included). Used by :func:`child` and by benchmarks/train_peer.py."""
    import torch

    dtype = getattr(torch, a.dtype)
    from tasks import data, train

    E, n, d, k, steps = a.E, a.n, a.d, a.k, a.steps
    net, X, y = data.synthetic_stack(range(E), d, n, k, dtype=dtype)
    sched = train.Schedule(lr0=LR, period=10**9, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    W, b, v = net.W.clone(), net.b.clone(), net.v.clone()
    if a.method in ("kktlab", "kktlab_whole", "kktlab_compiled"):
        chunk = E if a.method == "kktlab_whole" else None
        comp = a.method == "kktlab_compiled"
        t0 = time.perf_counter()
        train.train(net, X, y, sched, max_steps=2 * train.gd.STEPS_PER_CALL, chunk=chunk, compile=comp)  # warm-up: the block graph compiles (inductor's import included)
        if comp:
            out["compile_s"] = time.perf_counter() - t0

        def run():
            return train.train(net, X, y, sched, max_steps=steps, chunk=chunk, compile=comp).net
    elif a.method == "loop":
        def run(E=E, steps=steps):
            res = []
            for e in range(E):
                m = torch.nn.Sequential(torch.nn.Linear(d, k, dtype=dtype), torch.nn.ReLU(),
                                        torch.nn.Linear(k, 1, bias=False, dtype=dtype))
                with torch.no_grad():
                    m[0].weight.copy_(W[e]), m[0].bias.copy_(b[e]), m[2].weight.copy_(v[e:e + 1])
                opt = torch.optim.SGD(m.parameters(), lr=LR)
                for _ in range(steps):
                    opt.zero_grad()
                    torch.exp(-y[e] * m(X[e]).squeeze(-1)).mean().backward()
                    opt.step()
                res.append((m[0].weight.detach(), m[0].bias.detach(), m[2].weight.detach()[0]))
            return res

        run(1, 2)  # warm-up (autograd, optimizer) on net 0
    else:
        from torch.func import grad, vmap

        def loss(p, x, t):
            h = torch.relu(x @ p[0].T + p[1])
            return torch.exp(-t * (h @ p[2])).mean()

        g_all = vmap(grad(loss))

        def step(p, x, t):
            g = g_all(p, x, t)
            return tuple(pi - LR * gi for pi, gi in zip(p, g))

        # the chunked ensemble: kktlab's own chunks (auto_chunk, even_chunk), each chunk of nets
        # all its steps before the next, so its activations stay in the cache (issue 33)
        c = train.gd.even_chunk(E, train.auto_chunk(E, n, k, dtype, "cpu")) if a.method.endswith("_chunked") else E
        if a.method.startswith("vmap_compiled"):
            # the clock starts before torch.compile(), which imports inductor (~2 s here): kktlab's
            # warm-up above pays that import inside its first call as well
            t0 = time.perf_counter()
            step = torch.compile(step, dynamic=False)
            for lo in range(0, E, c):  # every chunk shape (a smaller last chunk is one more graph)
                step((W[lo:lo + c], b[lo:lo + c], v[lo:lo + c]), X[lo:lo + c], y[lo:lo + c])
            out["compile_s"] = time.perf_counter() - t0
        else:
            step((W, b, v), X, y)

        def run():
            parts = []
            for lo in range(0, E, c):
                p, s = (W[lo:lo + c], b[lo:lo + c], v[lo:lo + c]), slice(lo, lo + c)
                for _ in range(steps):
                    p = step(p, X[s], y[s])
                parts.append(p)
            return tuple(torch.cat(t) for t in zip(*parts))
    return run


def worker_env(bare: bool) -> dict:
    from deploy.runtime import QUIET_ENV

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for key, val in QUIET_ENV.items():
        if bare and key.startswith("MALLOC_"):
            env.pop(key, None)
        else:
            env.setdefault(key, val)
    return env


def run_child(method, shape, E, steps, params_out, env):
    n, d, k, dtype = shape
    args = [sys.executable, __file__, "--child", method, "--n", str(n), "--d", str(d), "--k", str(k),
            "--dtype", dtype, "--E", str(E), "--steps", str(steps), "--params-out", params_out]
    p = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return {"method": method, "error": p.stderr[-800:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def grid_row(shape, E, a, env, tmp) -> dict:
    import torch

    n, d, k, dtype = shape
    steps = max(a.min_steps, a.net_steps // E)
    methods = [m for m in a.methods if not (m == "loop" and E * steps > a.max_loop_net_steps)]
    runs = {m: [] for m in (*methods, "gemm")}
    params = {}
    for r in range(a.repeats):
        order = methods[r % len(methods):] + methods[:r % len(methods)]
        for m in ["gemm", *order]:
            pth = os.path.join(tmp, f"{m}.pt")
            out = run_child(m, shape, E, steps, pth, env)
            runs[m].append(out)
            if m != "gemm" and "error" not in out and m not in params:
                params[m] = torch.load(pth)
    gemm = max(o["gflops"] for o in runs["gemm"] if "gflops" in o)
    step_gemms = max(o["step_gemms_gflops"] for o in runs["gemm"] if "gflops" in o)
    gemm_cpu = max(o["gflops_cpu"] for o in runs["gemm"] if "gflops" in o)
    step_gemms_cpu = max(o["step_gemms_gflops_cpu"] for o in runs["gemm"] if "gflops" in o)
    fl = flops_per_net_step(n, d, k)
    row = {"n": n, "d": d, "k": k, "dtype": dtype, "E": E, "steps": steps, "gemm_gflops": gemm,
           "step_gemms_gflops": step_gemms, "gemm_gflops_cpu": gemm_cpu, "step_gemms_gflops_cpu": step_gemms_cpu,
           "methods": {}}
    ref = params.get("kktlab")
    for m in methods:
        ok = [o for o in runs[m] if "us_per_net_step" in o]
        if not ok:
            row["methods"][m] = {"error": runs[m][0].get("error")}
            continue
        us = [o["us_per_net_step"] for o in ok]
        cpu = [o["cpu_us_per_net_step"] for o in ok]
        rec = {"us_per_net_step_min": min(us), "us_per_net_step_median": statistics.median(us),
               "cpu_us_per_net_step_min": min(cpu), "cpu_us_per_net_step_median": statistics.median(cpu),
               "gflops_at_min": fl / (min(us) * 1e-6) / 1e9, "runs": ok,
               "max_param_diff_vs_kktlab": (max(float((x - y).abs().max()) for x, y in zip(params[m], ref))
                                           if ref is not None and m in params else None)}
        rec["fraction_of_gemm"] = rec["gflops_at_min"] / gemm
        rec["fraction_of_step_gemms"] = rec["gflops_at_min"] / step_gemms
        # CPU time (user + sys of the process): on a shared machine it leaves out the time other
        # users' jobs held the core, which wall time does not
        rec["gflops_cpu_at_min"] = fl / (min(cpu) * 1e-6) / 1e9
        rec["fraction_of_gemm_cpu"] = rec["gflops_cpu_at_min"] / gemm_cpu
        rec["fraction_of_step_gemms_cpu"] = rec["gflops_cpu_at_min"] / step_gemms_cpu
        if m in (*PEERS, "kktlab_compiled"):
            cs = min(o["compile_s"] for o in ok)
            rec["compile_s_min"] = cs
            rec["us_per_net_step_amortised"] = min(us) + cs / (E * a.amortise_steps) * 1e6
            rec["cpu_us_per_net_step_amortised"] = min(cpu) + cs / (E * a.amortise_steps) * 1e6
        row["methods"][m] = rec
    compare(row, (a.amortise_steps, 10 * a.amortise_steps))
    base = row["methods"].get("kktlab", {}).get("us_per_net_step_min")
    for m, rec in row["methods"].items():
        if base and "us_per_net_step_min" in rec:
            rec["kktlab_speedup"] = rec["us_per_net_step_min"] / base
            if "us_per_net_step_amortised" in rec:
                rec["kktlab_speedup_amortised"] = rec["us_per_net_step_amortised"] / base
    return row


def compare(row, run_lengths) -> None:
    """kktlab's best mode against the compiled ensemble, in place: ``row["vs_compiled_vmap"]`` has,
    in wall and in CPU time, the steady state (best of eager and compiled at their minimum time)
    and each run length in ``run_lengths`` (compile time amortised over that many steps of the E
    nets; eager has none; compile time is wall time in both clocks), each with the mode that wins
    there and the ratio (> 1: kktlab faster). The peer is the faster of the compiled ensembles
    measured (``PEERS``: unchunked and chunked like kktlab, issue 33) at that run length, named in
    ``peer``; ``ratio_<peer>`` gives the ratio against each."""
    ms = row["methods"]
    modes = [m for m in ("kktlab", "kktlab_compiled") if "us_per_net_step_min" in ms.get(m, {})]
    peers = [m for m in PEERS if "us_per_net_step_min" in ms.get(m, {})]
    if not modes or not peers:
        return
    out = {}
    for clock in ("", "cpu_"):
        def per_net(rec, steps):
            extra = 0.0 if steps is None else rec.get("compile_s_min", 0.0) / (row["E"] * steps) * 1e6
            return rec[f"{clock}us_per_net_step_min"] + extra

        for steps in (None, *run_lengths):
            times = {m: per_net(ms[m], steps) for m in modes}
            best = min(times, key=times.get)
            ref = {m: per_net(ms[m], steps) for m in peers}
            peer = min(ref, key=ref.get)
            key = ("steady" if steps is None else f"amortised_{steps}_steps") + ("_cpu" if clock else "")
            out[key] = {"best": best, "peer": peer, "ratio": ref[peer] / times[best],
                        **{f"ratio_{m}": ref[m] / times[best] for m in peers}}
    row["vs_compiled_vmap"] = out


def summary(row) -> str:
    ms = row["methods"]
    head = (f"n{row['n']} d{row['d']} k{row['k']} {row['dtype']} E{row['E']:5d}: kktlab "
            f"{ms.get('kktlab', {}).get('us_per_net_step_min', float('nan')):7.1f} us/net-step "
            f"({ms.get('kktlab', {}).get('fraction_of_gemm', float('nan')):.0%} of GEMM {row['gemm_gflops']:.0f} GF/s)")
    parts = [head]
    for key, res in row.get("vs_compiled_vmap", {}).items():
        if key.endswith("_cpu"):
            parts.append(f"{key[:-4]}: {res['best']} {res['ratio']:.2f}x {res['peer']}")
    for m in METHODS[1:]:
        if m in ms and "kktlab_speedup" in ms[m]:
            parts.append(f"{m} {ms[m]['kktlab_speedup']:.2f}x")
    return "  ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one shape (n=d=50, k=100, float64), 2 repeats")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--E", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--net-steps", type=int, default=20480, help="net-steps per method and repeat (steps = this / E)")
    ap.add_argument("--min-steps", type=int, default=40, help="at least this many steps (one-off costs per call)")
    ap.add_argument("--max-loop-net-steps", type=int, default=20480, help="skip the loop above this")
    ap.add_argument("--amortise-steps", type=int, default=10_000, help="run length for amortising compile time")
    ap.add_argument("--shape", nargs=4, action="append", metavar=("N", "D", "K", "DTYPE"),
                    help="run only these shapes (repeatable); the JSON is named after them")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--bare-env", action="store_true", help="without the workers' malloc settings")
    ap.add_argument("--out", help="JSON name (default from --quick / --shape)")
    ap.add_argument("--child")
    ap.add_argument("--n", type=int), ap.add_argument("--d", type=int), ap.add_argument("--k", type=int)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--params-out")
    a = ap.parse_args(argv)
    if a.child:
        a.method = a.child
        a.E = a.E[0]
        print(json.dumps(child(a)))
        return
    from benchmarks.common import write

    shapes = [(50, 50, 100, "float64")] if a.quick else [(20, 20, 32, "float32"), (50, 50, 100, "float64"),
                                                          (50, 50, 100, "float32")]
    if a.shape:
        shapes = [(int(n), int(d), int(k), dt) for n, d, k, dt in a.shape]
    if a.quick:
        a.repeats = min(a.repeats, 2)
    env = worker_env(a.bare_env)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            for E in a.E:
                row = grid_row(shape, E, a, env, tmp)
                rows.append(row)
                print(summary(row), flush=True)
    name = "train_batched_quick" if a.quick else "train_batched"
    name += "".join(f"_n{n}d{d}k{k}{dt}" for n, d, k, dt in shapes) if a.shape else ""
    name += "_bare_env" if a.bare_env else ""
    name = a.out or name
    path = write(name, {"env": {k: env.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                       "OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
                        "repeats": a.repeats, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
