#!/usr/bin/env bash
# One device call: the GPU kernel (and Triton-backed mixer) tests and every kernel family's benchmark
# against its peers.
#   usage (GPU machine, repository root, peers importable):  bash benchmarks/ops/gpu_check.sh OUT_DIR [steps...]
#   steps: tests scan newton fused_rnn mlstm ssd delta host (default: all). Environment: TEST_WORKERS (pytest-xdist
#   processes, default 12), TEST_PATHS (the tests step's test files, default the kernels' and the Triton-backed
#   mixers'), WARM_PROCS (default 8), BENCH_ARGS_<family> (replaces that family's arguments),
#   TESTS_LIMIT_S, WARM_LIMIT_S, LIMIT_<family> (seconds each step may take); BASELINE: a folder holding another
#   `seqkernels/` package (e.g. the last commit's: mkdir -p .baseline && git archive HEAD seqkernels | tar -x -C
#   .baseline), whose kernels each family's benchmark then also times, from a copy of the repository, after its
#   own run (arguments BASELINE_ARGS_<family>, default the family's; output OUT/baseline/results/<family>.json,
#   limit LIMIT_<family>); the last table is then every row against the baseline's (benchmarks.ops summary --baseline).
# First the tests (pytest-xdist) and the compilation of every benchmarked kernel (benchmarks.ops warm) run
# side by side (both are mostly Triton compilation, on the CPU); then each benchmark checks and times its
# implementations alone on the GPU. Writes OUT_DIR/results/<family>.json and OUT_DIR/logs/<step>.log; the
# last lines printed are the test summary and the table of ours vs the fastest peer per family.
# The whole run takes about 9-10 minutes on an H100 (tests beside the warm-up ~3 min; mamba-ssm's autotuning
# alone ~1-2 min); to stay within one 10-minute call, split it, e.g. "tests scan newton fused_rnn",
# "mlstm ssd host" and "delta" (each call's warm-up compiles what it times, the delta family's in one process
# per shape; its timed run of every implementation at six shapes, replays included, takes up to 7 minutes;
# then delta-probe prints each delta chunk kernel's time alone at head dims 64 and 128: DELTA_PROBE_SHAPES, empty
# for none).
# AUTOTUNE_IN=an earlier call's OUT_DIR/triton-autotune.tgz (carried): fla's autotuning results restored first
# (its dplr kernels at fla's shape alone outlast a family's limit when tuned from nothing); this call's are
# packed there at the end (benchmarks/autotune_cache.sh).
set -u
out=${1:?output folder}; shift
steps=${*:-tests scan newton fused_rnn mlstm ssd delta host}
mkdir -p "$out/results" "$out/logs"
out=$(cd "$out" && pwd)  # absolute: the baseline's benchmarks run from another folder
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# shellcheck source=benchmarks/autotune_cache.sh
source benchmarks/autotune_cache.sh
autotune_restore
trap 'autotune_pack "$out"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"

declare -A ARGS=(
  [scan]="${BENCH_ARGS_scan:-}"
  [newton]="${BENCH_ARGS_newton:---lengths 2048}"
  [fused_rnn]="${BENCH_ARGS_fused_rnn:---heads 12x64 --batches 16 --workers 8}"
  [mlstm]="${BENCH_ARGS_mlstm:---sections main --dtypes bf16,fp32 --exp-chunks 64 --sig-chunks 64 --no-fla --skip xl_chunk+bf16,limit_chunk+fp32}"
  [ssd]="${BENCH_ARGS_ssd:---states 64 --dtypes bf16 --impls ours,mamba}"
  [delta]="${BENCH_ARGS_delta:---graph}"
)
# mlstm_kernels' triton_xl_chunk in bfloat16 and triton_limit_chunk in float32 abort the process on triton 3.6
declare -A LIMIT=([scan]="${LIMIT_scan:-40}" [newton]="${LIMIT_newton:-45}" [fused_rnn]="${LIMIT_fused_rnn:-80}"
                  [mlstm]="${LIMIT_mlstm:-120}" [ssd]="${LIMIT_ssd:-150}" [delta]="${LIMIT_delta:-420}")
if [ -n "${BASELINE:-}" ]; then
  [ -d "$BASELINE/seqkernels" ] || { echo "error: BASELINE=$BASELINE holds no seqkernels/ folder" >&2; exit 2; }
  # the repository with the baseline's kernels, beside this one (the benchmarks import seqkernels from the cwd)
  base_tree=$(mktemp -d)
  trap 'rm -rf "$base_tree"; autotune_pack "$out"' EXIT
  cp -r benchmarks experiments mixers tasks analysis pyproject.toml "$base_tree"/
  cp -r "$BASELINE/seqkernels" "$base_tree"/
  mkdir -p "$out/baseline/results"
fi
families=()
for step in $steps; do [ "$step" != tests ] && [ "$step" != host ] && families+=("$step"); done

t0=$SECONDS
pids=()
if [[ " $steps " == *" tests "* ]]; then
  # the kernels, and the mixers whose tests reach a Triton path on a GPU (signed_mamba's GPU test among them)
  default_tests="tests/kernels tests/mixers/test_cells.py tests/mixers/test_mamba.py tests/mixers/test_mlstm_mixer.py
    tests/mixers/test_rnn_mixers.py tests/mixers/test_signed_mamba.py tests/mixers/test_delta_mixers.py
    tests/mixers/test_state_tracking_mixers.py tests/benchmarks/test_delta_probe.py"
  # SIGINT at the limit: pytest still prints its summary, a line per failure (-rf --tb=line)
  # shellcheck disable=SC2086  # the test paths are words
  timeout -s INT -k 30 "${TESTS_LIMIT_S:-360}" python3 -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-12}" \
    --durations=15 -m "not slow" -rf --tb=line \
    ${TEST_PATHS:-$default_tests} > "$out/logs/tests.log" 2>&1 &
  pids+=($!)
fi
if [ ${#families[@]} -gt 0 ]; then
  runs=()
  for f in "${families[@]}"; do runs+=("$f ${ARGS[$f]}"); done
  timeout "${WARM_LIMIT_S:-300}" python3 -m benchmarks.ops warm --procs "${WARM_PROCS:-8}" "${runs[@]}" \
    > "$out/logs/warm.log" 2>&1 &
  pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid"; done
echo "=== tests and warm-up done in $((SECONDS - t0)) s"; tail -n 3 "$out/logs/warm.log" 2>/dev/null

for f in "${families[@]}"; do
  t1=$SECONDS
  # shellcheck disable=SC2086  # the family's arguments are words
  timeout "${LIMIT[$f]}" python3 -m benchmarks.ops "$f" ${ARGS[$f]} --out "$out/results" > "$out/logs/$f.log" 2>&1
  echo "=== $f rc=$? in $((SECONDS - t1)) s"
  if [ -n "${BASELINE:-}" ]; then
    base_args="BASELINE_ARGS_$f"; base_args=${!base_args:-${ARGS[$f]}}
    t1=$SECONDS
    # shellcheck disable=SC2086  # the family's arguments are words
    (cd "$base_tree" && timeout "${LIMIT[$f]}" python3 -m benchmarks.ops "$f" $base_args --out "$out/baseline/results") \
      > "$out/logs/$f-baseline.log" 2>&1
    echo "=== $f on the baseline's kernels rc=$? in $((SECONDS - t1)) s"
  fi
done

if [[ " $steps " == *" delta "* ]]; then  # each delta chunk kernel alone, bfloat16 products, ms
  for shape in ${DELTA_PROBE_SHAPES-8x2048x16x64 8x2048x16x128}; do
    timeout 90 python3 -m benchmarks.ops delta-probe kernels --shape "$shape" 2>&1 | grep -E "^delta-probe|error"
  done
fi
if [[ " $steps " == *" host "* ]]; then
  timeout "${LIMIT_host:-90}" python3 -m benchmarks.ops host --out "$out/results" > "$out/logs/host.log" 2>&1
  echo "=== host time per call at tiny shapes (ms, wall; GPU time in the note):"; grep "^| " "$out/logs/host.log"
fi
echo "=== GPU kernel tests (tests/kernels, -n ${TEST_WORKERS:-12}):"
grep -E "^FAILED|^ERROR" "$out/logs/tests.log" | head -n 60
grep -E "[0-9]+ (passed|failed)" "$out/logs/tests.log" | tail -n 1
echo "=== ours vs the fastest peer (same run):"
python3 -m benchmarks.ops summary "$out/results"
if [ -n "${BASELINE:-}" ]; then
  echo "=== every row against the baseline's kernels (same machine):"
  python3 -m benchmarks.ops summary "$out/results" --baseline "$out/baseline/results"
fi
