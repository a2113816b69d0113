python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
# (The line above must stay first: it installs the carried wheels; see "Wheels" below.)
#
# benchmarks/gpu_session.sh: one session on a lent GPU machine (one NVIDIA H100 or H200, 16 cores,
# python3 = Python 3.12 with torch 2.11+cu130, numpy, scipy, pandas, xarray, pytest, ... and no
# internet). It is how the *_cuda.json numbers and the GPU sweep numbers were made:
#
#   bash benchmarks/gpu_session.sh          # from the repo root; writes into $OUT (default /tmp/gpu_out)
#
# Steps, each under its own `timeout` and all under one session deadline ($GPU_SESSION_BUDGET_S,
# default 420 s counted from the script's start; steps before the sweep leave it
# $GPU_SESSION_SWEEP_RESERVE_S, default 190 s), each run whatever the earlier ones gave:
#   info       nvidia-smi, python/torch/CUDA versions, where prefect/dask/zarr/dask_cuda import from
#   (a) tests  pytest -m requires_gpu on tests/test_gpu.py and tests/test_paper003_kernels.py
#   (b) bench  wide_step.py (B=64, d=784, k=1e4 and 1e5: fraction of a dense fp32 GEMM measured in the
#              same run); the stacked small-net step on CUDA (kktlab batched vs a per-net nn.Module
#              loop vs a torch.func ensemble, eager, then torch.compile at E=1024; inline below,
#              because train_batched.py runs on the CPU only); reconstruct_restarts.py
#   (c) sweep  kktlab run configs/gpu-fig1-slice.yaml (runner.cluster: cuda -> dask_cuda
#              LocalCUDACluster, embedded Prefect server, Zarr store); when dask_cuda does not
#              import, cluster: local with device: auto (see below why not cuda); kktlab status, verify
#   (b')       in the time left: cstar_kkt.py (through a wrapper that trains its nets on the GPU;
#              the script trains them on the CPU), attack_batched.py (--no-art: ART is not on the image)
# Output ($OUT, 3 files): session.log (everything), summary.txt (one line per step: rc, seconds,
# limit; then the headline numbers), results_cuda.tar (every JSON written, the pytest junit XML,
# the sweep's --json statistics and the config it ran), rewritten after every step.
#
# Wheels: .whl/ is not committed (.gitignore); name it in the device tool's `carry`. It was made on
# the developers' machine with
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -c <.venv pip freeze> -d DIR \
#     prefect==3.9.1 prefect-dask==0.3.7 'dask[distributed]==2026.7.1' distributed==2026.7.1 zarr==3.1.6 \
#     numcodecs==0.16.6 google-crc32c==1.9.0 fastapi==0.150.0
#   plus (--no-deps) dask-cuda==26.10.0 and rapids-dask-dependency==26.10.0 (which pins dask and
#   distributed to 2026.7.1, inside the project's >=2026.7.1,<2026.9; dask-cuda's own needs, click,
#   cuda-core, numpy, nvidia-ml-py, pandas, are on the image, zict is carried), keeping only the
#   wheels of packages the image lacks (typing_extensions 4.16 and certifi 2026.10.19 are carried
#   anyway: pydantic and prefect ask for at least those), less packages a whole kktlab sweep never
#   imports (checked by blocking them in a sweep here): apprise, cyclopts, rich-rst, dateparser,
#   docker, ruamel.yaml, oauthlib, requests-oauthlib, and bokeh (rapids-dask-dependency asks for
#   it; only Dask's dashboard uses it). 81 wheels, 43 MiB.
set -o pipefail
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
export PREFECT_HOME=/tmp/kktlab-prefect-home   # a fresh SQLite database for the embedded server
unset PREFECT_API_URL

OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/session.log
SUMMARY=$OUT/summary.txt
STAGE=/tmp/gpu_session_results   # collected into $OUT/results_cuda.tar after every step
rm -rf "$STAGE" && mkdir -p "$STAGE"
DEADLINE=${GPU_SESSION_BUDGET_S:-420}
SWEEP_RESERVE=${GPU_SESSION_SWEEP_RESERVE_S:-190}   # seconds kept for step (c) while (a), (b) run
echo "wheels installed into /tmp/site in ${SECONDS}s ($(ls .whl/*.whl | wc -l) wheels)" | tee -a "$LOG"
echo "# gpu_session.sh $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" > "$SUMMARY"

collect() {  # copy the JSONs written so far into $STAGE and (re)write the tar in $OUT
  local f
  for f in benchmarks/results/*_cuda.json; do  # (wide_step_cuda.json: renamed per width below)
    [ -e "$f" ] && [ "${f##*/}" != wide_step_cuda.json ] && cp -f "$f" "$STAGE/"
  done
  tar -C "$STAGE" -cf "$OUT/results_cuda.tar" . 2>>"$LOG"
}

step() {  # step NAME BUDGET_S RESERVE_S CMD...: run CMD under timeout min(BUDGET, time left - RESERVE)
  local name=$1 budget=$2 reserve=$3
  shift 3
  local left=$((DEADLINE - SECONDS - reserve))
  local t=$((budget < left ? budget : left))
  if ((t < 10)); then
    echo "=== [$name] SKIPPED: ${left}s left before the session deadline" | tee -a "$LOG"
    printf '%-26s skipped (no time left)\n' "$name" >>"$SUMMARY"
    return 0
  fi
  echo "=== [$name] $(date -u +%T) limit ${t}s: $*" | tee -a "$LOG"
  local s=$SECONDS
  timeout -k 10 "$t" "$@" 2>&1 | tee -a "$LOG"
  local rc=$?
  ((rc == 124 || rc == 137)) && echo "=== [$name] TIMED OUT after ${t}s" | tee -a "$LOG"
  echo "=== [$name] rc=$rc in $((SECONDS - s))s" | tee -a "$LOG"
  printf '%-26s rc=%-4s %4ss (limit %ss)\n' "$name" "$rc" "$((SECONDS - s))" "$t" >>"$SUMMARY"
  collect
  return 0
}

# ---------------------------------------------------------------------------------------- info
cat >/tmp/gpu_info.py <<'EOF'
import importlib, importlib.metadata as md, platform, sys
import torch
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", "SMs", p.multi_processor_count, "cc", f"{p.major}.{p.minor}")
for name in ("prefect", "prefect_dask", "dask", "distributed", "zarr", "numcodecs", "google_crc32c", "xarray",
             "numpy", "pandas", "scipy", "torchmetrics", "pydantic", "typing_extensions", "dask_cuda", "cuda.core"):
    try:
        mod = importlib.import_module(name)
        dist = {"google_crc32c": "google-crc32c", "prefect_dask": "prefect-dask", "dask_cuda": "dask-cuda",
                "cuda.core": "cuda-core"}.get(name, name)
        try:
            ver = md.version(dist)
        except md.PackageNotFoundError:
            ver = getattr(mod, "__version__", "?")
        print(f"  {name:18s} {ver:14s} {getattr(mod, '__file__', '?')}")
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"  {name:18s} IMPORT FAILED: {type(exc).__name__}: {exc}")
EOF
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv; } 2>&1 | tee -a "$LOG"
step info 60 0 python3 /tmp/gpu_info.py

# ----------------------------------------------------------------------- (a) GPU tests (~40 s)
step pytest_requires_gpu 90 "$SWEEP_RESERVE" python3 -m pytest -q -rs -m requires_gpu -p no:cacheprovider \
  --durations=0 --junitxml="$STAGE/pytest_requires_gpu.xml" tests/test_gpu.py tests/test_paper003_kernels.py

# ---------------------------------------------------------------------- (b) benchmarks on CUDA
# wide-net step: B=64, d=784, width 1e4 and 1e5, fp32 (TF32 off), vs a 4096^3 fp32 GEMM measured in the same run
for k in 10000 100000; do
  rm -f benchmarks/results/wide_step_cuda.json
  step "wide_step_k$k" 40 "$SWEEP_RESERVE" python3 benchmarks/wide_step.py --device cuda --B 64 --d 784 --k "$k" --steps 200
  [ -e benchmarks/results/wide_step_cuda.json ] && mv benchmarks/results/wide_step_cuda.json "$STAGE/wide_step_B64_d784_k${k}_cuda.json"
done
collect

# small nets stacked on one GPU (train_batched.py's methods, on CUDA): per net-step time of
# kktlab's stacked step (eager; compile=True at one E), a per-net nn.Module + SGD loop (measured on
# a few nets: its cost per net-step does not depend on E), a torch.func vmap ensemble (eager and
# compiled at one E); same nets, same data, same constant-LR exp-loss GD on every side.
cat >/tmp/gpu_train_batched.py <<'EOF'
import json, os, sys, time
import torch

sys.path.insert(0, os.getcwd())
from benchmarks.common import write  # noqa: E402
from tasks import data, train  # noqa: E402
from tasks.nets import TwoLayer  # noqa: E402

dev = os.environ.get("DEV", "cuda")
n, d, k = (int(x) for x in os.environ.get("SHAPE", "50,50,100").split(","))
Es = [int(x) for x in os.environ.get("ES", "16,256,1024,4096").split(",")]
steps = int(os.environ.get("STEPS", "200"))
loop_nets, loop_steps = (int(x) for x in os.environ.get("LOOP", "8,200").split(","))
compile_E = int(os.environ.get("COMPILE_E", "1024"))
dtypes = os.environ.get("DTYPES", "float32,float64").split(",")
LR = 1e-3
torch.backends.cuda.matmul.allow_tf32 = False
sched = train.Schedule(lr0=LR, period=10**9, target_loss=1e-300, max_iters=10**9, sync_every=10**9)


def sync():
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def kktlab(net, X, y, compile=False):
    run = lambda s: train.train(TwoLayer(net.W.clone(), net.b.clone(), net.v.clone()), X, y, sched,  # noqa: E731
                                max_steps=s, compile=compile).net
    t_warm, _ = timed(lambda: run(2 * train.gd.STEPS_PER_CALL))
    t, res = timed(lambda: run(steps))
    return t, (res.W, res.b, res.v), t_warm


def vmap_ensemble(net, X, y, compile=False):
    from torch.func import grad, vmap

    def loss(p, x, t):
        h = torch.relu(x @ p[0].T + p[1])
        return torch.exp(-t * (h @ p[2])).mean()

    g_all = vmap(grad(loss))

    def step(p, x, t):
        g = g_all(p, x, t)
        return tuple(pi - LR * gi for pi, gi in zip(p, g))

    p0 = (net.W.clone(), net.b.clone(), net.v.clone())
    t0 = time.perf_counter()
    if compile:
        step = torch.compile(step, dynamic=False)
    step(p0, X, y)
    sync()
    t_warm = time.perf_counter() - t0

    def run():
        p = p0
        for _ in range(steps):
            p = step(p, X, y)
        return p
    t, res = timed(run)
    return t, res, t_warm


def loop(net, X, y, dtype):
    def run(nets, nsteps):
        out = []
        for e in range(nets):
            m = torch.nn.Sequential(torch.nn.Linear(d, k, dtype=dtype, device=dev), torch.nn.ReLU(),
                                    torch.nn.Linear(k, 1, bias=False, dtype=dtype, device=dev))
            with torch.no_grad():
                m[0].weight.copy_(net.W[e]), m[0].bias.copy_(net.b[e]), m[2].weight.copy_(net.v[e:e + 1])
            opt = torch.optim.SGD(m.parameters(), lr=LR)
            for _ in range(nsteps):
                opt.zero_grad()
                torch.exp(-y[e] * m(X[e]).squeeze(-1)).mean().backward()
                opt.step()
            out.append((m[0].weight.detach(), m[0].bias.detach(), m[2].weight.detach()[0]))
        return out
    run(1, 2)  # warm-up
    t, res = timed(lambda: run(loop_nets, loop_steps))
    return t / (loop_nets * loop_steps) * 1e6, res


def gemm_tflops(dtype, n=4096, reps=5):
    a, b = (torch.randn(n, n, dtype=dtype, device=dev) for _ in range(2))
    a @ b
    t, _ = timed(lambda: [a @ b for _ in range(reps)])
    return 2 * n**3 * reps / t / 1e12


def maxdiff(p, q):
    return max(float((x - z).abs().max()) for x, z in zip(p, q))


rows = []
payload = {"shape": {"n": n, "d": d, "k": k}, "steps": steps, "loop_nets": loop_nets, "loop_steps": loop_steps,
           "lr": LR, "rows": rows}
flop = 4 * n * d * k + 4 * n * k  # per net-step (train_batched.py's count)
for dt_name in dtypes:
    dtype = getattr(torch, dt_name)
    payload[f"gemm4096_tflops_{dt_name}"] = gemm_tflops(dtype)
    for E in Es:
        net, X, y = data.synthetic_stack(range(E), d, n, k, dtype=dtype, device=dev)
        row = {"dtype": dt_name, "E": E}
        t, pk, _ = kktlab(net, X, y)
        row["kktlab_us_per_net_step"] = t / (E * steps) * 1e6
        row["kktlab_tflops"] = flop * E * steps / t / 1e12
        t, pv, _ = vmap_ensemble(net, X, y)
        row["vmap_us_per_net_step"] = t / (E * steps) * 1e6
        row["vmap_max_param_diff_vs_kktlab"] = maxdiff(pv, pk)
        if E == Es[0]:  # the loop's cost per net-step does not depend on E: once per dtype
            us, pl = loop(net, X, y, dtype)
            row["loop_us_per_net_step"] = us
            # the loop ran loop_steps steps on loop_nets nets: compare those with kktlab's after as many steps
            if loop_steps == steps:
                row["loop_max_param_diff_vs_kktlab"] = max(
                    maxdiff(pl[e], tuple(p[e] for p in pk)) for e in range(loop_nets))
        rows.append(row)
        print(json.dumps(row), flush=True)
        write("train_batched_gpu", payload, dev)  # after every row: a timeout keeps what was measured
        del net, X, y
# torch.compile last (its first call compiles: tens of seconds cold), at one E, first dtype
for row in rows:
    if row["E"] != compile_E or row["dtype"] != dtypes[0]:
        continue
    dtype = getattr(torch, row["dtype"])
    E = row["E"]
    net, X, y = data.synthetic_stack(range(E), d, n, k, dtype=dtype, device=dev)
    _, pk, _ = kktlab(net, X, y)
    t, pc, tc = kktlab(net, X, y, compile=True)
    row["kktlab_compiled_us_per_net_step"] = t / (E * steps) * 1e6
    row["kktlab_compiled_first_calls_s"] = tc
    row["kktlab_compiled_max_param_diff"] = maxdiff(pc, pk)
    print(json.dumps(row), flush=True)
    write("train_batched_gpu", payload, dev)
    t, pc, tc = vmap_ensemble(net, X, y, compile=True)
    row["vmap_compiled_us_per_net_step"] = t / (E * steps) * 1e6
    row["vmap_compiled_compile_s"] = tc
    row["vmap_compiled_max_param_diff_vs_kktlab"] = maxdiff(pc, pk)
    print(json.dumps(row), flush=True)
    write("train_batched_gpu", payload, dev)
loop_us = {r["dtype"]: r["loop_us_per_net_step"] for r in rows if "loop_us_per_net_step" in r}
for r in rows:
    if r["dtype"] in loop_us:
        r["loop_over_kktlab"] = loop_us[r["dtype"]] / r["kktlab_us_per_net_step"]
    r["vmap_over_kktlab"] = r["vmap_us_per_net_step"] / r["kktlab_us_per_net_step"]
    print(f"{r['dtype']} E={r['E']:5d}: kktlab {r['kktlab_us_per_net_step']:.3f} us/net-step "
          f"({r['kktlab_tflops']:.2f} TFLOP/s), loop {r.get('loop_over_kktlab', float('nan')):.0f}x slower, "
          f"vmap {r['vmap_over_kktlab']:.2f}x"
          + (f", compiled kktlab {r['kktlab_compiled_us_per_net_step']:.3f} us" if "kktlab_compiled_us_per_net_step" in r else "")
          + (f", compiled vmap {r['vmap_compiled_us_per_net_step']:.3f} us" if "vmap_compiled_us_per_net_step" in r else ""))
print("wrote", write("train_batched_gpu", payload, dev))
EOF
step train_batched_gpu 90 "$SWEEP_RESERVE" python3 /tmp/gpu_train_batched.py

# reconstruction: R restarts stacked as one problem vs R calls of one restart
step reconstruct_restarts 45 "$SWEEP_RESERVE" python3 benchmarks/reconstruct_restarts.py --device cuda --R 16 128 --steps 40

# ------------------------------------------- (c) a real sweep: Prefect + dask-cuda + Zarr store
CFG=configs/gpu-fig1-slice.yaml
if ! python3 -c "import dask_cuda.local_cuda_cluster" >>"$LOG" 2>&1; then
  # device: auto, not cuda: with device cuda every bundle asks Dask for the resource GPU=1
  # (deploy/dask.py resources_for), which only LocalCUDACluster workers have; auto still trains on
  # the GPU (the experiments pick cuda where torch sees one)
  sed 's/cluster: cuda/cluster: local/; s/device: cuda/device: auto/' "$CFG" >/tmp/gpu-fig1-slice-local.yaml
  CFG=/tmp/gpu-fig1-slice-local.yaml
  echo "!!! dask_cuda does not import: FALLBACK to runner.cluster: local with device: auto (the GPU) ($CFG)" | tee -a "$LOG"
  echo "sweep: FALLBACK cluster local (dask_cuda does not import)" >>"$SUMMARY"
fi
cp "$CFG" "$STAGE/sweep_config.yaml"
rm -rf /tmp/gpu.zarr /tmp/gpu.zarr.*
SWEEP_T0=$SECONDS
step sweep_fig1_slice 200 15 python3 -m kktlab.cli run "$CFG" --store /tmp/gpu.zarr --json "$STAGE/sweep_cuda.json"
SWEEP_WALL=$((SECONDS - SWEEP_T0))
step sweep_status 30 0 python3 -m kktlab.cli status /tmp/gpu.zarr
step sweep_verify 40 0 python3 -m kktlab.cli verify /tmp/gpu.zarr

# ------------------------------------- (b, continued) secondary benchmarks, in the time left
# exact c* vs bisection, batched vs per-net c* and KKT fits; cstar_kkt.py trains its nets on the
# CPU (set-up, not timed, ~minutes at E=64): this wrapper trains them on the GPU instead
cat >/tmp/gpu_cstar_kkt.py <<'EOF'
import os, sys
sys.path.insert(0, os.getcwd())
import benchmarks.cstar_kkt as B  # noqa: E402
from tasks import data, train  # noqa: E402


def trained_stack(E, d, m, k, device):
    net, X, y = data.synthetic_stack(range(E), d, m, k, device=device)
    st = train.train(net, X, y, train.Schedule(lr0=1e-2, period=10, target_loss=1e-8,
                                               max_iters=int(os.environ.get("MAX_ITERS", "4000"))))
    return st.net, X, y


B.trained_stack = trained_stack
B.main(sys.argv[1:])
EOF
step cstar_kkt 45 5 python3 /tmp/gpu_cstar_kkt.py --device cuda --E 64

# paper-003 attacks: PGD-l2 and the exact single step, K stacked nets vs a per-net loop
step attack_batched 30 5 python3 benchmarks/attack_batched.py --device cuda --no-art
step attack_batched_small 30 5 python3 benchmarks/attack_batched.py --device cuda --no-art \
  --K 64 --d 49 --m 100 --tag _small

# ------------------------------------------------------------------------------ headline numbers
cat >/tmp/gpu_summary.py <<'EOF'
import glob, json, os, sys
stage, wall = sys.argv[1], float(sys.argv[2])
def load(name):
    try:
        with open(os.path.join(stage, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
out = []
s = load("sweep_cuda.json")
if s:
    cells = sum(g["written"] for g in s)
    out.append(f"sweep: {cells} cells written in {wall:.0f} s end to end ({cells / wall:.2f} cells/s incl. server "
               f"and cluster start); " + "; ".join(f"{g['group']}: {g['written']}/{g['total']} cells, {g['bundles']} "
               f"bundles, failed {g['failed']}, flow wall {g['wall_s']:.1f} s ({g['written'] / max(g['wall_s'], 1e-9):.2f} cells/s)"
               for g in s))
for f in sorted(glob.glob(os.path.join(stage, "wide_step_*_cuda.json"))):
    w = load(os.path.basename(f))
    out.append(f"wide step {w['shape']}: {w['step_s'] * 1e3:.3f} ms/step, {w['achieved_tflops']:.1f} TFLOP/s = "
               f"{100 * w['fraction_of_measured_gemm']:.0f}% of the measured fp32 GEMM ({w['gemm_tflops_measured']:.1f} TFLOP/s)")
t = load("train_batched_gpu_cuda.json")
for r in (t or {}).get("rows", []):
    out.append("small nets " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
r = load("reconstruct_restarts_cuda.json")
for row in (r or {}).get("rows", []):
    out.append(f"reconstruct d,k,l={row['d']},{row['k']},{row['l']} R={row['R']}: stacked {row['stacked_s']:.3f} s, "
               f"sequential {row['sequential_s']:.3f} s, {row['ratio']:.1f}x, max diff {row['max_cand_diff']:.1e}")
c = load("cstar_kkt_cuda.json")
for name, row in ((c or {}).get("rows") or {}).items():
    out.append(f"cstar_kkt {name}: speedup {row['speedup']:.2f}")
for tag in ("", "_small"):
    a = load(f"attack_batched{tag}_cuda.json")
    if a:
        res = a["results"]
        out.append(f"attack_batched{tag}: pgd loop/stacked {res['pgd_loop_over_stacked']:.1f}x, single step "
                   f"loop/stacked {res['single_step_loop_over_stacked']:.1f}x")
print("\n".join(out))
EOF
{ echo "# headline numbers"; python3 /tmp/gpu_summary.py "$STAGE" "$SWEEP_WALL" 2>&1; } | tee -a "$SUMMARY" "$LOG"
collect
echo "session done in ${SECONDS}s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG" "$SUMMARY"
