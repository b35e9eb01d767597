"""Every axis that varies in a results file (depth, width, precision, options) is a column of table.md:
cells that differ in it are never merged into one row."""

import random

import pandas as pd
import pytest

from experiments.sweeps.results import model_labels, summarize, table_frame, varying_axes


def _row(mixer, seed, lr, val, test, **axes):
    return {
        "entry": "parity",
        "task": "parity",
        "mixer": mixer,
        "seed": seed,
        "lr": lr,
        "status": "ok",
        "best_val_acc": val,
        "test/acc": test,
        "n_params": 1000,
        "layers": 1,
        "d_model": 64,
        "precision": "32-true",
        "mixer_config": "{}",
        **axes,
    }


def test_cells_that_differ_in_precision_width_or_options_get_rows_of_their_own():
    rng = random.Random(7)
    rows, expected = [], {}
    variants = [
        {"precision": "32-true"},
        {"precision": "bf16-mixed"},
        {"d_model": 128},
        {"mixer_config": '{"num_heads": 2}'},
        {"layers": 2},
    ]
    for i, axes in enumerate(variants):
        tests = []
        for seed in range(3):
            # per seed two lrs: the one with the better validation accuracy decides the test accuracy
            vals, accs = [rng.random() for _ in range(2)], [rng.random() for _ in range(2)]
            rows += [_row("signed_deltanet", seed, lr, v, a, **axes) for lr, v, a in zip((1e-3, 1e-2), vals, accs)]
            tests.append(accs[vals.index(max(vals))])
        expected[i] = max(tests)
    df = pd.DataFrame(rows).sample(frac=1, random_state=3)  # row order does not matter
    assert varying_axes(df) == ["layers", "d_model", "precision", "mixer_config"]
    summary = summarize(df)
    assert len(summary) == len(variants)
    for i, axes in enumerate(variants):
        full = {"layers": 1, "d_model": 64, "precision": "32-true", "mixer_config": "{}", **axes}
        match = summary
        for col, value in full.items():
            match = match[match[col] == value]
        assert len(match) == 1 and match["test/acc best"].iloc[0] == expected[i], axes
    table = table_frame(df)
    assert {"layers", "width", "precision", "mixer options"} <= set(table.columns)
    assert sorted(table["precision"]) == ["32-true"] * 4 + ["bf16-mixed"]
    assert "num_heads=2" in set(table["mixer options"]) and "d=128" in set(table["width"])
    labels = set(model_labels(df))
    assert "signed_deltanet, d=64, bf16-mixed, defaults" in labels and len(labels) == len(variants)


def test_an_axis_that_differs_only_between_mixers_is_no_column():
    df = pd.DataFrame(
        [_row("gru", 0, 1e-3, 0.9, 0.9, mixer_config='{"num_heads": 1}'), _row("lstm", 0, 1e-3, 0.8, 0.7)]
    )
    assert varying_axes(df) == ["layers"]
    assert list(table_frame(df).columns[:4]) == ["task", "mixer", "layers", "params"]


def test_a_model_collapsed_to_a_constant_is_flagged():
    rows = [
        {**_row("gated_deltanet", seed, 1e-3, 0.5, 0.52), "test/top_pred": top}
        for seed, top in enumerate((1.0, 0.9995, 0.71))
    ] + [{**_row("gru", 0, 1e-3, 1.0, 1.0), "test/top_pred": 0.5}]
    table = table_frame(pd.DataFrame(rows)).set_index("mixer")
    assert table.loc["gated_deltanet", "constant output"] == "2/3" and table.loc["gru", "constant output"] == ""
    from experiments.sweeps.results import table_markdown

    assert "`constant output`: seeds whose model predicts one class" in table_markdown(pd.DataFrame(rows))


def test_the_top_prediction_share_counts_scored_positions():
    import torch

    from experiments.trial.lit import TopPredictionShare
    from tasks import IGNORE_INDEX

    g = torch.Generator().manual_seed(5)
    metric = TopPredictionShare(7)
    counts = [0] * 7
    for n in (3, 11):
        preds = torch.randint(0, 7, (n, 13), generator=g)
        targets = torch.randint(0, 7, (n, 13), generator=g)
        targets[torch.rand(n, 13, generator=g) < 0.4] = IGNORE_INDEX
        metric.update(preds, targets)
        for p, t in zip(preds.flatten().tolist(), targets.flatten().tolist()):  # by hand
            counts[p] += t != IGNORE_INDEX
    assert float(metric.compute()) == pytest.approx(max(counts) / sum(counts), rel=1e-6)
    constant = TopPredictionShare(3)
    constant.update(torch.full((4, 5), 2), torch.zeros(4, 5, dtype=torch.long))
    assert float(constant.compute()) == 1.0
