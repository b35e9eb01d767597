#!/usr/bin/env bash
# One device call that checks and times every Triton family (SPEC §7): GPU tests, then each family's
# benchmark (each checks its implementations against the reference before timing), then the sweep
# workers' throughput and a paper-table reproduction. Each step has its own time limit so one slow
# step cannot starve the rest; logs, JSON and tables are packed into OUT_DIR/results.tgz.
#   usage (on the GPU machine, repo root):  bash benchmarks/gpu_check.sh OUT_DIR [steps...]
#   steps: tests scan newton mlstm ssd fused_rnn trainstep workers workers-mps table6 flashrnn
#          (default: the kernel steps)
set -u
out=${1:?output folder}; shift
steps=${*:-tests scan newton mlstm ssd fused_rnn}
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
    tests) run tests "${TESTS_LIMIT_S:-150}" python3 -m pytest -v --tb=short -p no:cacheprovider \
             tests/kernels/test_fused_rnn.py::test_gpu_matches_reference tests/kernels/test_newton_fused.py \
             tests/kernels/test_scan_triton.py tests/kernels/test_ssd.py::test_triton_cuda tests/kernels/test_mlstm_triton.py ;;
    scan) run scan 150 python3 -m kernels.bench scan --sweep --out "$res/json" ;;
    newton) run newton 150 python3 -m kernels.bench newton --out "$res/json" ;;
    mlstm) run mlstm 70 python3 -m kernels.bench mlstm --sections main --dtypes fp32 --no-fla --out "$res/json" ;;
    ssd)  # one run per state size: both together do not fit in one step's limit
      # parallel compilation (--warm) and one chunk size, or mamba-ssm's serial autotuning overruns the limit
      for state in 64 128; do
        run "ssd-state$state" 150 python3 -m kernels.bench ssd --states "$state" --dtypes bf16,fp32 --chunks 128 \
          --impls triton-q128,mamba --warm 16 --warm-parts 6 --out "$res/json"
      done ;;
    fused_rnn) run fused_rnn 200 python3 -m kernels.bench fused_rnn --out "$res/json" ;;
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
