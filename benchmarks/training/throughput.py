"""``python -m benchmarks.training.throughput``: how fast trials train, per step engine.

Three measurements, each a sub-command:

- ``generation``: seconds to generate ``--samples`` sequences of length 100 for every task.
- ``steps``: training steps/s of one trial through the real training path (Lightning, ``run_trial``)
  for each task entry × mixer × ``--engines`` (``eager``: steps launched op by op, the way every step
  ran before; ``graph``: each step a CUDA-graph replay), fixed ``--steps`` per trial (no early stop).
- ``kernels``: what one captured training step costs on the GPU, per task entry × mixer: kernels per
  step by family, their summed time and the replay's wall time (``benchmarks.training.step_profile``); with
  ``--compile`` also with the model ``torch.compile``d; ``--batch-sizes`` profiles the step at other
  batch sizes too, ``--stacks`` with several trials stacked into one model. Needs a CUDA GPU.
- ``workers``: N trials at once in N worker processes (``--counts``, e.g. 1,4,8,16; ``--mps`` to share
  the GPU through CUDA MPS) on the Table 6 mix (task entries × mixers of ``--preset``, round robin),
  per engine: steady steps/s per worker (after compilation and graph capture); in total while all N
  train at once (``concurrent_rate``: the steps every trial ran in the window in which all of them
  were past their compilation and none had finished, over that window, from each trial's
  ``progress.csv``); the sum of the trials' own steady rates (an upper bound: a trial that finishes
  late ran part of its steady phase on a less crowded GPU); end to end (all steps over the
  wall-clock of the whole run, start-up included) and the GPU busy fraction
  (``torch.cuda.utilization`` sampled every 0.2 s while they train). ``--stacks 1,3`` also runs each
  worker's trials as stacks of 3 seeds (``experiments.trial.stack``): N workers then train 3N trials, and
  the rates count trial steps (a stack's step is 3).

``--precisions 32-true,bf16-mixed`` repeats ``steps``, ``kernels`` and ``workers`` in each precision (default:
the preset's). Each prints a Markdown table (pandas) and, with ``--json``, writes its rows there.

Examples::

    python -m benchmarks.training.throughput steps --preset pararnn-table6 --tasks mqar --mixers flashgru --steps 3000
    python -m benchmarks.training.throughput workers --counts 1,4,8,16 --mps --engines eager,graph --steps 4000
    python -m benchmarks.training.throughput kernels --tasks mqar --compile
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments.cli import Parser, nonnegative_int, positive_int, positive_int_list, run_cli, str_list

log = logging.getLogger("benchmarks.training.throughput")

GENERATION = [
    ("parity", {}),
    ("parity", {"running": True}),
    ("keep_nth", {}),
    ("keep_nth", {"per_position": True}),
    ("mqar", {}),
    ("mqar", {"placement": "power"}),
    ("khop", {"k": 1}),
    ("khop", {"k": 2}),
]


def time_generation(num_samples: int, repeats: int) -> pd.DataFrame:
    """Median seconds to generate ``num_samples`` sequences of length 100, per task configuration."""
    from tasks import get_task

    rows = []
    for name, opts in GENERATION:
        try:
            task = get_task(name, seq_len=100, **opts)
        except ValueError:  # an option this version of the task lacks
            continue
        times = []
        for r in range(repeats):
            t0 = time.perf_counter()
            task.generate(num_samples, seed=r)
            times.append(time.perf_counter() - t0)
        rows.append({"task": name + "".join(f" {k}={v}" for k, v in opts.items()), "seconds": statistics.median(times)})
    return pd.DataFrame(rows)


def benchmark_specs(
    preset: str,
    tasks: list[str] | None,
    mixers: list[str] | None,
    steps: int,
    device: str,
    count: int | None = None,
    precision: str | None = None,
) -> list[tuple[str, Any]]:
    """``(entry, TrialSpec)`` pairs of the preset's task entries × mixers (round robin over ``count`` trials),
    ``steps`` steps each with a single validation at the end and small evaluation sets (timing, not results),
    in ``precision`` (``32-true`` or ``bf16-mixed``; default: the preset's)."""
    from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep

    entries = tasks or list(load_preset(preset).get("tasks", {}))
    mix = []
    for entry in entries:
        plan = resolve_sweep(entry, preset, {"mixers": mixers} if mixers else None)
        train = {
            **dataclasses.asdict(plan.train),
            "max_steps": steps,
            "eval_every": steps,
            "early_stop_acc": 2.0,
            "plateau_steps": None,
            "val_size": 256,
            "test_size": 256,
        }
        plan = resolve_sweep(entry, preset, {"mixers": plan.mixers, "seeds": [0], "lrs": plan.lrs[:1], "train": train})
        mix += [
            (
                entry,
                s
                if precision is None
                else dataclasses.replace(s, model=dataclasses.replace(s.model, precision=precision)),
            )
            for s in build_specs(plan, device)
        ]
    if count is None:
        return mix
    return [
        (entry, dataclasses.replace(spec, seed=i // len(mix)))
        for i, (entry, spec) in ((i, mix[i % len(mix)]) for i in range(count))
    ]


def time_steps(
    preset: str,
    tasks: list[str] | None,
    mixers: list[str] | None,
    engines: list[str],
    steps: int,
    device: str,
    precisions: list[str | None] = (None,),
) -> pd.DataFrame:
    """Steps/s of single trials through ``run_trial``, per entry × mixer × precision × engine (same process, one
    after another)."""
    from experiments.trial.train import RunOptions, run_trial

    rows = []
    specs = [c for p in precisions for c in benchmark_specs(preset, tasks, mixers, steps, device, precision=p)]
    for entry, spec in specs:
        for engine in engines:
            result = run_trial(spec, options=RunOptions(logger="none", engine=engine))
            rows.append(
                {
                    "task": entry,
                    "mixer": spec.model.mixer,
                    "precision": spec.model.precision,
                    "engine": engine,
                    "steps": result["steps"],
                    "steps_per_s": result["steps_per_s"],
                    "steady_steps_per_s": result["steady_steps_per_s"],
                    "device": result["device"],
                }
            )
            log.info("%s", rows[-1])
    return pd.DataFrame(rows)


def profile_kernels(
    preset: str,
    tasks: list[str] | None,
    mixers: list[str] | None,
    compile: bool,
    batch_sizes: list[int] | None = None,
    stacks: list[int] = (1,),
    top: int = 0,
    precisions: list[str | None] = (None,),
) -> pd.DataFrame:
    """``benchmarks.training.step_profile.profile_step`` rows per entry × mixer × precision (``precisions``;
    default: the preset's) × batch size (``batch_sizes``; default: the preset's) × stack size (``stacks``:
    trials stacked into one model, ``experiments.trial.stack``) (and compiled, with ``compile``); ``top`` > 0:
    each row's ``heaviest`` kernels (``heaviest_table``)."""
    from benchmarks.training.step_profile import profile_step

    rows = []
    specs = [c for p in precisions for c in benchmark_specs(preset, tasks, mixers, 100, "cuda", precision=p)]
    for entry, spec in specs:
        for batch, stack in ((b, s) for b in batch_sizes or [spec.train.batch_size] for s in stacks):
            sized = dataclasses.replace(spec, train=dataclasses.replace(spec.train, batch_size=batch))
            for compiled in (False, True) if compile else (False,):
                row = profile_step(sized, compiled, stack=stack, top=top)
                rows.append({"task": entry, "precision": spec.model.precision, "batch": batch, **row})
                log.info("%s", rows[-1])
    table = pd.DataFrame(rows)
    import torch

    table["device"] = torch.cuda.get_device_name()
    return table


def heaviest_table(table: pd.DataFrame) -> pd.DataFrame:
    """The ``heaviest`` kernels of ``profile_kernels`` rows as one table: a line per (profiled step, kernel)."""
    keys = [c for c in ("task", "mixer", "precision", "batch", "stack", "compiled") if c in table]
    lines = [
        {**{k: row[k] for k in keys}, **kernel}
        for _, row in table.iterrows()
        if isinstance(row.get("heaviest"), list)
        for kernel in row["heaviest"]
    ]
    return pd.DataFrame(lines)


def concurrent_rate(progress: list[pd.DataFrame], weights: list[float] | None = None) -> tuple[float, float]:
    """``(steps/s, window s)``: the steps all trials ran together per second in the window in which
    every one of them trained, from each trial's progress samples (``unix_time_s``, ``step``; the first
    sample is the end of its compilation, the last its end of training; steps interpolated linearly
    between samples). ``(nan, 0.0)`` when the trials' windows do not overlap. ``weights``: each trial's
    steps count that many times (e.g. its tokens or FLOPs per step: the rate is then tokens/s or FLOP/s)."""
    if not progress or any(len(p) < 2 for p in progress):
        return float("nan"), 0.0
    start = max(float(p["unix_time_s"].iloc[0]) for p in progress)
    end = min(float(p["unix_time_s"].iloc[-1]) for p in progress)
    if end <= start:
        return float("nan"), 0.0
    steps = sum(
        w * float(np.interp(end, p["unix_time_s"], p["step"]) - np.interp(start, p["unix_time_s"], p["step"]))
        for p, w in zip(progress, weights or [1.0] * len(progress), strict=True)
    )
    return steps / (end - start), end - start


class GPUBusy:
    """Samples ``torch.cuda.utilization()`` (the share of time a kernel ran) every ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch

        while not self._stop.wait(self.interval):
            try:
                self.samples.append(torch.cuda.utilization())
            except Exception:  # no NVML: no samples
                return

    def __enter__(self) -> GPUBusy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, skip: int = 0) -> float:
        kept = self.samples[skip:]
        return statistics.mean(kept) / 100 if kept else float("nan")


def stacked_specs(cells: list[tuple[str, Any]], stack: int) -> list[tuple[str, Any]]:
    """Each of ``cells`` as ``stack`` trials of seeds ``seed * stack + k`` (one full stack per cell)."""
    return [
        (entry, dataclasses.replace(spec, seed=spec.seed * stack + k)) for entry, spec in cells for k in range(stack)
    ]


def train_together(
    cells: list[tuple[str, Any]], n: int, device: str, run_dir: Path, options: Any
) -> tuple[pd.DataFrame, list[pd.DataFrame | None], float, float]:
    """Train ``cells`` (``(entry, TrialSpec)`` pairs) on ``n`` worker processes (``experiments.sweeps.workers``)
    in a fresh study in ``run_dir``; returns ``(rows, progress, wall s, GPU busy)``: the collected results row
    per cell, each cell's ``progress.csv`` (``None`` where it wrote none), the run's wall-clock and the GPU
    busy fraction while they trained (NaN without a GPU)."""
    import shutil

    import torch

    from experiments.sweeps.results import collect
    from experiments.sweeps.study import GridStudy
    from experiments.sweeps.workers import cell_dir, run_workers
    from experiments.trial.train import PROGRESS_FILE

    shutil.rmtree(run_dir, ignore_errors=True)
    grid = GridStudy.open(None, run_dir, f"bench-{run_dir.name}")
    grid.sync(cells)
    t0 = time.perf_counter()
    with GPUBusy() as busy:
        run_workers(grid, cells, run_dir, None, n, device, options=options)
    wall = time.perf_counter() - t0
    files = [cell_dir(run_dir, entry, spec) / PROGRESS_FILE for entry, spec in cells]
    progress = [pd.read_csv(f) if f.is_file() else None for f in files]
    return collect(grid, cells), progress, wall, busy.mean() if torch.cuda.is_available() else float("nan")


def time_workers(
    counts: list[int],
    engines: list[str],
    preset: str,
    tasks: list[str] | None,
    mixers: list[str] | None,
    steps: int,
    device: str,
    out: Path,
    stacks: list[int] = (1,),
    precisions: list[str | None] = (None,),
) -> pd.DataFrame:
    """For each precision (``precisions``; default: the preset's), engine, stack size S in ``stacks`` and N in
    ``counts``: N stacks of S trials of the mix (N trials when S is 1) on N worker processes; throughput rows
    (steps are trial steps: a stack's step counts S)."""
    from experiments.trial.train import RunOptions

    rows = []
    for prec, engine, stack, n in ((p, e, s, n) for p in precisions for e in engines for s in stacks for n in counts):
        cells = stacked_specs(benchmark_specs(preset, tasks, mixers, steps, device, count=n, precision=prec), stack)
        precision = cells[0][1].model.precision
        options = RunOptions(logger="none", engine=engine, stack=stack)
        df, progress, wall, busy = train_together(
            cells, n, device, out / f"{precision}-{engine}-s{stack}-n{n}", options
        )
        ok = df[df["status"] == "ok"]
        together, window = concurrent_rate(progress) if all(p is not None for p in progress) else (float("nan"), 0.0)
        rows.append(
            {
                "precision": precision,
                "engine": engine,
                "stack": stack,
                "workers": n,
                "ok_trials": len(ok),
                "steps_per_s_per_worker": round(stack * float(ok["steady_steps_per_s"].median()), 1)
                if len(ok)
                else float("nan"),
                "total_steps_per_s": round(together, 1),
                "together_window_s": round(window, 1),
                "sum_of_steady_steps_per_s": round(float(ok["steady_steps_per_s"].sum()), 1)
                if len(ok)
                else float("nan"),
                "end_to_end_steps_per_s": round(float(ok["steps"].sum()) / wall, 1) if len(ok) else float("nan"),
                "gpu_busy": round(busy, 3),
                "wall_s": round(wall, 1),
                "per_mixer_steps_per_s": json.dumps(
                    (stack * ok.groupby("mixer")["steady_steps_per_s"].median()).round(1).to_dict()
                ),
                "device": str(ok["device"].iloc[0]) if len(ok) else device,
            }
        )
        log.info("%s", rows[-1])
    return pd.DataFrame(rows)


def parser() -> Parser:
    p = Parser(prog="python -m benchmarks.training.throughput", description=__doc__)
    sub = p.add_subparsers(dest="what", required=True)
    gen = sub.add_parser("generation", help="data generation time per task")
    gen.add_argument("--samples", type=positive_int, default=100_000)
    gen.add_argument("--repeats", type=positive_int, default=3)
    kernels = sub.add_parser("kernels", help="kernels and GPU time of one captured training step (CUDA)")
    kernels.add_argument("--preset", default="pararnn-table6", help="preset giving the shapes (default: %(default)s)")
    kernels.add_argument("--tasks", type=str_list, help="task entries of --preset (default: all)")
    kernels.add_argument("--mixers", type=str_list, help="mixers (default: each entry's preset mixers)")
    kernels.add_argument("--compile", action="store_true", help="also profile the step with the model torch.compile'd")
    kernels.add_argument(
        "--batch-sizes", type=positive_int_list, help="training batch sizes to profile (default: the preset's)"
    )
    kernels.add_argument(
        "--stacks",
        type=positive_int_list,
        default=[1],
        help="trials stacked into one model per profiled step (default: 1; e.g. 1,3)",
    )
    precisions_help = "Lightning precisions to compare, e.g. 32-true,bf16-mixed (default: the preset's)"
    kernels.add_argument("--precisions", type=str_list, default=[None], help=precisions_help)
    kernels.add_argument(
        "--top",
        type=nonnegative_int,
        default=0,
        help="also list each step's N kernels with the most GPU time (default: 0, none)",
    )
    for name, help_ in (("steps", "steps/s of single trials per engine"), ("workers", "steps/s of N parallel workers")):
        q = sub.add_parser(name, help=help_)
        q.add_argument("--preset", default="pararnn-table6", help="preset giving the shapes (default: %(default)s)")
        q.add_argument("--tasks", type=str_list, help="task entries of --preset (default: all)")
        q.add_argument("--mixers", type=str_list, help="mixers (default: each entry's preset mixers)")
        q.add_argument(
            "--engines", type=str_list, default=["eager", "graph"], help="step engines (default: eager,graph)"
        )
        q.add_argument(
            "--steps", type=positive_int, default=2000, help="training steps per trial (default: %(default)s)"
        )
        q.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
        q.add_argument("--precisions", type=str_list, default=[None], help=precisions_help)
        if name == "workers":
            q.add_argument(
                "--counts", type=positive_int_list, default=[1, 4, 8, 16], help="worker counts (default: 1,4,8,16)"
            )
            q.add_argument(
                "--stacks",
                type=positive_int_list,
                default=[1],
                help="trials per stacked model in each worker (default: 1; e.g. 1,3 compares)",
            )
            q.add_argument(
                "--out", type=Path, default=Path("runs/bench-workers"), help="scratch folder (default: %(default)s)"
            )
            from experiments.engines.mps import add_mps_argument

            add_mps_argument(q)
    for q in sub.choices.values():
        q.add_argument("--json", type=Path, help="also write the rows here as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def run() -> None:
        from experiments.trial.train import ENGINES, quiet_lightning

        quiet_lightning()
        if args.what == "generation":
            table = time_generation(args.samples, args.repeats)
        elif args.what == "kernels":
            table = profile_kernels(
                args.preset,
                args.tasks,
                args.mixers,
                args.compile,
                args.batch_sizes,
                args.stacks,
                args.top,
                args.precisions,
            )
        else:
            bad = [e for e in args.engines if e not in ENGINES]
            if bad:
                raise ValueError(f"--engines: unknown {', '.join(bad)}; valid: {', '.join(ENGINES)}")
            if args.what == "steps":
                table = time_steps(
                    args.preset, args.tasks, args.mixers, args.engines, args.steps, args.device, args.precisions
                )
            else:
                from experiments.engines.mps import workers_mps

                with workers_mps(args.mps, max(args.counts)):
                    table = time_workers(
                        args.counts,
                        args.engines,
                        args.preset,
                        args.tasks,
                        args.mixers,
                        args.steps,
                        args.device,
                        args.out,
                        args.stacks,
                        args.precisions,
                    )
                table["mps"] = args.mps
        heaviest = heaviest_table(table) if "heaviest" in table else None
        print(table.drop(columns=["heaviest"], errors="ignore").to_markdown(index=False))
        if heaviest is not None and len(heaviest):
            print("\nkernels with the most GPU time per step:\n" + heaviest.to_markdown(index=False))
        if args.json:
            import torch

            args.json.parent.mkdir(parents=True, exist_ok=True)
            from experiments.sweeps.workers import host_cores, physical_cores

            meta = {
                "date": time.strftime("%Y-%m-%d"),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "command": " ".join(sys.argv),
                "cpus": host_cores(),
                "physical_cores": physical_cores(),
            }
            args.json.write_text(json.dumps({"meta": meta, "rows": table.to_dict(orient="records")}, indent=1))

    return run_cli(run, "nothing to resume: re-run the measurement")


if __name__ == "__main__":
    sys.exit(main())
