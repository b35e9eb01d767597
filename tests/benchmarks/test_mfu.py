"""``python -m benchmarks.training.mfu``: FLOPs per step, device peaks, representative cells, phase timing,
the workers' waves and the report."""

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from benchmarks.training.flops import count_flops, device_peaks, step_flops
from benchmarks.training.mfu import (
    main,
    merged,
    preset_projection,
    report_name,
    representative_cells,
    shape_key,
    worker_steps,
    worker_waves,
)
from benchmarks.training.phases import PHASES, Phases


def test_count_flops_of_linear_layers_forward_and_backward():
    """Two bias-free linear layers on a batch that needs no gradient: the forward's 2*B*i*o per layer, the
    backward's weight gradients the same again, and the input gradient of the second layer only."""
    B, i, h, o = 7, 13, 5, 11
    net = nn.Sequential(nn.Linear(i, h, bias=False), nn.Linear(h, o, bias=False))
    x = torch.randn(B, i)
    flops, custom = count_flops(lambda: net(x).square().sum().backward())
    forward = 2 * B * (i * h + h * o)
    assert flops == forward + forward + 2 * B * h * o and custom == []


def test_count_flops_names_custom_operators_it_cannot_see_into():
    @torch.library.custom_op("mfu_test::scaled_matmul", mutates_args=())
    def scaled_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 2 * (a @ b)

    @scaled_matmul.register_fake
    def _(a, b):
        return a.new_empty(a.shape[0], b.shape[1])

    flops, custom = count_flops(lambda: scaled_matmul(torch.randn(3, 4), torch.randn(4, 5)))
    assert custom == ["mfu_test::scaled_matmul"]


def test_step_flops_of_a_dense_model_follow_six_n_d():
    """A GRU model's weights are all in matrix products: forward + backward is about 6 FLOPs per parameter
    per token of the padded batch (the embedding is a lookup, the norms elementwise). Lengths uniform in 3..40:
    the mean real length is near 21.5."""
    cell = next(c for c in representative_cells("state-tracking", ["s3"], ["gru"], "cpu") if c.spec.model.layers == 1)
    spec = cell.spec
    row = step_flops(spec, "cpu", sample=2048)
    assert (row["batch"], row["padded_len"]) == (spec.train.batch_size, 40)
    assert abs(row["real_len"] - 21.5) < 0.5
    tokens = row["batch"] * row["padded_len"]
    assert 0.85 < row["flops"] / (6 * row["n_params"] * tokens) < 1.0


def test_step_flops_with_length_bucketing_count_the_cut_batches():
    """Bucketed batches are cut to their longest sequence: the mean width comes down to near the mean real length,
    and the FLOPs of a GRU (linear in the width) come down with it."""
    cell = next(c for c in representative_cells("state-tracking", ["s3"], ["gru"], "cpu") if c.spec.model.layers == 1)
    small = dataclasses.replace(cell.spec.train, train_size=4096, batch_size=64)
    full = step_flops(dataclasses.replace(cell.spec, train=small), "cpu")
    cut = step_flops(dataclasses.replace(cell.spec, train=dataclasses.replace(small, length_bucketing=16)), "cpu")
    assert full["padded_len"] == 40 and cut["real_len"] == full["real_len"]
    assert cut["real_len"] <= cut["padded_len"] < 1.1 * cut["real_len"]
    assert cut["flops"] < 0.8 * full["flops"]


def test_device_peaks_by_name():
    assert device_peaks("NVIDIA H100 80GB HBM3").bf16 == 989e12
    assert device_peaks("NVIDIA H200").fp32 == 67e12 and device_peaks("NVIDIA H200").tf32 == 494e12
    assert device_peaks("NVIDIA H100 PCIe").bf16 == 756e12
    assert device_peaks("cpu") is None and device_peaks("NVIDIA GeForce GTX 1080") is None


def test_representative_cells_stand_for_every_sweep_of_their_shape():
    """state-tracking: every sweep trains gru at one layer, counting mod 5 and S3 also at two; the tasks differ
    only in vocabulary, so two cells, each naming the sweeps it stands for (a brute-force grouping of the
    preset's whole grid gives the same)."""
    from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep

    cells = representative_cells("state-tracking", None, ["gru"], "cpu")
    assert [(c.spec.model.mixer, c.spec.model.layers) for c in cells] == [("gru", 1), ("gru", 2)]
    groups: dict[int, set[str]] = {}
    for entry in load_preset("state-tracking")["tasks"]:
        for spec in build_specs(resolve_sweep(entry, "state-tracking"), "cpu"):
            if spec.model.mixer == "gru":
                groups.setdefault(spec.model.layers, set()).add(entry)
    assert {c.spec.model.layers: set(c.entries) for c in cells} == groups
    # every trial of the shape is counted, by its budget: the brute-force grid's count per depth and budget
    budgets: dict[int, dict] = {}
    for entry in load_preset("state-tracking")["tasks"]:
        for spec in build_specs(resolve_sweep(entry, "state-tracking"), "cpu"):
            if spec.model.mixer == "gru":
                key = (spec.train.max_steps, spec.train.eval_every)
                budgets.setdefault(spec.model.layers, {}).setdefault(key, 0)
                budgets[spec.model.layers][key] += 1
    assert {c.spec.model.layers: c.trials for c in cells} == budgets
    assert len({shape_key(c.spec) for c in representative_cells("grazzi-table3", device="cpu")}) == 14


def test_representative_cells_refuse_an_unknown_sweep():
    with pytest.raises(ValueError, match="no sweep nope"):
        representative_cells("state-tracking", ["nope"], None, "cpu")


def test_phase_projection_to_a_full_trial():
    """10 steps of 1 ms after a 5-step warm-up with 20 ms of host time between them, 2 validations of 0.5 s,
    3 s of tests, 1.5 s of other host work: a 1,000-step trial validating every 100 steps has 995 steps with
    1.99 s of host time, 10 validations, and the 1.5 s once."""
    p = Phases(
        setup_s=2.0,
        warmup_s=4.0,
        warmup_steps=5,
        train_s=0.01,
        host_s=0.02,
        steps=10,
        validation_s=1.0,
        validations=2,
        test_s=3.0,
        other_s=1.5,
    )
    assert p.steps_per_s == pytest.approx(1000.0)
    seconds = p.project(1000, 100)
    assert seconds == pytest.approx(
        {
            "setup": 2.0,
            "warmup": 4.0,
            "stall": 0.0,
            "train": 0.995,
            "host": 1.99,
            "validation": 5.0,
            "test": 3.0,
            "other": 1.5,
            "total": 18.485,
        }
    )
    shares = p.shares(1000, 100)
    assert list(shares) == list(PHASES) and sum(shares.values()) == pytest.approx(1.0)


def _projection_row(steps_per_s, trials, together=None, **extra):
    """A cell's row: 100 steps of ``1 / steps_per_s`` s each after no warm-up, 1 s of set-up, no validation."""
    phases = Phases(
        setup_s=1.0, warmup_s=0.0, warmup_steps=0, train_s=100 / steps_per_s, steps=100,
        validation_s=0.0, validations=0, test_s=0.0, other_s=0.0,
    )  # fmt: skip
    row = {"steps_per_s": steps_per_s, "phases": dataclasses.asdict(phases), "trials": trials, **extra}
    return row if together is None else {**row, "with_workers_steps_per_s": together}


def test_preset_projection_shares_the_trials_over_the_workers():
    """Cell a: 3 trials of 1,000 steps at 100 steps/s alone, 50 with the workers (each 2 x 11 s = 22 s); cell b:
    1 trial of 2,000 steps at 200 alone, 100 together (2 x 11 s = 22 s): 88 s over 2 workers is 44 s. One worker's
    rates missing: trial after trial at the rates alone (3 x 11 + 11 = 44 s). A cell that did not run: its trials
    are counted apart."""
    a = _projection_row(100.0, [[1000, 500, 3]], 50.0)
    b = _projection_row(200.0, [[2000, 500, 1]], 100.0)
    p = preset_projection([a, b], 2)
    assert (p["trials"], p["steps"], p["workers"], p["unmeasured_trials"]) == (4, 5000, 2, 0)
    assert p["wall_s"] == pytest.approx(44.0) and p["longest_trial_s"] == pytest.approx(22.0)
    assert preset_projection([a, b], 8)["wall_s"] == pytest.approx(22.0)  # no less than the longest trial
    serial = preset_projection([a, _projection_row(200.0, [[2000, 500, 1]])], 2)
    assert (serial["workers"], serial["wall_s"]) == (1, pytest.approx(44.0))
    failed = {"error": "RuntimeError: x", "trials": [[10, 5, 7]]}
    assert preset_projection([a, failed], 0)["unmeasured_trials"] == 7
    assert preset_projection([{k: v for k, v in a.items() if k != "trials"}], 2) is None


def test_worker_waves_cover_every_cell_and_fill_the_last_wave():
    assert worker_waves(list("abcde"), 2) == [[(0, 0), (1, 0)], [(2, 0), (3, 0)], [(4, 0), (0, 1)]]
    assert worker_waves(list("ab"), 5) == [[(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]]
    assert worker_waves([], 3) == []


def test_worker_steps_size_a_trial_for_its_share_of_the_gpu():
    assert worker_steps(1000.0, 20.0, 16) == 7500  # 1000 * 6/16 steps/s for 20 s
    assert worker_steps(1000.0, 20.0, 2) == 20000  # two workers: each at most its own rate
    assert worker_steps(1.0, 1.0, 16) == 50 and worker_steps(float("nan"), 20.0, 16) == 50


def test_merged_reports_replace_presets_and_keep_the_others():
    a, b = {"device": "NVIDIA H200", "command": "a"}, {"device": "NVIDIA H200", "command": "b"}
    first = merged(None, a, {"p": {"cells": [1]}, "q": {"cells": [2]}})
    both = merged(first, b, {"q": {"cells": [3]}, "r": {"cells": [4]}})
    assert both["runs"] == [a, b]
    assert {k: (v["cells"], v["run"]) for k, v in both["presets"].items()} == {
        "p": ([1], 0),
        "q": ([3], 1),
        "r": ([4], 1),
    }
    assert merged(both, a, {"p": {"cells": [5]}})["runs"] == [b, a]  # run 0 no longer used: dropped
    with pytest.raises(ValueError, match="measured on NVIDIA H200"):
        merged(first, {"device": "cpu"}, {})


def test_quick_report_of_one_cell(tmp_path, capsys):
    """--quick: one cell alone on the CPU, the report and its JSON; the rates agree with the phases; --merge adds
    another preset's section without dropping the first."""
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "transformer", "--out", str(out), "--steps", "8"]
    assert main(["state-tracking", *args]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["presets"]["state-tracking"]["cells"]
    assert [(r["mixer"], r["layers"]) for r in rows] == [("transformer", 1), ("transformer", 2)]
    r = rows[0]
    assert r["engine"] == "eager" and r["phases"]["steps"] == 7 and r["phases"]["validations"] == 2  # every 4 steps
    assert r["steps_per_s"] == pytest.approx(r["phases"]["steps"] / r["phases"]["train_s"])
    assert r["flops"] > 0 and r["batch"] == 8 and r["padded_len"] == 40
    text = out.read_text()
    assert "## state-tracking" in text and "device: cpu (no known peak: MFU n/a)" in text
    trials = sum(n for row in rows for *_, n in row["trials"])
    assert trials > len(rows) and f"Projected wall time of the trials of sweeps s3: {trials} trials" in text
    assert "trial after trial on one process" in text
    assert "| s3 | transformer | 2 |" in text
    merge = ["--quick", "--tasks", "parity", "--mixers", "transformer", "--out", str(out), "--steps", "4", "--merge"]
    assert main(["grazzi-table3", *merge]) == 0
    text = out.read_text()
    assert "## state-tracking" in text and "## grazzi-table3" in text and "run 2: grazzi-table3" in text


def test_quick_report_with_length_bucketing_shows_less_padding(tmp_path):
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "gru", "--out", str(out), "--length-bucketing", "4"]
    assert main(["state-tracking", *args]) == 0
    r = json.loads(out.with_suffix(".json").read_text())["presets"]["state-tracking (length pools of 4)"]["cells"][0]
    assert r["engine"] == "eager" and r["real_len"] <= r["padded_len"] < 40
    assert "length-bucketed batches (pools of 4)" in out.read_text()
    assert report_name("p", 2048, 8) == "p (batch 2048, length pools of 8)" and report_name("p", None) == "p"
    assert report_name("p", None, 0, "bf16-mixed") == "p (bf16-mixed)"


def test_quick_report_with_another_batch_size_sits_beside_the_presets_own(tmp_path):
    """``--batch-size``: every cell trains on batches of that size; the report names the preset with it, so a
    ``--merge`` keeps the preset's own rows."""
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "gru", "--out", str(out), "--steps", "4"]
    assert main(["state-tracking", *args]) == 0
    assert main(["state-tracking", *args, "--batch-size", "3", "--merge"]) == 0
    presets = json.loads(out.with_suffix(".json").read_text())["presets"]
    assert {r["batch"] for r in presets["state-tracking"]["cells"]} == {8}
    assert {r["batch"] for r in presets["state-tracking (batch 3)"]["cells"]} == {3}
    text = out.read_text()
    assert "## state-tracking (batch 3)" in text and "run 2: state-tracking (batch 3)" in text
    assert "batches of 3 sequences" in text


def test_bad_input_is_one_line_of_error(tmp_path, capsys):
    assert main(["no-such-preset", "--quick", "--out", str(tmp_path / "m.md")]) == 2
    assert "unknown preset(s) no-such-preset" in capsys.readouterr().err
    assert main(["state-tracking", "--quick", "--tasks", "s9", "--out", str(tmp_path / "m.md")]) == 2
    assert "has no sweep s9" in capsys.readouterr().err
    assert not (tmp_path / "m.md").exists()


@pytest.mark.slow
def test_quick_workers_report_their_tokens_together(tmp_path):
    """Two cells on two CPU worker processes: both trained in a shared window; the padded tokens per step are
    the batch times 40 and the real ones the batch times the mean length, so their rates' ratio is the
    cells' real share."""
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "gru", "--workers", "2", "--out", str(out)]
    assert main(["state-tracking", *args, "--scratch", str(tmp_path / "scratch")]) == 0
    data = json.loads(out.with_suffix(".json").read_text())["presets"]["state-tracking"]
    together, rows = data["together"], data["cells"]
    assert together["window_s"] > 0 and len(together["waves"]) == 1
    assert all(r["with_workers_steps_per_s"] > 0 for r in rows)
    share = together["real_tokens_per_s"] / together["padded_tokens_per_s"]
    assert min(r["real_len"] / 40 for r in rows) - 1e-9 <= share <= max(r["real_len"] / 40 for r in rows) + 1e-9
    assert not math.isnan(together["flops_per_s"]) and together["flops_per_s"] > 0
    # end to end counts worker start-up and the test passes too: fewer tokens per second than in the window
    assert 0 < together["end_to_end_real_tokens_per_s"] < together["real_tokens_per_s"]
    assert "End to end (worker start-up" in out.read_text()


def test_a_stalled_batch_is_counted_once_not_in_the_step_rate():
    """Nine 1 ms batches of one step and one of 13 s (a kernel autotuned mid-trial): the rate is 1,000 steps/s,
    the stall 13 s less one step's 1 ms, once in the projection; jitter under 5x the median is not a stall."""
    from benchmarks.training.phases import PhaseTimer, split_stalls

    timer = PhaseTimer()
    timer.batches = [(2.0, 1)] + [(0.001, 1)] * 4 + [(13.0, 1)] + [(0.001, 1)] * 5
    p = timer.phases(wall_s=16.0, setup_s=0.5)
    assert (p.stalls, p.steps) == (1, 10)
    assert p.stall_s == pytest.approx(12.999) and p.steps_per_s == pytest.approx(1000.0)
    seconds = p.project(1001, 1001)
    assert seconds["stall"] == pytest.approx(12.999) and seconds["train"] == pytest.approx(1.0)
    assert split_stalls([(0.001, 1), (0.004, 1), (0.001, 1), (0.003, 2)]) == (0.0, 0)
    assert split_stalls([]) == (0.0, 0)


def test_a_first_validation_that_compiles_is_a_stall():
    """Validations of 6 s (kernels autotuned for the evaluation's lengths), then 0.1 s and 0.12 s: 5.9 s of stall,
    0.11 s per validation; validations within 5x of each other are all validation time."""
    from benchmarks.training.phases import PhaseTimer

    timer = PhaseTimer()
    timer.batches = [(2.0, 1)] + [(0.001, 1)] * 10
    timer.validations = [6.0, 0.1, 0.12]
    p = timer.phases(wall_s=20.0, setup_s=0.5)
    assert (p.stalls, p.stall_s) == (1, pytest.approx(5.89)) and p.validation_s == pytest.approx(0.33)
    timer.validations = [0.4, 0.1, 0.12]
    p = timer.phases(wall_s=20.0, setup_s=0.5)
    assert (p.stalls, p.stall_s, p.validation_s) == (0, 0.0, pytest.approx(0.62))


def test_step_flops_count_a_newton_mixer_as_it_trains():
    """FlashGRU's first training forward runs its Jacobian check (vmap + jacrev), which cannot run under the
    FLOP counter's dispatch mode and switched the counted model to the sequential loop with a warning: the
    count runs without the check and warns of nothing. Model FLOPs are matrix products, which the solve
    (Newton or the loop) does not change: the count equals the sequential mode's."""
    import warnings

    cell = next(c for c in representative_cells("pararnn-table6", ["parity"], ["flashgru"], "cpu"))
    spec = dataclasses.replace(cell.spec, train=dataclasses.replace(cell.spec.train, batch_size=8, train_size=64))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        newton = step_flops(spec, "cpu", sample=64)
    model = dataclasses.replace(spec.model, mixer_options={**spec.model.mixer_options, "mode": "sequential"})
    sequential = step_flops(dataclasses.replace(spec, model=model), "cpu", sample=64)
    assert newton["flops"] == sequential["flops"] > 0


def test_quick_report_in_another_precision_sits_beside_the_presets_own(tmp_path):
    """``--precision bf16-mixed``: every cell trains in it (the rows say so), reported as ``PRESET (bf16-mixed)``
    beside the preset's own float32 rows."""
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "gru", "--out", str(out), "--steps", "4"]
    assert main(["state-tracking", *args]) == 0
    assert main(["state-tracking", *args, "--precision", "bf16-mixed", "--merge"]) == 0
    presets = json.loads(out.with_suffix(".json").read_text())["presets"]
    assert {r["precision"] for r in presets["state-tracking"]["cells"]} == {"32-true"}
    assert {r["precision"] for r in presets["state-tracking (bf16-mixed)"]["cells"]} == {"bf16-mixed"}
    assert all("error" not in r for r in presets["state-tracking (bf16-mixed)"]["cells"])
    assert "every model in bf16-mixed" in out.read_text()


def test_the_timer_puts_the_loops_host_time_per_step_and_around_validations(monkeypatch):
    """A fake clock through the hooks: batches of 1 s with 0.1 s between them, a validation of 2 s with 0.3 s
    before and 0.5 s after it (a checkpoint, a Jacobian check): host 0.1 s per gap, the validation's 2.8 s with
    the validation; the rest of the wall time is ``other``, once."""
    import types

    from benchmarks.training import phases as ph

    now = [0.0]
    monkeypatch.setattr(ph, "_sync", lambda pl_module: now[0])
    timer = ph.PhaseTimer()
    trainer = types.SimpleNamespace(global_step=0, sanity_checking=False)

    def batch(seconds: float, gap: float) -> None:
        now[0] += gap
        timer.on_train_batch_start(trainer, None, None, 0)
        now[0] += seconds
        trainer.global_step += 1
        timer.on_train_batch_end(trainer, None, None, None, 0)

    batch(5.0, 0.0)  # the first batch: warm-up
    for _ in range(3):
        batch(1.0, 0.1)
    now[0] += 0.3
    timer.on_validation_start(trainer, None)
    now[0] += 2.0
    timer.on_validation_end(trainer, None)
    batch(1.0, 0.5)
    timer.on_train_end(trainer, None)
    now[0] += 4.0  # tear-down
    p = timer.phases(wall_s=now[0] + 1.0, setup_s=1.0)
    assert (p.steps, p.train_s, p.validations) == (4, pytest.approx(4.0), 1)
    assert p.host_s == pytest.approx(0.3) and p.validation_s == pytest.approx(2.8)
    assert p.other_s == pytest.approx(4.0)
    seconds = p.project(max_steps=101, eval_every=50)
    assert seconds["host"] == pytest.approx(0.3 / 4 * 100) and seconds["validation"] == pytest.approx(2 * 2.8)
    assert seconds["other"] == pytest.approx(4.0)


def test_a_run_cut_while_the_workers_train_keeps_the_cells_rows(tmp_path, monkeypatch):
    """The report is written once a preset's cells are measured, before its workers start: a run cut during
    the workers' run (here: they raise KeyboardInterrupt) leaves the cells' rows and says the workers'
    run did not finish."""
    from benchmarks.training import mfu

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mfu, "measure_workers", cut)
    out = tmp_path / "mfu.md"
    args = ["--quick", "--tasks", "s3", "--mixers", "gru", "--workers", "2", "--out", str(out)]
    assert main(["state-tracking", *args, "--scratch", str(tmp_path / "scratch")]) != 0
    data = json.loads(out.with_suffix(".json").read_text())["presets"]["state-tracking"]
    assert data["together"] == mfu.WORKERS_UNFINISHED and data["cells"][0]["steps_per_s"] > 0
    assert "workers' run failed: not finished" in out.read_text()
