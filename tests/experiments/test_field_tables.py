"""The field's benchmark tables: pd-ssm-fsa (mean ± std, agreement within max(2 × std, 5 points)),
pd-ssm-groups (its A5 and S5 table, rows at two depths), pd-ssm-claims (PD-SSM's and Mamba-3's claims at
its protocol), chomsky (Deletang et al.'s 15 tasks) and zoology-mqar (Zoology's Figure 2), and their --quick
forms."""

import dataclasses
import math

import pandas as pd
import pytest

from experiments.claims import preset_claims
from experiments.paper import (
    cell_tolerance,
    compare,
    comparison_frame,
    comparison_markdown,
    paper_agreement,
    paper_cell,
    paper_entries,
    paper_solved,
)
from experiments.reproduce import plans_for, run_reproduction
from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep
from experiments.sweeps.runner import SweepOptions

METRIC = "range40-256/acc"


def seeds(entry, mixer, values, lr=2e-3, layers=2):
    """Results rows of one (sweep, mixer) at depth ``layers``: one seed per value, all at ``lr``."""
    return [
        {
            "entry": entry,
            "task": entry,
            "mixer": mixer,
            "layers": layers,
            "seed": i,
            "lr": lr,
            "status": "ok",
            METRIC: v,
            f"final/{METRIC}": v,  # the final weights' (pd-ssm-groups' metric), here the same
            "best_val_acc": v,
            "final_val_acc": v,
            "n_params": 1000,
            "steps": 100,
        }
        for i, v in enumerate(values)
    ]


def test_paper_cells_parse_in_every_form():
    assert paper_cell(0.5)[:1] == (0.5,) and paper_cell([0.5, 1200])[:2] == (0.5, 1200.0)
    accuracy, params, std = paper_cell({"mean": 0.392, "std": 0.043})
    assert (accuracy, std) == (0.392, 0.043) and params != params
    assert math.isnan(paper_cell([0.5])[2])  # no std given
    with pytest.raises(ValueError, match="mean, std, params"):
        paper_cell({"avg": 0.4})


def test_agreement_is_max_of_two_paper_stds_and_five_points():
    assert paper_agreement("pd-ssm-fsa") == (2.0, 0.05)
    assert cell_tolerance("pd-ssm-fsa", 0.043) == pytest.approx(0.086)
    assert cell_tolerance("pd-ssm-fsa", 0.0) == 0.05 and cell_tolerance("pd-ssm-fsa", float("nan")) == 0.05
    assert paper_agreement("grazzi-table3") is None and cell_tolerance("grazzi-table3", 0.3) == 0.15


def test_pd_ssm_cells_compare_mean_over_seeds_with_the_papers_mean_and_std():
    """sLSTM on cycle navigation: paper 39.2 ± 4.3, so 31.0 agrees (within 8.6) and 30.0 does not; LSTM on
    parity: paper 100 ± 0, so 95.0 agrees (5 points) and 94.0 does not. Ours is the mean over seeds."""
    results = {
        "cycle_navigation": pd.DataFrame(
            seeds("cycle_navigation", "slstm", [0.30, 0.32, 0.31, 0.29, 0.33])
            + seeds("cycle_navigation", "lstm", [0.30] * 5)
        ),
        "parity": pd.DataFrame(seeds("parity", "lstm", [0.95] * 5) + seeds("parity", "slstm", [0.94] * 5)),
    }
    table = compare("pd-ssm-fsa", results, {"cycle_navigation": ["slstm", "lstm"], "parity": ["lstm", "slstm"]})
    t = table.set_index(["entry", "mixer"])
    assert t.loc[("cycle_navigation", "slstm"), "ours"] == pytest.approx(0.31)
    assert t.loc[("cycle_navigation", "slstm"), "ours_std"] == pytest.approx(
        pd.Series([0.30, 0.32, 0.31, 0.29, 0.33]).std(ddof=0)
    )
    assert t.loc[("cycle_navigation", "slstm"), "paper_std"] == 0.043
    frame = comparison_frame("pd-ssm-fsa", table).set_index("model")
    assert frame.loc["slstm", "Cycle Nav."].endswith("/ 39.2% ± 4.3 ✓")
    assert frame.loc["lstm", "Cycle Nav."].endswith("/ 100% ± 0.0 ✗")
    assert frame.loc["lstm", "Parity"].endswith("✓") and frame.loc["slstm", "Parity"].endswith("✗")
    text = comparison_markdown("pd-ssm-fsa", table, {"device": "cpu"})
    assert "within max(2 × the paper's std over seeds, 5 points) of the paper" in text
    assert "2 of 4 cells within max(2 × the paper's std over seeds, 5 points)" in text


def test_pd_ssm_protocol_and_rows():
    data = load_preset("pd-ssm-fsa")
    entries = paper_entries("pd-ssm-fsa")
    assert [e.entry for e in entries] == ["cycle_navigation", "even_pairs", "modular_arithmetic", "parity"]
    for plan in plans_for("pd-ssm-fsa"):
        assert plan.layers == [2] and plan.model.d_model == 128 and plan.lrs == [2e-3] and len(plan.seeds) == 5
        assert plan.train.batch_size == 256 and plan.train.early_stop_acc == 0.9995
        assert plan.extrapolation["min_len"] == 3 and plan.extrapolation["max_len"] == 40  # train.py: 3..40
        assert plan.extrapolation["test_range"] == [40, 256]
        assert plan.train.weight_decay == 0.01 and plan.train.min_lr == 1e-5  # train.py's AdamW and schedule
        assert set(plan.mixers) == set(data["paper"]["results"])  # every built row has the paper's numbers
        assert "mamba2" in plan.mixers and "mamba" not in plan.mixers  # Walker's models/mamba.py: Mamba2
    # mod_arith_no_brack.py ends the expression with `=` and labels it there
    assert resolve_sweep("modular_arithmetic", "pd-ssm-fsa").task_options == {"modulus": 5, "equals": True}
    assert all(len(e.values) == 12 for e in entries)  # the 12 rows of the table that are not LNCDEs
    results = data["paper"]["results"]
    assert {"mlstm_exp+slstm", "complex_diag", "pd_ssm"} <= set(results)  # xLSTM[1:1], ℂ Diag., PD-SSM
    assert results["pd_ssm"]["modular_arithmetic"] == {"mean": 0.962, "std": 0.034}
    assert sum(len(row) for row in results.values()) == 48  # the paper's 48 cells


def test_pd_ssm_claims_is_the_fsa_tables_protocol_for_three_rows():
    """pd-ssm-claims: pd-ssm-fsa's parity and modular arithmetic sweeps, unchanged but for the rows (so their
    PD-SSM and Mamba-2 cells are that table's), PD-SSM's and Mamba-2's numbers from it, Mamba-3's claim as
    1.0, and PD-SSM's and Mamba-3's claims checked at 95%."""
    claims, fsa = plans_for("pd-ssm-claims"), {p.entry: p for p in plans_for("pd-ssm-fsa")}
    assert [p.entry for p in claims] == ["parity", "modular_arithmetic"]
    for plan in claims:
        assert plan.mixers == ["pd_ssm", "mamba3", "mamba2"]
        base, ours = (dataclasses.replace(p, mixers=["pd_ssm", "mamba2"]) for p in (fsa[plan.entry], plan))
        assert build_specs(ours) == build_specs(base)  # the same cells: shared trials
    paper = load_preset("pd-ssm-claims")["paper"]
    assert paper["results"]["mamba3"] == {k: {"mean": 1.0, "std": 0.0} for k in ("parity", "modular_arithmetic")}
    assert paper["results"]["pd_ssm"]["parity"] == {"mean": 0.999, "std": 0.001}
    assert preset_claims("pd-ssm-claims") == {"solves_where_the_paper_does": ["pd_ssm", "mamba3"]}
    assert paper_solved("pd-ssm-claims") == 0.95


GATED_DP = "deltaproduct[householders=2,forget_gate=true]"
GROUP_COLUMNS = {"a5_2": ("A5", 2), "a5_6": ("A5", 6), "a5_8": ("A5", 8), "a5_12": ("A5", 12)}
GROUP_COLUMNS |= {"s5_4": ("S5", 4), "s5_8": ("S5", 8), "s5_32": ("S5", 32)}


def test_pd_ssm_groups_protocol_rows_and_the_papers_numbers():
    """assets/A5.png: the 7 (group, transitions) columns; ℂ Diagonal at 2 layers, Gated DP [-1, 1] at 1 and
    2, PD-SSM at 1, each in every column; the FSA table's protocol; the paper's 18 cells."""
    from tasks import get_task

    entries = paper_entries("pd-ssm-groups")
    assert [(e.entry, e.title) for e in entries] == [(k, f"({g}, {n})") for k, (g, n) in GROUP_COLUMNS.items()]
    for plan in plans_for("pd-ssm-groups"):
        group, k = GROUP_COLUMNS[plan.entry]
        assert plan.task == "word_problem" and plan.task_options == {"group": group, "transitions": k, "running": False}
        task = get_task(plan.task, **plan.task_options)
        assert task.vocab_size == k and task.num_classes == {"A5": 60, "S5": 120}[group]
        assert {m: plan.depths(m) for m in plan.mixers} == {"complex_diag": [2], GATED_DP: [1, 2], "pd_ssm": [1]}
        assert plan.mixer_options["pd_ssm"]["d_state"] == plan.mixer_options["complex_diag"]["d_state"] == 128
        assert plan.model.d_model == 128 and plan.lrs == [2e-3] and len(plan.seeds) == 5
        assert (plan.train.batch_size, plan.train.early_stop_acc, plan.train.weight_decay) == (256, 0.9995, 0.01)
        assert plan.extrapolation["min_len"] == 3 and plan.extrapolation["max_len"] == 40
        # chosen and stopped on lengths 40..256 as the authors' train.py, scored on a further set of them
        assert plan.extrapolation["test_range"] == plan.extrapolation["val_range"] == [40, 256]
    results = load_preset("pd-ssm-groups")["paper"]["results"]
    assert sum(len(row) for row in results.values()) == 18  # the table's numbers; the rest are dashes
    assert results["complex_diag, 2 layers"] == {"a5_2": 0.155}
    assert results[f"{GATED_DP}, 2 layers"] == {"a5_12": 0.684, "s5_4": 0.847, "s5_8": 0.622}
    assert results[GATED_DP]["s5_32"] == 0.0123 and results["pd_ssm"]["s5_32"] == 0.0107
    assert sum(v == 1.0 for v in results["pd_ssm"].values()) == 6
    assert paper_agreement("pd-ssm-groups") == (2.0, 0.05) and cell_tolerance("pd-ssm-groups", float("nan")) == 0.05
    assert {e.metric for e in entries} == {"range40-256/acc"}  # the checkpoint chosen on lengths 40..256


def test_pd_ssm_groups_rows_at_two_depths_take_their_own_numbers():
    """Gated DP at 1 and at 2 layers fill two rows of (A5, 12), each beside the paper's number at its
    depth (60.5 and 68.4); ℂ Diagonal's 2-layer cells sit in its 2-layer row; within 5 points agrees."""
    results = {
        "a5_12": pd.DataFrame(
            seeds("a5_12", GATED_DP, [0.60] * 5, layers=1)
            + seeds("a5_12", GATED_DP, [0.62] * 5, layers=2)
            + seeds("a5_12", "pd_ssm", [0.96] * 5, layers=1)
        ),
        "a5_2": pd.DataFrame(seeds("a5_2", "complex_diag", [0.10] * 5, layers=2)),
    }
    table = compare("pd-ssm-groups", results, {"a5_12": [GATED_DP, "pd_ssm"], "a5_2": ["complex_diag"]})
    t = table.set_index(["entry", "mixer"])
    assert t.loc[("a5_12", GATED_DP), ["ours", "paper"]].tolist() == pytest.approx([0.60, 0.605])
    assert t.loc[("a5_12", f"{GATED_DP}, 2 layers"), ["ours", "paper"]].tolist() == pytest.approx([0.62, 0.684])
    assert t.loc[("a5_2", "complex_diag, 2 layers"), ["ours", "paper"]].tolist() == pytest.approx([0.10, 0.155])
    frame = comparison_frame("pd-ssm-groups", table).set_index("model")
    assert list(frame.index) == ["complex_diag, 2 layers", GATED_DP, f"{GATED_DP}, 2 layers", "pd_ssm"]  # paper order
    assert frame.loc[GATED_DP, "(A5, 12)"].endswith("/ 60.5% ✓")
    assert frame.loc[f"{GATED_DP}, 2 layers", "(A5, 12)"].endswith("/ 68.4% ✗")  # 6.4 points below
    assert frame.loc["pd_ssm", "(A5, 12)"].endswith("/ 100% ✓")  # 96% is within 5 points of 100
    assert frame.loc["complex_diag, 2 layers", "(A5, 2)"].endswith("/ 15.5% ✗")


def test_chomsky_has_deletangs_fifteen_tasks_and_every_mixer_but_no_unchecked_numbers():
    """Table 2's numbers could not be checked against the paper, so the preset carries none (and says so):
    every cell is a further row until they are read from it."""
    from mixers import MIXERS
    from tasks import TASKS

    data = load_preset("chomsky")
    assert "results" not in data["paper"] and all(not e.values for e in paper_entries("chomsky"))
    assert "not checked against the paper" in data["paper"]["source"]
    tasks = {resolve_sweep(e, "chomsky").task for e in data["tasks"]}
    assert len(tasks) == 15 and tasks <= set(TASKS)
    mixers = resolve_sweep("parity", "chomsky").mixers
    assert set(MIXERS) - set(mixers) == {"unsigned_mamba"}  # the same computation as mamba
    assert {e.metric for e in paper_entries("chomsky")} == {"range41-500/acc"}


def test_zoology_sweeps_figure_two():
    entries = load_preset("zoology-mqar")["tasks"]
    plans = [resolve_sweep(e, "zoology-mqar") for e in entries]
    grid = {(p.task_options["seq_len"], p.task_options["num_kv_pairs"], p.model.d_model) for p in plans}
    assert grid == {(L, k, d) for L, k in ((64, 4), (128, 8), (256, 16)) for d in (64, 128, 256, 512)}
    assert all(p.task_options["placement"] == "zoology" and p.task_options["vocab_size"] == 8192 for p in plans)
    assert all(p.layers == [2] and len(p.lrs) == 4 and "transformer" in p.mixers for p in plans)
    # the Figure 2 configs: filler token 0 (random_non_queries=False), one attention head with learned
    # positions, AdamW with weight decay 0.1, cosine without warm-up, early stop at 0.99
    assert all(p.task_options["random_non_queries"] is False for p in plans)
    assert all(
        p.mixer_options["transformer"] == {"num_heads": 1, "positions": "learned", "max_len": p.task_options["seq_len"]}
        for p in plans
    )
    assert all((p.train.weight_decay, p.train.warmup_ratio, p.train.early_stop_acc) == (0.1, 0.0, 0.99) for p in plans)


@pytest.mark.parametrize("name", ["pd-ssm-fsa", "pd-ssm-groups", "chomsky", "zoology-mqar"])
def test_quick_plans_build_their_tasks(name):
    """Every sweep of the --quick form builds its task at its quick lengths (the preset's quick: section
    shrinks Zoology's pairs to fit 32 tokens)."""
    from tasks import get_task

    for plan in plans_for(name, quick=True):
        lengths = [plan.extrapolation["max_len"], *plan.extrapolation["eval_lengths"]] if plan.extrapolation else [None]
        for n in lengths:
            options = plan.task_options if n is None else {**plan.task_options, "seq_len": n}
            get_task(plan.task, **options).generate(2, seed=0)


@pytest.mark.parametrize(
    "name,entry,mixer",
    [
        ("pd-ssm-fsa", "parity", "lstm"),  # about 5 s on 2 cores
        ("pd-ssm-groups", "s5_8", "pd_ssm"),  # about 3 s
        ("pd-ssm-claims", "parity", "mamba3"),
        ("chomsky", "reverse_string", "gru"),  # about 5 s
        pytest.param("zoology-mqar", "l64_d64", "gru", marks=pytest.mark.slow),  # 12 s: a vocabulary of 8,192
    ],
)
def test_quick_reproduction_writes_the_comparison(tmp_path, name, entry, mixer):
    over = {"train": {"max_steps": 20, "train_size": 256, "val_size": 64, "test_size": 64}, "mixers": [mixer]}
    table = run_reproduction(name, tmp_path, SweepOptions(progress=False), quick=True, overrides=over, entries=[entry])
    assert list(table["entry"].unique()) == [entry] and table.set_index("mixer").loc[mixer, "seeds"] == 1
    text = (tmp_path / name / "reproduction.md").read_text()
    assert "QUICK" in text and f"| {mixer} " in text
    if name == "zoology-mqar":  # its claims, checked on the cells of this run (experiments.claims)
        assert "Claims, from the cells above" in text and f"| {mixer}" in text.split("Claims")[1]
    if name == "pd-ssm-groups":  # PD-SSM's claim: one column of the six run, the verdict open or refuted
        claim = next(line for line in text.splitlines() if line.startswith("- `pd_ssm` solves every column"))
        assert "of 6 columns ≥ 95%" in claim and "not run: (A5, 2), (A5, 6), (A5, 8), (A5, 12), (S5, 4))" in claim
