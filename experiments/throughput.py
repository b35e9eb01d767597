"""``python -m experiments.throughput``: data-generation speed and CPU training throughput.

Measures (one CPU thread, as CI and the smoke presets run):
1. generation of 100,000 samples of length 100 for every task (median of ``--repeats`` runs);
2. training steps/s of the smoke models (model + AdamW step, no Lightning) per mixer, and the same
   through the Lightning trainer (``run_trial``) for one mixer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from experiments.model import ModelConfig, SingleLayerModel
from experiments.presets import resolve_sweep
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


def time_training(task: str, mixer: str, steps: int) -> float:
    """Steps/s of model forward + backward + AdamW at the smoke preset's shapes (no Lightning)."""
    plan = resolve_sweep(task, "smoke", {"mixers": [mixer]})
    length = (plan.extrapolation or {}).get("max_len") or plan.task_options.get("seq_len", 100)
    t = get_task(task, **{**plan.task_options, "seq_len": length})
    vocab = t.vocab_size + (1 if plan.extrapolation else 0)
    model = SingleLayerModel(ModelConfig(vocab, t.num_classes, mixer=mixer, block=plan.block,
                                         positional=plan.positional, mixer_options=plan.mixer_options.get(mixer, {})))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = t.generate(plan.train.batch_size * 4, seed=0)
    batches = data.inputs.split(plan.train.batch_size), data.targets.split(plan.train.batch_size)

    def step(i: int) -> None:
        x, y = batches[0][i % 4], batches[1][i % 4]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(3):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=50, help="timed training steps per mixer")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"## Data generation: {args.samples:,} samples x L=100, {args.threads} thread(s), median of {args.repeats}\n")
    print("| task | seconds |\n|---|---|")
    for label, seconds in time_generation(args.samples, args.repeats):
        print(f"| {label} | {seconds:.3f} |")
    print(f"\n## Training throughput at the smoke presets' shapes ({args.threads} thread(s), steps/s, no Lightning)\n")
    print("| task | mixer | steps/s |\n|---|---|---|")
    for task in ("parity", "keep_nth", "mqar", "khop"):
        for mixer in resolve_sweep(task, "smoke").mixers:
            print(f"| {task} | {mixer} | {time_training(task, mixer, args.steps):.1f} |", flush=True)


if __name__ == "__main__":
    main()
