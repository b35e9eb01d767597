"""What bounds N processes that share one GPU under MPS, each replaying a CUDA graph of tiny kernels.

    python -m benchmarks.saturation kernels --procs 1,16 --ctas 1,16,64,256 --kernels 80 --seconds 4
    python -m benchmarks.saturation steps --procs 16 --tasks khop2 --seconds 15

``kernels``: each process replays a graph of ``--kernels`` elementwise kernels of ``G`` CTAs each
(``x.add_(1)`` on ``512 G`` floats: 128 threads x 4 per CTA) back to back; the rows give the kernels and
CTAs per second that all processes complete together. It calibrates the GPU's front end: how many
launches and CTAs it can start when the kernels themselves do almost nothing.

``steps``: each process replays the compiled training step of one trial of the Table 6 mix
(``experiments.step_profile.captured_step``: forward, loss, backward, bookkeeping, fused AdamW; the
mixers round robin over the processes); the row gives the steps per second in total and per mixer,
without Lightning or data loading around the replays (``python -m experiments.throughput workers``
measures the whole training loop).

The processes build their graphs, then start replaying together and run for ``--seconds``. Needs a
CUDA GPU and ``nvidia-cuda-mps-control`` (``experiments.mps``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import torch


def _noop_graph(ctas: int, kernels: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    x = torch.zeros(ctas * 512, device="cuda")
    for _ in range(3):
        x.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    return graph, x


def _step_graph(task: str, index: int) -> tuple[torch.cuda.CUDAGraph, str]:
    from experiments.step_profile import captured_step
    from experiments.throughput import benchmark_specs

    specs = benchmark_specs("pararnn-table6", [task], None, 100, "cuda")
    spec = specs[index % len(specs)][1]
    graph, _ = captured_step(spec, compile=True)
    return graph, spec.mixer


def _worker(args: list[str]) -> None:
    """One process: build the graph, signal ready, wait for the go file, replay for the given seconds."""
    kind, index, seconds, go = args[0], int(args[1]), float(args[2]), args[3]
    torch.set_num_threads(1)
    if kind == "kernels":
        (graph, _buffer), label = _noop_graph(int(args[4]), int(args[5])), f"ctas={args[4]}"
    else:
        graph, label = _step_graph(args[4], index)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    open(f"{go}.ready{index}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            graph.replay()
        n += 20
    torch.cuda.synchronize()
    print(json.dumps({"label": label, "replays_per_s": n / (time.perf_counter() - t0)}), flush=True)


def run_together(kind: str, procs: int, seconds: float, extra: list[str]) -> dict:
    """``procs`` worker processes under one MPS daemon; their replay rates, in total and per label."""
    from experiments.mps import cuda_mps

    go = tempfile.mktemp(prefix="saturation-go-")
    with cuda_mps(True):
        t0 = time.time()
        workers = [subprocess.Popen([sys.executable, "-m", "benchmarks.saturation", "_worker", kind, str(i), str(seconds),
                                     go, *extra], stdout=subprocess.PIPE, text=True) for i in range(procs)]
        while len(glob.glob(go + ".ready*")) < procs:
            if any(w.poll() is not None for w in workers):
                raise RuntimeError(f"a {kind} worker exited before it was ready (exit codes "
                                   f"{[w.poll() for w in workers]})")
            time.sleep(0.1)
        setup_s = time.time() - t0
        open(go, "w").close()
        rows = [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
    for path in glob.glob(go + "*"):
        os.remove(path)
    per: dict[str, list[float]] = {}
    for r in rows:
        per.setdefault(r["label"], []).append(r["replays_per_s"])
    return {"procs": procs, "setup_s": round(setup_s, 1), "replays_per_s": round(sum(r["replays_per_s"] for r in rows)),
            "per_process": {k: round(sum(v) / len(v)) for k, v in per.items()}}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        _worker(argv[1:])
        return
    p = argparse.ArgumentParser(prog="python -m benchmarks.saturation", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("kernels", help="graphs of no-op kernels of G CTAs (the GPU front end's capacity)")
    k.add_argument("--ctas", default="1,16,64,256", help="CTAs per kernel, comma-separated")
    k.add_argument("--kernels", type=int, default=80, help="kernels per graph (default 80, about one compiled step)")
    s = sub.add_parser("steps", help="compiled training steps of the Table 6 mix")
    s.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    for q in (k, s):
        q.add_argument("--procs", default="16", help="process counts, comma-separated")
        q.add_argument("--seconds", type=float, default=10.0, help="replay time per run")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (none is visible)")
    for n in (int(v) for v in args.procs.split(",")):
        if args.mode == "kernels":
            for g in (int(v) for v in args.ctas.split(",")):
                row = run_together("kernels", n, args.seconds, [str(g), str(args.kernels)])
                row.update(ctas=g, kernels_per_s=row["replays_per_s"] * args.kernels,
                           ctas_per_s=row["replays_per_s"] * args.kernels * g)
                print(json.dumps(row), flush=True)
        else:
            for task in args.tasks.split(","):
                row = run_together("steps", n, args.seconds, [task])
                print(json.dumps({"task": task, **row}), flush=True)


if __name__ == "__main__":
    main()
