"""Parallel sweep workers (SPEC §8.2 ``--workers N``) and their throughput benchmark.

``run_workers`` starts N long-lived worker processes on this machine (``multiprocessing`` spawn).
Each opens the study's storage and loops: claim a WAITING trial, run it, record it; when none is
left it re-queues the cells of dead workers (``study.sync_grid``) and waits for the running ones,
then exits. Worker ``i`` trains on ``cuda:{i % K}`` with K visible GPUs (several workers per GPU:
the models are tiny), else on the CPU with one thread. The parent shows one progress bar over all
cells by polling the storage, rewrites ``results.csv``/``table.md`` as cells finish (atomically),
replaces a worker that died (e.g. a CUDA error that poisoned its context) while cells remain, and
on Ctrl-C stops the workers, whose trials are then re-run by the next invocation.

Worker logs: ``<out>/workers/worker-<i>.log``.

Throughput benchmark::

    python -m experiments.workers --counts 1,4,8,16 --task mqar --mixer flashgru --steps 400 \\
        [--device cuda] [--json benchmarks/reproduction/workers-h100.json]

runs N identical fixed-step trials on N workers for each N and reports steps/s per worker and in
total (training only) and end-to-end trials per hour.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("experiments.workers")

#: a worker exits with this code to be replaced by a fresh process (its CUDA context is broken)
EXIT_RESTART = 75


def worker_devices(n: int, device: str = "auto") -> list[str]:
    """Device of each of ``n`` workers: ``cuda:{i % K}`` over the K visible GPUs, else ``cpu``."""
    import torch

    if device in ("auto", "cuda"):
        k = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if k == 0:
            if device == "cuda":
                raise ValueError("device 'cuda' requested but CUDA is not available")
            return ["cpu"] * n
        return [f"cuda:{i % k}" for i in range(n)]
    return [device] * n


def _cuda_broken(device: str) -> bool:
    if not device.startswith("cuda"):
        return False
    import torch

    try:
        (torch.ones(1, device=device) + 1).item()
        torch.cuda.synchronize(device)
        return False
    except Exception:
        return True


def worker_loop(study, specs: list, out: Path, device: str | None = None, stale_timeout: float = 60,
                poll_s: float = 2.0, on_trial: Callable[[dict, str], None] | None = None,
                on_claim: Callable[[dict], None] | None = None) -> dict[str, int]:
    """Claim and run trials of ``specs``' cells until every cell is done; returns outcome counts.

    While other workers still run trials, waits (``poll_s``) and re-queues the cells of dead
    workers. ``on_claim(spec_dict)``/``on_trial(spec_dict, outcome)`` are called around each trial.
    """
    from experiments._heartbeat import Heartbeat
    from experiments.study import HEARTBEAT_DIR, HEARTBEAT_INTERVAL, claim_next, cell_id, sync_grid, \
        uses_heartbeat_files, worker_id
    from experiments.sweep import run_one

    cells = {cell_id(s) for s in specs}
    hb_dir = out / HEARTBEAT_DIR if uses_heartbeat_files(study._storage) else None
    counts = {"ok": 0, "nan": 0, "error": 0, "lost": 0}
    with Heartbeat(study._storage, hb_dir, worker_id(), interval=min(HEARTBEAT_INTERVAL, stale_timeout / 4)) as hb:
        while True:
            trial = claim_next(study, cells)
            if trial is not None:
                hb.set_trial(trial._trial_id)
                if on_claim:
                    on_claim(trial.user_attrs["spec"])
                outcome = run_one(study, trial, out, device=device)
                hb.set_trial(None)
                counts[outcome] = counts.get(outcome, 0) + 1
                if on_trial:
                    on_trial(trial.user_attrs["spec"], outcome)
                if outcome == "error" and device and _cuda_broken(device):
                    log.error("CUDA context on %s is broken after trial %d: this worker exits", device, trial.number)
                    counts["restart"] = 1
                    return counts
                continue
            state = sync_grid(study, specs, heartbeat_dir=out / HEARTBEAT_DIR, stale_timeout=stale_timeout)
            if state["queued"] or state["stale"]:
                continue
            if state["pending"] == 0:
                return counts
            time.sleep(poll_s)


def _worker_main(index: int, spec_dicts: list[dict], study_name: str, storage_url: str | None, out: str,
                 device: str, stale_timeout: float) -> None:
    """Entry point of a worker process (spawned): logs to ``<out>/workers/worker-<index>.log``."""
    out_dir = Path(out)
    logs = out_dir / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    fd = os.open(logs / f"worker-{index}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{index} pid={os.getpid()} %(message)s")

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    from experiments.study import open_storage, open_study
    from experiments.train import TrialSpec, quiet_lightning

    quiet_lightning()
    specs = [TrialSpec.from_dict(d) for d in spec_dicts]
    study = open_study(open_storage(storage_url, out_dir, stale_timeout), study_name)
    log.info("worker %d on %s: %d cells", index, device, len(specs))
    try:
        counts = worker_loop(study, specs, out_dir, device=device, stale_timeout=stale_timeout,
                             on_trial=lambda s, o: log.info("%s seed=%s lr=%g: %s", s["mixer"], s["seed"], s["lr"], o))
    except KeyboardInterrupt:
        log.info("interrupted")
        sys.exit(130)
    log.info("done: %s", counts)
    sys.exit(EXIT_RESTART if counts.get("restart") else 0)


def start_worker(index: int, specs: list, study_name: str, storage_url: str | None, out: Path, device: str,
                 stale_timeout: float) -> mp.Process:
    """Spawn one worker process (``multiprocessing`` spawn context) and return it."""
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_worker_main, name=f"sweep-worker-{index}",
                       args=(index, [s.to_dict() for s in specs], study_name, storage_url, str(out), device,
                             stale_timeout))
    proc.start()
    return proc


def run_workers(study, specs: list, out: Path, storage_url: str | None, n_workers: int, device: str = "auto",
                stale_timeout: float = 60, progress: bool = True, label: str = "sweep",
                on_progress: Callable[[], None] | None = None, max_restarts: int | None = None) -> dict[str, int]:
    """Run ``specs``' cells (already enqueued in ``study``) on ``n_workers`` processes; wait for them.

    ``on_progress()`` is called whenever the number of finished cells changes (the sweep rewrites
    its results files there). Returns the final ``study.progress`` counts.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from experiments.study import cell_id, progress as cell_progress

    if n_workers < 1:
        raise ValueError(f"--workers must be >= 1, got {n_workers}")
    cells = list(dict.fromkeys(cell_id(s) for s in specs))
    devices = worker_devices(n_workers, device)
    restarts_left = n_workers if max_restarts is None else max_restarts
    procs = {i: start_worker(i, specs, study.study_name, storage_url, out, devices[i], stale_timeout)
             for i in range(n_workers)}
    log.info("%d workers on %s", n_workers, ", ".join(sorted(set(devices))))
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}")]
    last_done = -1
    try:
        with Progress(*columns, disable=not progress, transient=False) as bar:
            task_id = bar.add_task(f"{label} ({n_workers} workers)", total=len(cells), status="")
            while True:
                counts = cell_progress(study, cells)
                bar.update(task_id, completed=counts["done"],
                           status=f"{counts['running']} running, {counts['waiting']} waiting")
                if counts["done"] != last_done:
                    last_done = counts["done"]
                    if on_progress:
                        on_progress()
                alive = {i: p for i, p in procs.items() if p.is_alive()}
                for i, p in procs.items():
                    if i in alive or p.exitcode in (0, None):
                        continue
                    left = counts["running"] + counts["waiting"] + counts["todo"]
                    if left and restarts_left > 0:
                        restarts_left -= 1
                        log.warning("worker %d exited with code %s; starting a fresh one (%d restarts left)",
                                    i, p.exitcode, restarts_left)
                        alive[i] = start_worker(i, specs, study.study_name, storage_url, out, devices[i], stale_timeout)
                    else:
                        log.warning("worker %d exited with code %s", i, p.exitcode)
                procs = {**procs, **alive}
                if not alive:
                    break
                time.sleep(1.0)
    except KeyboardInterrupt:
        for p in procs.values():
            if p.is_alive():
                p.terminate()
        for p in procs.values():
            p.join(timeout=30)
        raise
    for p in procs.values():
        p.join()
    counts = cell_progress(study, cells)
    if on_progress:
        on_progress()
    return counts


# --- throughput benchmark ----------------------------------------------------------------------------
def bench_workers(counts: list[int], task: str, mixer: str, steps: int, device: str, out: Path,
                  preset: str = "pararnn-table6", progress: bool = True) -> list[dict[str, Any]]:
    """For each N in ``counts``: N identical ``steps``-step trials on N workers; throughput rows."""
    import dataclasses
    import shutil

    from experiments.presets import resolve_sweep
    from experiments.results import collect
    from experiments.study import cell_id, open_storage, open_study, sync_grid
    from experiments.sweep import build_specs

    rows = []
    for n in counts:
        train = {"max_steps": steps, "early_stop_acc": 2.0, "eval_every": steps, "test_size": 2000, "val_size": 500}
        plan = resolve_sweep(task, preset, {"mixers": [mixer], "seeds": list(range(n)), "train": train})
        specs = build_specs(plan, device)
        run_dir = out / f"n{n}"
        shutil.rmtree(run_dir, ignore_errors=True)
        study = open_study(open_storage(None, run_dir), f"bench-{n}")
        sync_grid(study, specs)
        t0 = time.perf_counter()
        run_workers(study, specs, run_dir, None, n, device, progress=progress, label=f"bench N={n}")
        wall = time.perf_counter() - t0
        df = collect(study, [cell_id(s) for s in specs])
        ok = df[df["status"] == "ok"] if len(df) else df
        per_worker = float(ok["steps_per_s"].mean()) if len(ok) else float("nan")
        rows.append({
            "workers": n, "task": plan.task, "mixer": mixer, "steps": steps, "ok_trials": int(len(ok)),
            "device": str(ok["device"].iloc[0]) if len(ok) else device,
            "steps_per_s_per_worker": round(per_worker, 1),
            "total_steps_per_s": round(per_worker * len(ok), 1),
            "wall_s": round(wall, 1),
            "end_to_end_steps_per_s": round(float(ok["steps"].sum()) / wall, 1) if len(ok) else float("nan"),
            "trials_per_hour": round(3600 * len(ok) / wall, 1),
            "train_config": json.dumps(dataclasses.asdict(plan.train)),
        })
        log.info("N=%d: %s", n, rows[-1])
    return rows


def main(argv: list[str] | None = None) -> int:
    from experiments.mps import add_mps_argument, cuda_mps

    p = argparse.ArgumentParser(
        prog="python -m experiments.workers",
        description="Throughput of N parallel sweep workers: N identical fixed-step trials (no early stopping) "
                    "on N workers, for each N; prints steps/s per worker and in total.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--counts", default="1,4,8,16", help="worker counts to measure (default: %(default)s)")
    p.add_argument("--task", default="mqar", help="a task entry of --preset (default: %(default)s)")
    p.add_argument("--preset", default="pararnn-table6", help="preset giving the task's shapes (default: %(default)s)")
    p.add_argument("--mixer", default="flashgru", help="mixer to train (default: %(default)s)")
    p.add_argument("--steps", type=int, default=400, help="training steps per trial (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-workers"), help="scratch folder (default: %(default)s)")
    p.add_argument("--json", type=Path, help="also write the rows here as JSON")
    add_mps_argument(p)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        counts = [int(x) for x in args.counts.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError(f"--counts must be positive integers, got {args.counts!r}")
        with cuda_mps(args.mps):
            rows = bench_workers(counts, args.task, args.mixer, args.steps, args.device, args.out, args.preset,
                                 progress=not args.no_progress)
        for r in rows:
            r["mps"] = args.mps
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    head = ["workers", "steps_per_s_per_worker", "total_steps_per_s", "end_to_end_steps_per_s", "trials_per_hour", "wall_s"]
    print(f"{rows[0]['device']}: {args.task} / {args.mixer}, {args.steps} steps per trial" + (", under MPS" if args.mps else ""))
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(r[h]) for h in head) + " |")
    if args.json:
        import platform

        import torch

        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
                "cpu_count": os.cpu_count()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
