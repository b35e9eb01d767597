"""Shared benchmark machinery: timing, physical limits, tables and JSON (SPEC §7).

Each family provides ``kernels/<family>/bench.py`` with ``main(argv: list[str]) -> None``;
``python -m kernels.bench <family> [--quick] [...]`` dispatches to it.
"""

from kernels.bench.common import (
    BenchRow,
    copy_bandwidth_gbs,
    environment,
    matmul_tflops,
    print_table,
    rel_error,
    time_ms,
    write_json,
)

__all__ = [
    "BenchRow",
    "copy_bandwidth_gbs",
    "environment",
    "matmul_tflops",
    "print_table",
    "rel_error",
    "time_ms",
    "write_json",
]
