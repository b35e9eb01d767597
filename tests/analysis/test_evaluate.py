"""``analysis.evaluate``: a trained trial re-tested from its folder gives back the trial's own test
accuracies (the same test sets rebuilt from spec.json), in each precision asked for."""

from __future__ import annotations

import pytest

from analysis.evaluate import evaluate_trial, main
from experiments.trial.shape import ModelShape
from experiments.trial.train import TrainConfig, TrialSpec, run_trial


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    out = tmp_path_factory.mktemp("trial")
    spec = TrialSpec(
        task="modular_arithmetic",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=3,
        task_options={"modulus": 5},
        extrapolation={"min_len": 3, "max_len": 11, "eval_lengths": [13, 21], "test_range": [11, 25]},
        train=TrainConfig(
            max_steps=60, batch_size=16, train_size=400, val_size=64, test_size=97, eval_every=30, early_stop_acc=1.0
        ),
    )
    return out, run_trial(spec, out)


def test_last_checkpoint_reproduces_the_trials_final_accuracies(trial):
    out, result = trial
    df = evaluate_trial(out, ["32-true", "bf16-true"], "last")
    full = df[df["precision"] == "32-true"].set_index("test_set")
    assert set(full.index) >= {"test", "len13", "len21", "range11-25"} and set(df["step"]) == {60}
    for name in ("test", "len13", "len21", "range11-25"):
        assert full.loc[name, "acc"] == pytest.approx(result[f"final/{name}/acc"], abs=1e-6)
        assert full.loc[name, "scaled_acc"] == pytest.approx((result[f"final/{name}/acc"] - 0.2) / 0.8, abs=1e-6)
    half = df[df["precision"] == "bf16-true"].set_index("test_set")
    assert ((half["acc"] - full["acc"]).abs() < 0.2).all()  # another precision, the same model
    best = evaluate_trial(out, ["32-true"], "best").set_index("test_set")
    assert best.loc["len21", "acc"] == pytest.approx(result["len21/acc"], abs=1e-6)


def test_bad_input_is_one_line(tmp_path, capsys, trial):
    assert main([str(tmp_path)]) == 2
    assert "no spec.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(trial[0]), "--precision", "fp8"])
    assert "unknown precision 'fp8'" in capsys.readouterr().err
