"""The sweep: results files, resume without re-running, interrupted trials, NaN trials, CLI errors."""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from experiments.presets import resolve_sweep
from experiments.study import open_storage, open_study
from experiments.sweep import main, run_sweep

ROOT = Path(__file__).resolve().parents[2]
TINY = {"max_steps": 20, "batch_size": 16, "train_size": 64, "val_size": 32, "test_size": 32, "eval_every": 10}


def tiny_plan(mixers, seeds=(0,), lrs=(1e-3,)):
    return resolve_sweep("parity", "smoke", {"mixers": list(mixers), "seeds": list(seeds), "lrs": list(lrs), "train": TINY,
                                             "extrapolation": {"min_len": 3, "max_len": 8, "eval_lengths": [12]}})


def trial_states(out, name="parity-smoke"):
    study = open_study(open_storage(None, out), name)
    return [t.state for t in study.get_trials(deepcopy=False)]


def test_sweep_writes_results_and_resumes_without_rerunning(tmp_path):
    plan = tiny_plan(["gru", "elman"], seeds=[0, 1])
    df = run_sweep(plan, tmp_path, progress=False)
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert {"test/acc", "len12/acc", "extrap/mean_acc", "n_params", "torch", "commit"} <= set(df.columns)
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert len(on_disk) == 4 and (tmp_path / "table.md").read_text().count("| parity |") == 2
    assert len(trial_states(tmp_path)) == 4
    run_sweep(plan, tmp_path, progress=False)  # resume: nothing left to do
    assert trial_states(tmp_path) == [TrialState.COMPLETE] * 4
    # a larger grid on the same storage runs only the new cells
    run_sweep(tiny_plan(["gru", "elman"], seeds=[0, 1, 2]), tmp_path, progress=False)
    assert trial_states(tmp_path).count(TrialState.COMPLETE) == 6


def test_interrupted_trial_is_rerun_once(tmp_path):
    plan = tiny_plan(["gru"], seeds=[0, 1])
    from experiments.study import cell_id, sync_grid
    from experiments.sweep import build_specs

    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    specs = build_specs(plan)
    sync_grid(study, specs)
    # simulate a worker killed mid-trial: RUNNING, claimed by a pid that no longer exists
    waiting = study.get_trials(states=(TrialState.WAITING,))[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    study._storage.set_trial_state_values(waiting._trial_id, TrialState.RUNNING)
    import socket
    study._storage.set_trial_system_attr(waiting._trial_id, "worker", {"host": socket.gethostname(), "pid": dead.pid})
    df = run_sweep(plan, tmp_path, progress=False)
    states = trial_states(tmp_path)
    assert states.count(TrialState.COMPLETE) == 2 and states.count(TrialState.FAIL) == 1
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert {cell_id(s) for s in specs} == set(t.user_attrs["cell"] for t in optuna.load_study(
        study_name="parity-smoke", storage=open_storage(None, tmp_path)).get_trials() if t.state == TrialState.COMPLETE)


def test_nan_trial_fails_cleanly_and_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    plan = tiny_plan(["nan_mixer:NaNMixer", "gru"])
    df = run_sweep(plan, tmp_path, progress=False)
    by_mixer = df.set_index("mixer")
    assert by_mixer.loc["nan_mixer:NaNMixer", "status"] == "failed"
    assert by_mixer.loc["nan_mixer:NaNMixer", "failure"] == "nan"
    assert "NaN" in by_mixer.loc["nan_mixer:NaNMixer", "error"] or "nan" in by_mixer.loc["nan_mixer:NaNMixer", "error"]
    assert by_mixer.loc["gru", "status"] == "ok"
    table = (tmp_path / "table.md").read_text()
    assert "| parity | nan_mixer:NaNMixer | – | 0 | 1 |" in table
    run_sweep(plan, tmp_path, progress=False)  # a NaN result is final: not re-run
    assert trial_states(tmp_path).count(TrialState.FAIL) == 1


@pytest.mark.parametrize("argv,message", [
    (["nosuchtask"], "unknown task 'nosuchtask'; known tasks:"),
    (["parity", "--preset", "nosuch"], "unknown preset 'nosuch'; known presets:"),
    (["parity", "--preset", "smoke", "--mixers", "gru,nosuch"], "unknown mixer 'nosuch'"),
    (["parity", "--preset", "smoke", "--task-option", "seq_len=0"], "seq_len must be >= 1"),
])
def test_cli_user_errors_are_one_line(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "experiments.sweep", *argv, "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_help_explains_everything(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in ("--mixers", "--seeds", "--lrs", "--preset", "--out", "--storage", "resumes", "module.path:CellClass"):
        assert word in text
