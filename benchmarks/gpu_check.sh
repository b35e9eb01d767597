#!/usr/bin/env bash
# One device call for the training-side checks: the training step's throughput, the sweep workers'
# throughput (plain and under MPS) and paper-table reproductions. Each step has its own time limit so one
# slow step cannot starve the rest; logs, JSON and tables are packed into OUT_DIR/results.tgz.
# The kernel tests and benchmarks: benchmarks/ops/gpu_check.sh.
#   usage (on the GPU machine, repo root):  bash benchmarks/gpu_check.sh OUT_DIR [steps...]
#   steps: trainstep workers workers-mps table6 flashrnn (default: trainstep workers)
set -u
out=${1:?output folder}; shift
steps=${*:-trainstep workers}
res="$out/results"
mkdir -p "$res/json"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
run() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - t0))s"; tail -n 25 "$res/$name.log"
}
for step in $steps; do
  case $step in
    trainstep)  # one process: steps/s of the preset models without Lightning, with and without the Newton check
      run trainstep 200 python3 -m experiments.throughput --skip-generation --preset pararnn-table6 --tasks mqar,parity \
        --mixers flashgru,flashlstm,transformer,mamba2 --device cuda --steps 200 --set check=false --profile ;;
    workers) run workers 240 python3 -m experiments.workers --counts "${WORKER_COUNTS:-1,4,8,16}" --steps 300 --device cuda \
               --mixer "${WORKER_MIXER:-flashgru}" --json "$res/workers-gpu.json" --no-progress ;;
    workers-mps)  # the same under the CUDA Multi-Process Service (kernels of all workers share the GPU at once)
      run workers-mps 240 python3 -m experiments.workers --counts "${WORKER_COUNTS:-1,4,8,16}" --steps 300 --device cuda \
               --mixer "${WORKER_MIXER:-flashgru}" --mps --json "$res/workers-gpu-mps.json" --no-progress ;;
    table6|flashrnn)
      name=$([ "$step" = table6 ] && echo pararnn-table6 || echo flashrnn-parity)
      # shellcheck disable=SC2086  # REPRODUCE_ARGS: e.g. "--only mqar,khop"
      run "$step" "${REPRODUCE_LIMIT_S:-300}" python3 -m experiments.reproduce "$name" --workers 16 --no-progress ${REPRODUCE_ARGS:-}
      run "$step-table" 40 python3 -m experiments.reproduce "$name" --table-only ${REPRODUCE_ARGS:-} --copy-to "$res/$name-gpu.md" ;;
    *) echo "unknown step $step" ;;
  esac
done
tar -C "$out" -czf "$out/results.tgz" results && rm -rf "$res"
