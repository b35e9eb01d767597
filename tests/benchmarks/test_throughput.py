"""``python -m benchmarks.training.throughput workers``: the aggregate rate counts only steps run while every
trial trained, from the trials' own progress samples."""

import math
import shutil
import subprocess
import types
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.training.throughput import concurrent_rate, time_workers


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
    from benchmarks.training.throughput import benchmark_specs

    for _, spec in benchmark_specs("pararnn-table6", None, None, 100_000, "cuda"):
        assert spec.train.max_steps == spec.train.eval_every == 100_000 and spec.train.plateau_steps is None


def test_benchmark_specs_take_the_precision_asked_for():
    """``--precisions``: the preset's precision by default, else the one asked for, on every spec; a precision
    Lightning does not train in is one line of error and exit code 2, before anything runs."""
    from benchmarks.training.throughput import benchmark_specs, main

    preset = {s.model.precision for _, s in benchmark_specs("grazzi-table3", ["arith"], None, 10, "cpu")}
    bf16 = benchmark_specs("grazzi-table3", ["arith"], None, 10, "cpu", precision="bf16-mixed")
    from experiments.sweeps.presets import resolve_sweep

    mixers = resolve_sweep("arith", "grazzi-table3").mixers
    assert preset == {"32-true"} and len(bf16) == len(mixers) and {s.model.precision for _, s in bf16} == {"bf16-mixed"}
    assert {s.model.mixer for _, s in bf16} == {
        s.model.mixer for _, s in benchmark_specs("grazzi-table3", ["arith"], None, 10, "cpu")
    }
    assert main(["steps", "--preset", "grazzi-table3", "--tasks", "arith", "--precisions", "fp16"]) == 2


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_saturation_benchmark_refuses_a_machine_without_a_gpu(capsys):
    """``python -m benchmarks.training.saturation`` on a CPU-only machine: one line saying why, exit code 2."""
    from benchmarks.training.saturation import main

    with pytest.raises(SystemExit) as stop:
        main(["kernels", "--procs", "2"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("needs a CUDA GPU (none is visible)")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_saturation_streams_sets_the_connections_before_refusing(capsys, monkeypatch):
    """``streams`` gives each stream its own hardware queue (``CUDA_DEVICE_MAX_CONNECTIONS`` 32, set before
    CUDA starts, a value of the caller's kept), and refuses a machine without a GPU like the other modes."""
    from benchmarks.training.saturation import main

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


def test_saturation_streams_names_an_unknown_mixer(capsys):
    """``streams --mixers`` with a name no mixer has: one line listing the known ones, exit code 2,
    before anything needs a GPU."""
    from benchmarks.training.saturation import main

    with pytest.raises(SystemExit) as stop:
        main(["streams", "--mixers", "flashgru,nosuch"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown mixer 'nosuch'" in last and "flashgru" in last


def test_resident_ctas_per_sm_takes_the_tightest_limit():
    from benchmarks.training.saturation import MAX_CTAS_PER_SM, resident_ctas_per_sm

    assert resident_ctas_per_sm(256, 64, 0) == 4  # registers: 8 warps x 2,048 per warp = 16,384 per CTA
    assert resident_ctas_per_sm(1024, 16, 0) == 2  # threads: 2,048 per SM
    assert resident_ctas_per_sm(128, 255, 0) == 2  # 255 registers round up to 8,192 per warp
    assert resident_ctas_per_sm(64, 32, 100_000) == 2  # shared memory: 233,472 bytes per SM
    assert resident_ctas_per_sm(32, 16, 0) == MAX_CTAS_PER_SM
    assert resident_ctas_per_sm(1024, 255, 0) == 1  # does not fit by registers: still one at a time


def test_slot_rows_weight_each_kernel_by_the_slots_it_fills():
    """Two replays of a step of two kernels: one filling half of a 132-SM GPU's slots for 10 µs, one
    that overfills it (share capped at 1) for 3 µs; a non-kernel event is ignored."""
    from benchmarks.training.saturation import slot_rows

    def kernel(name, dur, grid, block, regs, smem=0):
        return {
            "cat": "kernel",
            "name": name,
            "dur": dur,
            "args": {"grid": grid, "block": block, "registers per thread": regs, "shared memory": smem},
        }

    half = kernel("gemm", 10.0, [66, 4, 1], [256, 1, 1], 64)  # 264 CTAs of 4 per SM: 264 / 528
    full = kernel("conv", 3.0, [4096, 1, 1], [1024, 1, 1], 32)  # 4,096 CTAs of 2 per SM: capped
    events = [half, full, {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 5.0}, half, full]
    rows = slot_rows(events, replays=2, sms=132)
    assert [r["kernel"] for r in rows] == ["gemm", "conv"]
    assert rows[0] == {"kernel": "gemm", "launches": 1.0, "us": 10.0, "slot_us": pytest.approx(5.0)}
    assert rows[1]["us"] == 3.0 and rows[1]["slot_us"] == pytest.approx(3.0)


def _ncu_kernel(**over):
    """One kernel's ``NCU_METRICS`` in ncu's base units: 132 SMs at 2 GHz."""
    k = {
        "gpu__time_duration.sum": 8000.0,
        "smsp__inst_executed.sum": 2.112e6,
        "sm__warps_active.sum": 8.448e6,
        "sm__cycles_active.sum": 1.056e6,
        "sm__cycles_elapsed.avg.per_second": 2e9,
        "dram__bytes.sum": 3.35e6,
        "launch__grid_size": 264.0,
        "launch__block_size": 128.0,
        "launch__registers_per_thread": 40.0,
        "launch__shared_mem_per_block_static": 0.0,
        "launch__shared_mem_per_block_dynamic": 8192.0,
    }
    return {**k, **over}


def test_resource_floors_divide_each_count_by_the_whole_gpu():
    """Hand-computed on a 132-SM GPU at 2 GHz: 1.056M SM-cycles are 4 µs of all SMs; 2.112M warp
    instructions over 528 schedulers are 2 µs; 8.448M warp-cycles over 8,448 warp slots 0.5 µs, and
    with 40 registers (1,280 per warp, allocated as 1,280) 8.448M x 1,280 / (132 x 65,536) cycles."""
    from benchmarks.training.saturation import resource_floors

    f = resource_floors(_ncu_kernel(), sms=132)
    assert f["us"] == pytest.approx(8.0)
    assert f["sm_active"] == pytest.approx(4.0)
    assert f["issue"] == pytest.approx(2.0)
    assert f["warps"] == pytest.approx(0.5)
    assert f["regs"] == pytest.approx(8.448e6 * 1280 / (132 * 65536) / 2e9 * 1e6)
    assert f["smem"] == pytest.approx(8.448e6 * 2048 / (132 * 233472) / 2e9 * 1e6)  # 8 KiB over 4 warps
    assert f["dram"] == pytest.approx(1.0)
    # 33 registers round up to 1,280 per warp as well (units of 256); 48 to 1,536
    for regs, scale in ((33.0, 1.0), (48.0, 1.2)):
        k = _ncu_kernel(launch__registers_per_thread=regs)
        assert resource_floors(k, 132)["regs"] == pytest.approx(f["regs"] * scale)


def test_read_ncu_csv_skips_the_units_row_and_reads_grouped_numbers():
    from benchmarks.training.saturation import NCU_METRICS, read_ncu_csv

    header = ["ID", "Kernel Name", *NCU_METRICS]
    units = ["", "", "ns", "inst", "warp", "cycle", "hz", "byte", "", "", "register/thread", "byte/block", "byte/block"]
    values = [
        [
            "0",
            "gemm",
            "8,000",
            "2,112,000",
            "8448000",
            "1,056,000",
            "1,956,097,765.63",
            "3,350,000",
            "264",
            "128",
            "40",
            "0",
            "8,192",
        ],
        ["1", "add", "2,000", "100", "200", "300", "2e9", "0", "1", "32", "16", "", "0"],
    ]
    text = "\n".join(",".join(f'"{v}"' for v in row) for row in [header, units, *values]) + "\n"
    kernels = read_ncu_csv(text)
    assert [k["name"] for k in kernels] == ["gemm", "add"]
    assert kernels[0]["gpu__time_duration.sum"] == 8000.0
    assert kernels[0]["sm__cycles_elapsed.avg.per_second"] == pytest.approx(1956097765.63)
    assert kernels[1]["launch__shared_mem_per_block_static"] == 0.0  # an empty cell reads as 0


def test_step_floors_sum_the_kernels_and_list_the_most_warp_cycles_first():
    from benchmarks.training.saturation import FLOORS, resource_floors, step_floors

    small = {**_ncu_kernel(**{"sm__cycles_active.sum": 2.64e5, "sm__warps_active.sum": 2.112e6}), "name": "small"}
    big = {**_ncu_kernel(), "name": "big"}
    row = step_floors([small, big, small], sms=132, top=2)
    assert row["kernels"] == 3
    for f in FLOORS:
        want = 2 * resource_floors(small, 132)[f] + resource_floors(big, 132)[f]
        assert row[f] == pytest.approx(want, abs=0.06)
    assert [k["kernel"] for k in row["top"]] == ["big", "small"]
    assert row["sm_active"] == pytest.approx(4.0 + 2 * 1.0, abs=0.06)
    assert row["warps"] == pytest.approx(0.5 + 2 * 0.125, abs=0.06)


def test_gpu_share_weights_each_stream_by_its_mixers_shared_time():
    """Three streams of two mixers round robin (a, b, a): a's two streams at 100 steps/s of 2,000 µs
    each, b's one at 200 of 1,000 µs: 0.4 + 0.2 of the GPU."""
    from benchmarks.training.saturation import gpu_share

    assert gpu_share({"a": 100.0, "b": 200.0}, ["a", "b"], 3, {"a": 2000.0, "b": 1000.0}) == pytest.approx(0.6)


def test_mix_shares_runs_each_mixer_alone_then_the_mix(monkeypatch):
    """``shares`` with the replays stubbed: a mixer alone at R steps/s takes 1e6 / R µs; the mix row's
    ``gpu_share`` adds its streams' shares."""
    import benchmarks.training.saturation as sat

    class Spec:
        def __init__(self, mixer):
            self.model = types.SimpleNamespace(mixer=mixer)  # a TrialSpec's model shape

    monkeypatch.setattr(
        "benchmarks.training.throughput.benchmark_specs", lambda *a, **k: [("khop2", Spec("x")), ("khop2", Spec("y"))]
    )
    alone = {"x": 4000, "y": 2000}
    calls = []

    def replay(task, counts, seconds, depth=4, stack=1, mixers=None):
        calls.append(mixers)
        if mixers:
            return [{"replays_per_s": alone[mixers[0]]}]
        return [{"replays_per_s": 3000, "per_stream": {"x": 750.0, "y": 750.0}}]

    monkeypatch.setattr(sat, "replay_streams", replay)
    rows = sat.mix_shares("khop2", 4, 1.0)
    assert calls == [["x"], ["y"], None]
    assert [r["mixer"] for r in rows] == ["x", "y", "mix"]
    assert rows[0]["shared_us"] == 250.0 and rows[1]["shared_us"] == 500.0
    assert rows[2]["gpu_share"] == pytest.approx((2 * 750 * 250 + 2 * 750 * 500) / 1e6)


def test_training_gpu_dmon_summary_reads_only_the_loaded_samples(tmp_path):
    """``training/gpu.sh``'s ``dmon_stop`` summarizes ``nvidia-smi dmon -s pc`` output: the SM clocks of
    the samples within 10% of the highest power, skipping header lines and idle samples."""
    if shutil.which("bash") is None or shutil.which("awk") is None:
        pytest.skip("needs bash and awk")
    script = Path(__file__).parents[2] / "benchmarks" / "training/gpu.sh"
    (tmp_path / "streams-dmon.txt").write_text(
        "# gpu    pwr  gtemp  mtemp   mclk   pclk \n# Idx      W      C      C    MHz    MHz \n"
        "    0     74     38     41   2619    345 \n    0    520     50     48   2619   1980 \n"
        "# gpu    pwr  gtemp  mtemp   mclk   pclk \n    0    480     51     48   2619   1755 \n"
        "    0    300     45     44   2619   1980 \n    0      -      -      -      -      - \n"
    )
    text = script.read_text()
    functions = text[text.index("dmon_start()") : text.index("\n}\n", text.index("dmon_stop()")) + 3]
    result = subprocess.run(
        ["bash", "-c", functions + "\ndmon_pid=; dmon_stop streams"],
        capture_output=True,
        text=True,
        env={"out": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "=== GPU 0 under load (2 samples within 10% of 520 W): SM clock 1755-1980 MHz"
