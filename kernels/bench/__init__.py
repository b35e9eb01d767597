"""Alias for callers that still import ``kernels.bench``: the benchmarks and their machinery live in
``benchmarks/ops`` (``python -m benchmarks.ops <family>``). Remove once ``mixers/cells/timing.py`` and
``experiments/results.py`` import ``benchmarks.ops.common`` (and ``benchmarks*`` is in pyproject's
package list, so that it imports from any working directory)."""

try:
    from benchmarks.ops import common as _common
except ModuleNotFoundError:  # the repository root is not on sys.path (another working directory)
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).resolve().parents[2]))
    from benchmarks.ops import common as _common

BenchRow, time_ms, git_commit, environment = _common.BenchRow, _common.time_ms, _common.git_commit, _common.environment
copy_bandwidth_gbs, matmul_tflops, rel_error = _common.copy_bandwidth_gbs, _common.matmul_tflops, _common.rel_error
