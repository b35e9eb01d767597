"""``python -m benchmarks.graph_capture --mixers a,b [--backend B]``: can each mixer's forward and backward be
captured in a CUDA graph, and does a replay on new inputs give what an eager call gives?

Per mixer (d = 64, 4 heads, input (16, 40, 64)): three eager forward+backward passes on a side stream
(compilation, autotuning), then the capture of one, then a replay on fresh inputs copied into the
captured input, compared with an eager call on the same inputs (output and input gradient, relative
norm error). Prints one line per mixer: ``ok``, or the first line of the error. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).float().norm() / b.float().norm().clamp_min(1e-30))


def check(name: str, backend: str | None) -> str:
    from mixers import build_mixer

    options = {"num_heads": 4} | ({"backend": backend} if backend and not name.startswith("fla:") else {})
    torch.manual_seed(0)
    mixer = build_mixer(name, 64, **options).cuda()
    x = torch.randn(16, 40, 64, device="cuda", requires_grad=True)

    def step() -> torch.Tensor:
        x.grad = None
        y = mixer(x)
        y.square().mean().backward()
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            y_static = step()
    except Exception as err:  # noqa: BLE001 - the report is the error
        return f"capture fails: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
    fresh = torch.randn_like(x)
    with torch.no_grad():
        x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    got_y, got_dx = y_static.detach().clone(), x.grad.detach().clone()
    want_y = step().detach()
    return f"ok: replay vs eager rel. error {_rel(got_y, want_y):.1e} (output), {_rel(got_dx, x.grad):.1e} (input grad)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.graph_capture", description=__doc__.split("\n\n")[0])
    p.add_argument("--mixers", required=True)
    p.add_argument("--backend")
    args = p.parse_args(argv)
    for name in args.mixers.split(","):
        try:
            print(f"{name}: {check(name, args.backend)}", flush=True)
        except Exception as err:  # noqa: BLE001
            print(f"{name}: error: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
