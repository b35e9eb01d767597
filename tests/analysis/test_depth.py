"""analysis.depth on a synthetic results.csv: the minimum depths are the hand-computed ones."""

import math

import pandas as pd
import pytest

from analysis.cli import run
from analysis.depth import best_values, main, metric_columns, min_depth_table
from analysis.tables import load_results

NAN = math.nan


def _row(entry, mixer, layers, seed, lr, val, exact, status="ok"):
    """``exact``: {length: value}."""
    row = {
        "entry": entry,
        "task": "word_problem",
        "task_config": f'{{"group": "{entry}"}}',
        "mixer": mixer,
        "layers": layers,
        "seed": seed,
        "lr": lr,
        "status": status,
        "best_val_acc": val if status == "ok" else NAN,
        "n_params": 1000,
    }
    for length, value in exact.items():
        row[f"len{length}/exact"] = value
        row[f"len{length}/acc"] = 1.0  # another metric: never read with the default template
    return row


ROWS = [
    # transformer on A5: depth 1 solves length 4 only; depth 2 solves 8 (seed 1) ; nothing solves 16
    _row("A5", "transformer", 1, 0, 1e-3, 0.8, {4: 0.95, 8: 0.50, 16: 0.10}),
    _row("A5", "transformer", 2, 0, 1e-3, 0.8, {4: 0.99, 8: 0.30, 16: 0.20}),
    _row("A5", "transformer", 2, 1, 1e-3, 0.9, {4: 0.99, 8: 0.92, 16: 0.40}),
    # seed 1's other lr scores 0.97 at length 16 but has the worse validation accuracy: --lr val ignores it
    _row("A5", "transformer", 2, 1, 1e-2, 0.5, {4: 0.99, 8: 0.60, 16: 0.97}),
    _row("A5", "transformer", 3, 0, 1e-3, 0.8, {4: 1.00, 8: 0.95, 16: 0.85}),
    # a failed depth-1 trial with perfect numbers: never counted
    _row("A5", "transformer", 1, 1, 1e-3, NAN, {4: 1.0, 8: 1.0, 16: 1.0}, status="failed"),
    # gru on A5: depth 1 solves every length; threshold is inclusive (0.9 exactly)
    _row("A5", "gru", 1, 0, 1e-3, 0.99, {4: 1.00, 8: 0.90, 16: 0.95}),
    # Z60: transformer solves all lengths at depth 1 and 2 -> 1; gru evaluated at 4 and 8 only (16 NaN)
    _row("Z60", "transformer", 1, 0, 1e-3, 0.9, {4: 0.91, 8: 0.93, 16: 0.90}),
    _row("Z60", "transformer", 2, 0, 1e-3, 0.9, {4: 0.99, 8: 0.99, 16: 0.99}),
    _row("Z60", "gru", 1, 0, 1e-3, 0.9, {4: 0.99, 8: 0.20, 16: NAN}),
    _row("Z60", "gru", 4, 0, 1e-3, 0.9, {4: 0.99, 8: 0.95, 16: NAN}),
]


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "results.csv"
    pd.DataFrame(ROWS).to_csv(path, index=False)
    return path


def _depths(table):
    return {(r.group, r.mixer, r.length): (None if not r.reached else int(r.min_layers)) for r in table.itertuples()}


def test_minimum_depth_matches_hand_computation(results):
    table = min_depth_table(best_values(load_results([results])), threshold=0.9)
    assert _depths(table) == {
        ("A5", "transformer", 4): 1,
        ("A5", "transformer", 8): 2,
        ("A5", "transformer", 16): None,
        ("A5", "gru", 4): 1,
        ("A5", "gru", 8): 1,
        ("A5", "gru", 16): 1,
        ("Z60", "transformer", 4): 1,
        ("Z60", "transformer", 8): 1,
        ("Z60", "transformer", 16): 1,
        ("Z60", "gru", 4): 1,
        ("Z60", "gru", 8): 4,  # no length-16 point: gru was not evaluated there
    }
    a5_16 = table[(table["group"] == "A5") & (table["mixer"] == "transformer") & (table["length"] == 16)].iloc[0]
    assert a5_16["best_value"] == pytest.approx(0.85) and a5_16["layers_tried"] == "1,2,3" and a5_16["max_layers"] == 3
    a5_8 = table[(table["group"] == "A5") & (table["mixer"] == "transformer") & (table["length"] == 8)].iloc[0]
    assert a5_8["value_at_min"] == pytest.approx(0.92)


def test_sweeps_per_training_length_form_one_group(tmp_path):
    """One sweep per training length (``a5_4``, ``a5_8``: the same task options, other lengths) is one
    group ``a5``, each length read from its own sweep; another group's single sweep keeps its name."""

    def row(entry, group, length, layers, value, val=0.9, lr=1e-3):
        extrapolation = f'{{"min_len": 2, "max_len": {length}, "eval_lengths": [{length}]}}'
        out = _row(entry, "lstm", layers, 0, lr, val, {length: value})
        return {**out, "task_config": f'{{"group": "{group}"}}', "extrapolation": extrapolation}

    rows = [
        row("a5_4", "A5", 4, 1, 0.99, val=0.6),
        # the same (group, mixer, depth, seed) in another sweep, with a better validation accuracy: each
        # sweep's lr is chosen within it, so neither hides the other's length
        row("a5_8", "A5", 8, 1, 0.40, val=0.8),
        row("a5_8", "A5", 8, 2, 0.95),
        # within one sweep the lr with the better validation accuracy is read, not the better value
        row("a5_8", "A5", 8, 2, 0.10, val=0.95, lr=1e-2),
        row("z60_8", "Z60", 8, 1, 0.97),
    ]
    path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    table = min_depth_table(best_values(load_results([path])), threshold=0.9)
    assert _depths(table) == {("a5", "lstm", 4): 1, ("a5", "lstm", 8): None, ("z60_8", "lstm", 8): 1}
    assert table.loc[table["length"] == 8, "layers_tried"].iloc[0] == "1,2"


def test_lr_max_and_threshold(results):
    df = load_results([results])
    best_lr = _depths(min_depth_table(best_values(df, lr="max"), threshold=0.9))
    assert best_lr[("A5", "transformer", 16)] == 2  # the 0.97 of the lr with the worse validation accuracy
    strict = _depths(min_depth_table(best_values(df), threshold=0.96))
    assert strict[("A5", "transformer", 4)] == 2 and strict[("A5", "gru", 8)] is None
    other_metric = _depths(min_depth_table(best_values(df, metric="len{L}/acc"), threshold=0.9))
    assert set(other_metric.values()) == {1}


def test_missing_layers_column_means_depth_one(tmp_path):
    path = tmp_path / "results.csv"
    pd.DataFrame([{k: v for k, v in r.items() if k != "layers"} for r in ROWS[6:7]]).to_csv(path, index=False)
    table = min_depth_table(best_values(load_results([path])))
    assert set(table["min_layers"]) == {1} and set(table["layers_tried"]) == {"1"}


def test_bad_metric_and_threshold(results):
    df = load_results([results])
    with pytest.raises(ValueError, match=r"hold \{L\} once"):
        metric_columns(df, "len64/exact")
    with pytest.raises(ValueError, match="metrics there: len\\{L\\}/acc, len\\{L\\}/exact"):
        metric_columns(df, "len{L}/last_acc")
    with pytest.raises(ValueError, match="threshold"):
        min_depth_table(best_values(df), threshold=1.5)


def test_cli_writes_the_figure_and_the_plotted_numbers(results, tmp_path):
    out = tmp_path / "out"
    paths = main([str(results), "--out", str(out)])
    assert sorted(p.name for p in paths) == ["depth.csv", "depth.pdf", "depth.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    plotted = pd.read_csv(out / "depth.csv")
    assert len(plotted) == 11 and {"min_layers", "reached", "plotted_y", "layers_tried"} <= set(plotted.columns)
    unsolved = plotted[~plotted["reached"]]
    # the A5 panel tried depths 1..3: its unsolved point is drawn in the band above, near 4
    assert len(unsolved) == 1 and abs(unsolved["plotted_y"].iloc[0] - 4) < 0.5
    # coinciding lines are offset: both Z60 mixers need depth 1 at length 4 and are drawn apart
    z60_4 = plotted[(plotted["group"] == "Z60") & (plotted["length"] == 4)]["plotted_y"]
    assert z60_4.nunique() == 2 and (z60_4 - 1).abs().max() < 0.5
    named = main([str(results), "--out", str(out), "--name", "a5-depth"])
    assert sorted(p.name for p in named) == ["a5-depth.csv", "a5-depth.pdf", "a5-depth.png"]


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert run(main, [str(tmp_path / "nowhere.csv")]) == 2
    assert capsys.readouterr().err.startswith("error: no results file")


def test_a_mixer_tried_at_fewer_depths_is_not_put_in_a_band_of_depths_it_never_ran(tmp_path, monkeypatch):
    import analysis.plotting

    rows = [
        _row("A5", "transformer", 1, 0, 1e-3, 0.8, {4: 0.95, 8: 0.5, 16: 0.1}),
        _row("A5", "transformer", 2, 0, 1e-3, 0.8, {4: 0.99, 8: 0.95, 16: 0.2}),
        _row("A5", "rwkv7", 1, 0, 1e-3, 0.8, {4: 0.93, 8: 0.4, 16: 0.1}),  # never tried at depth 2
    ]
    path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    seen = {}

    def keep(fig, stem, data, dpi=None):
        seen["yticks"] = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
        seen["legend"] = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        return []

    monkeypatch.setattr(analysis.plotting, "save_figure", keep)
    main([str(path), "--out", str(tmp_path / "out")])
    assert "none of the depths tried" in seen["yticks"] and "none of 1..2" not in seen["yticks"]
    assert "rwkv7 (tried at depth 1)" in seen["legend"] and "transformer" in seen["legend"]
