"""What a sweep says while it runs: the whole status on a narrow terminal, the sweep's time left, and a
word when the GPU-sized default preset is about to run on a CPU."""

import io
import logging

import pandas as pd
import pytest
from rich.console import Console

from experiments import sweep
from experiments.sweeps.runner import Progress, sweep_eta
from experiments.trial.running import TrialProgress, append_sample, steps_left


def test_the_status_is_not_cut_at_80_columns():
    words = [f"trial{i}: step {100 * i}/1500, val 6{i}.0%, 9 steps/s, ~{i}0 s left" for i in range(4)]
    buffer = io.StringIO()
    with Progress("parity sweep", 11, console=Console(file=buffer, force_terminal=True, width=80)) as bar:
        bar.running("; ".join(words))
    text = " ".join(buffer.getvalue().split())
    for w in words:
        assert " ".join(w.split()) in text.replace("\x1b", " "), buffer.getvalue()


def test_the_sweep_eta_counts_every_unfinished_cell(tmp_path):
    done, running, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (done, running):
        folder.mkdir()
    append_sample(done / "progress.csv", 1.0, 500, 0.99)
    append_sample(done / "progress.csv", 2.0, 650, 1.0, phase="end")  # early stop: nothing left
    append_sample(running / "progress.csv", 1.0, 100, None)
    append_sample(running / "progress.csv", 9.0, 340, 0.6)
    cells = [(done, "a", 1000), (running, "b", 1000), (fresh, "c", 1500)]
    assert [steps_left(f, n) for f, _, n in cells] == [0, 660, 1500]
    trials = [TrialProgress("b", 340, 1000, 0.6, 30.0), TrialProgress("x", 10, 50, None, float("nan"))]
    assert sweep_eta(cells, trials) == "; sweep: at most ~72 s left (2 running)"  # 2160 steps at 30 steps/s
    assert sweep_eta(cells, trials[1:]) == ""


@pytest.mark.parametrize("preset,warned", [(None, True), ("smoke", False)])
def test_no_preset_on_a_cpu_says_so(tmp_path, monkeypatch, caplog, preset, warned):
    def no_training(plan, out, *args, **kwargs):
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text("")
        return pd.DataFrame()

    monkeypatch.setattr(sweep, "run_sweep", no_training)
    argv = ["parity", "--mixers", "gru", "--device", "cpu", "--out", str(tmp_path / "out")]
    with caplog.at_level(logging.WARNING, logger="experiments"):
        assert sweep.main(argv + (["--preset", preset] if preset else [])) == 0
    said = [r.getMessage() for r in caplog.records if "no --preset" in r.getMessage()]
    if warned:
        plan = sweep.resolve_sweep("parity", "default", {"mixers": ["gru"]})
        cells = len(plan.layers) * len(plan.seeds) * len(plan.lrs)
        assert said == [
            f"no --preset: running the 'default' preset, the paper's setup for a GPU, on the CPU: {cells} cells "
            f"of up to {plan.train.max_steps:,} steps each (hours to days); for minutes on a CPU: --preset smoke"
        ]
    else:
        assert said == []


def test_the_bf16_rms_norm_notice_is_muted_and_its_fallback_computes_the_same():
    import warnings

    import torch
    import torch.nn.functional as F

    from experiments.trial.train import quiet_lightning

    x, w = torch.randn(3, 7, 24).to(torch.bfloat16), torch.randn(24) * 0.5 + 1.0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_lightning()
        out = F.rms_norm(x, (24,), w, 1e-5)
    assert not [w for w in seen if "Mismatch dtype" in str(w.message)]
    ref = x.double() / x.double().pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * w.double()
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)  # bfloat16 rounding of the result


def test_a_long_model_check_says_what_it_is_doing(caplog):
    import time

    from experiments.sweeps.runner import _still_checking

    with caplog.at_level(logging.INFO, logger="experiments"), _still_checking("model 2/7 (deltanet)", every=0.05):
        time.sleep(0.3)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checking model 2/7 (deltanet): ")]
    assert len(said) >= 2 and "compiling its Triton kernels" in said[0]
