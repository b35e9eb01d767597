"""Timing, physical limits, result tables and JSON output shared by every family's benchmark.

Times are medians in milliseconds. On CUDA they come from ``triton.testing.do_bench`` (CUDA events,
warm-up first); on the CPU from ``torch.utils.benchmark``-style wall-clock medians.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable

import torch


@dataclasses.dataclass
class BenchRow:
    """One timed implementation at one shape.

    ``ms`` is the median time in milliseconds (``nan`` when skipped, with ``note`` saying why);
    ``limit_ms`` is the physical floor for the same work (bytes / copy bandwidth or FLOPs / matmul
    rate), so ``ms / limit_ms`` is the gap to the limit.
    """

    family: str
    impl: str
    shape: str
    direction: str  # "fwd" or "fwd+bwd"
    dtype: str
    ms: float
    limit_ms: float = math.nan
    max_rel_err: float = math.nan
    note: str = ""
    extra: dict = dataclasses.field(default_factory=dict)


def time_ms(fn: Callable[[], object], *, warmup: int = 25, rep: int = 100, device: str | None = None) -> float:
    """Median wall time of ``fn()`` in ms. CUDA: ``do_bench`` (warmup/rep in ms); CPU: counts."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(max(1, min(warmup, 3))):
        fn()
    samples = []
    budget = time.perf_counter() + max(rep, 1) / 1000.0 * 20  # at most ~20x rep ms of samples
    while len(samples) < 5 or (time.perf_counter() < budget and len(samples) < 50):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(samples))


def copy_bandwidth_gbs(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device=device)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def matmul_tflops(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Measured dense matmul rate in TFLOP/s on random ``n x n`` operands."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ b, device=device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` when ``out`` has a NaN or Inf."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return math.inf
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


def git_commit() -> str:
    """Short git commit of the suite's checkout (``"unknown"`` outside one, e.g. on a device copy)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        ).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def environment(device: str) -> dict:
    """Device name, library versions, date and commit, for the JSON header."""
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    for peer in ("pararnn-torch", "flashrnn", "mlstm-kernels", "accelerated-scan", "fla-core"):
        env[peer] = _version(peer)
    return env


def print_table(rows: Iterable[BenchRow], *, baseline: str | None = None) -> str:
    """Format rows as a Markdown table (returned and printed).

    ``baseline``: an impl name; each row gets its time ratio to that impl at the same
    (shape, direction, dtype).
    """
    rows = list(rows)
    base = {}
    if baseline:
        for r in rows:
            if r.impl == baseline:
                base[(r.shape, r.direction, r.dtype)] = r.ms
    def num(x: object, spec: str) -> str:
        return format(x, spec) if isinstance(x, (int, float)) and x == x else "-"

    head = "| shape | dtype | dir | impl | ms | vs " + (baseline or "-") + " | limit ms | limit/ms | rel err | note |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        b = base.get((r.shape, r.direction, r.dtype), math.nan)
        ratio = r.ms / b if b == b and r.ms == r.ms else math.nan
        eff = r.limit_ms / r.ms if r.limit_ms == r.limit_ms and r.ms == r.ms else math.nan
        lines.append(
            f"| {r.shape} | {r.dtype} | {r.direction} | {r.impl} | {num(r.ms, '.4g')} | {num(ratio, '.3g')}x | "
            f"{num(r.limit_ms, '.4g')} | {num(eff, '.0%')} | {num(r.max_rel_err, '.2g')} | {r.note} |"
        )
    text = "\n".join(lines)
    print(text)
    return text


def write_json(family: str, rows: Iterable[BenchRow], env: dict, out_dir: str | os.PathLike = "benchmarks") -> Path:
    """Write ``{env, rows}`` to ``<out_dir>/<family>-<device>-<date>.json``; returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = "".join(c if c.isalnum() else "-" for c in str(env.get("device", "dev"))).strip("-").lower()
    stamp = env.get("date", "")[:19].replace(":", "").replace("-", "")
    path = out / f"{family}-{dev}-{stamp}.json"
    payload = {"family": family, "env": env, "rows": [dataclasses.asdict(r) for r in rows]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)
    return path
