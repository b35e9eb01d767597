"""analysis.recall_answers: the split of MQAR query answers, by hand and on a trained trial."""

import pytest
import torch

from analysis.recall_answers import answer_split, main
from experiments.trial.shape import ModelShape
from experiments.trial.train import RunOptions, TrainConfig, TrialSpec, quiet_lightning, run_trial
from tasks import get_task


def test_answer_split_on_a_hand_made_batch():
    # context k1=1 v1=9, k2=2 v2=8; queries at 4 (asks k1), 5 (k2), 6 (k1); -100 elsewhere
    inputs = torch.tensor([[1, 9, 2, 8, 1, 2, 1, 0]])
    targets = torch.tensor([[-100, -100, -100, -100, 9, 8, 9, -100]])
    predictions = torch.tensor([[0, 0, 0, 0, 9, 9, 5, 3]])  # right, the other pair's value, neither
    split = answer_split(inputs, targets, predictions, num_pairs=2)
    assert split["queries"] == 3
    assert split["right"] == pytest.approx(1 / 3) and split["other_pair"] == pytest.approx(1 / 3)
    assert split["neither"] == pytest.approx(1 / 3)
    assert split["right_by_pair"] == [pytest.approx(0.5), pytest.approx(0.0)]


def test_answer_split_counts_like_a_loop_on_random_predictions():
    task = get_task("mqar", seq_len=24, vocab_size=16, num_kv_pairs=3)
    data = task.generate(50, seed=3)
    predictions = torch.randint(0, 16, data.targets.shape, generator=torch.Generator().manual_seed(4))
    counts = {"right": 0, "other_pair": 0, "neither": 0}
    for x, y, p in zip(data.inputs.tolist(), data.targets.tolist(), predictions.tolist()):
        values = x[1:6:2]
        for t in range(len(x)):
            if y[t] >= 0:
                counts["right" if p[t] == y[t] else "other_pair" if p[t] in values else "neither"] += 1
    split = answer_split(data.inputs, data.targets, predictions, num_pairs=3)
    n = sum(counts.values())
    assert split["queries"] == n and all(split[k] == pytest.approx(v / n) for k, v in counts.items())


def test_cli_reads_a_trained_trial_and_refuses_other_folders(tmp_path, capsys):
    quiet_lightning()
    spec = TrialSpec(
        task="mqar",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 16, "vocab_size": 16},
        train=TrainConfig(max_steps=20, eval_every=10, batch_size=8, train_size=64, val_size=16, test_size=16),
    )
    run_trial(spec, tmp_path / "trial", options=RunOptions(logger="none"))
    df = main([str(tmp_path / "trial"), "--sequences", "40"])
    row = df.iloc[0]
    assert row["mixer"] == "gru" and row["queries"] > 0
    assert row["right"] + row["other_pair"] + row["neither"] == pytest.approx(1.0)
    assert "| trial" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a finished trial folder"):
        main([str(tmp_path)])
