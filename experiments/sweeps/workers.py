"""Running the cells of a study: the per-trial step, the worker loop and the pool of worker processes.

``run_cells`` runs claimed trials (one through ``experiments.trial.train.run_trial`` in the cell's folder,
or one cell's seeds as a stack through ``experiments.trial.stack.run_stack``) and records their outcomes in
the study. ``worker_loop`` claims and runs trials until every cell is done, re-queueing
the cells of dead workers. ``run_workers`` starts N long-lived worker processes on this machine
(``multiprocessing`` spawn), each running ``worker_loop``: worker ``i`` trains on ``cuda:{i % K}``
with K visible GPUs (several workers per GPU: the models are tiny), else on the CPU with one thread.
Under ``--mps``, the cells of ``priority: high`` sweeps go first to a quarter of the workers, which run
at the MPS server's normal client priority while the others run below it (``priority_classes``).
The parent reports progress by polling the storage, replaces a worker that died (e.g. a CUDA error
that poisoned its context) while cells remain, and on Ctrl-C stops the workers, whose trials are
recorded as interrupted and re-run by the next invocation. Worker logs: ``<out>/workers/worker-<i>.log``.

A cell's folder, ``<out>/trials/<entry>-<mixer>-s<seed>-lr<lr>-<hash>/``, is the same for every
trial of the cell: a re-run after an interruption resumes from its ``checkpoints/last.ckpt``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from experiments.engines.mps import BELOW_NORMAL as MPS_BELOW_NORMAL
from experiments.engines.mps import NORMAL as MPS_NORMAL
from experiments.engines.mps import PRIORITY_ENV, mps_running
from experiments.engines.signals import raise_on_sigterm

log = logging.getLogger("experiments.sweeps.workers")

#: a worker exits with this code to be replaced by a fresh process (its CUDA context is broken)
EXIT_RESTART = 75
#: a worker exits with this code when it was interrupted (Ctrl-C / SIGTERM)
EXIT_INTERRUPTED = 130

Cell = tuple  # (entry: str, spec: TrialSpec)


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


def _allowed_cpus() -> list[int]:
    """Indices of the CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def host_cores() -> int:
    """CPU cores this process may run on."""
    return len(_allowed_cpus())


def physical_cores(sysfs: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Physical cores among the CPUs this process may run on (hyper-threads counted once), from Linux's
    ``cpu<i>/topology/thread_siblings_list``; ``None`` where that is not readable."""
    cpus = _allowed_cpus()
    try:
        return len({(sysfs / f"cpu{i}" / "topology" / "thread_siblings_list").read_text().strip() for i in cpus})
    except OSError:
        return None


def worker_threads(n_workers: int, cores: int | None = None) -> int:
    """Torch CPU threads of each of ``n_workers`` worker processes: an equal share of the host's cores, at least 1.

    Without it every worker would start one thread per core, and 16 GPU workers on 16 cores would spend
    most of their time contending for the CPU (data generation, kernel launches): docs/performance.md.
    """
    return max(1, (host_cores() if cores is None else cores) // max(1, n_workers))


def priority_classes(n_workers: int, n_priority_cells: int, mps: bool) -> list[int | None]:
    """The MPS client priority of each of ``n_workers`` workers (``None``: leave it as it is).

    With MPS and some high-priority cells, a quarter of the workers (at least one, at most one per such
    cell) run at ``MPS_NORMAL`` and take those cells first; the others run at ``MPS_BELOW_NORMAL``, so the
    server schedules the first group's kernels ahead of theirs: the longest trials finish sooner, the
    total rate stays (docs/performance.md, "Priority for the longest trials").
    """
    if not mps or n_priority_cells == 0:
        return [None] * n_workers
    high = min(n_priority_cells, max(1, n_workers // 4))
    return [MPS_NORMAL] * high + [MPS_BELOW_NORMAL] * (n_workers - high)


def cell_dir(out: Path, entry: str, spec) -> Path:
    """The folder of a cell (shared by all its trials, so an interrupted trial resumes there)."""
    from experiments.sweeps.study import spec_hash

    return out / "trials" / f"{entry}-{path_name(spec.model.mixer)}-s{spec.seed}-lr{spec.lr:g}-{spec_hash(spec)}"


def stack_dir(out: Path, entry: str, specs: list) -> Path:
    """The folder of a stack of trials (``experiments.trial.stack``): its resume checkpoint and step log. The
    same trials stacked again (a re-run after an interruption) resume there."""
    import hashlib

    from experiments.trial.stack import stack_key

    spec = specs[0]
    digest = hashlib.sha1(stack_key(spec).encode()).hexdigest()[:10]
    seeds = ",".join(str(s.seed) for s in specs)
    return out / "stacks" / f"{entry}-{path_name(spec.model.mixer)}-lr{spec.lr:g}-s{seeds}-{digest}"


def path_name(mixer: str) -> str:
    """A mixer name as part of a folder name: ``module:Cell`` -> ``module.Cell``,
    ``deltaproduct[householders=4]`` -> ``deltaproduct.householders=4``."""
    return mixer.replace(":", ".").replace("[", ".").replace("]", "").replace(",", ".")


def report_validation(trial, acc: float, step: int) -> None:
    """``acc`` as the Optuna trial's intermediate value at ``step`` (learning curves), and the time as its
    ``alive`` user attribute: where a trial's worker dies (a machine given back mid-run), its last sign
    of life (``results.busy_seconds``)."""
    trial.report(acc, step=step)
    trial.set_user_attr("alive", datetime.now().isoformat())


class ReportValidation(Callback):
    """Reports ``val/acc`` after each validation (``report_validation``)."""

    def __init__(self, trial) -> None:
        self.trial = trial

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and "val/acc" in trainer.callback_metrics:
            report_validation(self.trial, float(trainer.callback_metrics["val/acc"]), trainer.global_step)


def run_cells(grid, trials: list, out: Path, device: str | None = None, options=None) -> list[str]:
    """Run claimed trials and record each one's outcome: ``"ok"``, ``"nan"``, ``"error"`` or ``"lost"``.

    One trial runs through ``run_trial`` in its cell's folder; several (one cell's seeds, ``claim_stack``)
    as one stacked model through ``experiments.trial.stack.run_stack``, each trial's files in its own cell's
    folder and the stack's resume checkpoint in ``stack_dir``; a failure of the stack (NaN loss, an
    error) is the failure of each of its trials. ``device`` (a worker's GPU) replaces the spec's
    ``"auto"``/``"cuda"``; the cell stays the same. Writes ``run.json`` (worker, device, library
    versions) in each cell's folder. ``"lost"``: the trial was finished elsewhere meanwhile (declared
    stale while this worker hung); its cell was re-queued. Ctrl-C records the trials as interrupted and
    re-raises. ``options``: ``experiments.trial.train.RunOptions`` (step log, step engine).
    """
    from experiments.sweeps.results import atomic_write_text, versions
    from experiments.sweeps.study import worker_identity
    from experiments.trial.lit import NonFiniteLossError
    from experiments.trial.stack import run_stack
    from experiments.trial.train import CHECKPOINT_DIR, LAST_CHECKPOINT, RunOptions, TrialSpec, run_trial

    options = options or RunOptions()
    specs = [TrialSpec.from_dict(t.user_attrs["spec"]) for t in trials]
    entry = trials[0].params.get("entry", specs[0].task)
    dirs = [cell_dir(out, entry, spec) for spec in specs]  # of the cells' specs, before the device is set
    run_dir = dirs[0] if len(trials) == 1 else stack_dir(out, entry, specs)  # where training resumes from
    infos = []
    for trial, spec, tdir in zip(trials, specs, dirs):
        if device and spec.device in ("auto", "cuda"):
            spec.device = device
        tdir.mkdir(parents=True, exist_ok=True)
        infos.append(
            {
                "trial": trial.number,
                "cell": trial.user_attrs["cell"],
                "device": spec.device,
                "worker": worker_identity(),
                "versions": versions(),
                **({"stack": str(run_dir.relative_to(out))} if len(trials) > 1 else {}),
            }
        )
        atomic_write_text(tdir / "run.json", json.dumps(infos[-1], indent=1))

    def fail_all(failure: str, error: str) -> list[str]:
        return [failure if grid.finish(t, None, failure=failure, error=error) else "lost" for t in trials]

    claimed = time.perf_counter()
    try:
        if len(trials) == 1:
            results = [run_trial(specs[0], dirs[0], callbacks=[ReportValidation(trials[0])], options=options)]
        else:
            results = run_stack(
                specs,
                dirs,
                run_dir,
                options=options,
                report=lambda s, acc, step: report_validation(trials[s], acc, step),
            )
    except NonFiniteLossError as err:
        (run_dir / CHECKPOINT_DIR / LAST_CHECKPOINT).unlink(
            missing_ok=True
        )  # a final failure: --retry-failed starts afresh
        return fail_all("nan", str(err))
    except KeyboardInterrupt:
        with signals_deferred():  # a second Ctrl-C / SIGTERM must not cut the recording short
            fail_all("interrupted", "stopped by Ctrl-C / SIGTERM; re-run to resume")
        raise
    except Exception as err:  # a kernel error etc.: the trials fail, the sweep goes on
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        (run_dir / CHECKPOINT_DIR / LAST_CHECKPOINT).unlink(missing_ok=True)
        return fail_all("error", f"{type(err).__name__}: {err}")
    ran = time.perf_counter()
    # the versions each trial ran with (the table shows them) and where its checkpoints are
    outcomes = [
        "ok" if grid.finish(trial, {**result, **info["versions"], "trial_dir": str(tdir.relative_to(out))}) else "lost"
        for trial, result, info, tdir in zip(trials, results, infos, dirs)
    ]
    first = results[0]
    log.debug(
        "trial(s) %s: %.1f s in all: setup %.1f, train %.1f, test %.1f, own %.1f, recording %.1f",
        ",".join(str(t.number) for t in trials),
        time.perf_counter() - claimed,
        first["setup_time_s"],
        first["train_time_s"],
        first["wall_time_s"] - first["train_time_s"],
        ran - claimed - first["setup_time_s"] - first["wall_time_s"],
        time.perf_counter() - ran,
    )
    return outcomes


def claim_stack(grid, trial, cells: list[Cell], size: int) -> list:
    """``trial`` plus up to ``size - 1`` more WAITING trials of its cell's other seeds (same entry, task,
    mixer, lr and options), claimed for this worker in seed order."""
    from experiments.sweeps.study import cell_id
    from experiments.trial.stack import stack_key
    from experiments.trial.train import TrialSpec

    spec = TrialSpec.from_dict(trial.user_attrs["spec"])
    if spec.train.grad_clip:  # clipping is per trial: a stack would clip the trials' gradients together
        return [trial]
    entry = trial.params.get("entry", spec.task)
    group = sorted(
        (s.seed, cell_id(s)) for e, s in cells if e == entry and stack_key(s) == stack_key(spec) and s.seed != spec.seed
    )
    stack = [trial]
    for _, key in group:
        if len(stack) >= size:
            break
        other = grid.claim({key})
        if other is not None:
            stack.append(other)
    return sorted(stack, key=lambda t: t.user_attrs["spec"]["seed"])


@contextlib.contextmanager
def signals_deferred():
    """Hold Ctrl-C and SIGTERM while the block runs (main thread); they are delivered after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


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


def worker_loop(
    grid,
    cells: list[Cell],
    out: Path,
    device: str | None = None,
    poll_s: float = 2.0,
    on_trial: Callable[[dict, str], None] | None = None,
    on_claim: Callable[[dict], None] | None = None,
    options=None,
    prefer: set[str] | None = None,
) -> dict[str, int]:
    """Claim and run trials of ``cells`` (``(entry, spec)`` pairs) until every cell is done; returns outcome counts.

    ``prefer``: cell ids to claim first while any of them waits (then any cell).

    With ``options.stack`` > 1 it claims up to that many trials of one cell's seeds at a time and trains
    them as one stacked model (``run_cells``). While other workers still run trials, waits
    (``poll_s``) and re-queues the cells of dead workers. ``on_claim(spec_dict)``/``on_trial(spec_dict, outcome)`` are called around each trial.
    """
    from experiments.sweeps._heartbeat import Heartbeat
    from experiments.sweeps.study import HEARTBEAT_INTERVAL, cell_id, worker_id

    keys = list(dict.fromkeys(cell_id(s) for _, s in cells))  # claimed in the grid's order,
    keys.sort(key=lambda key: key not in (prefer or ()))  # the preferred cells first
    counts = {"ok": 0, "nan": 0, "error": 0, "lost": 0}
    with Heartbeat(grid, worker_id(), interval=min(HEARTBEAT_INTERVAL, grid.stale_timeout / 4)) as hb:
        while True:
            trial = grid.claim(keys)
            if trial is not None:
                stack = (
                    claim_stack(grid, trial, cells, options.stack)
                    if options is not None and options.stack > 1
                    else [trial]
                )
                hb.set_trial([t.number for t in stack])
                specs = [t.user_attrs["spec"] for t in stack]
                for spec in specs if on_claim else ():
                    on_claim(spec)
                outcomes = run_cells(grid, stack, out, device=device, options=options)
                hb.set_trial(None)
                for spec, outcome in zip(specs, outcomes):
                    counts[outcome] = counts.get(outcome, 0) + 1
                    if on_trial:
                        on_trial(spec, outcome)
                if "error" in outcomes and device and _cuda_broken(device):
                    log.error("CUDA context on %s is broken after trial %d: this worker exits", device, trial.number)
                    counts["restart"] = 1
                    return counts
                continue
            state = grid.sync(cells)
            if state["queued"] or state["stale"]:
                continue
            if state["waiting"] + state["running"] == 0:
                return counts
            time.sleep(poll_s)


def _worker_main(
    index: int,
    cell_dicts: list[tuple[str, dict]],
    study_name: str,
    storage_url: str | None,
    out: str,
    device: str,
    stale_timeout: float,
    options: dict,
    threads: int = 1,
    mps_priority: int | None = None,
    prefer: list[str] | None = None,
) -> None:
    """Entry point of a worker process (spawned): logs to ``<out>/workers/worker-<index>.log``; uses
    ``threads`` torch CPU threads (a CPU trial then uses its spec's ``cpu_threads``); sets its MPS client
    priority (before its CUDA context exists) and claims the ``prefer`` cells first."""
    if mps_priority is not None:
        os.environ[PRIORITY_ENV] = str(mps_priority)
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
    out_dir = Path(out)
    logs = out_dir / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    fd = os.open(logs / f"worker-{index}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{index} pid={os.getpid()} %(message)s")
    logging.getLogger("experiments").setLevel(logging.DEBUG)  # a worker's log file keeps its trials' timings

    # Ctrl-C at a terminal reaches the whole process group; the sweep's process answers it by stopping the
    # workers with SIGTERM. A worker that took the SIGINT too would get two interrupts milliseconds apart,
    # and the second, inside Lightning's handling of the first, would skip the checkpoint written on
    # interruption: its trial would restart at step 0. So a worker takes only the SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_on_sigterm()  # once: a second SIGTERM is ignored, not cutting the interrupt checkpoint short
    from experiments.sweeps.study import GridStudy
    from experiments.trial.train import RunOptions, TrialSpec, quiet_lightning

    quiet_lightning()
    cells = [(entry, TrialSpec.from_dict(d)) for entry, d in cell_dicts]
    grid = GridStudy.open(storage_url, out_dir, study_name, stale_timeout)
    log.info(
        "worker %d on %s: %d cells, %d CPU threads%s",
        index,
        device,
        len(cells),
        torch.get_num_threads(),
        "" if mps_priority is None else f", MPS client priority {mps_priority}, {len(prefer or ())} cells first",
    )
    try:
        counts = worker_loop(
            grid,
            cells,
            out_dir,
            device=device,
            options=RunOptions(**options),
            prefer=set(prefer) if prefer else None,
            on_trial=lambda s, o: log.info("%s seed=%s lr=%g: %s", s["mixer"], s["seed"], s["lr"], o),
        )
    except KeyboardInterrupt:
        log.info("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    log.info("done: %s", counts)
    sys.exit(EXIT_RESTART if counts.get("restart") else 0)


def start_worker(
    index: int,
    cells: list[Cell],
    study_name: str,
    storage_url: str | None,
    out: Path,
    device: str,
    stale_timeout: float,
    options=None,
    threads: int = 1,
    mps_priority: int | None = None,
    prefer: set[str] | None = None,
) -> mp.Process:
    """Spawn one worker process (``multiprocessing`` spawn context) with ``threads`` CPU threads and return it."""
    import dataclasses

    from experiments.trial.train import RunOptions

    ctx = mp.get_context("spawn")
    proc = ctx.Process(
        target=_worker_main,
        name=f"sweep-worker-{index}",
        args=(
            index,
            [(e, s.to_dict()) for e, s in cells],
            study_name,
            storage_url,
            str(out),
            device,
            stale_timeout,
            dataclasses.asdict(options or RunOptions()),
            threads,
            mps_priority,
            sorted(prefer) if prefer else None,
        ),
    )
    proc.start()
    return proc


def run_workers(
    grid,
    cells: list[Cell],
    out: Path,
    storage_url: str | None,
    n_workers: int,
    device: str = "auto",
    on_progress: Callable[[dict[str, int]], None] | None = None,
    max_restarts: int | None = None,
    options=None,
    priority: set[str] = frozenset(),
) -> dict[str, int]:
    """Run ``cells`` (already enqueued in ``grid``) on ``n_workers`` processes; wait for them.

    ``priority``: ids of cells to run on the higher-priority workers under MPS (``priority_classes``).

    ``on_progress(counts)`` is called every second with the cells' ``grid.progress`` counts. Returns
    the final counts. On Ctrl-C the workers are stopped (their trials are recorded as interrupted)
    and ``KeyboardInterrupt`` is re-raised.
    """
    from experiments.sweeps.study import cell_id

    if n_workers < 1:
        raise ValueError(f"--workers must be >= 1, got {n_workers}")
    keys = list(dict.fromkeys(cell_id(s) for _, s in cells))
    devices = worker_devices(n_workers, device)
    restarts_left = n_workers if max_restarts is None else max_restarts

    threads = worker_threads(n_workers)
    priority = set(priority) & set(keys)
    on_gpu = all(d.startswith("cuda") for d in devices)
    classes = priority_classes(n_workers, len(priority), mps_running() and on_gpu)
    others = set(keys) - priority

    def start(i: int) -> mp.Process:
        prefer = None if classes[i] is None else (priority if classes[i] == MPS_NORMAL else others)
        return start_worker(
            i, cells, grid.name, storage_url, out, devices[i], grid.stale_timeout, options, threads, classes[i], prefer
        )

    procs = {i: start(i) for i in range(n_workers)}
    log.info(
        "%d workers on %s, %d CPU threads each (host: %d logical CPUs, %s physical cores; logs: %s)%s",
        n_workers,
        ", ".join(sorted(set(devices))),
        threads,
        host_cores(),
        physical_cores() or "?",
        out / "workers",
        f"; {classes.count(MPS_NORMAL)} at MPS normal priority take the {len(priority)} high-priority cells first"
        if MPS_NORMAL in classes
        else "",
    )
    try:
        while True:
            counts = grid.progress(keys)
            if on_progress:
                on_progress(counts)
            alive = {i: p for i, p in procs.items() if p.is_alive()}
            for i, p in procs.items():
                if i in alive or p.exitcode in (0, None):
                    continue
                left = counts["running"] + counts["waiting"] + counts["todo"]
                if left and restarts_left > 0 and p.exitcode != EXIT_INTERRUPTED:
                    restarts_left -= 1
                    log.warning(
                        "worker %d exited with code %s; starting a fresh one (%d restarts left)",
                        i,
                        p.exitcode,
                        restarts_left,
                    )
                    alive[i] = start(i)
                elif p.exitcode == EXIT_INTERRUPTED:
                    raise KeyboardInterrupt  # a worker was stopped by a signal meant for the whole run
                else:
                    log.warning("worker %d exited with code %s", i, p.exitcode)
            procs = {**procs, **alive}
            if not alive:
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        for p in procs.values():
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker records its trial as interrupted
        for p in procs.values():
            p.join(timeout=30)
        raise
    for p in procs.values():
        p.join()
    counts = grid.progress(keys)
    if on_progress:
        on_progress(counts)
    return counts
