#!/usr/bin/env bash
# One device call for the training side: the CUDA-graph engine's GPU tests, the step engines' throughput,
# and paper-table reproductions that may outlive one call.
#   usage (GPU machine, repository root, optuna importable):  bash benchmarks/training/gpu.sh OUT_DIR STEP...
#   steps:
#     graph-tests           tests/experiments/test_cuda_graph.py (graph vs eager, the Newton policy, resume) and
#                           tests/benchmarks/test_step_profile.py
#     kernels               python -m benchmarks.training.throughput kernels --compile --top 8 (kernels and GPU time of a
#                           captured step, and its 8 heaviest kernels)
#     steps                 python -m benchmarks.training.throughput steps (single trials, eager and graph)
#     workers               python -m benchmarks.training.throughput workers (N = WORKER_COUNTS under MPS, eager and graph)
#     saturation            python -m benchmarks.training.saturation kernels, steps and slots (what bounds 16 processes on one GPU)
#     streams               python -m benchmarks.training.saturation steps (16 processes, MPS) then streams (1, 4, 8, 16 streams of
#                           one process): the same compiled steps with and without processes and MPS (STREAMS_S s each); GPU 0's
#                           power and clocks in OUT/streams-dmon.txt (nvidia-smi dmon)
#     shares                python -m benchmarks.training.saturation shares (each mixer's step alone on 16 streams, then the mix)
#                           (GPU 0's power and clocks in OUT/shares-dmon.txt)
#     counters              python -m benchmarks.training.saturation counters (each mixer's step under ncu; raw CSVs in OUT/counters)
#     mfu                   python -m benchmarks.training.mfu MFU_PRESETS --workers 16 --mps MFU_ARGS: the MFU report
#                           OUT/mfu.md and OUT/mfu.json (with MFU_MERGE=an earlier call's mfu.json, carried: its other
#                           presets kept, --merge)
#     start:NAME            start (or resume) a reproduction in its own process session (setsid) in RUN_ROOT/reproduce
#                           (one study for every reproduction, as experiments.reproduce's default) and go on at once;
#                           on a fresh machine, with RESTORE_RUN=an archive of a `wait`/`stop` (carried), it unpacks it first;
#                           where the reproduction is still running (a machine kept from the last call) it does nothing
#     wait:NAME             wait up to WAIT_S s for the reproduction, then write the table from what finished
#                           (OUT_DIR/NAME.md; of the cells that REPRODUCE_ARGS select) and pack the run into
#                           OUT_DIR/NAME-run.tgz (benchmarks.training.pack_run: the journal, and the checkpoints of
#                           unfinished trials, furthest-trained first, within PACK_MAX_MB (default 48) MiB: the rest
#                           restart; over 15 MiB it comes as NAME-run.tgz.part00, .part01, ...: the device tool
#                           returns files of at most 16 MiB, 64 MiB per call, and the archive travels back with
#                           the checkout and the carried wheels, 64 MiB per call too)
#     watch:NAME            wait up to WAIT_S s for the reproduction, printing its progress as `wait` does; no table, no
#                           archive (a call between a `start:` and a `stop:` that keeps the machine busy)
#     stop:NAME             as `wait`, but interrupts the reproduction (Ctrl-C to its process group: running trials
#                           write interrupted.ckpt) once WAIT_S s are up, so the archive resumes on another machine.
#     bundle                every file under OUT_DIR but the run archives into OUT_DIR/bundle.tgz (the originals removed):
#                           the device tool returns at most 8 files per call, and the archive's parts must all come back
#   A long reproduction: each device call `start:NAME wait:NAME bundle` with WAIT_S about 90 s below the call's limit
#   and RESTORE_RUN set to the previous call's archive. On a machine still held from that call, `start:` finds the
#   reproduction running and leaves it (no restore, no restart: the run goes on while the calls come and go); on a fresh
#   machine it restores the archive and resumes, so no call depends on the machine staying held (idle machines are
#   released within a minute). `wait:` packs a running reproduction without interrupting it (checkpoints of the last
#   validation); `stop:NAME bundle` instead interrupts it first (the trials' own interrupted.ckpt, up to 2 minutes).
#   Send a `start:` step's output to a file, not a pipe.
# Environment: KERNELS_ARGS / STEPS_ARGS / WORKERS_ARGS (extra arguments), RUN_ROOT (default /tmp/runs: outside any carried
# folder), REPRODUCE_OUT (the reproductions' --out, default RUN_ROOT/reproduce), REPRODUCE_ARGS (default
# "--workers 16 --mps"), WAIT_S (default 540), PACK_MAX_MB (default 48), RESTORE_RUN (a NAME-run.tgz to resume from on a fresh machine),
# EXPRESSIVITY_COMMIT (the commit results record where the checkout has no .git), MFU_PRESETS (default: pararnn-table6
# grazzi-table3 deltaproduct-groups state-tracking), MFU_ARGS, MFU_MERGE.
set -u
out=${1:?output folder}; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
run_root=${RUN_ROOT:-/tmp/runs}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
# GPU 0's power and clocks, sampled every second by `nvidia-smi dmon` while a step runs (OUT/STEP-dmon.txt)
dmon_start() { nvidia-smi dmon -i 0 -s pc -d 1 > "$out/$1-dmon.txt" 2>&1 & dmon_pid=$!; }
dmon_stop() {
  kill "$dmon_pid" 2> /dev/null; wait "$dmon_pid" 2> /dev/null
  # columns: gpu pwr(W) gtemp mtemp mclk pclk(MHz); the samples within 10% of the highest power: the loaded ones
  awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {n++; w[n] = $2; c[n] = $6; if ($2 > top) top = $2}
       END {lo = ""; hi = 0; k = 0
            for (i = 1; i <= n; i++) if (w[i] >= 0.9 * top) {k++; if (lo == "" || c[i] < lo) lo = c[i]; if (c[i] > hi) hi = c[i]}
            printf "=== GPU 0 under load (%d samples within 10%% of %s W): SM clock %s-%s MHz\n", k, top, lo, hi}' "$out/$1-dmon.txt"
}
for step in "$@"; do
  t0=$SECONDS
  case $step in
    graph-tests)
      timeout -k 10 400 python3 -m pytest -q -p no:cacheprovider tests/experiments/test_cuda_graph.py \
        tests/benchmarks/test_step_profile.py > "$out/graph-tests.log" 2>&1
      echo "=== graph-tests rc=$? in $((SECONDS - t0)) s"; tail -n 15 "$out/graph-tests.log" ;;
    kernels)
      # shellcheck disable=SC2086
      timeout -k 10 400 python3 -m benchmarks.training.throughput kernels --compile --top 8 ${KERNELS_ARGS:-} --json "$out/kernels.json" \
        > "$out/kernels.log" 2>&1
      echo "=== kernels rc=$? in $((SECONDS - t0)) s"; grep "^|" "$out/kernels.log" ;;
    steps)
      # shellcheck disable=SC2086
      timeout -k 10 500 python3 -m benchmarks.training.throughput steps --device cuda ${STEPS_ARGS:-} --json "$out/steps.json" \
        > "$out/steps.log" 2>&1
      echo "=== steps rc=$? in $((SECONDS - t0)) s"; grep "^|" "$out/steps.log" ;;
    workers)
      # shellcheck disable=SC2086
      timeout -k 10 560 python3 -m benchmarks.training.throughput workers --device cuda --mps --counts "${WORKER_COUNTS:-1,4,8,16}" \
        --out "$run_root/bench-workers" ${WORKERS_ARGS:-} --json "$out/workers.json" > "$out/workers.log" 2>&1
      echo "=== workers rc=$? in $((SECONDS - t0)) s"; grep "^|" "$out/workers.log" ;;
    saturation)
      { timeout -k 10 200 python3 -m benchmarks.training.saturation kernels --procs 1,16 --seconds 4
        timeout -k 10 200 python3 -m benchmarks.training.saturation steps --procs 16 --tasks khop2 --seconds 15
        timeout -k 10 200 python3 -m benchmarks.training.saturation slots --tasks khop2 --top 5; } \
        > "$out/saturation.log" 2>&1
      echo "=== saturation rc=$? in $((SECONDS - t0)) s"; grep "^{" "$out/saturation.log" ;;
    streams)
      dmon_start streams
      { timeout -k 10 240 python3 -m benchmarks.training.saturation steps --procs 16 --tasks khop2 --seconds "${STREAMS_S:-10}"
        timeout -k 10 360 python3 -m benchmarks.training.saturation streams --streams 1,4,8,16 --tasks khop2 --seconds "${STREAMS_S:-10}"; } \
        > "$out/streams.log" 2>&1
      echo "=== streams rc=$? in $((SECONDS - t0)) s"; dmon_stop streams; grep "^{" "$out/streams.log" ;;
    shares)
      dmon_start shares
      timeout -k 10 560 python3 -m benchmarks.training.saturation shares --streams 16 --tasks khop2 --seconds 6 \
        > "$out/shares.log" 2>&1
      echo "=== shares rc=$? in $((SECONDS - t0)) s"; dmon_stop shares; grep "^{" "$out/shares.log" ;;
    mfu)
      merge=""
      if [ -n "${MFU_MERGE:-}" ]; then cp "$MFU_MERGE" "$out/mfu.json" && merge=--merge; fi
      # shellcheck disable=SC2086
      timeout -k 10 560 python3 -m benchmarks.training.mfu ${MFU_PRESETS:-pararnn-table6 grazzi-table3 deltaproduct-groups state-tracking} \
        --workers 16 --mps --scratch "$run_root/bench-mfu" $merge ${MFU_ARGS:-} --out "$out/mfu.md" > "$out/mfu.log" 2>&1
      echo "=== mfu rc=$? in $((SECONDS - t0)) s"; grep -E "^(## |All |The )" "$out/mfu.md" ;;
    counters)
      timeout -k 10 500 python3 -m benchmarks.training.saturation counters --tasks khop2 --top 6 --csv-dir "$out/counters" \
        > "$out/counters.log" 2>&1
      echo "=== counters rc=$? in $((SECONDS - t0)) s"; grep "^{" "$out/counters.log" ;;
    start:*|wait:*|stop:*|watch:*)
      name=${step#*:}; dir=${REPRODUCE_OUT:-$run_root/reproduce}; args=${REPRODUCE_ARGS:---workers 16 --mps}
      mkdir -p "$dir"
      if [[ $step == start:* ]]; then
        if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2> /dev/null; then
          echo "=== $name is running (pid $(cat "$dir/$name.pid")): this machine was kept; no restore, no second start"
          continue
        fi
        if [ -n "${RESTORE_RUN:-}" ] && [ ! -e "$dir/journal.log" ]; then
          # the archive, or its parts NAME-run.tgz.part00, .part01, ...
          if [ -f "$RESTORE_RUN" ]; then tar -xzf "$RESTORE_RUN" -C "$dir"; else cat "$RESTORE_RUN".part* | tar -xz -C "$dir"; fi \
            && echo "=== restored $RESTORE_RUN into $dir"
        fi
        # run from a copy: the next device call replaces this checkout under a running job
        code=/tmp/code-$name; rm -rf "$code"; mkdir -p "$code"
        cp -r tasks mixers kernels experiments analysis pyproject.toml "$code"/
        # the copy has no .git: results record EXPRESSIVITY_COMMIT when given (a device checkout's .git
        # may be older than its files), else the checkout's commit
        commit=${EXPRESSIVITY_COMMIT:-$(git describe --always --dirty --abbrev=12 2> /dev/null || echo unknown)}
        # shellcheck disable=SC2086
        (cd "$code" && EXPRESSIVITY_COMMIT=$commit PYTHONPATH="$code:${PYTHONPATH:-}" setsid nohup python3 -m experiments.reproduce "$name" --out "$dir" \
          --no-progress $args >> "$dir/$name.log" 2>&1 < /dev/null &)
        sleep 1; pgrep -f -n "experiments.reproduce $name" > "$dir/$name.pid"
        echo "=== started $name (pid $(cat "$dir/$name.pid")) at $(date -u +%FT%TZ)"
        continue
      fi
      pid=$(cat "$dir/$name.pid")
      deadline=$((SECONDS + ${WAIT_S:-540}))
      while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $deadline ]; do
        sleep 15; grep "cells done" "$dir/$name.log" | tail -n 1
      done
      if [[ $step == watch:* ]]; then
        echo "=== $name: $(kill -0 "$pid" 2> /dev/null && echo running || echo finished) at $(date -u +%FT%TZ)"
        continue
      fi
      if [[ $step == stop:* ]] && kill -0 "$pid" 2> /dev/null; then
        kill -INT -- "-$(ps -o pgid= "$pid" | tr -d ' ')"  # its process group (setsid): the workers too
        for _ in $(seq 120); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
      fi
      state=$(kill -0 "$pid" 2> /dev/null && echo running || echo finished)
      echo "=== $name: $state at $(date -u +%FT%TZ)"; tail -n 5 "$dir/$name.log"
      # the table of the cells the run was asked for (REPRODUCE_ARGS' --quick, --only, --device, ...; --table-only
      # starts no worker and no MPS daemon)
      # shellcheck disable=SC2086
      python3 -m experiments.reproduce "$name" --out "$dir" --table-only $args --copy-to "$out/$name.md" > "$out/$name-table.log" 2>&1 \
        || tail -n 5 "$out/$name-table.log"
      rm -f "$out/$name-run.tgz" "$out/$name-run.tgz".part*
      python3 -m benchmarks.training.pack_run "$dir" "$out/$name-run.tgz" "$name" --max-mb "${PACK_MAX_MB:-48}"
      cat "$out/$name.md" 2> /dev/null | sed -n '/^| model/,/^$/p' ;;
    bundle)
      (cd "$out" && find . -type f ! -name '*-run.tgz' ! -name '*-run.tgz.part*' ! -name bundle.tgz -print0 \
        | tar -czf bundle.tgz --null -T - --remove-files) && echo "=== bundled into $out/bundle.tgz" ;;
    *) echo "unknown step $step" ;;
  esac
done
