#!/usr/bin/env bash
# One device call for the state-tracking mixers and depth: GPU tests, fla smoke sweeps, --layers 2 on the
# GPU, steps/s of the delta-rule mixers (fast vs reference backend, graph vs eager engine), and the survey
# of fla's layers. Every piece writes under OUT_DIR; the last lines printed are the summaries.
#   usage (GPU machine, repository root, fla and optuna importable):  bash benchmarks/mixers_gpu.sh OUT_DIR [steps...]
#   steps: tests bench steps fla-smoke layers2 rates survey (default: all)
# FIRST_CONFIG=1: every Triton autotuner runs its first configuration (benchmarks/first_config): for the
# correctness steps (tests, fla-smoke, layers2), never with the timing steps.
# AUTOTUNE_IN=an earlier call's OUT_DIR/triton-autotune.tgz (carried): fla's autotuning results restored
# first; this call's packed there at the end (benchmarks/autotune_cache.sh).
set -u
out=${1:?output folder}; shift
steps=${*:-tests bench steps fla-smoke layers2 rates survey}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
if [[ "${FIRST_CONFIG:-0}" == 1 ]]; then export PYTHONPATH="$PWD/benchmarks/first_config:${PYTHONPATH:-}"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
# shellcheck source=benchmarks/autotune_cache.sh
source benchmarks/autotune_cache.sh
autotune_restore
trap 'autotune_pack "$out"' EXIT
DELTA=deltanet,signed_deltanet,deltaproduct,gated_deltanet,rwkv7
run() {  # run NAME LIMIT_S CMD...: log to OUT/NAME.log, print rc and time
  local name=$1 limit=$2; shift 2
  local t=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - t)) s"
}
has() { [[ " $steps " == *" $1 "* ]]; }
report() {  # report NAME TITLE: OUT/NAME.md, the sweep's table under a line naming the device, date and commit
  { echo "# $2"; echo
    echo "$(cut -d, -f1 "$out/device.txt"), $(date -u +%F), commit $(git describe --always --dirty 2> /dev/null || echo unknown):"
    echo "\`bash benchmarks/mixers_gpu.sh OUT $1\`"; echo
    sed -n '/^| task/,$p' "${RUNS:-/tmp/gpu-runs}/$1/table.md"; } > "$out/$1.md" 2> /dev/null
  tail -n 3 "$out/$1.log"
}

if has tests; then
  run tests "${LIMIT_tests:-300}" python3 -m pytest -v -rf --tb=short -p no:cacheprovider -n "${TEST_WORKERS:-8}" -m gpu \
    tests/kernels/test_delta.py tests/mixers/test_delta_mixers.py tests/experiments/test_depth_gpu.py
  tail -n 15 "$out/tests.log"
fi
if has bench; then  # the gated delta rule: ours (chunk) vs fla (with our backward where fla refuses its own)
  run bench "${LIMIT_bench:-240}" python3 -m benchmarks.ops delta --out "$out"
  sed -n '/^# delta/,$p' "$out/bench.log"
fi
if has steps; then  # forward+backward per backend, eager and as a CUDA-graph replay (does the capture work?)
  run steps "${LIMIT_steps:-240}" python3 -m benchmarks.mixer_steps --mixers "${STEPS_MIXERS:-$DELTA,fla:DeltaNet,fla:GatedDeltaNet}" \
    --backends "${STEPS_BACKENDS:-chunk,fla,reference}" --json "$out/mixer_steps.json"
  sed -n '/median ms/,$p' "$out/steps.log"
fi
if has survey; then  # in the background, beside the sweeps below (after the timings above)
  timeout "${LIMIT_survey:-330}" python3 -m benchmarks.fla_layers --procs "${SURVEY_PROCS:-12}" --steps 100 \
    --timeout 200 --out "$out/fla-layers.md" > "$out/survey.log" 2>&1 &
  survey_pid=$!
fi
if has fla-smoke; then  # every named fla layer through the sweep CLI (smoke preset, eager steps: fla is not captured)
  run fla-smoke "${LIMIT_fla:-240}" python3 -m experiments.sweep parity --preset smoke --device cuda --workers 4 \
    --mixers fla:DeltaNet,fla:GatedDeltaNet,fla:GatedDeltaProduct,fla:RWKV7Attention --out "${RUNS:-/tmp/gpu-runs}/fla-smoke" --no-progress
  report fla-smoke "fla layers through the sweep CLI (parity, smoke preset, 1 layer)"
  head -n 8 "$out/fla-smoke.md" 2>/dev/null
fi
if has layers2; then  # every built-in mixer at two layers on the GPU, through the sweep (graph engine)
  run layers2 "${LIMIT_layers2:-300}" python3 -m experiments.sweep parity --preset smoke --device cuda --workers 12 \
    --layers 2 --max-steps 500 --out "${RUNS:-/tmp/gpu-runs}/layers2" --no-progress \
    --mixers "gru,lstm,elman,slstm,flashgru,flashlstm,transformer,mamba,mamba2,signed_mamba,mlstm_exp,mlstm_sig,$DELTA"
  report layers2 "every built-in mixer at 2 layers (parity, smoke preset, at most 500 steps)"
  head -n 20 "$out/layers2.md" 2>/dev/null
fi
if has rates; then  # steps/s per backend and engine: parity of the state-tracking preset, 1,500 steps, no early stop
  for backend in fla reference; do
    for engine in graph eager; do
      run "rates-$backend-$engine" "${LIMIT_rates:-200}" python3 -m experiments.sweep parity --preset state-tracking \
        --device cuda --workers 5 --engine "$engine" --mixers "$DELTA" --mixer-option "backend=$backend" --seeds 0 \
        --lrs 3e-3 --max-steps 1500 --train-option early_stop_acc=1.0 --out "${RUNS:-/tmp/gpu-runs}/rates-$backend-$engine" --no-progress
    done
  done
  python3 - "$out" <<'EOF'
import sys, pandas as pd, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for f in sorted(pathlib.Path(__import__("os").environ.get("RUNS", "/tmp/gpu-runs")).glob("rates-*/results.csv")):
    df = pd.read_csv(f)
    _, backend, engine = f.parent.name.split("-")
    for _, r in df.iterrows():
        rows.append({"mixer": r["mixer"], "backend": backend, "engine": r.get("engine", engine), "asked": engine,
                     "steady_steps_per_s": r.get("steady_steps_per_s"), "status": r["status"],
                     "note": r.get("engine_note", "") if isinstance(r.get("engine_note", ""), str) else ""})
t = pd.DataFrame(rows)
t.to_csv(out / "rates.csv", index=False)
print(t.to_markdown(index=False))
EOF
fi
if has survey; then
  wait "$survey_pid"; echo "=== survey rc=$?"
  head -n 8 "$out/fla-layers.md" 2>/dev/null
fi
