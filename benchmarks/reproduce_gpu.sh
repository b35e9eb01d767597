#!/usr/bin/env bash
# A paper-table reproduction that outlives one device call (each call is limited to 10 minutes).
#   start: launch `experiments.reproduce NAME --workers W` in its own process session (setsid), so it
#          keeps running on the warm machine after the call returns; then wait like `wait`.
#   wait:  wait up to WAIT_S seconds (default 540) for it to finish; then write the comparison from
#          what has finished and pack the log, the table and the workers' logs into OUT_DIR.
# The next call must come within the machine's idle time (30 s) or the machine and the run are gone;
# a re-run of `start` resumes from the study (finished trials are kept, interrupted ones re-run).
#   usage (on the GPU machine, repo root):  bash benchmarks/reproduce_gpu.sh OUT_DIR start|wait NAME [reproduce args...]
# RUN_DIR (default runs/reproduce/NAME) is the reproduction's --out: put it outside any folder that a
# device call carries (a carried folder is replaced on every call, with what was written inside it).
set -u
out=${1:?output folder}; action=${2:?start or wait}; name=${3:?table name}; shift 3
workers=${WORKERS:-16}
mps=$([ "${MPS:-1}" = 1 ] && echo --mps)  # MPS=0: time-sliced workers (about half the throughput)
run_dir=${RUN_DIR:-runs/reproduce/$name}
mkdir -p "$run_dir" "$out"
pid_file=$run_dir/bg.pid log=$run_dir/bg.log
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
if [ "$action" = start ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
  setsid nohup python3 -m experiments.reproduce "$name" --out "$run_dir" --workers "$workers" $mps --no-progress "$@" >> "$log" 2>&1 &
  echo $! > "$pid_file"
  echo "started $name (pid $(cat "$pid_file"), $workers workers ${mps:-without MPS}) at $(date -u +%FT%TZ)"
fi
deadline=$((SECONDS + ${WAIT_S:-540}))
while kill -0 "$(cat "$pid_file")" 2> /dev/null && [ $SECONDS -lt $deadline ]; do
  sleep 15
  printf '%s  finished trials: %s\n' "$(date -u +%T)" "$(find "$run_dir" -name model.pt 2> /dev/null | wc -l)"
done
if kill -0 "$(cat "$pid_file")" 2> /dev/null; then state=running; else state=finished; fi
echo "$name: $state at $(date -u +%FT%TZ)"
tail -n 30 "$log"
python3 -m experiments.reproduce "$name" --out "$run_dir" --table-only "$@" --copy-to "$out/$name-gpu.md" > "$out/table.log" 2>&1 \
  || tail -n 5 "$out/table.log"
tar -C "$run_dir" -czf "$out/$name-run.tgz" --exclude='*.ckpt' --exclude='*.pt' . 2> /dev/null
cp "$log" "$out/$name.log"
echo "$state" > "$out/state.txt"
