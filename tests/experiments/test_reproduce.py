"""Reproduction presets and ``experiments.reproduce``: paper numbers, comparison table, a quick run."""

import datetime
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import experiments.paper as paper_module
from experiments.paper import (
    aggregate,
    compare,
    comparison_frame,
    comparison_markdown,
    entry_metric,
    evaluated_metric,
    paper_entries,
    paper_layers,
    paper_solved,
    reproduction_presets,
    selection_column,
    verdict,
)
from experiments.reproduce import devices_used, plans_for, run_reproduction, scheduled_minutes, trial_versions
from experiments.reproduce import main as reproduce_main
from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep
from experiments.sweeps.runner import SweepOptions
from experiments.sweeps.study import cell_id

ROOT = Path(__file__).resolve().parents[2]
PAPER_TABLE6 = {  # paper 000 Table 6
    "transformer": [1.00, 0.53, 1.00, 0.82, 0.78],
    "mamba2": [0.01, 0.52, 1.00, 1.00, 0.98],
    "flashgru": [1.00, 1.00, 1.00, 1.00, 1.00],
    "flashlstm": [1.00, 1.00, 1.00, 1.00, 1.00],
}


def test_reproduction_presets_carry_the_papers_numbers():
    assert set(reproduction_presets()) >= {"pararnn-table6", "pararnn-table1", "flashrnn-parity"}
    t6 = load_preset("pararnn-table6")["paper"]["results"]
    for mixer, accs in PAPER_TABLE6.items():
        assert [t6[mixer][e][0] for e in ("keep_nth", "parity", "mqar", "khop", "khop2")] == accs
    assert t6["flashgru"]["parity"][1] == 3800 and t6["transformer"]["parity"][1] == 31800
    fr = load_preset("flashrnn-parity")["paper"]["results"]
    assert {m: v["parity"][0] for m, v in fr.items()} == {
        "transformer": 0.52,
        "mamba": 0.56,
        "mlstm_exp": 0.54,
        "elman": 1.0,
        "gru": 1.0,
        "lstm": 1.0,
        "slstm": 1.0,
    }
    for name in ("pararnn-table6", "pararnn-table1", "flashrnn-parity"):
        data = load_preset(name)
        assert "Departure" in data["description"] and data["budget"]
        for plan in plans_for(name):  # every sweep resolves and every mixer has the paper's number ...
            if plan.layers != [paper_layers(data["paper"], plan.entry)]:  # ... but departures at another depth
                assert not any(plan.entry in v for v in data["paper"]["results"].values())
                continue
            assert set(plan.mixers) == set(data["paper"]["results"])
            assert all(plan.entry in data["paper"]["results"][m] for m in plan.mixers)


def test_compare_with_a_mixer_whose_trials_all_failed():
    failed = [dict(r, status="failed") for r in _rows("parity", "mamba2", [0.5, 0.5, 0.5])]
    df = pd.DataFrame(_rows("parity", "flashgru", [0.5, 0.99, 0.7]) + failed)
    t = compare("pararnn-table1", {"parity": df}).set_index("mixer")
    assert t.loc["mamba2", "failed"] == 3 and t.loc["mamba2", "ours"] != t.loc["mamba2", "ours"]
    assert t.loc["flashgru", "ours"] == 0.99


def test_a_paper_model_a_variant_does_not_train_is_not_reported_missing():
    """A variant preset trains a subset of the paper's models: the others are absent from its table, not
    counted as incomplete; a planned model without results still is."""
    df = pd.DataFrame(_rows("parity", "flashgru", [0.5, 0.99, 0.7]))
    everything = compare("pararnn-table1", {"parity": df}).set_index("mixer")
    assert len(everything) > 1 and (everything.drop(index="flashgru")["seeds"] == 0).all()
    subset = compare("pararnn-table1", {"parity": df}, {"parity": ["flashgru", "mamba2"]}).set_index("mixer")
    assert set(subset.index) == {"flashgru", "mamba2"} and subset.loc["mamba2", "seeds"] == 0
    assert subset.loc["flashgru", "ours"] == 0.99


def test_table6_matches_the_paper_setup_and_table1_is_its_subset():
    p = resolve_sweep("khop2", "pararnn-table6")
    assert (p.task, p.task_options["k"], p.task_options["vocab_size"], p.model.block) == ("khop", 2, 5, "full")
    p = resolve_sweep("parity", "pararnn-table6")
    assert p.model.block == "mixer" and p.mixer_options["flashgru"]["clip_norm"] is None
    assert resolve_sweep("khop", "pararnn-table6").lrs == [5e-4]  # the paper's lr where the budget suffices
    assert (p.train.batch_size, p.train.train_size, p.train.test_size) == (16, 10_000, 100_000)
    assert resolve_sweep("keep_nth", "pararnn-table6").model.positional == "sinusoidal"
    cells = lambda name: {cell_id(s) for plan in plans_for(name) for s in build_specs(plan)}  # noqa: E731
    assert cells("pararnn-table1") < cells("pararnn-table6")  # running both in one --out shares the trials


def test_table6_full_trains_at_the_papers_lr_from_the_first_step():
    """Paper 000: cosine schedule "starting at 5e-4" for up to 3,000 epochs; no warm-up below it."""
    from experiments.trial.lit import cosine_with_warmup, warmup_steps

    for entry in ("keep_nth", "parity", "mqar", "khop", "khop2"):
        p = resolve_sweep(entry, "pararnn-table6-full")
        assert p.lrs == [5e-4] and p.train.max_steps == 3000 * 10_000 // 16
        warmup = warmup_steps(p.train.warmup_ratio, p.train.max_steps)
        assert cosine_with_warmup(0, warmup, p.train.max_steps) == 1.0
        assert p.train.plateau_steps == 100_000


def test_table6_full_queues_its_longest_sweeps_first():
    """Workers claim cells in plan order: the 1.8M-step k-hop Transformer trials must not start last,
    nor the Parity† Transformer trials (up to 0.73M steps) after MQAR's (up to 0.43M)."""
    entries = [p.entry for p in plans_for("pararnn-table6-full")]
    paper_depth = [p.entry for p in plans_for("pararnn-table6") if p.layers == [1]]  # not the departure rows
    assert entries[:4] == ["khop", "khop2", "parity", "mqar"] and sorted(entries) == sorted(paper_depth)
    first = build_specs(plans_for("pararnn-table6-full")[0])[0]
    assert (first.task, first.task_options["k"], first.model.mixer) == ("khop", 1, "transformer")


def test_table_columns_follow_the_paper_not_the_run_order():
    rows = _rows("mqar", "flashgru", [0.9]) + _rows("keep_nth", "flashgru", [0.8])  # mqar ran first
    t = compare("pararnn-table6", {e: pd.DataFrame([r for r in rows if r["task"] == e]) for e in ("mqar", "keep_nth")})
    columns = list(comparison_frame("pararnn-table6", t).columns)
    assert columns[0] == "model" and columns.index("Keep-nth† n=5 V=128") < columns.index("MQAR κ=2 V=128")


def test_the_metric_line_names_each_column_once():
    """pararnn-table6's MQAR column holds two sweeps (1 and 2 layers): one ``MQAR ... `test/acc` `` in the line."""
    rows = _rows("mqar", "flashgru", [0.9]) + _rows("keep_nth", "flashgru", [0.8])
    results = {e: pd.DataFrame([r for r in rows if r["task"] == e]) for e in ("mqar", "keep_nth")}
    results["mqar_2layers"] = pd.DataFrame(_rows("mqar", "flashgru", [0.95])).assign(entry="mqar_2layers", layers=2)
    text = comparison_markdown("pararnn-table6", compare("pararnn-table6", results), {"device": "cpu"})
    metric = next(line for line in text.splitlines() if line.startswith("Metric: "))
    assert metric.count("MQAR κ=2 V=128 `test/acc`") == 1 and "Keep-nth† n=5 V=128 `test/last_acc`" in metric


def test_a_report_links_its_presets_evidence_file_only_when_there_is_one(tmp_path, monkeypatch):
    rows = _rows("mqar", "flashgru", [0.9])
    table = compare("pararnn-table6", {"mqar": pd.DataFrame(rows)})
    monkeypatch.setattr(paper_module, "REPORTS", tmp_path)
    assert "evidence" not in comparison_markdown("pararnn-table6", table, {"device": "cpu"}).lower()
    (tmp_path / "pararnn-table6.evidence.md").write_text("# Evidence\n")
    (tmp_path / "pararnn-table1.evidence.md").write_text("# Another preset's evidence\n")
    lines = comparison_markdown("pararnn-table6", table, {"device": "cpu"}).splitlines()
    linking = [line for line in lines if "evidence" in line.lower()]
    assert linking == [paper_module.evidence_link("pararnn-table6")]
    assert "](pararnn-table6.evidence.md)" in linking[0]


def test_every_committed_report_links_its_presets_evidence_file():
    """The committed reports are written by ``--copy-to`` and their evidence by hand: each report whose preset
    (its heading) has an evidence file carries the writer's link line; each evidence file belongs to a preset."""
    presets = set(reproduction_presets())
    evidence = sorted(paper_module.REPORTS.glob("*.evidence.md"))
    assert evidence, "no evidence files found"
    assert sorted({p.name.removesuffix(".evidence.md") for p in evidence} - presets) == []
    for report in sorted(set(paper_module.REPORTS.glob("*.md")) - set(evidence)):
        text = report.read_text()
        name = re.match(r"# Reproduction: (\S+)\n", text).group(1)
        link = paper_module.evidence_link(name)
        assert link is None or link in text.splitlines(), f"{report.name} lacks the line: {link}"


def test_table_rows_follow_the_paper_not_the_run_order():
    """Rows in the order of the paper's results (Grazzi: Transformer, mLSTM, sLSTM, Mamba, ...), whichever
    sweep ran first; a mixer the paper does not have comes last."""
    rows = {
        "arith_xlstm": _rows("arith_xlstm", "slstm", [0.5]) + _rows("arith_xlstm", "mlstm_exp", [0.4]),
        "arith": _rows("arith", "signed_deltanet", [0.9])
        + _rows("arith", "gru", [0.3])
        + _rows("arith", "transformer", [0.2]),
    }
    t = compare("grazzi-table3", {e: pd.DataFrame(r).assign(layers=3) for e, r in rows.items()})
    frame = comparison_frame("grazzi-table3", t)
    assert frame["model"].tolist() == [
        "transformer",
        "mlstm_exp",
        "slstm",
        "mamba",
        "signed_mamba",
        "deltanet",
        "signed_deltanet",
        "gru",
    ]


def test_devices_used_skips_trials_without_a_device():
    df = pd.DataFrame({"device": ["NVIDIA H200", float("nan"), "NVIDIA H200"]})  # an interrupted trial has none
    assert devices_used(df) == "NVIDIA H200" and devices_used(pd.DataFrame()) == "none yet"


def test_versions_are_those_the_finished_trials_recorded():
    """A failed trial's row carries the reporting process's versions (it recorded none): left out."""
    df = pd.DataFrame(
        {
            "status": ["ok", "failed", "ok"],
            "torch": ["2.11.0+cu130", "2.13.0+cpu", "2.11.0+cu130"],
            "commit": ["abc", "abc-dirty", "def"],
        }
    )
    assert trial_versions(df) == "torch 2.11.0+cu130, commit abc/def"


def _rows(entry, mixer, values, lrs=None):
    lrs = lrs or [1e-3] * len(values)
    return [
        {
            "entry": entry,
            "task": entry,
            "mixer": mixer,
            "seed": i,
            "lr": lr,
            "status": "ok",
            "test/acc": v,
            "test/last_acc": v,
            "extrap/mean_acc": v,
            "best_val_acc": v,
            "n_params": 1000,
            "steps": 100,
        }
        for i, (v, lr) in enumerate(zip(values, lrs))
    ]


@pytest.mark.slow
def test_compare_best_and_mean_at_best_lr():
    df = pd.DataFrame(_rows("parity", "flashgru", [0.5, 0.99, 0.7]) + _rows("parity", "mamba2", [0.5, 0.51, 0.52]))
    t = compare("pararnn-table1", {"parity": df}).set_index("mixer")
    assert t.loc["flashgru", "ours"] == 0.99 and t.loc["flashgru", "paper"] == 1.0
    assert (
        t.loc["mamba2", "ours"] == 0.52 and t.loc["transformer", "ours"] != t.loc["transformer", "ours"]
    )  # not run: NaN
    # mean over seeds at the lr whose mean validation accuracy is best
    rows = _rows("parity", "gru", [1.0, 0.9, 0.8], [1e-2] * 3) + _rows("parity", "gru", [0.95, 0.95, 0.95], [1e-3] * 3)
    t = compare("flashrnn-parity", {"parity": pd.DataFrame(rows)}).set_index("mixer")
    assert t.loc["gru", "ours"] == pytest.approx(0.95) and t.loc["gru", "lr"] == 1e-3
    assert [verdict(0.99, 1.0), verdict(0.5, 1.0), verdict(1.0, 0.5), verdict(0.5, 0.53)] == ["✓", "✗", "↑", "✓"]
    frame = comparison_frame("flashrnn-parity", t.reset_index()).set_index("model")
    assert frame.loc["gru"].iloc[0] == "95.0% ± 0.0 (1.0k) / 100% ✗"
    text = comparison_markdown("flashrnn-parity", t.reset_index(), {"device": "cpu", "date": "today"})
    assert "gru 95.0% vs 100%" in text and "| gru " in text
    assert "resumed" not in text and "summed: nan min." in text
    text = comparison_markdown("flashrnn-parity", t.reset_index(), {"trial_min": 114.6, "resumed": 16})
    assert "summed: 114.6 min (16 trials resumed from a checkpoint: their last invocation only)." in text


def test_final_weight_metrics_pick_the_lr_by_the_final_weights_validation():
    """A ``final/...`` metric scores the final weights, so per seed the lr is the one whose final weights
    validate best; the best checkpoint's metric keeps choosing by the best validation accuracy."""
    rows = _rows("arith", "signed_deltanet", [0.9, 0.8], [1e-2, 1e-2]) + _rows(
        "arith", "signed_deltanet", [0.7, 0.6], [1e-3] * 2
    )
    df = pd.DataFrame(rows).assign(layers=3)
    # lr 1e-2 had the best checkpoints (0.9, 0.8 validation) but collapsed by the end; 1e-3 ends at 1.0
    df["final_val_acc"] = [0.3, 0.4, 1.0, 1.0]
    df["range40-256/scaled_acc"] = [0.5, 0.45, 0.2, 0.1]  # best checkpoints
    df["final/range40-256/scaled_acc"] = [0.05, 0.15, 0.97, 0.35]  # final weights
    best = aggregate(df, "range40-256/scaled_acc", "best", 3).iloc[0]
    final = aggregate(df, "final/range40-256/scaled_acc", "best", 3).iloc[0]
    assert (best["value"], best["lr"]) == (0.5, 1e-2)
    assert (final["value"], final["lr"]) == (0.97, 1e-3)  # not 0.15: lr 1e-2's final weights validate worse
    mean = aggregate(df, "final/range40-256/scaled_acc", "mean_at_best_lr", 3).iloc[0]
    assert mean["lr"] == 1e-3 and mean["value"] == pytest.approx(0.66)
    assert selection_column("final/len64/acc") == "final_val_acc" and selection_column("len64/acc") == "best_val_acc"
    table = compare("grazzi-table3", {"arith": df})
    text = comparison_markdown("grazzi-table3", table, {"device": "cpu", "date": "today"})
    assert "per seed the lr whose final weights have the best validation accuracy" in text


def test_cells_whose_trials_skipped_updates_are_marked():
    """The skipped share is the chosen trials' skipped updates over their steps: 30 of 200 (15%) marks
    flashgru ⚠ and lists it under the table; 1 of 200 (0.5%, under 1%) leaves mamba2 unmarked."""
    rows = _rows("parity", "flashgru", [0.6, 0.7]) + _rows("parity", "mamba2", [0.5, 0.52])
    skipped = {("flashgru", 0): 10, ("flashgru", 1): 20, ("mamba2", 0): 1}
    for r in rows:
        r["steps"], r["newton/skipped_steps"] = 100, skipped.get((r["mixer"], r["seed"]), 0)
    t = compare("pararnn-table1", {"parity": pd.DataFrame(rows)})
    assert dict(zip(t["mixer"], t["skipped"]))["flashgru"] == pytest.approx(0.15)
    frame = comparison_frame("pararnn-table1", t).set_index("model")
    assert frame.loc["flashgru"].iloc[0].endswith("✗ ⚠") and "⚠" not in frame.loc["mamba2"].iloc[0]
    text = comparison_markdown("pararnn-table1", t, {"device": "cpu", "date": "today"})
    assert "parity/flashgru 15% of the steps" in text and "parity/mamba2" not in text.split("⚠ Trials")[1]


def test_cells_still_climbing_at_the_end_of_their_budget_are_listed():
    """A chosen trial that ran its whole budget with its best validation in the last 10% of it, below the
    early stop, was still climbing: the report lists its cell. Early-stopped or solved trials are not."""
    rows = (
        _rows("parity", "flashgru", [0.6, 0.7]) + _rows("parity", "mamba2", [0.5, 0.52]) + _rows("parity", "gru", [1.0])
    )
    for r in rows:
        r["max_steps"] = 100
        r["best_step"] = {("flashgru", 0): 95, ("flashgru", 1): 90, ("mamba2", 0): 100, ("mamba2", 1): 40}.get(
            (r["mixer"], r["seed"]), 100
        )
    rows[3]["steps"] = 60  # mamba2 seed 1 early-stopped at 60 of 100
    t = compare("pararnn-table1", {"parity": pd.DataFrame(rows)}).set_index("mixer")
    assert (t.loc["flashgru", "climbing"], t.loc["mamba2", "climbing"], t.loc["gru", "climbing"]) == (2, 1, 0)
    text = comparison_markdown("pararnn-table1", t.reset_index(), {"device": "cpu", "date": "today"})
    listed = text.split("Cells still climbing")[1].split("\n")[0]
    assert "parity/flashgru (2 of 2 seeds)" in listed and "parity/mamba2 (1 of 2 seeds)" in listed
    assert "parity/gru (" not in listed


def test_a_paper_metric_per_column():
    """``metric: {default: ..., entry: ...}`` picks the column the paper reports for each sweep."""
    paper = {"metric": {"default": "test/acc", "keep_nth": "test/last_acc"}}
    assert entry_metric(paper, "keep_nth") == "test/last_acc" and entry_metric(paper, "mqar") == "test/acc"
    assert entry_metric({"metric": "extrap/mean_acc"}, "parity") == "extrap/mean_acc"
    assert entry_metric({}, "parity") == "test/acc"
    assert entry_metric({"metric": "len{L}/exact"}, "a5_16", [16]) == "len16/exact"  # the sweep's own length
    assert entry_metric({"metric": "len{L}/exact"}, "a5", [8, 64, 32]) == "len64/exact"
    with pytest.raises(ValueError, match="needs the sweep's evaluation lengths"):
        entry_metric({"metric": "len{L}/exact"}, "parity")


def test_busy_seconds_is_the_length_of_the_union_of_trial_intervals():
    """Against a count of the covered seconds, on random overlapping, nested and disjoint intervals
    (trials without an end are left out)."""
    from optuna.trial import FrozenTrial, TrialState

    from experiments.sweeps.results import busy_seconds

    t0 = datetime.datetime(2026, 1, 1)

    def trial(number, start, end):
        return FrozenTrial(
            number=number,
            state=TrialState.COMPLETE if end is not None else TrialState.RUNNING,
            value=None,
            datetime_start=t0 + datetime.timedelta(seconds=start),
            datetime_complete=None if end is None else t0 + datetime.timedelta(seconds=end),
            params={},
            distributions={},
            user_attrs={},
            system_attrs={},
            intermediate_values={},
            trial_id=number,
        )

    rng = random.Random(7)
    for _ in range(50):
        spans = [(a, a + rng.randint(0, 40)) for a in (rng.randint(0, 200) for _ in range(rng.randint(0, 12)))]
        trials = [trial(i, a, b) for i, (a, b) in enumerate(spans)]
        covered = {s for a, b in spans for s in range(a, b)}
        assert busy_seconds([*reversed(trials), trial(99, 0, None)]) == len(covered)


def test_busy_seconds_ends_a_died_trial_at_its_last_sign_of_life():
    """Two invocations (0-100 s and 1000-1100 s) with the machine given back in between: the trials
    running at 100 s are marked died only at 1000 s. Their intervals end at their last validation
    (``alive``) or, without one, at the last other trial event inside them; the gap is not counted."""
    from optuna.trial import FrozenTrial, TrialState

    from experiments.sweeps.results import busy_seconds

    t0 = datetime.datetime(2026, 1, 1)
    at = lambda s: t0 + datetime.timedelta(seconds=s)  # noqa: E731

    def trial(number, start, end, **attrs):
        return FrozenTrial(
            number=number,
            state=TrialState.FAIL if attrs.get("failure") else TrialState.COMPLETE,
            value=None,
            datetime_start=at(start),
            datetime_complete=at(end),
            params={},
            distributions={},
            user_attrs=attrs,
            system_attrs={},
            intermediate_values={},
            trial_id=number,
        )

    first = [trial(0, 0, 60), trial(1, 10, 90)]
    died = trial(2, 20, 1000, failure="died", alive=at(95).isoformat())
    second = [trial(3, 1000, 1100)]
    assert busy_seconds([*first, died, *second]) == 95 + 100  # 0-95 (alive at 95), 1000-1100
    old_run = trial(2, 20, 1000, failure="died")  # a run from before the alive attribute: last event 90 s
    assert busy_seconds([*first, old_run, *second]) == 90 + 100
    assert busy_seconds([trial(5, 30, 1000, failure="died")]) == 0  # nothing else seen: its start
    assert busy_seconds([*first, trial(4, 20, 80, failure="interrupted")]) == 90  # an interrupted trial's end is real


def _makespan_by_events(seconds: list[float], workers: int) -> float:
    """Independent reference: a clock that advances to the next finish and hands the next trial to the idle worker."""
    import heapq

    running, queue, now = [], list(seconds), 0.0
    while queue or running:
        while queue and len(running) < workers:
            heapq.heappush(running, now + queue.pop(0))
        now = heapq.heappop(running)
    return now


def test_scheduled_minutes_lays_the_trials_on_the_workers_in_claim_order():
    # 4, 3, 3, 2 minutes on 2 workers: 4 | 3, then 3 after the 3, then 2 after the 4: 6 minutes
    df = pd.DataFrame({"wall_time_s": [240.0, 180.0, 180.0, 120.0]})
    assert scheduled_minutes(df, 2) == pytest.approx(6.0)
    assert scheduled_minutes(df, 1) == pytest.approx(12.0) and scheduled_minutes(df, 9) == pytest.approx(4.0)
    rng = random.Random(7)
    for _ in range(20):
        seconds = [rng.uniform(1, 500) for _ in range(rng.randint(1, 40))]
        workers = rng.randint(1, 17)
        got = scheduled_minutes(pd.DataFrame({"wall_time_s": seconds}), workers)
        assert got == pytest.approx(_makespan_by_events(seconds, workers) / 60)
    # a trial resumed at step 750 of 1000 timed its last quarter only: counted whole; failed trials have no time
    resumed = pd.DataFrame(
        {"wall_time_s": [60.0, 30.0, float("nan")], "steps": [1000, 1000, 40], "resumed_from_step": [0, 750, 0]}
    )
    assert scheduled_minutes(resumed, 1) == pytest.approx((60 + 120) / 60)
    assert math.isnan(scheduled_minutes(pd.DataFrame({"wall_time_s": [float("nan")]}), 4))
    assert math.isnan(scheduled_minutes(pd.DataFrame(), 4))


@pytest.mark.slow
def test_quick_reproduction_runs_resumes_and_writes_the_comparison(tmp_path):
    over = {
        "train": {"max_steps": 10, "train_size": 64, "val_size": 32, "test_size": 64},
        "mixers": ["gru", "flashgru"],
    }
    table = run_reproduction(
        "pararnn-table1", tmp_path, SweepOptions(progress=False), quick=True, overrides=over, entries=["parity"]
    )
    assert set(table["entry"]) == {"parity"} and table.set_index("mixer").loc["flashgru", "ours_params"] > 0
    text = (tmp_path / "pararnn-table1" / "reproduction.md").read_text()
    assert "QUICK" in text and "| flashgru " in text and "Cells: 2 of 2 finished" in text
    busy = float(re.search(r"time with trials running, over every invocation: ([0-9.]+) min", text).group(1))
    wall = float(re.search(r"wall time of this invocation: ([0-9.]+) min", text).group(1))
    assert 0 <= busy <= wall + 0.05
    # a quick check is laid on the workers it ran with (here in-process: 1), not the preset's budget
    assert re.search(r"laid on 1 worker\(s\) in claim order: [0-9.]+ min for one uninterrupted run", text)
    results = tmp_path / "pararnn-table1" / "parity" / "results.csv"
    assert len(pd.read_csv(results)) == 2
    mtime = results.stat().st_mtime_ns
    run_reproduction(
        "pararnn-table1", tmp_path, SweepOptions(progress=False), quick=True, overrides=over, entries=["parity"]
    )
    text = (tmp_path / "pararnn-table1" / "reproduction.md").read_text()
    assert re.search(r"\(and up-front model checks: [0-9.]+ min over 2 invocation\(s\)\)", text)
    df = pd.read_csv(results)
    assert len(df) == 2 and set(df["trial"]) == {0, 1}  # resumed: nothing re-ran
    assert set(df["status"]) == {"ok"}
    assert results.stat().st_mtime_ns >= mtime
    # pararnn-table6 in the same folder shares the cell: its parity sweep reuses the finished trials
    table6 = run_reproduction("pararnn-table6", tmp_path, quick=True, overrides=over, entries=["parity"], run=False)
    assert table6.set_index("mixer").loc["flashgru", "seeds"] == 1
    text6 = (tmp_path / "pararnn-table6" / "reproduction.md").read_text()
    assert "up-front model checks" not in text6  # it did not run, so it checked nothing


def test_mixers_restrict_the_table_to_those_rows(tmp_path, capsys):
    """``--mixers``: only those rows' cells (with ``--only``, of those sweeps); a sweep without any of them
    is left out; a mixer the preset does not have is a one-line error naming the valid ones."""
    table = run_reproduction(
        "pd-ssm-groups", tmp_path, quick=True, entries=["a5_2", "s5_4"], mixers=["pd_ssm"], run=False
    )
    assert list(table["mixer"]) == ["pd_ssm", "pd_ssm"] and list(table["entry"]) == ["a5_2", "s5_4"]
    rows = run_reproduction("pd-ssm-fsa", tmp_path, quick=True, mixers=["lstm", "pd_ssm"], run=False)
    assert set(rows["mixer"]) == {"lstm", "pd_ssm"} and len(rows) == 8  # 2 rows x 4 sweeps
    assert reproduce_main(["pd-ssm-groups", "--quick", "--table-only", "--out", str(tmp_path), "--mixers", "gru"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: unknown mixer(s) gru in pd-ssm-groups; valid: complex_diag, "
        "deltaproduct[householders=2,forget_gate=true], pd_ssm"
    )


def test_the_command_prints_where_its_report_is(tmp_path, capsys):
    assert reproduce_main(["pararnn-table1", "--quick", "--table-only", "--out", str(tmp_path), "--no-progress"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"report: {tmp_path / 'pararnn-table1' / 'reproduction.md'}")


@pytest.mark.slow
def test_cli_unknown_reproduction_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.reproduce", "nosuch"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and "unknown reproduction 'nosuch'; known: " in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_failed_cells_are_final_unless_retry_failed(tmp_path, monkeypatch):
    """A cell whose trial failed (here: NaN) is not re-run on resume, only with retry_failed."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    over = {
        "train": {"max_steps": 5, "train_size": 32, "val_size": 16, "test_size": 16},
        "mixers": ["nan_mixer:NaNMixer"],
    }
    args = dict(quick=True, overrides=over, entries=["parity"])
    quiet = SweepOptions(progress=False)
    results = tmp_path / "pararnn-table1" / "parity" / "results.csv"
    run_reproduction("pararnn-table1", tmp_path, quiet, **args)
    assert pd.read_csv(results)["status"].tolist() == ["failed"]
    run_reproduction("pararnn-table1", tmp_path, quiet, **args)
    assert set(pd.read_csv(results)["trial"]) == {0}
    run_reproduction("pararnn-table1", tmp_path, SweepOptions(progress=False, retry_failed=True), **args)
    df = pd.read_csv(results)
    assert set(df["trial"]) == {1} and df["status"].tolist() == ["failed"]  # re-ran (and failed again)


def test_state_tracking_reproductions_resolve_with_their_protocols():
    """The three state-tracking papers: depth, width and options as their protocols state; the paper
    numbers of Grazzi et al.'s Table 3 as printed; cells agree within the preset's tolerance."""
    grazzi = {p.entry: p for p in plans_for("grazzi-table3")}
    assert {e: p.layers for e, p in grazzi.items()} == {
        "parity": [2],
        "parity_slstm": [2],
        "parity_linear": [2],
        "arith": [3],
        "arith_xlstm": [3],
        "arith_slstm": [3],
        "arith_brackets": [3],
        "arith_brackets_xlstm": [3],
        "arith_brackets_slstm": [3],
    }
    # mLSTM and sLSTM on modular arithmetic at the paper's width 64 with one head, every other model at 128
    xlstm = [p for e, p in grazzi.items() if e.startswith("arith") and e.endswith("lstm")]
    assert sorted(p.mixers[0] for p in xlstm) == ["mlstm_exp", "mlstm_exp", "slstm", "slstm"]
    assert all(p.model.d_model == 64 and p.mixer_options == {p.mixers[0]: {"num_heads": 1}} for p in xlstm)
    assert {p.model.d_model for p in grazzi.values() if p not in xlstm} == {128}
    # as their code: sLSTM without the block's convolution, Mamba and DeltaNet on parity without weight decay
    assert {e for e, p in grazzi.items() if p.model.conv_kernel == 0} == {
        "parity_slstm",
        "arith_slstm",
        "arith_brackets_slstm",
    }
    assert {e: p.train.weight_decay for e, p in grazzi.items() if e.startswith("parity")} == {
        "parity": 0.1,
        "parity_slstm": 0.1,
        "parity_linear": 0.0,
    }
    assert grazzi["arith"].train.grad_clip == 1.0 and grazzi["arith_xlstm"].train.grad_clip == 1.0
    assert sum(len(p.mixers) * len(p.seeds) * len(p.lrs) for p in grazzi.values()) == 126
    assert grazzi["parity"].train.grad_clip is None and grazzi["parity"].train.min_lr == 1e-6
    # scored as the paper: test sequences of lengths drawn from 40..256
    assert {tuple(p.extrapolation["test_range"]) for p in grazzi.values()} == {(40, 256)}
    assert {p.train.test_size for p in grazzi.values()} == {4096}
    # the paper's scoring: every step trained (no early stop), the final weights scored
    assert {e.metric for e in paper_entries("grazzi-table3")} == {"final/range40-256/scaled_acc"}
    assert {p.train.early_stop_acc for p in grazzi.values()} == {1.0}
    steps = {e: p.train.max_steps for e, p in grazzi.items()}
    assert steps == {e: {"arith": 10_000, "arith_xlstm": 5000, "arith_slstm": 5000}.get(e, 2500) for e in grazzi}
    assert list(grazzi)[:3] == ["arith", "arith_xlstm", "arith_slstm"]  # the longest trials are claimed first
    quick = plans_for("grazzi-table3", quick=True)
    assert {tuple(p.extrapolation["test_range"]) for p in quick} == {(16, 32)}
    t3 = load_preset("grazzi-table3")["paper"]["results"]
    assert [t3[m]["arith"][0] for m in ("deltanet", "signed_deltanet")] == [0.314, 0.971]
    assert [verdict(0.9, 0.971, 0.15), verdict(0.8, 0.971, 0.15), verdict(0.3, 0.1, 0.15)] == ["✓", "✗", "↑"]
    groups = plans_for("deltaproduct-groups")
    assert "deltaproduct[householders=4]" in groups[0].mixers and groups[0].extrapolation["eval_lengths"][-1] == 512
    assert {p.train.warmup_ratio for p in groups} == {0.0}  # the paper's schedule: no warm-up
    illusion = plans_for("illusion-of-state")
    assert illusion[0].layers == [1, 2, 3, 4] and {p.task_options["group"] for p in illusion} == {"A5", "A4xZ5", "Z60"}
    deep = [p for p in illusion if p.mixers == ["transformer", "mamba"]]
    rnn = [p for p in illusion if p.mixers == ["lstm"]]
    assert len(deep) == 9 and len(rnn) == 12 and {tuple(p.layers) for p in rnn} == {(1,)}
    assert {p.train.warmup_ratio for p in deep} == {0.0}  # the paper's lr is constant: no warm-up
    # long enough for the climbing deep cells (10k steps), stopped where they plateau; the RNN runs its 20k
    assert {(p.train.max_steps, p.train.plateau_steps) for p in deep} == {(10_000, 2_500)}
    assert {p.train.plateau_steps for p in rnn} == {None}
    # the RNN under the protocol that learned A5 in the state-tracking preset: bare mixer, lr 1e-2, 20k steps
    st_lstm = resolve_sweep("a5", "state-tracking")
    assert {(p.model.block, p.model.d_model, p.lrs[0], p.train.max_steps, p.train.warmup_ratio) for p in rnn} == {
        (
            st_lstm.model.block,
            st_lstm.model.d_model,
            st_lstm.lrs[0],
            st_lstm.train.max_steps,
            st_lstm.train.warmup_ratio,
        )
    }
    # as the paper: one model per training length k (lengths 2..k), tested at k, for both families
    for family, ks in ((deep, (4, 8, 16)), (rnn, (4, 8, 16, 32))):
        lengths = {(p.task_options["group"], p.extrapolation["max_len"]) for p in family}
        assert lengths == {(g, k) for g in ("A5", "A4xZ5", "Z60") for k in ks}
    assert all(p.extrapolation["eval_lengths"] == [p.extrapolation["max_len"]] for p in illusion)
    assert paper_solved("illusion-of-state") == 0.9 and paper_solved("deltaproduct-groups") == 0.98
    assert [verdict(0.92, 1.0, solved=0.9), verdict(0.92, 1.0), verdict(0.92, 0.0, solved=0.9)] == ["✓", "✗", "↑"]
    quick = plans_for("illusion-of-state", quick=True)
    assert quick[0].layers == [1, 2] and quick[0].seeds == [0]
    # --quick caps each sweep's lengths (train <= 16, test <= 32): the k sweeps stay distinct, with their own metric
    shapes = {(p.entry, p.extrapolation["max_len"], tuple(p.extrapolation["eval_lengths"])) for p in quick}
    assert {s for s in shapes if s[0].startswith("a5_")} == {
        ("a5_4", 4, (4,)),
        ("a5_8", 8, (8,)),
        ("a5_16", 16, (16,)),
        ("a5_4_rnn", 4, (4,)),
        ("a5_8_rnn", 8, (8,)),
        ("a5_16_rnn", 16, (16,)),
        ("a5_32_rnn", 16, (32,)),
    }


def test_a_solved_line_outside_zero_one_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(paper_module, "load_reproduction", lambda name: {"paper": {"solved": 1.5}})
    with pytest.raises(ValueError, match=r"paper: solved must be in \(0, 1\], got 1.5"):
        paper_module.paper_solved("any")


def test_a_length_metric_not_evaluated_falls_back_to_the_longest_length_evaluated():
    """``--quick`` evaluates at 16 and 32: a paper metric at length 512 shows the length-32 one instead."""
    nan = float("nan")
    df = pd.DataFrame({"len16/acc": [0.5, 0.6], "len32/acc": [0.4, nan], "len64/acc": [nan, nan], "test/acc": [1, 1]})
    assert evaluated_metric("len512/acc", df) == "len32/acc"
    assert evaluated_metric("len16/acc", df) == "len16/acc"
    assert evaluated_metric("len512/exact", df) == "len512/exact"  # nothing to fall back to
    assert evaluated_metric("test/last_acc", df) == "test/last_acc"
    # a range test set: the evaluated range reaching furthest
    ranged = pd.DataFrame(
        {"range16-32/scaled_acc": [0.3], "range8-24/scaled_acc": [0.9], "range40-256/scaled_acc": [nan]}
    )
    assert evaluated_metric("range40-256/scaled_acc", ranged) == "range16-32/scaled_acc"
    assert evaluated_metric("range40-256/acc", ranged) == "range40-256/acc"
    # the final weights' metrics fall back among the final weights' columns only
    final = ranged.assign(**{"final/range8-24/scaled_acc": [0.2], "final/range40-256/scaled_acc": [nan]})
    assert evaluated_metric("final/range40-256/scaled_acc", final) == "final/range8-24/scaled_acc"
    assert evaluated_metric("final/len512/acc", df) == "final/len512/acc"


def test_deltaproduct_groups_paper_trains_on_the_papers_data_budget():
    """deltaproduct-groups-paper: the cells of deltaproduct-groups (mixers, lrs, seeds, tasks, width), trained
    on length 128 only for at least the paper's 9.9M sequences (100 epochs of 99,000), tested at 512, every
    step trained."""
    base = {p.entry: p for p in plans_for("deltaproduct-groups")}
    paper = {p.entry: p for p in plans_for("deltaproduct-groups-paper")}
    assert paper.keys() == base.keys() == {"s3", "s4", "a5", "s5"}
    for entry, p in paper.items():
        b = base[entry]
        assert (p.mixers, p.lrs, p.seeds, p.model.d_model) == (b.mixers, b.lrs, b.seeds, b.model.d_model)
        assert p.train.max_steps * p.train.batch_size >= 9_900_000 and p.train.train_size == 99_000
        assert (p.extrapolation["min_len"], p.extrapolation["max_len"]) == (128, 128)
        assert p.extrapolation["eval_lengths"][-1] == 512 and p.train.warmup_ratio == 0.0
        assert p.train.early_stop_acc > 1.0  # no early stop: the whole budget, as the paper
    assert load_preset("deltaproduct-groups-paper")["paper"] == load_preset("deltaproduct-groups")["paper"]


def test_grazzi_table3_long_trains_its_cells_on_ten_times_the_sequences():
    """grazzi-table3-long: grazzi-table3's cells (mixers, lrs, seeds, width, layers, task options), each
    trained on at least ten times its sequences per trial, at the paper's batch, length-bucketed, as long
    as grazzi-table3 trains (its early-stop rule), over its training set at most 26 times; the same paper
    table."""
    base = {p.entry: p for p in plans_for("grazzi-table3")}
    long = {p.entry: p for p in plans_for("grazzi-table3-long")}
    assert long.keys() == base.keys()
    for entry, p in long.items():
        b = base[entry]
        assert (p.mixers, p.lrs, p.seeds, p.model.d_model, p.task_options) == (
            b.mixers,
            b.lrs,
            b.seeds,
            b.model.d_model,
            b.task_options,
        )
        assert p.layers == b.layers and p.train.weight_decay == b.train.weight_decay
        assert p.train.max_steps * p.train.batch_size >= 10 * b.train.max_steps * b.train.batch_size, entry
        assert p.train.batch_size == 1024 and p.train.length_bucketing > 0
        assert p.train.max_steps * p.train.batch_size <= 26 * p.train.train_size
        assert p.train.early_stop_acc == b.train.early_stop_acc and p.extrapolation == b.extrapolation
    assert load_preset("grazzi-table3-long")["paper"] == load_preset("grazzi-table3")["paper"]


def test_state_tracking_long_gives_a5_and_s5_their_budget():
    """state-tracking-long: state-tracking's cells, A5 and S5 for at least 100,000 steps, the other tasks as
    there, every batch length-bucketed; the same claims."""
    base = {p.entry: p for p in plans_for("state-tracking")}
    long = {p.entry: p for p in plans_for("state-tracking-long")}
    assert long.keys() == base.keys()
    for entry, p in long.items():
        b = base[entry]
        assert (p.mixers, p.lrs, p.seeds, p.layers, p.mixer_layers) == (
            b.mixers,
            b.lrs,
            b.seeds,
            b.layers,
            b.mixer_layers,
        )
        assert (p.task_options, p.extrapolation, p.train.batch_size) == (
            b.task_options,
            b.extrapolation,
            b.train.batch_size,
        )
        want = 100_000 if entry in ("a5", "s5") else b.train.max_steps
        assert p.train.max_steps == want and p.train.length_bucketing > 0, entry
    assert load_preset("state-tracking-long")["paper"] == load_preset("state-tracking")["paper"]
