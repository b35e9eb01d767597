"""analysis.width on a synthetic results frame: the table holds an independent loop's numbers and the
figure's lines are exactly those numbers, one panel per setting."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.width import main, plot_widths
from experiments.claims import width_table

SETTINGS = {  # Zoology's first two panels, as the preset's sweeps write their task_config
    "mqar num_kv_pairs=4 seq_len=64": {"num_kv_pairs": 4, "seq_len": 64, "vocab_size": 8192},
    "mqar num_kv_pairs=8 seq_len=128": {"num_kv_pairs": 8, "seq_len": 128, "vocab_size": 8192},
}
WIDTHS = (64, 128, 512)  # awkward: not every power of two
MIXERS = ("transformer", "gru", "mamba")
LRS = (1e-3, 1e-2)


def synthetic_results(seed=0, seeds=(0, 1, 2)):
    """One row per (setting, width, mixer, lr, seed), random accuracies; a failed trial the loop must skip."""
    rng = np.random.default_rng(seed)
    rows = []
    for config in SETTINGS.values():
        for width in WIDTHS:
            for mixer in MIXERS:
                for lr in LRS:
                    for s in seeds:
                        rows.append(
                            {
                                "entry": f"l{config['seq_len']}_d{width}",
                                "task": "mqar",
                                "task_config": json.dumps(config, sort_keys=True),
                                "mixer": mixer,
                                "layers": 2,
                                "d_model": width,
                                "seed": s,
                                "lr": lr,
                                "status": "ok",
                                "best_val_acc": rng.uniform(),
                                "test/acc": rng.uniform(),
                                "n_params": 1000 * width,
                                "steps": 100,
                            }
                        )
    rows.append({**rows[0], "seed": 9, "status": "failed", "best_val_acc": math.nan, "test/acc": 1.0})
    return pd.DataFrame(rows)


def reference(df, how):
    """Per (setting, mixer, width): best seed of each seed's best-validation lr, or the mean over seeds at the
    lr with the best mean validation accuracy; a plain loop over the rows."""
    out = {}
    ok = df[df["status"] == "ok"]
    for label, config in SETTINGS.items():
        for width in WIDTHS:
            for mixer in MIXERS:
                cell = ok[
                    (ok["task_config"] == json.dumps(config, sort_keys=True))
                    & (ok["d_model"] == width)
                    & (ok["mixer"] == mixer)
                ]
                if how == "best":
                    per_seed = {}
                    for r in cell.to_dict("records"):
                        if r["seed"] not in per_seed or r["best_val_acc"] > per_seed[r["seed"]]["best_val_acc"]:
                            per_seed[r["seed"]] = r
                    out[(label, mixer, width)] = max(r["test/acc"] for r in per_seed.values())
                else:
                    lr = max(LRS, key=lambda lr: cell[cell["lr"] == lr]["best_val_acc"].mean())
                    out[(label, mixer, width)] = cell[cell["lr"] == lr]["test/acc"].mean()
    return out


@pytest.mark.parametrize("how", ["best", "mean_at_best_lr"])
def test_width_table_matches_a_loop_over_the_rows(how):
    df = synthetic_results()
    table = width_table(df, "test/acc", how)
    want = reference(df, how)
    got = {(r.setting, r.mixer, r.width): r.value for r in table.itertuples()}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    # settings by sequence length, mixers in order of appearance, widths ascending
    assert list(dict.fromkeys(table["setting"])) == list(SETTINGS)
    assert list(table["width"][: len(WIDTHS)]) == list(WIDTHS) and table["mixer"].iloc[0] == "transformer"
    assert set(table["seeds"]) == {3}


def test_plotted_lines_are_the_tables_numbers(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import analysis.plotting
    from analysis.plotting import name_styles

    table = width_table(synthetic_results(seed=1), "test/acc", "mean_at_best_lr")
    figures = []
    monkeypatch.setattr(analysis.plotting, "save_figure", lambda fig, stem, data: figures.append((fig, data)) or [])
    plot_widths(table, None, "test/acc", 0.98)
    fig, data = figures[0]
    assert data is table
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == list(SETTINGS)  # one panel per setting
    colours, markers = name_styles(MIXERS)  # the style of each mixer's line: tells the lines apart
    style = {(matplotlib.colors.to_hex(colours[m]), markers[m]): m for m in MIXERS}
    for ax in axes:
        sel = table[table["setting"] == ax.get_title()]
        lines = {
            style[(matplotlib.colors.to_hex(line.get_color()), line.get_marker())]: line
            for line in ax.get_lines()
            if len(line.get_xdata()) and (matplotlib.colors.to_hex(line.get_color()), line.get_marker()) in style
        }
        assert set(lines) == set(MIXERS)
        for mixer, line in lines.items():
            mine = sel[sel["mixer"] == mixer].sort_values("width")
            np.testing.assert_allclose(line.get_xdata(), mine["width"])
            np.testing.assert_allclose(line.get_ydata(), mine["value"])
        solved = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.98, 0.98]]
        assert len(solved) == 1 and ax.get_xscale() == "log"


def test_cli_writes_the_figure_and_its_numbers(tmp_path):
    df = synthetic_results()
    for entry, rows in df.groupby("entry"):
        (tmp_path / "runs" / entry).mkdir(parents=True)
        rows.to_csv(tmp_path / "runs" / entry / "results.csv", index=False)
    paths = main([str(tmp_path / "runs"), "--out", str(tmp_path / "fig"), "--name", "zoology"])
    assert sorted(p.name for p in paths) == ["zoology.csv", "zoology.pdf", "zoology.png"]
    written = pd.read_csv(tmp_path / "fig" / "zoology.csv")
    want = reference(df, "best")
    assert len(written) == len(want)
    for r in written.itertuples():
        assert r.value == pytest.approx(want[(r.setting, r.mixer, r.width)], rel=1e-6)


def test_bad_input(tmp_path):
    from analysis.cli import run

    df = synthetic_results()
    with pytest.raises(ValueError, match="no 'test/exact' column"):
        width_table(df, "test/exact")
    with pytest.raises(ValueError, match="lack the column"):
        width_table(df.drop(columns="d_model"))
    df.to_csv(tmp_path / "results.csv", index=False)
    assert run(main, [str(tmp_path / "results.csv"), "--solved", "2", "--out", str(tmp_path)]) == 2
