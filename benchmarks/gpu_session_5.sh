[ -d /tmp/site/zarr ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; export PYTHONPATH=/tmp/site:$PWD
# (The line above must stay first: it installs the carried wheels, the same 81 as gpu_session.sh's,
# unless the device command's own first line did already; see "Wheels" in gpu_session.sh.)
#
# benchmarks/gpu_session_5.sh: issue 46's chain at GPU size (issue 39's question on real data), the wide
# step's equivalence check redone, and the warm-cache compile, in one session on a lent GPU (one H100 or
# H200, 16 cores, python3 = Python 3.12 with torch 2.11+cu130, no internet):
#
#   bash benchmarks/gpu_session_5.sh        # from the repo root; writes into $OUT (default /tmp/gpu_out)
#
# Carry .whl (the wheels) and .data (MNIST: a copy of the shared data folder's mnist/, 11.6 MB; the script
# sets KKTLAB_DATA to it). Steps, in priority order, each under its own `timeout` and all under one deadline
# ($GPU_SESSION_BUDGET_S, default 520 s counted from the script's start, the wheel install included); each
# step gets at most its budget and never what the later ones reserve:
#   chain            kktlab run of configs/pipeline-mnist-gpu-slice.yaml (4 nets on MNIST 0/1 at d = 784,
#                    m = 100, width 1000; unlearn by GA at alpha 0.5, 1 with identity and retrain; the KKT
#                    attack, 48 rows x 10,000 steps; the before/after difference attack) through
#                    runner.cluster: cuda (dask-cuda, one worker, 2 threads, device auto; cluster: local when
#                    dask-cuda does not import), as two configs of one run: nets + unlearned, then the whole
#                    chain (so the attack's 48 rows stack into 2 bundles instead of 6 cut as unlearn bundles
#                    finish). Expected ~200 s (see the config's sizing notes); limit 300 s.
#                    New for it: unlearn's retraining runs on the GPU (it ran on the CPU whatever the device:
#                    ~15-30 min per retrain bundle on one thread at this size), and kkt_measure's default mask
#                    is made on the data's device (reconstruct's eps* of a W-only net on CUDA mixed devices, so
#                    every attack cell would have failed; benchmarks/fake_cuda.py, below, found it).
#   chain_findings   benchmarks/chain_session.py summary: per stage cells, bundle compute seconds and cells
#                    per second; per net eps_rel; per method and alpha the forgotten vs retained recovery,
#                    distance and cosine of both attacks with their chance baselines (csv + JSON)
#   chain_report     kktlab report of the store (figures, index.md / index.html)
#   wide             benchmarks/wide_step_variants.py (B = 64, d = 784, k = 1e5 and 1e4, fp32) with the check
#                    fixed: 16 steps at an LR picked per shape where kktlab's step is stable and moves
#                    (session 4's fixed LR 1e-2 made it diverge: every check degenerate); no max-autotune
#                    (measured in session 4: 81 s); ~90 s, limit 130 s
#   cold             benchmarks/cold_compile.py: the first compiled call with an empty inductor/Triton cache,
#                    then with that cache warm (session 4's warm run was cut at 20 s), then the FX/autograd
#                    cache flags; whatever time is left (~60-170 s)
# Output ($OUT, 3 files): session.log (everything), summary.txt (one line per step: rc, seconds, limit; then
# the headline numbers), results_gpu5.tar.gz (every JSON and csv, the chain's configs, run statistics, tables
# and report, the wide step's profiler trace; not the chain's Zarr store, ~400 MB), rewritten after every step.
#
# Some steps only: GPU5_STEPS=wide,cold (default chain,chain_findings,chain_report,wide,cold). A dry run of
# the whole script on a CPU (skip the install line; the project's python3 first on PATH; tiny sizes; 193 s
# on the 2-core box: chain 80 s, findings 13, report 19, wide 30, cold 50):
#   tail -n +2 benchmarks/gpu_session_5.sh | PATH=$PWD/.venv/bin:$PATH GPU5_DEVICE=cpu GPU5_SMALL=1 OUT=/tmp/g5 bash
# Before a session, the chain's CUDA code paths can be checked on a CPU for device mixes (none left now):
#   python benchmarks/chain_session.py config configs/pipeline-mnist-gpu-slice.yaml --out /tmp/s.yaml --small
#   KKTLAB_DATA=$PWD/.data python benchmarks/fake_cuda.py /tmp/s.yaml --store /tmp/f.zarr
set -o pipefail
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
export PREFECT_HOME=/tmp/kktlab-prefect-home
unset PREFECT_API_URL

OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/session.log
SUMMARY=$OUT/summary.txt
STAGE=/tmp/gpu_session5_results   # collected into $OUT/results_gpu5.tar.gz after every step
rm -rf "$STAGE" && mkdir -p "$STAGE"
STORE=$STAGE/chain.zarr           # left out of the tarball (its tables, report and JSON go in)
DEADLINE=${GPU_SESSION_BUDGET_S:-520}
DEV=${GPU5_DEVICE:-cuda}
SMALL=()
[ -n "${GPU5_SMALL:-}" ] && SMALL=(--small)
if [ -z "${KKTLAB_DATA:-}" ] && [ -d .data/mnist ]; then export KKTLAB_DATA=$PWD/.data; fi
echo "wheels installed into /tmp/site in ${SECONDS}s ($(ls .whl/*.whl 2>/dev/null | wc -l) wheels); KKTLAB_DATA=${KKTLAB_DATA:-unset}" | tee -a "$LOG"
echo "# gpu_session_5.sh $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo '+dirty') device $DEV" >"$SUMMARY"

collect() {  # (re)write the tarball of everything written so far, less the Zarr store
  tar -C "$STAGE" --exclude='./chain.zarr*' -czf "$OUT/results_gpu5.tar.gz" . 2>>"$LOG"
}

STEPS=${GPU5_STEPS:-chain,chain_findings,chain_report,wide,cold}

step() {  # step NAME BUDGET_S RESERVE_S CMD...: CMD under timeout min(BUDGET, time left - RESERVE);
  local name=$1 budget=$2 reserve=$3  # the limit reaches CMD as $STEP_LIMIT_S (the scripts fit their plans to it)
  shift 3
  if [[ ",$STEPS," != *",$name,"* ]]; then
    printf '%-15s not asked (GPU5_STEPS=%s)\n' "$name" "$STEPS" >>"$SUMMARY"
    return 0
  fi
  local left=$((DEADLINE - SECONDS - reserve))
  local t=$((budget < left ? budget : left))
  if ((t < 15)); then
    echo "=== [$name] SKIPPED: ${left}s left before the session deadline" | tee -a "$LOG"
    printf '%-15s skipped (no time left)\n' "$name" >>"$SUMMARY"
    return 0
  fi
  echo "=== [$name] $(date -u +%T) limit ${t}s: $*" | tee -a "$LOG"
  local s=$SECONDS
  STEP_LIMIT_S=$t timeout -k 10 "$t" "$@" 2>&1 | tee -a "$LOG"
  local rc=$?
  ((rc == 124 || rc == 137)) && echo "=== [$name] TIMED OUT after ${t}s" | tee -a "$LOG"
  echo "=== [$name] rc=$rc in $((SECONDS - s))s" | tee -a "$LOG"
  printf '%-15s rc=%-4s %4ss (limit %ss)\n' "$name" "$rc" "$((SECONDS - s))" "$t" >>"$SUMMARY"
  collect
  return 0
}

# budgets: chain 300 + findings 60 + report 45 (never into wide's 130 + 15), wide 130, cold <= 170; ~5 s summary
# ----------------------------------------------------------------------------------------- info
{ timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu --format=csv; } 2>&1 | tee -a "$LOG" "$STAGE/nvidia_smi.csv"

# ------------------------------------------------------------------ the chain at GPU size (issue 39)
CHAIN_CFG=configs/pipeline-mnist-gpu-slice.yaml
CARGS=()
if [ "$DEV" = cpu ]; then
  CARGS=(--cluster local --device cpu --workers 1 --threads-per-worker 2)  # the GPU run's bundles, on the CPU
elif ! python3 -c "import dask_cuda.local_cuda_cluster" >>"$LOG" 2>&1; then
  # device auto (as the config's): with device cuda every bundle asks Dask for the resource GPU=1
  # (deploy/dask.py resources_for), which only LocalCUDACluster workers have; auto still runs on the GPU
  CARGS=(--cluster local --device auto --workers 1)
  echo "!!! dask_cuda does not import: FALLBACK to runner.cluster: local with device: auto" | tee -a "$LOG" "$SUMMARY"
fi
for part in part1 full; do
  python3 benchmarks/chain_session.py config "$CHAIN_CFG" --out "$STAGE/chain_$part.yaml" --store "$STORE" \
    $([ $part = part1 ] && echo --upto unlearned) "${CARGS[@]}" "${SMALL[@]}" 2>&1 | tee -a "$LOG"
done
# one kktlab run, two configs in order: nets + unlearned, then the chain (recon and diff read stored cells)
step chain 300 150 python3 -m kktlab.cli run "$STAGE/chain_part1.yaml" "$STAGE/chain_full.yaml" \
  --json "$STAGE/chain_run.json"
step chain_findings 60 145 python3 benchmarks/chain_session.py summary "$STORE" --out "$STAGE" \
  --stats "$STAGE/chain_run.json"
step chain_report 45 145 python3 -m kktlab.cli report "$STORE" --out "$STAGE/chain_report"

# ------------------------------------------------------------- wide step: the check redone (issue 46)
# its own inductor cache, so that the cold-compile step below starts from nothing of it
TORCHINDUCTOR_CACHE_DIR=/tmp/kktlab_inductor_wide TRITON_CACHE_DIR=/tmp/kktlab_inductor_wide/triton \
  step wide 130 15 python3 benchmarks/wide_step_variants.py --device "$DEV" --out "$STAGE" --no-max-autotune "${SMALL[@]}"

# ---------------------------------------------------------------------------- cold and warm compile
CC=(--runs cold,warm,warm_fx_autograd_cache_on,cold_block1,warm_block1 --min-run-s 25)
[ -n "${GPU5_SMALL:-}" ] && CC=(--runs cold,warm --min-run-s 5 --E 16 --shape 10,10,20 --steps 20)
step cold 170 8 python3 benchmarks/cold_compile.py --device "$DEV" --out "$STAGE" "${CC[@]}"

# ------------------------------------------------------------------------------ headline numbers
{ echo "# headline numbers"; timeout 15 python3 benchmarks/gpu_session_4_summary.py "$STAGE" 2>&1; } | tee -a "$SUMMARY" "$LOG"
cp -f "$SUMMARY" "$STAGE/summary.txt" 2>/dev/null
collect
echo "session done in ${SECONDS}s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG" "$SUMMARY"
