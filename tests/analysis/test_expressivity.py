"""analysis.expressivity on a synthetic results file: the CSVs hold the hand-computed numbers."""

import json
import math

import pandas as pd
import pytest

from analysis.cli import run
from analysis.expressivity import length_table, main, map_table, metric_note
from analysis.tables import load_results

NAN = math.nan
EXTRAP_40 = json.dumps({"min_len": 3, "max_len": 40, "eval_lengths": [40, 80, 240]})
EXTRAP_20 = json.dumps({"min_len": 3, "max_len": 20, "eval_lengths": [40, 100]})


def _row(task, config, extrap, mixer, seed, lr, val, accs, status="ok"):
    """``accs``: {length: (acc, last_acc)}."""
    row = {
        "task": task,
        "task_config": json.dumps(config),
        "mixer": mixer,
        "seed": seed,
        "lr": lr,
        "status": status,
        "best_val_acc": val if status == "ok" else NAN,
        "n_params": 1000,
        "extrapolation": extrap,
    }
    for length, (acc, last) in accs.items():
        row[f"len{length}/acc"], row[f"len{length}/last_acc"] = acc, last
    return row


S3, PARITY, MOD3 = (
    ("word_problem", {"group": "S3"}, EXTRAP_40),
    ("parity", {"running": True}, EXTRAP_40),
    ("modular_count", {"m": 3}, EXTRAP_20),
)
ROWS = [
    # mamba on S3: one seed (listed first: the map keeps the mixers' order of appearance, mamba before gru)
    _row(*S3, "mamba", 0, 1e-3, 0.60, {40: (0.5, 0.3), 80: (0.4, 0.2), 240: (0.3, 0.17)}),
    # gru on S3: seed 0 picks lr 1e-2 (val 0.95), seed 1 lr 1e-3 (val 0.99); the unpicked rows score higher
    _row(*S3, "gru", 0, 1e-3, 0.90, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 1.0)}),
    _row(*S3, "gru", 0, 1e-2, 0.95, {40: (0.99, 0.98), 80: (0.8, 0.7), 240: (0.5, 0.2)}),
    _row(*S3, "gru", 1, 1e-3, 0.99, {40: (1.0, 1.0), 80: (0.95, 0.9), 240: (0.7, 0.4)}),
    _row(*S3, "gru", 1, 1e-2, 0.50, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 1.0)}),
    _row(*S3, "gru", 2, 1e-3, NAN, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 1.0)}, status="failed"),
    # parity: gru listed before mamba here; the order stays the global one
    _row(*PARITY, "gru", 0, 1e-3, 1.00, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 0.99)}),
    _row(*PARITY, "mamba", 0, 1e-3, 0.70, {40: (0.7, 0.55), 80: (0.6, 0.5), 240: (0.55, 0.5)}),
    # counting mod 3, trained up to 20 and evaluated at 40 and 100 only: 6x (120) falls back to 100
    _row(*MOD3, "gru", 0, 1e-3, 1.00, {40: (0.98, 0.97), 100: (0.9, 0.6)}),
    # a sweep without extrapolation is ignored
    {
        "task": "parity",
        "task_config": "{}",
        "mixer": "gru",
        "seed": 0,
        "lr": 1e-3,
        "status": "ok",
        "best_val_acc": 1.0,
        "extrapolation": "",
        "test/acc": 1.0,
    },
]


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "sweep" / "results.csv"
    path.parent.mkdir()
    pd.DataFrame(ROWS).to_csv(path, index=False)
    return path


def _cell(table, task, mixer, **where):
    sel = table[(table["task_label"] == task) & (table["mixer"] == mixer)]
    for key, value in where.items():
        sel = sel[sel[key] == value]
    assert len(sel) == 1, (task, mixer, where, table)
    return sel.iloc[0]


def _reference(rows, task, config, mixer, length, metric):
    """Independent loop: per seed the row with the best validation accuracy, then best / mean over seeds."""
    per_seed = {}
    for r in rows:
        mine = (r["task"], r["task_config"], r["mixer"], r["status"]) == (task, json.dumps(config), mixer, "ok")
        if (
            mine
            and r["extrapolation"]
            and (r["seed"] not in per_seed or r["best_val_acc"] > per_seed[r["seed"]]["best_val_acc"])
        ):
            per_seed[r["seed"]] = r
    values = [r[f"len{length}/{metric}"] for r in per_seed.values()]
    return max(values), sum(values) / len(values)


@pytest.mark.slow
def test_map_csv_holds_the_hand_computed_numbers(results, tmp_path):
    out = tmp_path / "map"
    paths = main([str(results), "--out", str(out)])
    assert {p.name for p in paths} == {
        f"expressivity-{k}.{e}" for k in ("map", "lengths") for e in ("png", "pdf", "csv")
    }
    table = pd.read_csv(out / "expressivity-map.csv")
    # default: last_acc (present), best seed, factors 2 and 6
    assert set(table["metric"]) == {"last_acc"} and set(table["target_factor"]) == {2, 6}
    gru_80 = _cell(table, "S3 word", "gru", target_factor=2)
    assert (gru_80["length"], gru_80["value"], gru_80["best"]) == (80, 0.9, 0.9)
    assert gru_80["mean"] == pytest.approx(0.8) and gru_80["std"] == pytest.approx(0.1) and gru_80["seeds"] == 2
    assert gru_80["lr"] == 1e-3 and gru_80["chance"] == pytest.approx(1 / 6)
    gru_240 = _cell(table, "S3 word", "gru", target_factor=6)
    assert (gru_240["length"], gru_240["value"]) == (240, 0.4) and gru_240["mean"] == pytest.approx(0.3)
    assert _cell(table, "S3 word", "mamba", target_factor=6)["value"] == pytest.approx(0.17)
    assert _cell(table, "parity", "gru", target_factor=6)["value"] == pytest.approx(0.99)
    mod3 = _cell(table, "count mod 3", "gru", target_factor=6)
    assert (mod3["length"], mod3["train_max_len"], mod3["value"]) == (100, 20, 0.6)
    assert _cell(table, "count mod 3", "gru", target_factor=2)["length"] == 40
    # every mapped number against the independent loop
    configs = {"S3 word": S3, "parity": PARITY, "count mod 3": MOD3}
    for _, r in table.iterrows():
        task, config, _ = configs[r["task_label"]]
        best, mean = _reference(ROWS, task, config, r["mixer"], r["length"], "last_acc")
        assert (r["best"], r["mean"]) == (pytest.approx(best), pytest.approx(mean))
    # column order: parity, counting, word problems; rows: mixers in order of appearance
    assert list(dict.fromkeys(table["task_label"])) == ["parity", "count mod 3", "S3 word"]
    lengths = pd.read_csv(out / "expressivity-lengths.csv")
    assert len(lengths) == 3 + 3 + 3 + 3 + 2  # S3 gru/mamba, parity mamba/gru at 3 lengths; mod 3 at 2
    for task in ("parity", "S3 word"):
        assert list(dict.fromkeys(lengths[lengths["task_label"] == task]["mixer"])) == ["mamba", "gru"]
        assert list(dict.fromkeys(table[table["task_label"] == task]["mixer"])) == ["mamba", "gru"]


def test_metric_and_aggregate_options(results):
    df = load_results([results])
    acc = length_table(df, metric="acc", aggregate="mean")
    gru = _cell(acc, "S3 word", "gru", length=80)
    assert gru["metric"] == "acc" and gru["value"] == pytest.approx((0.8 + 0.95) / 2) and gru["best"] == 0.95
    no_last = df.drop(columns=[c for c in df.columns if c.endswith("/last_acc")])
    assert set(length_table(no_last)["metric"]) == {"acc"}  # auto falls back to acc
    table = map_table(length_table(df), factors=[1])
    # count mod 3 was trained to 20 and evaluated from 40 on: no length near 1x, so no cell (not its 2x one)
    assert set(table["length"]) == {40} and len(table) == 4 and "count mod 3" not in set(table["task_label"])


def test_bad_input(results, tmp_path):
    df = load_results([results])
    with pytest.raises(ValueError, match="no length-extrapolation trials"):
        length_table(df[df["extrapolation"] == ""])
    with pytest.raises(ValueError, match="metric must be one of"):
        length_table(df, metric="f1")
    with pytest.raises(ValueError, match="factors must be positive"):
        map_table(length_table(df), factors=[0])
    assert run(main, [str(tmp_path / "missing.csv"), "--out", str(tmp_path)]) == 2


def test_deeper_models_are_rows_of_their_own():
    """A mixer swept at 1 and 2 layers gives two rows of the map: ``gru`` and ``gru, 2 layers``, each with
    its own best seed (the 2-layer row's lower accuracy is not hidden by the 1-layer one's)."""
    rows = [
        dict(_row(*PARITY, "gru", 0, 1e-3, 1.0, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 1.0)}), layers=1),
        dict(_row(*PARITY, "gru", 0, 1e-3, 0.9, {40: (0.9, 0.8), 80: (0.7, 0.6), 240: (0.6, 0.5)}), layers=2),
    ]
    table = length_table(pd.DataFrame(rows), metric="last_acc")
    got = table[table["length"] == 80].set_index("mixer")["value"].to_dict()
    assert got == {"gru": 1.0, "gru, 2 layers": 0.6}


def _figure_texts(fig):
    return (
        [t.get_text() for t in fig.texts]
        + [t.get_text() for ax in fig.axes for t in ax.texts]
        + [ax.get_title() for ax in fig.axes]
        + [fig._suptitle.get_text() if fig._suptitle else ""]
    )


def test_a_panel_without_its_length_says_so_on_the_figure(results, monkeypatch):
    """Counting mod 3 was trained to 20 and evaluated at 40 and 100: the 6x panel (120) shows 100 and must
    not claim to be 6x; the figure itself names what is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import analysis.plotting
    from analysis import expressivity

    figures = []
    monkeypatch.setattr(analysis.plotting, "save_figure", lambda fig, stem, table: figures.append(fig) or [])
    table = map_table(length_table(load_results([results])))
    expressivity.plot_map(table, None)
    titles = [ax.get_title() for ax in figures[0].axes if ax.get_title()]
    assert titles[0].startswith("2× the training length") and titles[1].startswith("nearest to 6× the training length")
    notes = [t for t in _figure_texts(figures[0]) if "no length at 6×" in t]
    assert len(notes) == 1 and "count mod 3: L = 100 (5×)" in notes[0], _figure_texts(figures[0])


def test_coinciding_lines_stay_visible(results, monkeypatch):
    """Three mixers at 100% at every length: three lines, apart, each in the legend; the CSV keeps the values."""
    import matplotlib

    matplotlib.use("Agg")
    import analysis.plotting
    from analysis import expressivity

    rows = [
        _row(*PARITY, m, 0, 1e-3, 1.0, {40: (1.0, 1.0), 80: (1.0, 1.0), 240: (1.0, 1.0)})
        for m in ("gru", "lstm", "elman")
    ]
    rows.append(_row(*PARITY, "mamba", 0, 1e-3, 0.7, {40: (0.7, 0.55), 80: (0.6, 0.5), 240: (0.55, 0.5)}))
    lengths = length_table(pd.DataFrame(rows))
    figures = []
    monkeypatch.setattr(analysis.plotting, "save_figure", lambda fig, stem, table: figures.append((fig, table)) or [])
    expressivity.plot_lengths(lengths, None)
    fig, table = figures[0]
    assert set(table["value"][table["mixer"] != "mamba"]) == {1.0}  # the data written is untouched
    (ax,) = fig.axes
    curves = {tuple(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata()) == 3}
    assert len(curves) == 4  # gru, lstm, elman apart, and mamba
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"gru", "lstm", "elman", "mamba"} <= set(legend)


def test_a_mixer_run_in_two_precisions_is_two_rows_of_the_map():
    rows = [
        {
            **_row(*PARITY, "signed_deltanet", 0, 1e-3, 0.9, {40: (1.0, 0.98), 80: (1.0, 0.97), 240: (0.9, 0.8)}),
            "precision": "32-true",
        },
        {
            **_row(*PARITY, "signed_deltanet", 0, 1e-3, 0.8, {40: (0.6, 0.55), 80: (0.5, 0.5), 240: (0.5, 0.5)}),
            "precision": "bf16-mixed",
        },
    ]
    table = length_table(pd.DataFrame(rows).assign(source="x"), metric="last_acc")
    at240 = table[table["length"] == 240].set_index("mixer")["value"].to_dict()
    assert at240 == {"signed_deltanet, 32-true": 0.8, "signed_deltanet, bf16-mixed": 0.5}


def test_the_map_is_coloured_above_chance_and_leaves_unevaluated_lengths_empty(monkeypatch):
    """Parity at 51% and S3 at 16% are both chance: the same colour; a task evaluated only up to 2x has
    an empty 6x cell, not its 2x number."""
    import matplotlib

    matplotlib.use("Agg")
    import analysis.plotting
    from analysis import expressivity

    short = json.dumps({"min_len": 3, "max_len": 40, "eval_lengths": [40, 80]})
    rows = [
        _row(*PARITY, "gru", 0, 1e-3, 0.5, {40: (0.52, 0.51), 80: (0.5, 0.51), 240: (0.5, 0.51)}),
        _row(*S3, "gru", 0, 1e-3, 0.2, {40: (0.2, 1 / 6), 80: (0.2, 1 / 6), 240: (0.2, 1 / 6)}),
        _row("modular_count", {"m": 5}, short, "lstm", 0, 1e-3, 0.9, {40: (1.0, 1.0), 80: (0.9, 0.9)}),
    ]
    table = map_table(length_table(pd.DataFrame(rows), metric="last_acc"))
    scaled = {(r.task_label, r.mixer, r.target_factor): r.scaled for r in table.itertuples()}
    assert scaled[("parity", "gru", 6)] == pytest.approx(0.02) and scaled[("S3 word", "gru", 6)] == pytest.approx(0)
    lstm = table[table["mixer"] == "lstm"]
    assert list(lstm["target_factor"]) == [2] and list(lstm["length"]) == [80]  # no 6x cell for it
    figures = []
    monkeypatch.setattr(analysis.plotting, "save_figure", lambda fig, stem, data: figures.append(fig) or [])
    expressivity.plot_map(table, None)
    texts = _figure_texts(figures[0])
    assert any("colour: accuracy above chance" in t for t in texts)
    two, six = figures[0].axes[0], figures[0].axes[1]
    assert sorted(t.get_text() for t in two.texts) == ["17", "51", "90"]
    assert sorted(t.get_text() for t in six.texts) == ["17", "51"]  # the lstm cell at 6x is empty, not 90


def test_twelve_mixers_get_colour_blind_colours_and_distinct_styles(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    import analysis.plotting
    from analysis import expressivity

    names = [f"m{i}" for i in range(11)] + ["my_cells:MinimalGRU"]
    rows = [_row(*PARITY, m, 0, 1e-3, 0.9, {40: (0.9, 0.9), 80: (0.1 * i, 0.05 * i)}) for i, m in enumerate(names)]
    figures = []
    monkeypatch.setattr(analysis.plotting, "save_figure", lambda fig, stem, data: figures.append(fig) or [])
    expressivity.plot_lengths(length_table(pd.DataFrame(rows)), None)
    lines = {line.get_label(): line for ax in figures[0].axes for line in ax.get_lines() if line.get_label() in names}
    styles = {(matplotlib.colors.to_hex(line.get_color()), line.get_marker()) for line in lines.values()}
    palette = {matplotlib.colors.to_hex(c) for c in sns.color_palette("colorblind")}
    assert len(lines) == len(names) and len(styles) == len(names)  # no two share colour and marker
    assert {colour for colour, _ in styles} <= palette  # the colour-blind palette, no hue ramp


def test_string_answers_are_scored_per_symbol_and_labels_at_the_last_position():
    """Reverse string answers a string after its input (``answer_positions == "every"``): its cells are the
    per-symbol ``acc`` (Deletang's accuracy); parity's label and S3's running product keep ``last_acc``.
    The figures name which tasks use which."""
    import matplotlib

    matplotlib.use("Agg")

    reverse = ("reverse_string", {}, EXTRAP_40)
    rows = [
        _row(*reverse, "gru", 0, 1e-3, 0.9, {40: (0.95, 0.5), 80: (0.81, 0.25), 240: (0.62, 0.0)}),
        _row(*PARITY, "gru", 0, 1e-3, 1.0, {40: (1.0, 1.0), 80: (0.9, 0.75), 240: (0.7, 0.55)}),
        _row(*S3, "gru", 0, 1e-3, 1.0, {40: (1.0, 1.0), 80: (0.8, 0.6), 240: (0.6, 0.3)}),
    ]
    lengths = length_table(pd.DataFrame(rows))
    got = {(r.task_label, r.length): (r.metric, r.value) for r in lengths.itertuples()}
    assert got[("reverse_string", 80)] == ("acc", 0.81) and got[("reverse_string", 240)] == ("acc", 0.62)
    assert got[("parity", 240)] == ("last_acc", 0.55) and got[("S3 word", 80)] == ("last_acc", 0.6)
    # Deletang's tasks after the state-tracking ones, by level of the hierarchy
    assert list(dict.fromkeys(lengths["task_label"])) == ["parity", "S3 word", "reverse_string"]
    assert metric_note(lengths) == "last_acc; acc: reverse_string"
    # --metric forces one reading on every task
    assert set(length_table(pd.DataFrame(rows), metric="last_acc")["metric"]) == {"last_acc"}


def test_every_task_declares_its_answer_layout():
    """A task answered at every scored position scores several positions of a sequence; Deletang's
    string-output tasks (``tasks.transduction``) are such tasks, his label tasks are not."""
    from tasks import TASKS, Transduction, get_task

    assert {cls.answer_positions for cls in TASKS.values()} == {"last", "every"}
    for name, cls in TASKS.items():
        if issubclass(cls, Transduction):
            assert cls.answer_positions == "every", name
        if cls.answer_positions == "every":
            task = get_task(name, seq_len=16 if name != "mqar" else 64)
            scored = (task.generate(8, seed=3).targets != -100).sum(dim=1)
            assert (scored > 1).any(), name
    for name in ("even_pairs", "cycle_navigation", "missing_duplicate", "solve_equation", "parity"):
        assert TASKS[name].answer_positions == "last", name
