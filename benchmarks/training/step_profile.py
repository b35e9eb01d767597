"""What one captured training step costs on the GPU: its kernels, their time, and the replay's time.

``profile_step(spec)`` builds the trial's model and data as ``run_trial`` does, captures one training
step (forward, loss, backward, the step's bookkeeping of ``CapturedSteps.record_step``, fused
capturable AdamW: what the graph engine's CUDA graph holds) in a CUDA graph, and measures

- ``kernels_per_step``: kernels one replay launches, by family (``elementwise``, ``reduction``,
  ``gemm``, ``other``: the suite's Triton kernels, copies and the rest), from ``torch.profiler``;
- ``gpu_us_per_step``: the sum of those kernels' durations;
- ``replay_us_per_step``: wall time per replay, replays back to back (the step rate of one trial
  alone on the GPU is its inverse).

With ``compile=True`` the model and loss are ``torch.compile``d first (Inductor fuses the
elementwise and reduction chains, forward and backward) as the ``compiled`` engine does
(``experiments.engines.cuda_graph.compiled_loss``). A trial that cannot be captured reports why in ``error``.

Used by ``python -m benchmarks.training.throughput kernels``. Needs a CUDA GPU.
"""

from __future__ import annotations

import time
from typing import Any

import torch

#: kernel-name fragments of each family (first match wins; ``other`` catches the rest)
FAMILIES = {
    "gemm": ("gemm", "splitKreduce", "cutlass", "cublas"),
    "reduction": ("reduce_kernel", "scan_innermost", "_red_", "_per_"),
    "elementwise": ("elementwise_kernel", "triton_poi", "CatArrayBatchedCopy", "unrolled_elementwise", "fill_kernel"),
}


def kernel_family(name: str) -> str:
    """``gemm``, ``reduction``, ``elementwise`` or ``other`` for a CUDA kernel's name."""
    for family, fragments in FAMILIES.items():
        if any(f in name for f in fragments):
            return family
    return "other"


def profile_replays(graph, replays: int):
    """``torch.profiler`` of ``replays`` back-to-back replays of a captured ``graph`` (CUDA activity only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return prof


def _kernel_events(prof) -> list:
    """The CUDA kernels of a profile (memcpy / memset excluded)."""
    return [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not any(m in e.name.lower() for m in ("memcpy", "memset"))
    ]


def heaviest_kernels(kernels: list, steps: int, n: int) -> list[dict[str, Any]]:
    """The ``n`` kernels (by name) with the most GPU time in ``kernels`` (profiler events with ``name``
    and ``device_time`` in µs, from ``steps`` replays), heaviest first: ``kernel`` (the name, cut at 100
    characters), ``family``, ``launches`` and ``us`` per step, and ``share`` of the step's kernel time."""
    launches: dict[str, int] = {}
    us: dict[str, float] = {}
    for e in kernels:
        launches[e.name] = launches.get(e.name, 0) + 1
        us[e.name] = us.get(e.name, 0.0) + e.device_time
    total = sum(us.values()) or 1.0
    return [
        {
            "kernel": name[:100],
            "family": kernel_family(name),
            "launches": round(launches[name] / steps, 1),
            "us": round(us[name] / steps, 1),
            "share": round(us[name] / total, 3),
        }
        for name in sorted(us, key=us.get, reverse=True)[:n]
    ]


def captured_step(
    spec, compile: bool = False, warmup: int = 3, stack: int = 1, stream: torch.cuda.Stream | None = None
):
    """``(graph, step)``: the trial's training step captured in a CUDA graph (after ``warmup`` eager
    steps on a side stream), and the step as a plain function (for an eager profile). ``stack`` > 1:
    the step of that many trials (seeds ``spec.seed + k``) stacked into one model (``experiments.trial.stack``).
    ``stream``: the stream to warm up and capture on (default: a new side stream and PyTorch's shared
    capture stream); graphs that one process replays at once on several streams each need their own,
    since per-stream state such as the scan's look-back workspace is keyed on the capturing stream."""
    from experiments.engines.cuda_graph import CUDAGraphPrecision
    from experiments.trial.stack import build_stacked_module
    from experiments.trial.train import build_datamodule, build_module

    seeds = [spec.seed + k for k in range(stack)] if stack > 1 else None
    torch.manual_seed(spec.seed)
    dm = build_datamodule(spec, "cuda", stack_seeds=seeds)
    dm.setup("fit")
    engine = "compiled" if compile else "graph"  # the trial's captured step: its skip flag, its loss
    lit = (build_stacked_module(spec, dm, seeds, engine) if seeds else build_module(spec, dm, engine)).cuda()
    if compile:
        lit.compile_loss()
    opt = lit.configure_optimizers()  # the training's fused, capturable AdamW
    lit.bind_learning_rate(opt)
    tokens, targets = (t.clone() for t in dm.train_dataloader().batch(0))

    # as in training: the closure in the graph engine's precision context (bfloat16 autocast for bf16-mixed)
    precision = CUDAGraphPrecision(autocast=spec.model.precision == "bf16-mixed")

    def step() -> None:  # the training's closure, then the optimizer step
        with precision.forward_context():
            lit.training_closure(opt, tokens, targets)
        opt.step()

    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    return graph, step


def profile_step(
    spec, compile: bool = False, replays: int = 300, profiled: int = 5, stack: int = 1, top: int = 0
) -> dict[str, Any]:
    """The step's kernels and times (module docstring) as one row; ``stack``: trials stacked in the step;
    ``top`` > 0: also ``heaviest``, the ``top`` kernels with the most GPU time (``heaviest_kernels``)."""
    if not torch.cuda.is_available():
        raise ValueError("profiling a captured training step needs a CUDA GPU (none is visible)")
    row: dict[str, Any] = {"mixer": spec.model.mixer, "compiled": compile, "stack": stack}
    t0 = time.perf_counter()
    try:
        graph, _ = captured_step(spec, compile, stack=stack)
    except Exception as e:  # noqa: BLE001  (a trial that cannot be captured is reported, not fatal)
        torch.cuda.synchronize()
        return {**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    row["setup_s"] = round(time.perf_counter() - t0, 1)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    replay_us = (time.perf_counter() - t0) / replays * 1e6
    kernels = _kernel_events(profile_replays(graph, profiled))
    families = {f: 0 for f in (*FAMILIES, "other")}
    for e in kernels:
        families[kernel_family(e.name)] += 1
    row.update(
        {
            "kernels_per_step": round(len(kernels) / profiled, 1),
            **{f: round(n / profiled, 1) for f, n in families.items()},
            "gpu_us_per_step": round(sum(e.device_time for e in kernels) / profiled, 1),
            "replay_us_per_step": round(replay_us, 1),
            "steps_per_s_alone": round(1e6 / replay_us),
        }
    )
    if top:
        row["heaviest"] = heaviest_kernels(kernels, profiled, top)
    del graph
    return row
