"""``python -m experiments.throughput workers``: the aggregate rate counts only steps run while every
trial trained, from the trials' own progress samples."""

import math

import pandas as pd
import pytest

from experiments.throughput import concurrent_rate, time_workers


def _progress(times, steps):
    return pd.DataFrame({"unix_time_s": times, "step": steps})


def test_concurrent_rate_counts_the_shared_window_only():
    # A: 100 steps/s from t=0 to 10; B: 50 steps/s from t=4 to 20. Shared window [4, 10]: 600 + 300 steps.
    a = _progress([0.0, 5.0, 10.0], [0, 500, 1000])
    b = _progress([4.0, 12.0, 20.0], [0, 400, 800])
    rate, window = concurrent_rate([a, b])
    assert window == pytest.approx(6.0) and rate == pytest.approx(900 / 6)
    # the sum of their own rates (150) is what a late finisher on an emptier GPU would inflate; here equal
    assert rate == pytest.approx(100 + 50)


def test_concurrent_rate_interpolates_uneven_trials():
    # B runs 10 steps/s until t=6, then 90 steps/s (A finished at t=6 in a real run would do that)
    a = _progress([0.0, 6.0], [0, 600])
    b = _progress([1.0, 6.0, 11.0], [0, 50, 500])
    rate, window = concurrent_rate([a, b])
    assert window == pytest.approx(5.0) and rate == pytest.approx((500 + 50) / 5)


def test_concurrent_rate_without_overlap_is_nan():
    assert math.isnan(concurrent_rate([_progress([0, 1], [0, 10]), _progress([2, 3], [0, 10])])[0])
    assert math.isnan(concurrent_rate([_progress([0], [0])])[0]) and math.isnan(concurrent_rate([])[0])


@pytest.mark.slow
def test_two_cpu_workers_report_a_rate_they_ran_together(tmp_path):
    """Two short trials on two worker processes: each writes progress.csv; the shared-window rate is
    positive, and no larger than the sum of the trials' own steady rates (plus sampling slack)."""
    rows = time_workers([2], ["eager"], "pararnn-table6", ["parity"], ["flashgru"], 300, "cpu", tmp_path)
    row = rows.iloc[0]
    assert row["ok_trials"] == 2 and row["together_window_s"] > 0
    assert 0 < row["total_steps_per_s"] <= 1.2 * row["sum_of_steady_steps_per_s"]
    files = sorted(tmp_path.rglob("progress.csv"))
    assert len(files) == 2
    for f in files:
        p = pd.read_csv(f)
        assert p["step"].is_monotonic_increasing and p["step"].iloc[-1] == 300 and p["step"].iloc[0] >= 10


def test_long_benchmark_trials_train_every_step():
    """--steps above a preset's plateau window: no plateau stop (and no validation error) cuts them."""
    from experiments.throughput import benchmark_specs

    for _, spec in benchmark_specs("pararnn-table6", None, None, 100_000, "cuda"):
        assert spec.train.max_steps == spec.train.eval_every == 100_000 and spec.train.plateau_steps is None


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_saturation_benchmark_refuses_a_machine_without_a_gpu(capsys):
    """``python -m benchmarks.saturation`` on a CPU-only machine: one line saying why, exit code 2."""
    from benchmarks.saturation import main

    with pytest.raises(SystemExit) as stop:
        main(["kernels", "--procs", "2"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("needs a CUDA GPU (none is visible)")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_saturation_streams_sets_the_connections_before_refusing(capsys, monkeypatch):
    """``streams`` gives each stream its own hardware queue (``CUDA_DEVICE_MAX_CONNECTIONS`` 32, set before
    CUDA starts, a value of the caller's kept), and refuses a machine without a GPU like the other modes."""
    from benchmarks.saturation import main

    for given, want in ((None, "32"), ("8", "8")):
        if given is None:
            monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
        else:
            monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", given)
        with pytest.raises(SystemExit) as stop:
            main(["streams", "--streams", "1,2"])
        assert stop.value.code == 2
        assert __import__("os").environ["CUDA_DEVICE_MAX_CONNECTIONS"] == want
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith("needs a CUDA GPU (none is visible)")


def test_resident_ctas_per_sm_takes_the_tightest_limit():
    from benchmarks.saturation import MAX_CTAS_PER_SM, resident_ctas_per_sm

    assert resident_ctas_per_sm(256, 64, 0) == 4  # registers: 8 warps x 2,048 per warp = 16,384 per CTA
    assert resident_ctas_per_sm(1024, 16, 0) == 2  # threads: 2,048 per SM
    assert resident_ctas_per_sm(128, 255, 0) == 2  # 255 registers round up to 8,192 per warp
    assert resident_ctas_per_sm(64, 32, 100_000) == 2  # shared memory: 233,472 bytes per SM
    assert resident_ctas_per_sm(32, 16, 0) == MAX_CTAS_PER_SM
    assert resident_ctas_per_sm(1024, 255, 0) == 1  # does not fit by registers: still one at a time


def test_slot_rows_weight_each_kernel_by_the_slots_it_fills():
    """Two replays of a step of two kernels: one filling half of a 132-SM GPU's slots for 10 µs, one
    that overfills it (share capped at 1) for 3 µs; a non-kernel event is ignored."""
    from benchmarks.saturation import slot_rows

    def kernel(name, dur, grid, block, regs, smem=0):
        return {"cat": "kernel", "name": name, "dur": dur,
                "args": {"grid": grid, "block": block, "registers per thread": regs, "shared memory": smem}}

    half = kernel("gemm", 10.0, [66, 4, 1], [256, 1, 1], 64)  # 264 CTAs of 4 per SM: 264 / 528
    full = kernel("conv", 3.0, [4096, 1, 1], [1024, 1, 1], 32)  # 4,096 CTAs of 2 per SM: capped
    events = [half, full, {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 5.0}, half, full]
    rows = slot_rows(events, replays=2, sms=132)
    assert [r["kernel"] for r in rows] == ["gemm", "conv"]
    assert rows[0] == {"kernel": "gemm", "launches": 1.0, "us": 10.0, "slot_us": pytest.approx(5.0)}
    assert rows[1]["us"] == 3.0 and rows[1]["slot_us"] == pytest.approx(3.0)
