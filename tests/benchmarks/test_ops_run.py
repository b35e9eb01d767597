"""``benchmarks.ops.common.run``: checked, timed rows; with ``graph=True`` the CUDA-graph replay time beside
the eager one, or the reason it could not be captured (here, on the CPU: no CUDA)."""

from __future__ import annotations

import math

import torch

from benchmarks.ops.common import Impl, Problem, run, table


def _problem() -> Problem:
    x = torch.randn(64, 64)
    pb = Problem("toy", {"dim": 64}, "fp32", None, {"fwd": 0.001}, "main")
    pb.impls = lambda: [Impl("matmul", lambda: x @ x, None, lambda: 0.0, "")]
    return pb


def test_run_times_and_checks_each_implementation():
    (row,) = run([_problem()], log=lambda _: None)
    assert row.impl == "matmul" and row.ms > 0 and row.max_rel_err == 0.0 and row.extra == {}
    assert "graph ms" not in table([row])


def test_graph_timing_records_why_a_thunk_was_not_replayed():
    (row,) = run([_problem()], log=lambda _: None, graph=not torch.cuda.is_available())
    if torch.cuda.is_available():  # CPU tensors on a GPU machine: not the case this test covers
        return
    assert row.ms > 0 and "graph_error" in row.extra and "graph_ms" not in row.extra


def test_table_shows_the_replay_column_when_a_row_has_one():
    (row,) = run([_problem()], log=lambda _: None)
    row.extra["graph_ms"] = 0.5
    lines = table([row]).splitlines()
    assert "graph ms" in lines[0] and "0.5" in lines[2]
    assert not math.isnan(row.ms)


def test_profile_stores_the_heaviest_kernels_of_the_named_implementations():
    """``profile(name)`` true: the implementation's heaviest ops per call, heaviest first (CPU ops here), with
    launches per call; logged; the other implementations carry none."""
    a, b = torch.randn(384, 384), torch.randn(8)
    pb = Problem("toy", {"dim": 384}, "fp32", None, {}, "main")
    pb.impls = lambda: [
        Impl("heavy", lambda: (a @ a @ a, b + 1, b + 2), None, lambda: 0.0, ""),
        Impl("light", lambda: b + 1, None, lambda: 0.0, ""),
    ]
    logged = []
    heavy, light = run([pb], log=logged.append, profile=lambda name: name == "heavy")
    kernels = heavy.extra["kernels"]
    assert kernels[0]["kernel"] in ("aten::mm", "aten::matmul") and kernels[0]["launches"] == 2
    assert [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
    assert any(k["kernel"] == "aten::add" and k["launches"] == 2 for k in kernels)
    assert "kernels" not in light.extra and any("device kernels per call" in m for m in logged)
