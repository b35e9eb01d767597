"""Wall time of a cell mixer's modes (sequential loop vs Newton-parallel) at several lengths.

``time_modes(name, lengths, modes=...)`` returns rows ``{mixer, mode, L, fwd_ms, fwd_bwd_ms}``
(median of ``samples`` runs after one warm-up; on CUDA the median of ``triton.testing.do_bench``). CLI (prints a Markdown table)::

    python -m benchmarks.training.cell_modes [--mixers flashgru,flashlstm] [--lengths 256,1024,4096]
        [--modes sequential,parallel] [--batch 8] [--d-model 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import pandas as pd
import torch


def _median_ms(fn, samples: int, device: str) -> float:
    if device.startswith("cuda"):
        import triton.testing

        return float(triton.testing.do_bench(fn, return_mode="median"))
    fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_modes(
    name: str,
    lengths: Sequence[int],
    modes: Sequence[str] = ("sequential", "parallel"),
    batch: int = 8,
    d_model: int = 64,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    samples: int = 3,
) -> list[dict]:
    """Median forward and forward+backward times (ms) of mixer ``name`` in each mode."""
    from mixers import build_mixer

    torch.manual_seed(0)
    mixer = build_mixer(name, d_model).to(device=device, dtype=dtype)
    rows = []
    for L in lengths:
        x = torch.randn(batch, L, d_model, device=device, dtype=dtype, requires_grad=True)
        for mode in modes:
            mixer.mode = mode

            def fwd():
                with torch.no_grad():
                    mixer(x)

            def fwd_bwd():
                mixer(x).sum().backward()

            rows.append(
                {
                    "mixer": name,
                    "mode": mode,
                    "L": L,
                    "fwd_ms": _median_ms(fwd, samples, device),
                    "fwd_bwd_ms": _median_ms(fwd_bwd, samples, device),
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training.cell_modes", description=__doc__.split("\n")[0])
    p.add_argument("--mixers", default="flashgru,flashlstm")
    p.add_argument("--lengths", default="256,1024,4096")
    p.add_argument("--modes", default="sequential,parallel")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--samples", type=int, default=3, help="timed runs per point on the CPU (median)")
    args = p.parse_args(argv)
    table = []
    for name in args.mixers.split(","):
        rows = time_modes(
            name,
            [int(v) for v in args.lengths.split(",")],
            args.modes.split(","),
            args.batch,
            args.d_model,
            args.device,
            samples=args.samples,
        )
        seq = {r["L"]: r for r in rows if r["mode"] == "sequential"}
        for r in rows:
            s = seq.get(r["L"])
            table.append(
                {
                    "mixer": name,
                    "L": r["L"],
                    "mode": r["mode"],
                    "fwd ms": r["fwd_ms"],
                    "fwd+bwd ms": r["fwd_bwd_ms"],
                    "fwd speed-up vs sequential": s["fwd_ms"] / r["fwd_ms"] if s else float("nan"),
                    "fwd+bwd speed-up": s["fwd_bwd_ms"] / r["fwd_bwd_ms"] if s else float("nan"),
                }
            )
    sys.stdout.write(pd.DataFrame(table).to_markdown(index=False, floatfmt=".1f") + "\n")


if __name__ == "__main__":
    main()
