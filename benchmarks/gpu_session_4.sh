[ -d /tmp/site/zarr ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1; export PYTHONPATH=/tmp/site:$PWD
# (The line above must stay first: it installs the carried wheels, the same 81 as gpu_session.sh's,
# unless the device command's own first line did already; see "Wheels" in gpu_session.sh. Of them
# only zarr, numcodecs and google-crc32c are imported here, plus prefect/dask for the info step.)
#
# benchmarks/gpu_session_4.sh: what issue 46 still lacks, measured in one session on a lent GPU
# (one H100 or H200, 16 cores, python3 = Python 3.12 with torch 2.11+cu130, no internet):
#
#   bash benchmarks/gpu_session_4.sh        # from the repo root; writes into $OUT (default /tmp/gpu_out)
#
# Steps, each under its own `timeout` and all under one deadline ($GPU_SESSION_BUDGET_S, default
# 420 s counted from the script's start, the wheel install included); each step is given at most
# its budget and never what the later steps reserve; each runs whatever the earlier ones gave:
#   info   nvidia-smi (clocks included), torch / CUDA versions, where the deps import from
#   wide   benchmarks/wide_step_variants.py: B=64, d=784, k=1e5 and 1e4, fp32, TF32 off: a torch.profiler
#          kernel table of kktlab's step (GEMM vs elementwise vs launch gaps), each GEMM layout alone,
#          and the variants (a) kktlab, (b) hand-fused (best layout, preallocated, one compiled
#          elementwise function), (c) torch.compile max-autotune, (d) CUDA graphs, (e) kktlab's
#          compiled Gram blocks, (f) Gram-carried blocks; ms/step, TFLOP/s, fraction of a 4096^3 fp32
#          GEMM measured in the same run, max parameter difference from (a)
#   cold   benchmarks/cold_compile.py: the first train(..., compile=True) call at E=1024, n,d,k=50,50,100
#          in fresh processes: empty inductor/Triton cache, the same cache warm, FX-graph/autograd cache
#          flags on, shipped cache artifacts, one-step blocks
#   grid   benchmarks/paper_grid_timing.py: paper 002 Fig. 1(a) (k=1000) and paper 004 F004-1 through the
#          experiments' real run_bundle on slices of the real configs, extrapolated to the full grids
# Output ($OUT, 3 files): session.log (everything), summary.txt (one line per step: rc, seconds,
# limit; then the headline numbers), results_gpu4.tar.gz (every JSON, the profiler's Chrome trace of
# kktlab's step at k=1e5), rewritten after every step.
#
# Some steps only (a rerun): GPU4_STEPS=wide,grid (default info,wide,cold,grid). A dry run of the
# whole script on a CPU (skip the install line; tiny sizes):
#   tail -n +2 benchmarks/gpu_session_4.sh | GPU4_DEVICE=cpu GPU4_SMALL=1 OUT=/tmp/g4 bash
set -o pipefail
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg
export PREFECT_HOME=/tmp/kktlab-prefect-home
unset PREFECT_API_URL

OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/session.log
SUMMARY=$OUT/summary.txt
STAGE=/tmp/gpu_session4_results   # collected into $OUT/results_gpu4.tar.gz after every step
rm -rf "$STAGE" && mkdir -p "$STAGE"
DEADLINE=${GPU_SESSION_BUDGET_S:-420}
DEV=${GPU4_DEVICE:-cuda}
SMALL=()
[ -n "${GPU4_SMALL:-}" ] && SMALL=(--small)
echo "wheels installed into /tmp/site in ${SECONDS}s ($(ls .whl/*.whl 2>/dev/null | wc -l) wheels)" | tee -a "$LOG"
echo "# gpu_session_4.sh $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null || echo '?') device $DEV" >"$SUMMARY"

collect() {  # (re)write the tarball of everything written so far
  tar -C "$STAGE" -czf "$OUT/results_gpu4.tar.gz" . 2>>"$LOG"
}

STEPS=${GPU4_STEPS:-info,wide,cold,grid}  # a rerun of some steps only: GPU4_STEPS=grid bash benchmarks/gpu_session_4.sh

step() {  # step NAME BUDGET_S RESERVE_S CMD...: CMD under timeout min(BUDGET, time left - RESERVE);
  local name=$1 budget=$2 reserve=$3  # the limit reaches CMD as $STEP_LIMIT_S (the scripts fit their plans to it)
  shift 3
  if [[ ",$STEPS," != *",$name,"* ]]; then
    printf '%-14s not asked (GPU4_STEPS=%s)\n' "$name" "$STEPS" >>"$SUMMARY"
    return 0
  fi
  local left=$((DEADLINE - SECONDS - reserve))
  local t=$((budget < left ? budget : left))
  if ((t < 15)); then
    echo "=== [$name] SKIPPED: ${left}s left before the session deadline" | tee -a "$LOG"
    printf '%-14s skipped (no time left)\n' "$name" >>"$SUMMARY"
    return 0
  fi
  echo "=== [$name] $(date -u +%T) limit ${t}s: $*" | tee -a "$LOG"
  local s=$SECONDS
  STEP_LIMIT_S=$t timeout -k 10 "$t" "$@" 2>&1 | tee -a "$LOG"
  local rc=$?
  ((rc == 124 || rc == 137)) && echo "=== [$name] TIMED OUT after ${t}s" | tee -a "$LOG"
  echo "=== [$name] rc=$rc in $((SECONDS - s))s" | tee -a "$LOG"
  printf '%-14s rc=%-4s %4ss (limit %ss)\n' "$name" "$rc" "$((SECONDS - s))" "$t" >>"$SUMMARY"
  collect
  return 0
}

# budgets: info 15, wide 180, cold 70, grid 140 (the brief's <= 150 s); summary ~5 s
# ----------------------------------------------------------------------------------------- info
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu --format=csv; } 2>&1 | tee -a "$LOG"
step info 15 390 python3 benchmarks/gpu_probe.py --device "$DEV" --out "$STAGE/gpu_info_$DEV.json"

# ------------------------------------------------------------- wide step: profile and variants
# its own inductor cache, so that the cold-compile step below starts from nothing of it
TORCHINDUCTOR_CACHE_DIR=/tmp/kktlab_inductor_wide TRITON_CACHE_DIR=/tmp/kktlab_inductor_wide/triton \
  step wide 180 215 python3 benchmarks/wide_step_variants.py --device "$DEV" --out "$STAGE" "${SMALL[@]}"

# ---------------------------------------------------------------------------- cold compile
CC=()
[ -n "${GPU4_SMALL:-}" ] && CC=(--E 16 --shape 10,10,20 --steps 20)
step cold 70 145 python3 benchmarks/cold_compile.py --device "$DEV" --out "$STAGE" "${CC[@]}"

# ------------------------------------------------------------------------------ paper grids
step grid 140 5 python3 benchmarks/paper_grid_timing.py --device "$DEV" --out "$STAGE" "${SMALL[@]}"

# ------------------------------------------------------------------------------ headline numbers
{ echo "# headline numbers"; timeout 30 python3 benchmarks/gpu_session_4_summary.py "$STAGE" 2>&1; } | tee -a "$SUMMARY" "$LOG"
cp -f "$SUMMARY" "$STAGE/summary.txt" 2>/dev/null
collect
echo "session done in ${SECONDS}s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG" "$SUMMARY"
