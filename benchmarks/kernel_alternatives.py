"""kktlab's other hot kernels against the best simple alternative a user would write (issue 19).

Each kernel's problem is built once by the parent (not timed) and saved; every method then runs in
a fresh process per repeat (``--repeats``, methods interleaved in a rotated order), one torch
thread, the Dask workers' environment. A child calls its method once untimed (warm-up; for
``torch.compile`` methods this is the compile, reported as ``first_call_s``), then ``--inner``
timed calls: min wall and CPU time (CPU time excludes the time other users' jobs held the core).
Every method's full answer is compared with kktlab's (largest absolute and relative difference).

- ``cstar`` (paper 002 §2.9, ``attacks.c_star_exact``) on E trained nets: vs ``c_star_bisection``
  (60-step bisection on the flip predicate, batched over the nets: what a user would write), and
  the exact kernel called net by net.
- ``kkt`` (paper 001 K1, ``kkt.kkt_measure`` with NNLS multipliers) on E nets x A step sizes α:
  vs ``scipy.optimize.nnls`` per problem on the explicit p x m gradient matrix, and a batched
  projected-gradient NNLS in plain torch on the Gram matrix (step 1/λ_max, ``--pg-iters`` steps,
  residual formed explicitly).
- ``forging`` (paper 000, ``forging.models.grad_w``: ∇_w f of a batch of points, in closed form as
  batched matrix products since issue 19): vs torch.func ``vmap(grad)`` (kktlab's kernel before),
  the same under ``torch.compile``, and a per-point autograd loop.

    python benchmarks/kernel_alternatives.py [all|cstar|kkt|forging] [--repeats 3] [--inner 2]
"""

from __future__ import annotations

import argparse
import json
import math
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

import torch  # noqa: E402

METHODS = {"cstar": ("kktlab", "bisection_batched", "kktlab_loop"),
           "kkt": ("kktlab", "scipy_nnls_loop", "torch_pg_batched"),
           "forging": ("kktlab", "vmap_grad", "vmap_compiled", "autograd_loop")}


# ----- problems (parent, not timed) -------------------------------------------------------------

def problem_cstar(a) -> dict:
    from tasks import attacks, data, kkt, train

    net, X, y = data.synthetic_stack(range(a.E), a.d, a.m, a.k)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-8, max_iters=4000))
    I = kkt.margin_set(y * st.net(X), torch.ones_like(y, dtype=torch.bool))
    z = attacks.margin_direction(st.net, X, y, I)
    cap = torch.full((a.E,), 20 * math.sqrt(a.d), dtype=X.dtype)
    return {"W": st.net.W, "b": st.net.b, "v": st.net.v, "X": X, "y": y, "I": I, "z": z, "cap": cap}


def problem_kkt(a) -> dict:
    from benchmarks.kkt_measure import sweep

    W_hat, u, X, y, keep = sweep(a.E, a.A, a.d, a.m, a.n, a.epochs)
    return {"W": W_hat, "u": u, "X": X, "y": y, "keep": keep}


def problem_forging(a) -> dict:
    from tasks.forging.models import make_model

    g = torch.Generator().manual_seed(0)
    model = make_model("relu1", a.d, a.n, g)
    Xp = torch.randn(a.N, a.d + 1, dtype=torch.float64, generator=g)
    return {"w": model.w, "X": Xp, "d": a.d, "n": a.n}


# ----- methods (child) --------------------------------------------------------------------------

def method_cstar(name, p):
    from tasks import attacks, nets

    net = nets.TwoLayer(p["W"], p["b"], p["v"])
    args = (net, p["X"], p["y"], p["I"], p["z"])
    if name == "kktlab":
        return lambda: attacks.c_star_exact(*args, cap=p["cap"]).c_star
    if name == "bisection_batched":
        return lambda: attacks.c_star_bisection(*args, cap=p["cap"])

    def loop():
        out = []
        for e in range(net.E):
            s = slice(e, e + 1)
            out.append(attacks.c_star_exact(net.select(s), p["X"][s], p["y"][s], p["I"][s], p["z"][s],
                                            cap=p["cap"][s]).c_star)
        return torch.cat(out)
    return loop


def method_kkt(name, p, pg_iters=5000):
    from tasks.kkt.measure import gram, kkt_measure, outputs, relu_grad

    W, u, X, y, keep = p["W"], p["u"], p["X"], p["y"], p["keep"]  # W (E,A,n,d), u (E,n), X (E,m,d)
    E, A = W.shape[:2]
    if name == "kktlab":
        return lambda: kkt_measure(W, u[:, None], X[:, None], y[:, None], keep[:, None]).eps

    def scipy_loop():
        from scipy.optimize import nnls

        out = torch.zeros(E, A, dtype=torch.float64)
        for e in range(E):
            for i in range(A):
                We = W[e, i]
                q = y[e] * (torch.relu(X[e] @ We.T) @ u[e])
                c = 1 / q[keep[e]].min()
                S = relu_grad(We, X[e])
                G = (y[e][:, None, None] * u[e][None, :, None] * S[:, :, None] * X[e][:, None, :])[keep[e]]
                out[e, i] = nnls(G.reshape(G.shape[0], -1).T.numpy(), (c * We).flatten().numpy(), maxiter=10_000)[1]
        return out
    if name == "scipy_nnls_loop":
        return scipy_loop

    def torch_pg():  # batched projected gradient on the Gram matrix, plain torch
        Xb, yb, ub, kb = X[:, None].expand(E, A, *X.shape[1:]), y[:, None].expand(E, A, -1), u[:, None], keep[:, None]
        q = yb * outputs(W, ub, Xb)
        c = 1 / q.masked_fill(~kb, math.inf).amin(-1)
        S = relu_grad(W, Xb)
        K = gram(W, ub, Xb, yb, S) * (kb.unsqueeze(-1) & kb.unsqueeze(-2))
        Wc = W * c[..., None, None]
        G = yb[..., None, None] * ub[..., None, :, None] * S[..., None] * Xb[..., :, None, :]  # (E,A,m,n,d)
        G = G * kb[..., None, None]
        rhs = (G.flatten(-2) * Wc.flatten(-2).unsqueeze(-2)).sum(-1)  # G^T cθ, (E,A,m)
        L = torch.linalg.eigvalsh(K)[..., -1].clamp_min(1e-300)
        lam = torch.zeros_like(rhs)
        for _ in range(pg_iters):
            lam = (lam - ((K @ lam.unsqueeze(-1)).squeeze(-1) - rhs) / L.unsqueeze(-1)).clamp_min(0)
        R = Wc.flatten(-2) - (lam.unsqueeze(-1) * G.flatten(-2)).sum(-2)
        return R.norm(dim=-1)
    return torch_pg


def method_forging(name, p):
    from torch.func import grad, vmap

    from tasks.forging.models import grad_w, make_model

    d, n = int(p["d"]), int(p["n"])
    model = make_model("relu1", d, n, torch.Generator().manual_seed(0))
    w, X = p["w"], p["X"]
    assert torch.equal(model.w, w)
    if name == "kktlab":
        return lambda: grad_w(model, X)
    f = vmap(grad(model.loss, argnums=0), in_dims=(None, 0))  # kktlab's grad_w before issue 19
    if name == "vmap_grad":
        return lambda: f(w, X)
    if name == "vmap_compiled":
        fc = torch.compile(f)
        return lambda: fc(w, X)

    def loop():
        out = []
        for x in X:
            wr = w.clone().requires_grad_()
            out.append(torch.autograd.grad(model.loss(wr, x), wr)[0])
        return torch.stack(out)
    return loop


# ----- harness ------------------------------------------------------------------------------------

def child(a) -> dict:
    torch.set_num_threads(1)
    p = torch.load(a.problem)
    fn = {"cstar": method_cstar, "kkt": lambda m, p: method_kkt(m, p, a.pg_iters),
          "forging": method_forging}[a.kernel](a.child, p)
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    walls, cpus = [], []
    for _ in range(a.inner):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        res = fn()
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        walls.append(t)
        cpus.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
    torch.save(res.detach().contiguous(), a.out)
    return {"method": a.child, "first_call_s": first, "wall_s": walls, "cpu_s": cpus,
            "load_avg_1m": os.getloadavg()[0], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", default="all", choices=["all", *sorted(METHODS)])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inner", type=int, default=2)
    ap.add_argument("--E", type=int), ap.add_argument("--A", type=int, default=16)
    ap.add_argument("--d", type=int), ap.add_argument("--m", type=int), ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--n", type=int), ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--pg-iters", type=int, default=5000)
    ap.add_argument("--methods", nargs="+")
    ap.add_argument("--child"), ap.add_argument("--problem"), ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.kernel == "all":
        rest = [x for x in (sys.argv[1:] if argv is None else argv) if x != "all"]
        for kernel in sorted(METHODS):
            main([kernel, *rest])
        return
    defaults = {"cstar": dict(E=64, d=20, m=40), "kkt": dict(E=4, d=200, m=10, n=64), "forging": dict(d=10, n=32)}
    for key, val in defaults[a.kernel].items():
        setattr(a, key, getattr(a, key) if getattr(a, key) is not None else val)
    if a.child:
        print(json.dumps(child(a)))
        return
    from benchmarks.common import write
    from benchmarks.train_batched import worker_env

    env = worker_env(False)
    methods = a.methods or list(METHODS[a.kernel])
    runs, results = {m: [] for m in methods}, {}
    with tempfile.TemporaryDirectory() as tmp:
        prob = os.path.join(tmp, "problem.pt")
        torch.save({k: v for k, v in globals()[f"problem_{a.kernel}"](a).items()}, prob)
        base = [sys.executable, __file__, a.kernel, "--problem", prob, "--inner", str(a.inner),
                "--pg-iters", str(a.pg_iters)] + [x for k in ("E", "A", "d", "m", "k", "n", "N")
                                                   if getattr(a, k) is not None for x in (f"--{k}", str(getattr(a, k)))]
        for r in range(a.repeats):
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                out = os.path.join(tmp, f"{m}.pt")
                pr = subprocess.run(base + ["--child", m, "--out", out], env=env, capture_output=True, text=True)
                if pr.returncode != 0:
                    runs[m].append({"error": pr.stderr[-800:]})
                    continue
                runs[m].append(json.loads(pr.stdout.strip().splitlines()[-1]))
                results.setdefault(m, torch.load(out))
    ref = results.get("kktlab")
    rows = {}
    for m in methods:
        ok = [o for o in runs[m] if "wall_s" in o]
        if not ok:
            rows[m] = {"error": runs[m][0].get("error")}
            continue
        wall, cpu = [min(o["wall_s"]) for o in ok], [min(o["cpu_s"]) for o in ok]
        rec = {"wall_s_min": min(wall), "wall_s_median": statistics.median(wall), "cpu_s_min": min(cpu),
               "cpu_s_median": statistics.median(cpu), "first_call_s_min": min(o["first_call_s"] for o in ok),
               "runs": ok}
        if ref is not None and m in results:
            x, y = results[m].to(torch.float64), ref.to(torch.float64)
            fin = torch.isfinite(y) & torch.isfinite(x)
            rec["finite_agree"] = bool(torch.equal(torch.isfinite(x), torch.isfinite(y)))
            diff = (x - y).abs()[fin]
            rec["max_abs_diff_vs_kktlab"] = float(diff.max()) if diff.numel() else 0.0
            rec["max_rel_diff_vs_kktlab"] = float((diff / y.abs()[fin].clamp_min(1e-300)).max()) if diff.numel() else 0.0
        rows[m] = rec
    if "wall_s_min" in rows.get("kktlab", {}):
        for m, rec in rows.items():
            if "wall_s_min" in rec:
                rec["kktlab_speedup_wall"] = rec["wall_s_min"] / rows["kktlab"]["wall_s_min"]
                rec["kktlab_speedup_cpu"] = rec["cpu_s_min"] / rows["kktlab"]["cpu_s_min"]
    for m, rec in rows.items():
        print(f"{a.kernel:8s} {m:18s} " + ("ERROR " + rec["error"][-300:] if "error" in rec else
              f"min {rec['wall_s_min']:.4f} s (cpu {rec['cpu_s_min']:.4f} s)  median {rec['wall_s_median']:.4f} s  "
              f"kktlab {rec.get('kktlab_speedup_wall', float('nan')):.2f}x faster  "
              f"max |diff| {rec.get('max_abs_diff_vs_kktlab', float('nan')):.2g} "
              f"(rel {rec.get('max_rel_diff_vs_kktlab', float('nan')):.2g})"))
    shape = {k: getattr(a, k) for k in ("E", "A", "d", "m", "k", "n", "N", "pg_iters") if getattr(a, k) is not None}
    path = write(f"kernel_alternatives_{a.kernel}", {"kernel": a.kernel, "shape": shape, "repeats": a.repeats,
                                                     "inner": a.inner, "env": {k: env.get(k) for k in (
                                                         "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                         "OMP_NUM_THREADS")}, "methods": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
