"""Cold and warm compile of kktlab's compiled training step, each in a fresh process (issue 46).

The first call of ``tasks.train.train(..., compile=True)`` (gpu_session.sh's small-net part: E = 1024
stacked nets, n, d, k = 50, 50, 100, fp32, 2·STEPS_PER_CALL steps) with an EMPTY inductor and Triton
cache (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR: a fresh folder), then again in fresh processes on
the same, now warm, folder (default cache settings, then TORCHINDUCTOR_FX_GRAPH_CACHE=1 and
TORCHINDUCTOR_AUTOGRAD_CACHE=1 said explicitly), then what could bring a fresh worker's compile
down: the cache artifacts of the cold run (torch.compiler.save_cache_artifacts: what a worker could
ship) loaded into another empty folder, and smaller compiled blocks (steps_per_call = 1: one step
per graph instead of a Gram block of 4).

    python benchmarks/cold_compile.py --out DIR [--device cuda] [--budget-s 75]
    python benchmarks/cold_compile.py --out /tmp/cc --device cpu --E 8 --shape 10,10,20 --runs cold,warm

Each child prints one ``RESULT {json}`` line; the driver writes ``cold_compile_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# name -> (cache folder key, steps_per_call, explicit FX/autograd cache flags, load artifacts of run)
RUNS = {
    "cold": ("A", 4, False, None),
    "warm": ("A", 4, False, None),
    "warm_fx_autograd_cache_on": ("A", 4, True, None),
    "cold_with_shipped_artifacts": ("B", 4, False, "cold"),
    "cold_block1": ("C", 1, False, None),
    "warm_block1": ("C", 1, False, None),
    "cold_fx_autograd_cache_on": ("D", 4, True, None),
}
DEFAULT_RUNS = ",".join(RUNS)


def du(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def child(a) -> None:
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter() - t0
    sys.path.insert(0, str(ROOT))
    from tasks import data, train

    t_tasks = time.perf_counter() - t0 - t_torch
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        return time.perf_counter() - t, out

    res = {"pid": os.getpid(), "python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda, "t_import_torch_s": t_torch, "t_import_tasks_s": t_tasks,
           "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
           "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE"),
           "TORCHINDUCTOR_AUTOGRAD_CACHE": os.environ.get("TORCHINDUCTOR_AUTOGRAD_CACHE")}
    try:
        import torch._functorch.config as fcfg
        import torch._inductor.config as icfg

        res["config_fx_graph_cache"] = getattr(icfg, "fx_graph_cache", None)
        res["config_autograd_cache"] = getattr(fcfg, "enable_autograd_cache", None)
    except Exception as exc:  # noqa: BLE001
        res["config_error"] = str(exc)[:200]
    if dev.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name()
    n, d, k = (int(x) for x in a.shape.split(","))
    t, (net, X, y) = timed(lambda: data.synthetic_stack(range(a.E), d, n, k, dtype=torch.float32, device=dev))
    res["t_data_s"] = t
    if a.load_artifacts:
        blob = pathlib.Path(a.load_artifacts).read_bytes()
        t, info = timed(lambda: torch.compiler.load_cache_artifacts(blob))
        res["t_load_artifacts_s"], res["artifacts_bytes"] = t, len(blob)
        res["load_artifacts_info"] = str(info)[:300]
    sched = train.Schedule(lr0=1e-3, period=10**9, target_loss=1e-300, max_iters=10**9, sync_every=10**9)
    spc = a.steps_per_call
    fresh = lambda: type(net)(net.W.clone(), net.b.clone(), net.v.clone())  # noqa: E731
    first_steps = 2 * train.gd.STEPS_PER_CALL  # gpu_session.sh's first (warm-up) call
    t, _ = timed(lambda: train.train(fresh(), X, y, sched, max_steps=first_steps, compile=True, steps_per_call=spc))
    res["t_first_call_s"], res["first_call_steps"] = t, first_steps
    t, _ = timed(lambda: train.train(fresh(), X, y, sched, max_steps=first_steps, compile=True, steps_per_call=spc))
    res["t_second_call_s"] = t
    steps = a.steps
    t, _ = timed(lambda: train.train(fresh(), X, y, sched, max_steps=steps, compile=True, steps_per_call=spc))
    res["compiled_us_per_net_step"] = t / (a.E * steps) * 1e6
    train.train(fresh(), X, y, sched, max_steps=4)
    t, _ = timed(lambda: train.train(fresh(), X, y, sched, max_steps=steps))
    res["eager_us_per_net_step"] = t / (a.E * steps) * 1e6
    saved = (res["eager_us_per_net_step"] - res["compiled_us_per_net_step"]) * a.E / 1e6  # s per stack step
    res["break_even_steps"] = (res["t_first_call_s"] - res["t_second_call_s"]) / saved if saved > 0 else None
    try:
        from torch._dynamo.utils import counters

        res["counters"] = {sec: dict(counters[sec]) for sec in ("inductor", "aot_autograd", "stats") if sec in counters}
    except Exception as exc:  # noqa: BLE001
        res["counters_error"] = str(exc)[:200]
    try:
        from torch._dynamo.utils import compile_times

        res["compile_times"] = str(compile_times(repr="str"))[-3000:]
    except Exception as exc:  # noqa: BLE001
        res["compile_times_error"] = str(exc)[:200]
    if a.save_artifacts:
        try:
            arts = torch.compiler.save_cache_artifacts()
            if arts:
                blob, info = arts
                pathlib.Path(a.save_artifacts).write_bytes(blob)
                res["saved_artifacts_bytes"] = len(blob)
                res["saved_artifacts_info"] = str(info)[:300]
            else:
                res["saved_artifacts_bytes"] = 0
        except Exception as exc:  # noqa: BLE001
            res["save_artifacts_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if dev.type == "cuda":
        res["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    res["t_child_total_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(res, default=str), flush=True)


def driver(a) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_probe import nvidia_smi, write_json

    t0 = time.perf_counter()
    base = pathlib.Path(tempfile.mkdtemp(prefix="kktlab_cold_compile_"))
    out = pathlib.Path(a.out)
    path = out / f"cold_compile_{a.device.split(':')[0]}.json"
    payload = {"args": vars(a), "E": a.E, "shape_n_d_k": a.shape, "runs": {}, "skipped": [], "base_dir": str(base)}
    if a.device.startswith("cuda"):
        payload["smi_start"] = nvidia_smi()
    artifacts = {}
    for name in a.runs.split(","):
        if name not in RUNS:
            payload["skipped"].append(f"{name}: unknown run")
            continue
        key, spc, flags, load = RUNS[name]
        left = a.budget_s - (time.perf_counter() - t0)
        if left < a.min_run_s:
            payload["skipped"].append(f"{name}: {left:.0f} s left")
            print(f"[skip] {name}: {left:.0f} s left", flush=True)
            continue
        if load and load not in artifacts:
            payload["skipped"].append(f"{name}: no artifacts from run {load}")
            print(f"[skip] {name}: no artifacts from run {load}", flush=True)
            continue
        cache = base / key
        cache.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
                   PYTHONUNBUFFERED="1")
        for var in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
            env.pop(var, None)
        if flags:
            env.update(TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
        cmd = [sys.executable, __file__, "--child", "--device", a.device, "--E", str(a.E), "--shape", a.shape,
               "--steps", str(a.steps), "--steps-per-call", str(spc)]
        art = base / f"{name}.artifacts"
        if name.startswith("cold") and not load:
            cmd += ["--save-artifacts", str(art)]
        if load:
            cmd += ["--load-artifacts", str(artifacts[load])]
        before = du(cache)
        t = time.perf_counter()
        row = {"cache_folder": key, "steps_per_call": spc, "explicit_fx_autograd_cache_flags": flags,
               "loaded_artifacts_of": load, "cache_bytes_before": before}
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(10, left - 2), cwd=str(ROOT))
            row["process_wall_s"] = time.perf_counter() - t
            row["returncode"] = p.returncode
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line:
                row.update(json.loads(line[len("RESULT "):]))
            if p.returncode != 0 or not line:
                row["stderr_tail"] = (p.stderr or "")[-2000:]
        except subprocess.TimeoutExpired as exc:
            row["process_wall_s"] = time.perf_counter() - t
            row["timed_out"] = True
            row["stderr_tail"] = (exc.stderr or b"")[-2000:].decode(errors="replace") if isinstance(exc.stderr, bytes) \
                else str(exc.stderr or "")[-2000:]
        row["cache_bytes_after"] = du(cache)
        if art.is_file():
            artifacts[name] = art
        payload["runs"][name] = row
        print(f"[{name}] process {row.get('process_wall_s', float('nan')):.1f} s, first call "
              f"{row.get('t_first_call_s', float('nan')):.2f} s, second {row.get('t_second_call_s', float('nan')):.2f} s, "
              f"compiled {row.get('compiled_us_per_net_step', float('nan')):.3f} vs eager "
              f"{row.get('eager_us_per_net_step', float('nan')):.3f} us/net-step, cache "
              f"{row['cache_bytes_after'] / 2**20:.1f} MiB, rc {row.get('returncode')}", flush=True)
        if row.get("stderr_tail") and row.get("returncode") not in (0, None):
            print(row["stderr_tail"][-1500:], flush=True)
        payload["elapsed_s"] = time.perf_counter() - t0
        write_json(path, "cold_compile", payload, a.device)
    runs = payload["runs"]
    if "cold" in runs and "warm" in runs and "t_first_call_s" in runs["cold"] and "t_first_call_s" in runs["warm"]:
        payload["cold_over_warm_first_call"] = runs["cold"]["t_first_call_s"] / runs["warm"]["t_first_call_s"]
    if a.device.startswith("cuda"):
        payload["smi_end"] = nvidia_smi()
    payload["elapsed_s"] = time.perf_counter() - t0
    print("wrote", write_json(path, "cold_compile", payload, a.device))
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--E", type=int, default=1024)
    ap.add_argument("--shape", default="50,50,100", help="n,d,k")
    ap.add_argument("--steps", type=int, default=200, help="steps of the steady-state timings")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma list, in order, of: {DEFAULT_RUNS}")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for everything (default: $STEP_LIMIT_S - 6, which gpu_session_4.sh sets to the step's timeout, else 75.0)")
    ap.add_argument("--min-run-s", type=float, default=12.0, help="start no run with less left")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--keep", action="store_true", help="keep the cache folders")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps-per-call", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--save-artifacts", help=argparse.SUPPRESS)
    ap.add_argument("--load-artifacts", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.budget_s is None:
        a.budget_s = float(os.environ["STEP_LIMIT_S"]) - 6 if os.environ.get("STEP_LIMIT_S") else 75.0
    (child if a.child else driver)(a)


if __name__ == "__main__":
    main()
