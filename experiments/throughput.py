"""``python -m experiments.throughput``: data-generation speed and training-step throughput.

Measures:
1. generation of ``--samples`` samples of length 100 for every task (median of ``--repeats`` runs;
   ``--skip-generation`` to leave it out);
2. training steps/s (model forward + backward + AdamW, no Lightning) of each ``--mixers`` model at
   ``--preset``'s shapes for each ``--tasks`` entry, on ``--device`` (CUDA time includes a final
   synchronisation); ``--set KEY=VALUE`` overrides a mixer option for every timed mixer (e.g.
   ``--set check=false`` times a Newton cell without its residual check) and may be repeated:
   each ``--set`` group is timed as a separate variant;
3. ``--profile``: the top operators of a ``torch.profiler`` trace of 20 steps per model (CPU and
   CUDA self time), to see where a step's time goes.

Examples::

    python -m experiments.throughput                                   # smoke shapes, CPU, 1 thread
    python -m experiments.throughput --skip-generation --preset pararnn-table6 --tasks mqar \\
        --mixers flashgru,transformer --device cuda --set check=false --profile
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from experiments.model import ModelConfig, SingleLayerModel
from experiments.presets import resolve_sweep
from experiments.cli import key_value as _key_value
from tasks import get_task

GENERATION = [("parity", {}), ("parity", {"running": True}), ("keep_nth", {}), ("mqar", {}),
              ("mqar", {"placement": "power"}), ("khop", {"k": 1}), ("khop", {"k": 2})]


def time_generation(num_samples: int, repeats: int) -> list[tuple[str, float]]:
    rows = []
    for name, opts in GENERATION:
        task = get_task(name, seq_len=100, **opts)
        times = []
        for r in range(repeats):
            t0 = time.perf_counter()
            task.generate(num_samples, seed=r)
            times.append(time.perf_counter() - t0)
        label = name + "".join(f" {k}={v}" for k, v in opts.items())
        rows.append((label, statistics.median(times)))
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_step(task: str, mixer: str, preset: str = "smoke", device: str = "cpu", options: dict | None = None):
    """A closure running one training step of ``mixer`` at ``preset``'s shapes for ``task``, after 5
    warm-up steps (compilation, autotuning; synchronised).

    ``options`` override the preset's mixer options. ``step(i)`` trains on the ``i % 4``-th of four
    fixed batches (batch size and sequence length from the preset).
    """
    plan = resolve_sweep(task, preset, {"mixers": [mixer]})
    length = (plan.extrapolation or {}).get("max_len") or plan.task_options.get("seq_len", 100)
    t = get_task(plan.task, **{**plan.task_options, "seq_len": length})
    vocab = t.vocab_size + (1 if plan.extrapolation else 0)
    mixer_options = {**plan.mixer_options.get(mixer, {}), **(options or {})}
    dev = torch.device(device)
    model = SingleLayerModel(ModelConfig(vocab, t.num_classes, mixer=mixer, block=plan.block,
                                         positional=plan.positional, mixer_options=mixer_options)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = t.generate(plan.train.batch_size * 4, seed=0)
    xs = [b.to(dev) for b in data.inputs.split(plan.train.batch_size)]
    ys = [b.to(dev) for b in data.targets.split(plan.train.batch_size)]

    def step(i: int) -> None:
        loss = F.cross_entropy(model(xs[i % 4]).flatten(0, 1), ys[i % 4].flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(5):
        step(i)
    _sync(dev)
    return step


def time_training(task: str, mixer: str, steps: int, preset: str = "smoke", device: str = "cpu",
                  options: dict | None = None) -> float:
    """Steps/s of model forward + backward + AdamW (no Lightning); see ``build_step``."""
    step, dev = build_step(task, mixer, preset, device, options), torch.device(device)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    _sync(dev)
    return steps / (time.perf_counter() - t0)


def profile_training(task: str, mixer: str, preset: str, device: str, options: dict | None = None,
                     steps: int = 20, rows: int = 25) -> str:
    """``torch.profiler`` table (top ``rows`` operators by self CPU time) of ``steps`` training steps."""
    from torch.profiler import ProfilerActivity, profile

    step, dev = build_step(task, mixer, preset, device, options), torch.device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(i)
        _sync(dev)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _parse_set(text: str) -> dict:
    """``"check=false,iters=4"`` -> ``{"check": False, "iters": 4}`` (values parsed as YAML)."""
    return dict(_key_value(item) for item in text.split(",") if item)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-generation", action="store_true", help="time training only")
    p.add_argument("--steps", type=int, default=50, help="timed training steps per model (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--preset", default="smoke", help="preset giving the shapes (default: %(default)s)")
    p.add_argument("--tasks", default="parity,keep_nth,mqar,khop", help="task entries of --preset (default: %(default)s)")
    p.add_argument("--mixers", default=None, help="comma-separated mixers (default: each entry's preset mixers)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--set", dest="variants", action="append", type=_parse_set, default=[],
                   metavar="KEY=VALUE[,...]", help="mixer-option variant to time too (repeatable)")
    p.add_argument("--profile", action="store_true", help="print a torch.profiler table per model")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.skip_generation:
        print(f"## Data generation: {args.samples:,} samples x L=100, {args.threads} thread(s), median of {args.repeats}\n")
        print("| task | seconds |\n|---|---|")
        for label, seconds in time_generation(args.samples, args.repeats):
            print(f"| {label} | {seconds:.3f} |")
    where = args.device if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device))
    print(f"\n## Training throughput at the {args.preset} preset's shapes ({where}, {args.threads} CPU thread(s), "
          f"steps/s, no Lightning)\n")
    print("| task | mixer | options | steps/s |\n|---|---|---|---|")
    profiles = []
    for task in args.tasks.split(","):
        mixers = args.mixers.split(",") if args.mixers else resolve_sweep(task, args.preset).mixers
        for mixer in mixers:
            for options in [{}] + args.variants:
                label = ",".join(f"{k}={v}" for k, v in options.items()) or "preset"
                try:
                    rate = f"{time_training(task, mixer, args.steps, args.preset, args.device, options):.1f}"
                except TypeError as err:  # an option this mixer does not take
                    if not options:
                        raise
                    rate = f"n/a ({err})"
                print(f"| {task} | {mixer} | {label} | {rate} |", flush=True)
            if args.profile:
                profiles.append((task, mixer, profile_training(task, mixer, args.preset, args.device)))
    for task, mixer, table in profiles:
        print(f"\n## Profile: {task} / {mixer} (20 steps)\n\n{table}")


if __name__ == "__main__":
    main()
