"""Training actually learns: a GRU solves short parity (with length extrapolation) on the CPU."""

import math

import pytest

from experiments.lit import cosine_with_warmup
from experiments.train import TrainConfig, TrialSpec, quiet_lightning, run_trial


def test_cosine_with_warmup():
    assert cosine_with_warmup(0, 10, 100) == pytest.approx(0.1)
    assert cosine_with_warmup(9, 10, 100) == pytest.approx(1.0)
    assert cosine_with_warmup(55, 10, 100) == pytest.approx(0.5)
    assert cosine_with_warmup(100, 10, 100) == pytest.approx(0.0, abs=1e-12)
    assert not math.isnan(cosine_with_warmup(5, 10, 10))


@pytest.mark.slow
def test_gru_learns_short_parity_and_extrapolates(tmp_path):
    quiet_lightning()
    spec = TrialSpec(
        task="parity", mixer="gru", lr=3e-3, seed=0, mixer_options={"num_heads": 4},
        extrapolation={"min_len": 3, "max_len": 16, "eval_lengths": [16, 32]},
        train=TrainConfig(max_steps=1200, batch_size=32, train_size=3000, val_size=300, test_size=1000, eval_every=100),
    )
    result = run_trial(spec, tmp_path)
    assert result["test/acc"] >= 0.99, result
    assert result["len32/acc"] >= 0.95, result  # twice the longest training length
    assert result["stopped_early"], "early stopping at val acc > 0.999 should end the run before max_steps"
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "metrics.csv").is_file()


def test_transformer_cannot_learn_parity_quickly():
    """The counterpart: attention stays near chance on the same budget (a sanity check of the task)."""
    quiet_lightning()
    spec = TrialSpec(
        task="parity", mixer="transformer", lr=3e-3, seed=0,
        extrapolation={"min_len": 3, "max_len": 16, "eval_lengths": [32]},
        train=TrainConfig(max_steps=150, batch_size=32, train_size=1000, val_size=200, test_size=500, eval_every=50),
    )
    assert run_trial(spec)["len32/acc"] < 0.7


@pytest.mark.parametrize("with_out_dir", [True, False])
def test_trial_survives_its_working_directory_being_deleted(tmp_path, monkeypatch, with_out_dir):
    """A worker whose cwd was removed under it (e.g. a re-synced code folder) still trains and writes
    its results: nothing in a trial resolves the working directory."""
    quiet_lightning()
    gone = tmp_path / "cwd"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    spec = TrialSpec(task="parity", mixer="gru", lr=3e-3, seed=0, task_options={"seq_len": 8},
                     train=TrainConfig(max_steps=20, batch_size=8, train_size=64, val_size=32, test_size=32, eval_every=10))
    result = run_trial(spec, tmp_path / "trial" if with_out_dir else None)
    assert result["steps"] == 20
    assert not with_out_dir or (tmp_path / "trial" / "metrics.csv").is_file()
