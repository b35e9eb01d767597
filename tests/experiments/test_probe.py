"""``experiments.probe`` on cells defined here: report card, checks, sweeps next to a reference."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from experiments.probe import main, probe
from mixers.cells import RNNCell

ROOT = Path(__file__).resolve().parents[2]


class ProbeTanhCell(RNNCell):
    """h' = tanh(w * h + W x): a diagonal Jacobian."""

    jacobian = "diag"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.w = nn.Parameter(torch.rand(d_state) * 1.6 - 0.8)
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        return torch.tanh(self.w * h + x @ self.W)


class ProbeMisdeclaredCell(ProbeTanhCell):
    """Declares a diagonal Jacobian but mixes the state channels (dense)."""

    def __init__(self, d_in, d_state):
        super().__init__(d_in, d_state)
        self.R = nn.Parameter(torch.randn(d_state, d_state) * 0.3)

    def recurrence_step(self, h, x):
        return torch.tanh(h @ self.R + x @ self.W)


def test_probe_quick_on_a_test_cell_writes_the_report_card(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    numbers = probe("test_probe:ProbeTanhCell", tmp_path, quick=True, tasks=["parity"], references=["gru"],
                    max_steps=30, lengths=[16, 64], progress=False)
    assert numbers["jacobian"]["ok"]
    for dtype, bound in (("float64", 1e-9), ("float32", 1e-4)):
        a = numbers["agreement"][dtype]
        assert a["forward"] < bound and a["grad_input"] < bound and a["grad_params"] < bound, a
    assert [r["length"] for r in numbers["convergence"]] == [16, 64]
    assert all(r["iters_to_tol"] is not None and r["iters_to_tol"] <= 8 for r in numbers["convergence"])
    acc = numbers["sweeps"]["acc"]
    assert set(acc) == {"test_probe:ProbeTanhCell", "gru"} and all(0 <= a["parity"] <= 1 for a in acc.values())
    report = (tmp_path / "probe-report.md").read_text()
    for heading in ("## 1. Jacobian structure", "## 2. Newton-parallel vs sequential", "## 3. Newton iterations",
                    "## 4. Tasks", "| test_probe:ProbeTanhCell |", "| gru |"):
        assert heading in report
    df = pd.read_csv(tmp_path / "parity" / "results.csv")
    assert set(df["mixer"]) == {"test_probe:ProbeTanhCell", "gru"} and set(df["status"]) == {"ok"}
    assert json.loads((tmp_path / "probe.json").read_text())["cell"] == "test_probe:ProbeTanhCell"


def test_probe_flags_a_wrong_jacobian_declaration(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert main(["test_probe:ProbeMisdeclaredCell", "--no-sweeps", "--out", str(tmp_path), "--no-progress"]) == 0
    report = (tmp_path / "probe-report.md").read_text()
    assert "**WRONG**" in report and "declare jacobian='dense'" in report
    assert "## 2." not in report  # no Newton checks on a wrong declaration


def test_probe_cli_errors_are_one_line(tmp_path):
    for argv, message in ((["nosuchmodule:Cell"], "cannot import module 'nosuchmodule'"),
                          (["test_probe:ROOT"], "is not an RNNCell subclass"),
                          (["test_probe:ProbeTanhCell", "--tasks", "parity,nope"], "--tasks: unknown nope")):
        proc = subprocess.run([sys.executable, "-m", "experiments.probe", *argv, "--out", str(tmp_path)],
                              capture_output=True, text=True, cwd=Path(__file__).parent,
                              env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent}"})
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
