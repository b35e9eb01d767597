"""Alias of ``benchmarks.ops.common`` (see ``kernels/bench/__init__.py``)."""

from kernels.bench import _common

time_ms, git_commit, BenchRow, environment = _common.time_ms, _common.git_commit, _common.BenchRow, _common.environment
