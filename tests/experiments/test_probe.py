"""``experiments.probe`` on cells defined here: report card, rules, verdict, sweeps next to a reference."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.probe import main, probe
from experiments.sweeps.runner import SweepOptions

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"  # example_cells.py


@pytest.mark.slow
def test_probe_quick_on_a_test_cell_writes_the_report_card(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    numbers = probe(
        "example_cells:DiagCell",
        tmp_path,
        SweepOptions(progress=False),
        quick=True,
        tasks=["parity"],
        references=["gru"],
        max_steps=30,
        lengths=[16, 64],
    )
    assert numbers["rules"]["jacobian"]["ok"] and numbers["rules"]["position_wise"]["ok"] and numbers["verdict"]["ok"]
    for dtype, bound in (("float64", 1e-9), ("float32", 1e-4)):
        a = numbers["agreement"][dtype]
        assert a["forward"] < bound and a["grad_input"] < bound and a["grad_params"] < bound, a
    assert [r["length"] for r in numbers["convergence"]] == [16, 64]
    assert all(r["iters_to_tol"] is not None and r["iters_to_tol"] <= 8 for r in numbers["convergence"])
    acc = numbers["sweeps"]["acc"]
    assert set(acc) == {"example_cells:DiagCell", "gru"} and all(0 <= a["parity"] <= 1 for a in acc.values())
    report = (tmp_path / "probe-report.md").read_text()
    for heading in (
        "**Verdict: PASS",
        "## 1. Rules",
        "## 2. Newton-parallel vs sequential",
        "## 3. Newton iterations",
        "## 4. Tasks",
        "| example_cells:DiagCell ",
        "| gru ",
    ):
        assert heading in report
    df = pd.read_csv(tmp_path / "parity" / "results.csv")
    assert set(df["mixer"]) == {"example_cells:DiagCell", "gru"} and set(df["status"]) == {"ok"}
    # section 3 at the trained parameters: the fallback share it shows is the training runs' own
    (trained,) = numbers["trained_convergence"]
    cell = df[df["mixer"] == "example_cells:DiagCell"].iloc[0]
    assert trained["task"] == "parity" and len(trained["residuals"]) == 13
    assert trained["fallback"] == cell["newton/fallback_count"] / cell["newton/newton_forwards"]
    assert "At the trained parameters" in report and "| parity " in report.split("At the trained parameters")[1]
    assert json.loads((tmp_path / "probe.json").read_text())["cell"] == "example_cells:DiagCell"


@pytest.mark.slow
def test_probe_sweeps_the_state_tracking_tasks_beyond_the_training_lengths(tmp_path, monkeypatch):
    """The report card's z3 column is the mean accuracy at the evaluation lengths beyond training (quick: 16, 32)."""
    monkeypatch.syspath_prepend(str(TESTS))
    numbers = probe(
        "example_cells:DiagCell",
        tmp_path,
        SweepOptions(progress=False),
        quick=True,
        tasks=["z3"],
        references=["gru"],
        max_steps=30,
        lengths=[16],
    )
    df = pd.read_csv(tmp_path / "z3" / "results.csv")
    assert set(df["task"]) == {"modular_count"} and set(df["status"]) == {"ok"}
    assert {"len16/acc", "len32/acc", "extrap/mean_acc"} <= set(df.columns)
    by_mixer = df.set_index("mixer")["extrap/mean_acc"]
    assert numbers["sweeps"]["acc"]["gru"]["z3"] == by_mixer["gru"] and 0 <= by_mixer["gru"] <= 1
    report = (tmp_path / "probe-report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| mixer "))
    assert [c.strip() for c in header.strip("|").split("|")] == ["mixer", "z3", "solved"]
    assert "z3: mean accuracy beyond the training lengths" in report


def _probe_cli(cell, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(
        [f"example_cells:{cell}", "--no-sweeps", "--quick", "--lengths", "16", "--out", str(tmp_path), "--no-progress"]
    )
    return code, (tmp_path / "probe-report.md").read_text(), json.loads((tmp_path / "probe.json").read_text())


def test_probe_fails_a_wrong_jacobian_declaration(tmp_path, monkeypatch, capsys):
    code, report, numbers = _probe_cli("DenseDeclaredDiag", tmp_path, monkeypatch)
    assert f"report: {tmp_path / 'probe-report.md'} (numbers: {tmp_path / 'probe.json'})" in capsys.readouterr().out
    assert code == 1 and numbers["verdict"]["rules"] == ["declared Jacobian structure", "Newton-parallel vs sequential"]
    assert "**Verdict: FAIL: breaks its declared Jacobian structure" in report and "declare jacobian='dense'" in report
    assert "**WRONG**" in report and "## 3." not in report  # no convergence table for a failed cell
    a = numbers["agreement"]["float64"]  # the consequence, shown: right forward, wrong gradients
    assert a["forward"] < 1e-9 and a["grad_input"] > 1e-2 and not a["within"]


def test_probe_fails_a_coupling_that_starts_at_zero(tmp_path, monkeypatch):
    """Parallel and sequential agree at the built parameters; the rule check at moved parameters fails it."""
    code, report, numbers = _probe_cli("ZeroCouplingDiag", tmp_path, monkeypatch)
    assert code == 1 and numbers["verdict"]["rules"] == ["declared Jacobian structure"]
    assert all(numbers["agreement"][d]["within"] for d in ("float64", "float32"))
    assert "at randomly moved parameters" in report and "declare jacobian='dense'" in report
    assert numbers["rules"]["jacobian"]["param_draws"] == 8


def test_probe_never_blames_a_jacobian_fn_the_cell_does_not_define(tmp_path, monkeypatch):
    """A diagonal declaration whose off-diagonal entries are each within tolerance but add up beyond it:
    the Jacobian the solve uses (autograd in the declared structure) is off; the cell has no jacobian_fn."""
    code, report, numbers = _probe_cli("WeaklyCoupledDiag", tmp_path, monkeypatch)
    assert code == 1 and numbers["verdict"]["rules"][0] == "declared Jacobian structure", numbers["verdict"]
    assert "jacobian_fn" not in report and "closed-form" not in report, report


def test_probe_fails_a_step_that_mixes_positions(tmp_path, monkeypatch):
    code, report, numbers = _probe_cli("RunningMeanOverTime", tmp_path, monkeypatch)
    assert code == 1 and numbers["verdict"]["rules"][0] == "position-wise rule"
    assert "**Verdict: FAIL: breaks the position-wise rule; Newton-parallel and sequential disagree**" in report
    assert "- position-wise step: **BROKEN**" in report
    assert numbers["agreement"]["float64"]["forward"] > 0.1  # the table's error, now with its cause named
    assert numbers["rules"]["jacobian"]["ok"]  # one position at a time the Jacobian is diagonal


def test_probe_fails_a_non_finite_cell(tmp_path, monkeypatch):
    code, report, numbers = _probe_cli("NonFiniteCell", tmp_path, monkeypatch)
    assert code == 1 and numbers["verdict"]["rules"] == ["non-finite"]
    assert "**Verdict: FAIL: non-finite states or gradients**" in report


@pytest.mark.parametrize(
    "cell", ["mixers.cells.flash:FlashGRUCell", "mixers.cells.flash:FlashLSTMCell", "example_cells:DenseCell"]
)
def test_probe_passes_honest_cells(cell, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    numbers = probe(cell, tmp_path, SweepOptions(progress=False), quick=True, lengths=[16], run_sweeps=False)
    assert numbers["verdict"]["ok"], numbers["verdict"]
    for dtype, bound in (("float64", 1e-9), ("float32", 1e-4)):
        a = numbers["agreement"][dtype]
        assert a["forward"] < bound and a["grad_input"] < bound and a["grad_params"] < bound, a
    assert numbers["agreement"]["jacobian_at_states"] is None


@pytest.mark.slow
def test_probe_cli_errors_are_one_line(tmp_path):
    for argv, message in (
        (["nosuchmodule:Cell"], "cannot import module 'nosuchmodule'"),
        (["test_probe:ROOT"], "is not an RNNCell subclass"),
        (["example_cells:DiagCell", "--tasks", "parity,nope"], "--tasks: unknown nope"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.probe", *argv, "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}{os.pathsep}{Path(__file__).parent}"},
        )
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
