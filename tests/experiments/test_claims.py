"""experiments.claims: Zoology's claims checked on results (attention solves every setting; the recurrent
models need width, more as the setting grows), on results built so that each verdict is known."""

import json

import pandas as pd
import pytest

from experiments.claims import claims_lines, preset_claims, smallest_solving_width, width_table
from experiments.paper import compare, comparison_markdown

SETTINGS = {64: 4, 128: 8}  # sequence length: key-value pairs
WIDTHS = (64, 128, 512)
#: test accuracy per mixer, setting and width (ascending); the designed verdicts in the comments
CELLS = {
    "transformer": {64: (1.0, 1.0, 0.99), 128: (0.9, 1.0, 1.0)},  # misses one cell: L128 at d64
    "gru": {64: (0.5, 0.99, 1.0), 128: (0.2, 0.5, 0.985)},  # needs 128, then 512: needs width, grows
    "mamba": {64: (0.99, 1.0, 1.0), 128: (0.98, 0.99, 1.0)},  # solved at the smallest width: no width needed
    "lstm": {64: (0.1, 0.2, 0.99), 128: (0.3, 0.99, 0.99)},  # needs 512, then 128: the need shrinks
    "mamba2": {64: (0.1, 0.2, 0.3), 128: (0.1, 0.1, 0.1)},  # never solved: more than 512 everywhere, if any
}


def results(cells=CELLS, layers=2):
    rows = []
    for mixer, by_setting in cells.items():
        for seq_len, values in by_setting.items():
            config = {"num_kv_pairs": SETTINGS[seq_len], "seq_len": seq_len, "vocab_size": 8192}
            for width, value in zip(WIDTHS, values):
                for lr, shift in ((1e-3, 0.0), (1e-2, -0.5)):  # the second lr validates worse and tests worse
                    rows.append(
                        {
                            "entry": f"l{seq_len}_d{width}",
                            "task": "mqar",
                            "task_config": json.dumps(config),
                            "mixer": mixer,
                            "layers": layers,
                            "d_model": width,
                            "seed": 0,
                            "lr": lr,
                            "status": "ok",
                            "best_val_acc": value + shift,
                            "test/acc": value + shift,
                            "n_params": 1000,
                            "steps": 100,
                        }
                    )
    return pd.DataFrame(rows)


def test_zoology_declares_its_claims_over_the_mixers_it_runs():
    from experiments.sweeps.presets import load_preset

    claims = preset_claims("zoology-mqar")
    assert claims["solves_every"] == ["transformer"]
    mixers = load_preset("zoology-mqar")["defaults"]["mixers"]
    assert set(claims["needs_width"]) == set(mixers) - {"transformer"}


def test_smallest_solving_width_per_mixer_and_setting():
    table = width_table(results(), layers=2)
    got = smallest_solving_width(table, 0.98).set_index(["mixer", "setting"])["smallest"].to_dict()
    for mixer, by_setting in CELLS.items():
        for seq_len, values in by_setting.items():
            setting = f"mqar num_kv_pairs={SETTINGS[seq_len]} seq_len={seq_len}"
            want = next((w for w, v in zip(WIDTHS, values) if v >= 0.98), float("inf"))  # a loop over widths
            assert got[(mixer, setting)] == want, (mixer, setting)


def test_the_report_states_each_claims_verdict():
    lines = claims_lines("zoology-mqar", results())
    text = "\n".join(lines)
    assert "`transformer` solves every setting at every width: **does not hold** (5 of 6 cells ≥ 98%; below: " in text
    assert "mqar num_kv_pairs=8 seq_len=128 d=64 90.0%" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table[1:]}
    assert rows["gru"] == ["128", "512", "✓", "✓"]
    assert rows["mamba"] == ["64", "64", "✗", "✓"]
    assert rows["lstm"] == ["512", "128", "✓", "✗"]
    assert rows["mamba2"] == ["> 512", "> 512", "never", "✓"]  # the run cannot tell whether width helps
    assert "2 of 4 reach 98% in some setting only above the smallest width (1 reach it nowhere); for 3 of 4" in text
    # the claims are part of the report, under the comparison table
    df = results({"transformer": CELLS["transformer"]})  # one cell of the table is enough to render it
    table = compare("zoology-mqar", {"l64_d64": df[df["entry"] == "l64_d64"]})
    report = comparison_markdown("zoology-mqar", table, {"claims": lines})
    assert "Claims, from the cells above (solved: ≥ 98%)" in report and "| gru     | 128" in report


def test_attention_solving_everything_holds():
    cells = {"transformer": {64: (1.0, 0.99, 0.98), 128: (0.985, 1.0, 1.0)}}
    text = "\n".join(claims_lines("zoology-mqar", results(cells)))
    assert "`transformer` solves every setting at every width: **holds** (all 6 cells ≥ 98%)" in text


def test_cells_at_another_depth_are_not_the_papers_models():
    """A 1-layer run is a departure (``transformer, 1 layer``), not the paper's 2-layer model: not run."""
    text = "\n".join(claims_lines("zoology-mqar", results({"transformer": CELLS["transformer"]}, layers=1)))
    assert "`transformer` solves every setting at every width: not run." in text


def test_unknown_claims_are_rejected(monkeypatch):
    import experiments.claims

    monkeypatch.setattr(experiments.claims, "load_reproduction", lambda name: {"paper": {"claims": {"wins": []}}})
    with pytest.raises(ValueError, match="unknown claim"):
        preset_claims("zoology-mqar")


def group_rows(values, mixer="pd_ssm", layers=1):
    """pd-ssm-groups results: one trial per (column, seed) of ``mixer`` with the given accuracies."""
    return pd.DataFrame(
        [
            {
                "entry": entry,
                "task": "word_problem",
                "mixer": mixer,
                "layers": layers,
                "seed": seed,
                "lr": 2e-3,
                "status": "ok",
                "best_val_acc": value,
                "range40-256/acc": value,
                "n_params": 1000,
                "steps": 100,
            }
            for entry, per_seed in values.items()
            for seed, value in enumerate(per_seed)
        ]
    )


SOLVED_BY_THE_PAPER = ("a5_2", "a5_6", "a5_8", "a5_12", "s5_4", "s5_8")  # its 100.0 cells; (S5, 32) is 1.07


def test_pd_ssm_groups_claims_95_where_the_paper_has_100():
    """The claim is the mean over seeds at 95% or more in the six columns the paper's PD-SSM solves; its
    (S5, 32) cell (1.07) is no part of it."""
    assert preset_claims("pd-ssm-groups") == {"solves_where_the_paper_does": ["pd_ssm"]}
    good = {entry: [0.95, 0.97] for entry in SOLVED_BY_THE_PAPER} | {"s5_32": [0.01, 0.01]}
    text = "\n".join(claims_lines("pd-ssm-groups", group_rows(good)))
    assert "Claims, from the cells above (solved: ≥ 95%)" in text
    assert "`pd_ssm` solves every column the paper's row solves: **holds** (6 of 6 columns ≥ 95%)" in text
    bad = good | {"s5_8": [1.0, 0.89]}  # mean 94.5%
    text = "\n".join(claims_lines("pd-ssm-groups", group_rows(bad)))
    assert "**does not hold** (5 of 6 columns ≥ 95%; below: (S5, 8) 94.5%)" in text
    part = {entry: good[entry] for entry in ("a5_2", "s5_4")}
    text = "\n".join(claims_lines("pd-ssm-groups", group_rows(part)))
    assert "**open** (2 of 6 columns ≥ 95%; not run: (A5, 6), (A5, 8), (A5, 12), (S5, 8))" in text
    # PD-SSM at 2 layers is not the paper's 1-layer row: the claim is not run at all
    text = "\n".join(claims_lines("pd-ssm-groups", group_rows(good, layers=2)))
    assert "**open** (0 of 6 columns ≥ 95%; not run: (A5, 2)," in text
