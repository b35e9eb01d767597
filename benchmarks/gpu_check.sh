#!/usr/bin/env bash
# One device call that checks and times every Triton family (SPEC §7): GPU tests, then each family's
# benchmark (each checks its implementations against the reference before timing). Each step has its
# own time limit so one slow family cannot starve the rest.
#   usage (on the GPU machine, repo root):  bash benchmarks/gpu_check.sh OUT_DIR [steps...]
#   steps: tests scan newton mlstm ssd fused_rnn (default: all)
set -u
out=${1:?output folder}; shift
steps=${*:-tests scan newton mlstm ssd fused_rnn}
mkdir -p "$out/json"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
run() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - t0))s"; tail -n 25 "$out/$name.log"
}
for step in $steps; do
  case $step in
    tests) run tests 240 python3 -m pytest -q -x -p no:cacheprovider \
             tests/kernels/test_fused_rnn.py::test_gpu_matches_reference tests/kernels/test_newton_fused.py \
             tests/kernels/test_scan_triton.py tests/kernels/test_ssd.py::test_triton_cuda tests/kernels/test_mlstm_triton.py ;;
    scan) run scan 150 python3 -m kernels.bench scan --sweep --out "$out/json" ;;
    newton) run newton 150 python3 -m kernels.bench newton --out "$out/json" ;;
    mlstm) run mlstm 200 python3 -m kernels.bench mlstm --sections main,chunk --dtypes fp32 --no-fla --out "$out/json" ;;
    ssd) run ssd 150 python3 -m kernels.bench ssd --states 64,128 --dtypes bf16,fp32 --out "$out/json" ;;
    fused_rnn) run fused_rnn 200 python3 -m kernels.bench fused_rnn --out "$out/json" ;;
    *) echo "unknown step $step" ;;
  esac
done
tar -C "$out" -czf "$out/json.tgz" json && rm -rf "$out/json"
