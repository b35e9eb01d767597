"""``python -m benchmarks.ops <family|tool> [args...]``: run one family's benchmark or a tool."""

from __future__ import annotations

import importlib
import os
import sys

FAMILIES = ("scan", "newton", "fused_rnn", "mlstm", "ssd", "delta")
TOOLS = {
    "compile": "compile_report",
    "warm": "warm",
    "summary": "summary",
    "host": "host",
    "scan-probe": "scan_probe",
    "delta-probe": "delta_probe",
}


def _slice_autotuning(spec: str) -> None:
    """``BENCH_AUTOTUNE_PART=i/n``: every Triton autotuner tries only its configurations ``i, i + n,
    ...`` (``warm`` splits one autotuning over ``n`` processes; the disk cache then holds them all)."""
    part, parts = (int(v) for v in spec.split("/"))
    from triton.runtime import autotuner

    full = autotuner.Autotuner.prune_configs

    def sliced(self, *args, **kwargs):
        configs = full(self, *args, **kwargs)
        return configs[part::parts] or configs[:1]

    autotuner.Autotuner.prune_configs = sliced


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = ", ".join([*FAMILIES, *TOOLS])
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m benchmarks.ops {{{names}}} [options]  (python -m benchmarks.ops <name> -h)")
        print("A family: check every implementation and peer against the reference, time them, write")
        print("benchmarks/ops/results/<family>.json. compile: the compile report; warm: parallel compilation;")
        print("summary: one table of ours vs the fastest peer per family; host: host time per call;")
        print("scan-probe: where the scan's time goes (tiles, host); delta-probe: the delta chunk kernels one by")
        print("one (each kernel's time, a warps x stages grid).")
        raise SystemExit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in FAMILIES and name not in TOOLS:
        raise SystemExit(f"error: unknown benchmark {name!r}; known: {names}")
    if os.environ.get("BENCH_AUTOTUNE_PART"):
        _slice_autotuning(os.environ["BENCH_AUTOTUNE_PART"])
    importlib.import_module(f"benchmarks.ops.{TOOLS.get(name, name)}").main(rest)


if __name__ == "__main__":
    main()
