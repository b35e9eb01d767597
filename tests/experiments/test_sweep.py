"""The sweep: results files, resume without re-running, interrupted trials, NaN trials, what Optuna sees, CLI errors."""

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from optuna.trial import TrialState

from experiments.sweep import main, run_sweep
from experiments.sweeps.presets import build_specs, resolve_sweep
from experiments.sweeps.runner import SweepOptions
from experiments.sweeps.study import GridStudy, cell_id
from experiments.trial.shape import ModelShape

ROOT = Path(__file__).resolve().parents[2]
TINY = {"max_steps": 20, "batch_size": 16, "train_size": 64, "val_size": 32, "test_size": 32, "eval_every": 10}


def tiny_plan(mixers, seeds=(0,), lrs=(1e-3,)):
    return resolve_sweep(
        "parity",
        "smoke",
        {
            "mixers": list(mixers),
            "seeds": list(seeds),
            "lrs": list(lrs),
            "train": TINY,
            "extrapolation": {"min_len": 3, "max_len": 8, "eval_lengths": [12]},
        },
    )


def plain_study(out, name="parity-smoke"):
    """The sweep's study opened with plain Optuna, as optuna-dashboard or a user would."""
    return optuna.load_study(
        study_name=name,
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "journal.log"))),
    )


def trial_states(out, name="parity-smoke"):
    return [t.state for t in plain_study(out, name).get_trials(deepcopy=False)]


@pytest.mark.slow
def test_sweep_writes_results_and_resumes_without_rerunning(tmp_path):
    plan = tiny_plan(["gru", "elman"], seeds=[0, 1])
    df = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert {
        "test/acc",
        "test/last_acc",
        "final/test/acc",
        "len12/acc",
        "extrap/mean_acc",
        "n_params",
        "torch",
        "commit",
        "best_step",
        "trainset/acc",
        "final/trainset/acc",
    } <= set(df.columns)
    assert "trainset acc" in (tmp_path / "table.md").read_text()
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert len(on_disk) == 4 and (tmp_path / "table.md").read_text().count("| parity ") == 2
    assert len(trial_states(tmp_path)) == 4
    run_sweep(plan, tmp_path, SweepOptions(progress=False))  # resume: nothing left to do
    assert trial_states(tmp_path) == [TrialState.COMPLETE] * 4
    # a larger grid on the same storage runs only the new cells
    run_sweep(tiny_plan(["gru", "elman"], seeds=[0, 1, 2]), tmp_path, SweepOptions(progress=False))
    assert trial_states(tmp_path).count(TrialState.COMPLETE) == 6
    # one folder per cell, with the best and last checkpoints
    folders = sorted((tmp_path / "trials").iterdir())
    assert len(folders) == 6 and all((f / "checkpoints" / "best.ckpt").is_file() for f in folders)


@pytest.mark.slow
def test_plain_optuna_sees_the_cells_values_and_learning_curves(tmp_path):
    """What optuna-dashboard reads: parameters with the grid's distributions, the validation metric as the value,
    the validation accuracy after every evaluation as intermediate values, test metrics as attributes."""
    plan = tiny_plan(["gru", "elman"], seeds=[0, 1], lrs=[1e-3, 3e-3])
    df = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    study = plain_study(tmp_path)
    frame = study.trials_dataframe()
    assert {"params_mixer", "params_seed", "params_lr", "params_task", "params_entry", "value"} <= set(frame.columns)
    assert sorted(zip(frame["params_mixer"], frame["params_seed"], frame["params_lr"])) == sorted(
        (m, s, lr) for m in ("gru", "elman") for s in (0, 1) for lr in (1e-3, 3e-3)
    )
    by_cell = df.set_index(["mixer", "seed", "lr"])
    for t in study.trials:
        row = by_cell.loc[(t.params["mixer"], t.params["seed"], t.params["lr"])]
        assert t.value == pytest.approx(row["best_val_acc"])  # the selection metric, not the test accuracy
        assert t.user_attrs["result"]["test/acc"] == pytest.approx(row["test/acc"])
        assert sorted(t.intermediate_values) == [10, 20]  # eval_every = 10 of 20 steps
        assert max(t.intermediate_values.values()) == pytest.approx(t.value)
        # the last validation's time: a died trial's end for the run's busy time
        assert t.datetime_start < datetime.datetime.fromisoformat(t.user_attrs["alive"]) <= t.datetime_complete
        assert t.distributions["lr"].log and t.distributions["mixer"].choices == ("elman", "gru")


def _make_running(grid, number, pid):
    trial_id = grid.trial_id(number)
    grid.storage.set_trial_state_values(trial_id, TrialState.RUNNING)
    grid.storage.set_trial_system_attr(trial_id, "worker", {"host": socket.gethostname(), "pid": pid})


def test_interrupted_trial_is_rerun_once(tmp_path, caplog):
    plan = tiny_plan(["gru"], seeds=[0, 1])
    specs = build_specs(plan)
    grid = GridStudy.open(None, tmp_path, "parity-smoke")
    grid.sync([("parity", s) for s in specs])
    # simulate a worker killed mid-trial: RUNNING, claimed by a pid that no longer exists
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _make_running(grid, grid.trials(states=(TrialState.WAITING,))[0].number, dead.pid)
    with caplog.at_level("INFO", logger="experiments"):
        df = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert ", 1 cell(s) of dead workers re-queued" in caplog.text
    states = trial_states(tmp_path)
    assert states.count(TrialState.COMPLETE) == 2 and states.count(TrialState.FAIL) == 1
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert {cell_id(s) for s in specs} == {
        t.user_attrs["cell"] for t in plain_study(tmp_path).trials if t.state == TrialState.COMPLETE
    }


def test_nan_trial_fails_cleanly_and_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    plan = tiny_plan(["nan_mixer:NaNMixer", "gru"])
    df = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    by_mixer = df.set_index("mixer")
    assert by_mixer.loc["nan_mixer:NaNMixer", "status"] == "failed"
    assert by_mixer.loc["nan_mixer:NaNMixer", "failure"] == "nan"
    assert "nan" in by_mixer.loc["nan_mixer:NaNMixer", "error"].lower()
    assert by_mixer.loc["gru", "status"] == "ok"
    # the failed trial recorded no versions, and the reporting process's are not filled in for it
    assert by_mixer.loc["gru", "torch"] == torch.__version__ and pd.isna(by_mixer.loc["nan_mixer:NaNMixer", "torch"])
    table = (tmp_path / "table.md").read_text()
    row = next(line for line in table.splitlines() if "nan_mixer" in line)
    assert [c.strip() for c in row.strip("|").split("|")][3:6] == ["–", "0", "1"]  # params, seeds, failed
    run_sweep(plan, tmp_path, SweepOptions(progress=False))  # a NaN result is final: not re-run
    assert trial_states(tmp_path).count(TrialState.FAIL) == 1


def test_unfinished_cells_are_visible_in_the_table(tmp_path):
    """A grid with cells never run shows them as missing, with a line saying how to finish them."""
    from experiments.sweeps.results import collect, table_markdown

    plan = tiny_plan(["gru", "elman"])
    run_sweep(
        resolve_sweep("parity", "smoke", {**_plan_overrides(plan), "mixers": ["gru"]}),
        tmp_path,
        SweepOptions(progress=False),
    )
    grid = GridStudy.open(None, tmp_path, "parity-smoke")
    df = collect(grid, [("parity", s) for s in build_specs(plan)])
    assert df.set_index("mixer")["status"].to_dict() == {"gru": "ok", "elman": "missing"}
    text = table_markdown(df)
    assert "1 cell(s) have no result yet" in text and "| elman " in text


def _plan_overrides(plan):
    return {"seeds": plan.seeds, "lrs": plan.lrs, "train": TINY, "extrapolation": plan.extrapolation}


SLOW_MIXER = "test_workers:SlowMixer"


def _sweep_cmd(out, *extra):
    return [
        sys.executable,
        "-m",
        "experiments.sweep",
        "parity",
        "--preset",
        "smoke",
        "--mixers",
        SLOW_MIXER,
        "--max-steps",
        "200",
        "--task-option",
        "seq_len=8",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def _env():
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent}"}


def _ctrl_c_as_at_a_terminal():
    """A terminal's foreground job has SIGINT at its default; a job started with ``&`` by a non-interactive
    shell (as CI runners may start the tests) inherits it ignored, and Python then keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _trained_step(out) -> int:
    """The last training step any trial of ``out`` has written to its ``progress.csv`` (0: none yet)."""
    steps = [
        int(line.split(",")[1])
        for f in out.glob("trials/*/progress.csv")
        for line in f.read_text().splitlines()[1:]
        if line.count(",") == 3
    ]
    return max(steps, default=0)


def _interrupt_after_training_started(out, extra=(), sigterm=False):
    """Start the sweep, wait until its trial has trained further than before (a new step in its
    ``progress.csv``: progress it can see, whatever the machine's load), then Ctrl-C it (``sigterm``:
    SIGTERM to the sweep's own process only, as ``kill`` sends); returns the exit code, standard error
    and the step seen before the interruption."""
    before = _trained_step(out)
    proc = subprocess.Popen(
        _sweep_cmd(out, *extra),
        cwd=ROOT,
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )
    deadline = time.time() + 300
    while time.time() < deadline and _trained_step(out) <= before and proc.poll() is None:
        time.sleep(0.2)
    seen = _trained_step(out)
    assert before < seen < 200, f"no training progress to interrupt (steps {before} -> {seen})"
    if sigterm:
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, seen


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_ctrl_c_three_times_then_the_sweep_finishes(tmp_path, workers):
    """Each Ctrl-C: exit 130 with a resume hint, the trial recorded as interrupted (not a death), resumed
    from its checkpoint by the next run; after three of them the cell still finishes, once."""
    extra = ("--workers", str(workers)) if workers else ()
    steps, seen = [], []
    for _ in range(3):
        code, err, step = _interrupt_after_training_started(tmp_path, extra)
        assert code == 130, err
        assert "interrupted: re-run the same command to resume" in err and "Traceback" not in err
        steps.append(pd.read_csv(tmp_path / "results.csv")["status"].tolist())
        seen.append(step)
    study = plain_study(tmp_path)
    assert [t.user_attrs.get("failure") for t in study.trials] == ["interrupted"] * 3
    done = subprocess.run(
        _sweep_cmd(tmp_path, *extra), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    df = pd.read_csv(tmp_path / "results.csv")
    # each run went on from where the last one stopped: the final one resumed at or after the last step seen
    assert (
        df["status"].tolist() == ["ok"] and df["resumed_from_step"].iloc[0] >= seen[-1] and df["steps"].iloc[0] == 200
    )
    assert steps == [["missing"]] * 3  # an interrupted cell is shown as missing, never as a result
    assert [t.state for t in plain_study(tmp_path).trials].count(TrialState.COMPLETE) == 1


@pytest.mark.slow
def test_sigterm_stops_workers_and_records_the_trial_as_interrupted(tmp_path):
    """SIGTERM to the sweep's process (``kill``, ``timeout``, a scheduler) unwinds as Ctrl-C does: exit 143,
    the worker stopped (no process left in the group), the trial recorded as interrupted."""
    code, err, _ = _interrupt_after_training_started(tmp_path, ("--workers", "1"), sigterm=True)
    assert code == 143, err
    assert "interrupted: re-run the same command to resume" in err and "Traceback" not in err
    assert [t.user_attrs.get("failure") for t in plain_study(tmp_path).trials] == ["interrupted"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["nosuchtask"], "unknown task 'nosuchtask'; known tasks:"),
        (["parity", "--preset", "nosuch"], "unknown preset 'nosuch'; known presets:"),
        (["parity", "--preset", "smoke", "--mixers", "gru,nosuch"], "unknown mixer 'nosuch'"),
        (["parity", "--preset", "smoke", "--mixers", "torch:Tensor"], "mixer 'torch:Tensor'"),
        (["parity", "--preset", "smoke", "--task-option", "seq_len=0"], "seq_len must be >= 1"),
        (["parity", "--preset", "smoke", "--train-option", "nosuch=1"], "unknown train option(s) nosuch"),
        (["parity", "--preset", "smoke", "--train-option", "train_size=0"], "train_size must be a positive integer"),
        (["parity", "--preset", "smoke", "--train-option", "train_size"], "expected KEY=VALUE"),
        (["parity", "--preset", "smoke", "--max-steps", "-5"], "--max-steps: must be a positive integer, got '-5'"),
        (["parity", "--preset", "smoke", "--max-steps", "0"], "--max-steps: must be a positive integer, got '0'"),
        (["parity", "--preset", "smoke", "--lrs", "-1e-3"], "--lrs: must be numbers > 0, got '-1e-3'"),
        (["parity", "--preset", "smoke", "--seeds", "a"], "--seeds: expected an integer, got 'a'"),
        (
            ["parity", "--preset", "smoke", "--device", "tpu"],
            "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'",
        ),
        (["parity", "--preset", "smoke", "--workers", "-1"], "--workers: must be an integer >= 0, got '-1'"),
        (["parity", "--preset", "smoke", "--mps"], "--mps applies to worker processes"),
        pytest.param(
            ["parity", "--preset", "smoke", "--logger", "tensorboard"],
            "logger 'tensorboard' needs tensorboard",
            marks=pytest.mark.skipif(
                __import__("importlib").util.find_spec("tensorboard") is not None, reason="tensorboard is installed"
            ),
        ),
    ],
)
def test_cli_user_errors_are_one_line_and_store_nothing(tmp_path, capsys, argv, message):
    """``main`` in this process (the command line itself: the test below)."""
    out = tmp_path / "out"
    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (out / "journal.log").exists()  # nothing was stored as a "result"


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,message",
    [
        (["nosuchtask"], "unknown task 'nosuchtask'; known tasks:"),
        (["parity", "--preset", "smoke", "--mixers", "torch:Tensor"], "mixer 'torch:Tensor'"),
    ],
)
def test_the_command_line_prints_a_user_error_as_one_line_and_exits_2(tmp_path, argv, message):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", *argv, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (out / "journal.log").exists()


@pytest.mark.slow
def test_cli_unwritable_output_folder_is_one_line(tmp_path):
    if os.geteuid() == 0:  # root writes into read-only folders: use a file system nobody may write to
        target = "/sys/kernel/expressivity-suite-test"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        target = str(ro / "x")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", "parity", "--preset", "smoke", "--out", target],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: cannot write to --out {target!r}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_output_folder_that_is_a_file_is_one_line(tmp_path):
    file = tmp_path / "f"
    file.write_text("")
    for module in ("experiments.sweep", "experiments.reproduce"):
        first = "parity" if module.endswith("sweep") else "pararnn-table1"
        proc = subprocess.run(
            [sys.executable, "-m", module, first, "--out", str(file)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert (
            proc.returncode == 2
            and proc.stderr.strip() == f"error: --out {str(file)!r} is a file, not a folder: choose another path"
        )


def test_tensorboard_logger_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from experiments.trial.train import RunOptions, TrainConfig, TrialSpec, run_trial

    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=1e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(max_steps=10, batch_size=8, train_size=32, val_size=16, test_size=16, eval_every=5),
    )
    run_trial(spec, tmp_path, options=RunOptions(logger="tensorboard"))
    assert list((tmp_path / "logs" / "version_0").glob("events.out.tfevents.*"))


def test_cli_help_explains_everything(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in (
        "--mixers",
        "--seeds",
        "--lrs",
        "--preset",
        "--out",
        "--storage",
        "--logger",
        "resumes",
        "module.path:CellClass",
        "--preset smoke",
    ):
        assert word in text


@pytest.mark.slow
def test_cli_train_options_reach_every_trial(tmp_path):
    """--train-option overrides the preset's training configuration; --max-steps wins over a max_steps option."""
    main(
        [
            "parity",
            "--preset",
            "smoke",
            "--mixers",
            "gru",
            "--seeds",
            "0,1",
            "--task-option",
            "seq_len=8",
            "--train-option",
            "train_size=48",
            "--train-option",
            "batch_size=8",
            "--train-option",
            "max_steps=7",
            "--max-steps",
            "12",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    specs = [json.loads((f / "spec.json").read_text()) for f in sorted((tmp_path / "trials").iterdir())]
    assert len(specs) == 2
    assert all(s["train"]["train_size"] == 48 and s["train"]["batch_size"] == 8 for s in specs)
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["steps"].tolist() == [12, 12] and df["max_steps"].tolist() == [12, 12]


def test_progress_without_a_terminal_is_a_line_per_finished_cell(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="experiments.sweeps.runner")
    run_sweep(tiny_plan(["gru", "elman"]), tmp_path, SweepOptions(progress=True))  # pytest's stderr is not a terminal
    lines = [r.getMessage() for r in caplog.records if "cells done" in r.getMessage()]
    assert any(line.startswith("parity sweep: 1/2 cells done") for line in lines)
    assert any(line.startswith("parity sweep: 2/2 cells done") for line in lines) and "elapsed" in lines[-1]


# --- the study journal: a torn last record is set aside, anything else unreadable is one line -----------------
FAST = [
    "parity",
    "--preset",
    "smoke",
    "--seeds",
    "0",
    "--lrs",
    "1e-3",
    "--task-option",
    "seq_len=8",
    "--train-option",
    "train_size=32",
    "--train-option",
    "val_size=16",
    "--train-option",
    "test_size=16",
    "--train-option",
    "batch_size=8",
    "--max-steps",
    "4",
    "--no-progress",
]


def _fast_sweep(out, mixers="gru"):
    """A sweep of a few seconds on the CPU, in this process; returns its exit code."""
    return main([*FAST, "--mixers", mixers, "--out", str(out)])


def _journal_lines(out):
    return (out / "journal.log").read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("where", ["first", "middle"])
def test_unreadable_journal_is_one_line_naming_the_file_and_left_untouched(tmp_path, capsys, where):
    assert _fast_sweep(tmp_path) == 0
    lines = _journal_lines(tmp_path)
    at = 0 if where == "first" else 3
    (tmp_path / "journal.log").write_bytes(b"".join([*lines[:at], b"garbage\n", *lines[at:]]))
    before = (tmp_path / "journal.log").read_bytes()
    capsys.readouterr()
    assert _fast_sweep(tmp_path, "gru,elman") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert str(tmp_path / "journal.log") in err and f"line {at + 1}" in err and "move it aside" in err, err
    assert (tmp_path / "journal.log").read_bytes() == before  # never written after a failed read
    assert not list(tmp_path.glob("journal.log.*"))
    # the way out the message gives: without the journal the cells come back from their checkpoints
    (tmp_path / "journal.log").rename(tmp_path / "journal.log.bad")
    assert _fast_sweep(tmp_path) == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["status"].tolist() == ["ok"] and df["resumed_from_step"].tolist() == [4]  # re-tested, not retrained


TORN = b'{"op_code":5,"worker_id":"w","trial_id":0,"us'


@pytest.mark.slow
def test_torn_last_journal_record_is_set_aside_with_one_warning(tmp_path):
    assert _fast_sweep(tmp_path) == 0
    good = (tmp_path / "journal.log").read_bytes()
    (tmp_path / "journal.log").write_bytes(good + TORN)  # a crash mid-write
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", *FAST, "--mixers", "gru", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    side = tmp_path / "journal.log.torn-1"
    warning = [line for line in err.splitlines() if "torn" in line]
    assert len(warning) == 1 and str(tmp_path / "journal.log") in warning[0] and str(side) in warning[0], err
    assert side.read_bytes() == TORN
    assert (tmp_path / "journal.log").read_bytes().startswith(good)  # cut back to its last good line, then resumed
    assert all(json.loads(line) for line in _journal_lines(tmp_path))
    assert trial_states(tmp_path) == [TrialState.COMPLETE]


@pytest.mark.slow
def test_torn_journal_then_two_more_runs_keep_every_cell(tmp_path, capsys):
    assert _fast_sweep(tmp_path) == 0
    with open(tmp_path / "journal.log", "ab") as f:
        f.write(TORN[:30])
    assert _fast_sweep(tmp_path, "gru,elman") == 0
    assert _fast_sweep(tmp_path, "gru,elman,lstm") == 0
    assert "error" not in capsys.readouterr().err
    df = pd.read_csv(tmp_path / "results.csv")
    assert sorted(df["mixer"]) == ["elman", "gru", "lstm"] and set(df["status"]) == {"ok"}
    assert trial_states(tmp_path) == [TrialState.COMPLETE] * 3
    assert [p.name for p in tmp_path.glob("journal.log.torn-*")] == ["journal.log.torn-1"]


@pytest.mark.slow
def test_a_mixers_subset_keeps_the_folders_earlier_cells_in_the_results(tmp_path):
    """The README's "add your own cell" command writes to the main job's folder: its results files still
    show every finished cell of the folder's study (a --mixers subset filters what is trained)."""
    assert _fast_sweep(tmp_path, "gru,elman") == 0
    assert _fast_sweep(tmp_path, "lstm") == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["mixer"].tolist() == ["lstm", "gru", "elman"] and set(df["status"]) == {"ok"}
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {m} " in table for m in ("gru", "elman", "lstm")), table
    assert _fast_sweep(tmp_path, "gru") == 0  # a cell of both: once
    assert sorted(pd.read_csv(tmp_path / "results.csv")["mixer"]) == ["elman", "gru", "lstm"]


@pytest.mark.slow
def test_a_shared_study_reports_only_the_commands_own_cells(tmp_path):
    """Reproductions share one study across tables: a report keeps to its own cells (entries such as
    'parity' recur across presets with other settings)."""
    from experiments.sweeps.runner import run_plans

    run_plans([tiny_plan(["gru", "elman"])], tmp_path, "shared", SweepOptions(progress=False))
    results, _ = run_plans([tiny_plan(["lstm"])], tmp_path, "shared", SweepOptions(progress=False))
    assert results["parity"]["mixer"].tolist() == ["lstm"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--mixers", "nosuchmixer"],
        ["--task-option", "foo=1"],
        ["--task-option", "seq_len=0"],
        ["--mixers", "nomodule_xyz:Cell"],
        ["--train-option", "nosuch=1"],
        ["--mixers", "gru", "--storage", "postgresql://nobody@127.0.0.1:1/none"],
    ],
)
def test_rejected_command_leaves_no_output_folder(tmp_path, capsys, extra):
    out = tmp_path / "new" / "out"
    assert main(["parity", "--preset", "smoke", *extra, "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "new").exists()  # neither the folder nor its parent, both created for the run
    # a folder that existed before keeps what it had
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    assert main(["parity", "--preset", "smoke", *extra, "--out", str(out), "--no-progress"]) == 2
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_cli_help_lists_the_mixers(capsys):
    from mixers import MIXERS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert MIXERS and all(name in text for name in MIXERS)
    assert "module.path:Cell" in text and "fla:<Layer>" in text


@pytest.mark.parametrize(
    "mixer",
    [
        "my_cells_xyz:NoSuchCell",
        "tasks:NoSuchCell",
        "tasks:NoSuchCell[a=1]",
        "my_cells_xyz:NoSuchCell[a=1]",
        "nosuchmixer",
        "nosuchmixer[a=1]",
    ],
)
def test_mixer_errors_have_one_prefix(tmp_path, capsys, mixer):
    assert main(["parity", "--preset", "smoke", "--mixers", mixer, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count("mixer '") == 1 and "with options {}" not in err, err
    assert mixer.split("[")[0] in err


@pytest.mark.parametrize(
    "tail,torn",
    [
        (b'{"op_code":5,"trial', True),
        (b'{"op_code":5,"trial\n', True),
        (b"\0\0\0\0", True),
        (b"garbage\n", False),
        (b'{"a":\n{"b":1}\n', False),
        (b"{}", True),
    ],
)
def test_check_journal_sets_aside_only_a_torn_last_record(tmp_path, tail, torn):
    from experiments.sweeps.study import check_journal

    journal = tmp_path / "journal.log"
    good = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[2]}\n'
    journal.write_bytes(good + tail)
    if torn:
        assert "torn" in check_journal(journal)
        assert journal.read_bytes() == good and (tmp_path / "journal.log.torn-1").read_bytes() == tail
    else:
        with pytest.raises(ValueError, match="line 2 .*move it aside"):
            check_journal(journal)
        assert journal.read_bytes() == good + tail and not list(tmp_path.glob("journal.log.*"))
    if torn:
        assert check_journal(journal) is None  # repaired: nothing left to set aside


# --- progress: the running trials, the bar's count, log lines beside the bar, timings behind -v ---------------
@pytest.mark.slow
def test_without_a_terminal_the_running_trials_step_and_accuracy_are_reported(tmp_path, caplog, monkeypatch):
    """A line per ``progress_every`` seconds with the running trial's step, validation accuracy, rate and
    time left, read from its progress.csv while it trains (no fixed sleeps: the trial's own pace; a
    sample at every step, so a fast machine still writes one after the first validation)."""
    import logging

    import experiments.trial.train

    monkeypatch.setattr(experiments.trial.train, "PROGRESS_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="experiments.sweeps.runner")
    plan = resolve_sweep(
        "parity",
        "smoke",
        {
            "mixers": ["gru"],
            "seeds": [0],
            "lrs": [1e-3],
            "train": {**TINY, "max_steps": 400, "eval_every": 20},
            "extrapolation": {"min_len": 3, "max_len": 8, "eval_lengths": [12]},
        },
    )
    run_sweep(plan, tmp_path, SweepOptions(progress=True, progress_every=0.05))
    lines = [r.getMessage() for r in caplog.records if ": running: " in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert all(line.startswith("parity sweep: running: gru s0 lr 0.001: step ") for line in lines), lines
    assert any("/400, val " in line and "steps/s" in line and " left" in line for line in lines), lines


def test_the_running_trials_come_from_fresh_unfinished_progress_files(tmp_path):
    from experiments.trial.running import running_trials

    now = 1000.0
    rows = {
        "a": [(900.0, 10, "", "train"), (910.0, 30, "0.5", "train")],  # started before this run
        "b": [(995.0, 10, "", "train"), (999.0, 50, "0.75", "train")],  # running: 10 steps/s
        "c": [(995.0, 10, "", "train"), (999.0, 50, "", "end")],  # finished training
        "d": [(950.0, 10, "", "train"), (960.0, 50, "", "train")],
    }  # stale: no sample for 40 s
    cells = []
    for name, samples in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "progress.csv").write_text(
            "unix_time_s,step,val_acc,phase\n" + "".join(f"{t},{s},{v},{p}\n" for t, s, v, p in samples) + "99"
        )
        cells.append((tmp_path / name, name, 450))
    (trial,) = running_trials(cells, since=920.0, stale_s=30.0, now=now)
    assert (trial.label, trial.step, trial.val_acc, trial.rate, trial.eta_s) == ("b", 50, 0.75, 10.0, 40.0)
    assert trial.describe() == "b: step 50/450, val 75.0%, 10 steps/s, ~40 s left"


def _screen(output: str) -> list[str]:
    """The lines a terminal shows after ``output`` (text, carriage returns, newlines, and the CSI sequences
    rich writes: cursor up, erase in line; colours and cursor visibility ignored)."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", output):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token.startswith("\x1b["):
            n = int(token[2:-1]) if token[2:-1].isdigit() else None
            if token[-1] == "A":
                row = max(0, row - (n or 1))
            elif token[-1] == "K":
                lines[row] = "" if n == 2 else lines[row][:col]
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


@pytest.mark.slow
def test_on_a_terminal_the_bar_starts_at_the_finished_cells_and_log_lines_stay_whole(tmp_path, capsys, monkeypatch):
    """A re-run into the same folder on a (simulated) terminal: the bar, on standard error, shows the
    finished cells from its first drawing on, and log lines printed meanwhile are whole lines above it."""
    import logging

    import experiments.sweeps.runner as runner

    assert _fast_sweep(tmp_path, "gru,elman") == 0  # 2 cells finished
    monkeypatch.setattr(runner, "on_terminal", lambda: True)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "200")
    handler = logging.StreamHandler(sys.stderr)  # what logging.basicConfig does in the CLI
    logging.getLogger().addHandler(handler)
    level = logging.getLogger("experiments").level
    try:
        capsys.readouterr()  # -v: a timing line after the trial, printed while the bar is live
        assert main([*FAST[:-1], "--mixers", "gru,elman,lstm", "--out", str(tmp_path), "-v"]) == 0
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger("experiments").setLevel(level)
    err = capsys.readouterr().err
    counts = re.findall(r" (\d+)/3 \d+:\d\d:\d\d", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err))  # M/N, elapsed
    assert counts and counts[0] == "2" and set(counts) <= {"2", "3"}, counts
    lines = _screen(err)
    bars = [line for line in lines if "━" in line]
    assert bars and bars[-1].startswith("parity sweep") and " 3/3 " in bars[-1], lines
    timing = [line for line in lines if " s in all: " in line]
    assert len(timing) == 1 and re.fullmatch(
        r"trial\(s\) \d+: [\d.]+ s in all: setup [\d.]+, train [\d.]+, "
        r"test [\d.]+, own -?[\d.]+, recording [\d.]+",
        timing[0],
    ), lines


def test_log_lines_print_above_the_bar_not_onto_it():
    import io
    import logging

    from rich.console import Console

    from experiments.sweeps.runner import Progress

    buffer, stream = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    try:
        with Progress("parity sweep", 3, console=Console(file=buffer, force_terminal=True, width=100)) as bar:
            bar.update({"done": 1, "running": 1, "waiting": 1})
            logging.getLogger("experiments.test").warning("a log line while the bar is live")
        assert handler.stream is stream and stream.getvalue() == ""  # restored; the line went to the console
        printed = [line for line in buffer.getvalue().splitlines() if "a log line while the bar is live" in line]
        assert len(printed) == 1 and "parity sweep" not in printed[0], buffer.getvalue()
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.slow
def test_trial_timings_only_with_verbose(tmp_path, caplog):
    import logging

    caplog.set_level(logging.DEBUG)  # the handler takes everything; the CLI sets the level of "experiments"
    assert _fast_sweep(tmp_path / "quiet") == 0
    assert not [r for r in caplog.records if " s in all: setup " in r.getMessage()]
    caplog.clear()
    assert main([*FAST, "--mixers", "gru", "--out", str(tmp_path / "verbose"), "-v"]) == 0
    assert [r for r in caplog.records if " s in all: setup " in r.getMessage()]


def test_storage_errors_name_the_storage_with_its_scheme_and_without_the_password(tmp_path, monkeypatch):
    from experiments.sweeps import study

    sqlite = f"sqlite:///{tmp_path}/no/such/folder/x.db"
    with pytest.raises(ValueError) as err:
        study.open_storage(sqlite, tmp_path)
    assert str(err.value).startswith(f"cannot open --storage {sqlite!r}: ") and "host" not in str(err.value)

    def no_driver(*args, **kwargs):
        raise ImportError("No module named 'psycopg2'")

    monkeypatch.setattr(study, "RDBStorage", no_driver)
    with pytest.raises(ValueError) as err:
        study.open_storage("postgresql://me:secret@db.example:5432/sweeps", tmp_path)
    assert str(err.value) == (
        "--storage 'postgresql://db.example:5432/sweeps' needs a database driver: No module named 'psycopg2' "
        "(pip install 'expressivity-suite[postgres]')"
    )


def test_a_second_task_into_the_same_folder_keeps_the_first_tasks_results(tmp_path):
    """results.csv and table.md list every finished cell of the folder, whichever command added it."""
    run_sweep(tiny_plan(["gru"]), tmp_path, SweepOptions(progress=False))
    keep_nth = resolve_sweep("keep_nth", "smoke", {"mixers": ["elman"], "seeds": [0], "lrs": [1e-3], "train": TINY})
    df = run_sweep(keep_nth, tmp_path, SweepOptions(progress=False))
    assert sorted(zip(df["task"], df["mixer"], df["status"])) == [("keep_nth", "elman", "ok"), ("parity", "gru", "ok")]
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert sorted(on_disk["task"]) == ["keep_nth", "parity"]
    table = (tmp_path / "table.md").read_text()
    assert re.search(r"\| parity +\| gru ", table) and re.search(r"\| keep_nth +\| elman ", table)


def test_run_arguments_become_one_sweep_options():
    """The run arguments of a training CLI are read once into ``SweepOptions`` (its trials' ``RunOptions``
    inside, with the preset's budget engine), which ``run_plans`` takes whole; bad values are one line."""
    from experiments.cli import sweep_options
    from experiments.sweep import parser
    from experiments.trial.train import RunOptions

    argv = ["parity", "--workers", "3", "--device", "cpu", "--stale-timeout", "7", "--retry-failed"]
    args = parser().parse_args([*argv, "--no-progress", "--progress-every", "0", "--logger", "none", "--stack", "2"])
    assert sweep_options(args, "grazzi-table3") == SweepOptions(
        workers=3,
        device="cpu",
        stale_timeout=7.0,
        retry_failed=True,
        progress=False,
        progress_every=0.0,
        trial=RunOptions(logger="none", stack=2, gpu_engine="compiled"),
    )
    assert SweepOptions().trial == RunOptions()
    for bad, match in (({"workers": -1}, "workers must be"), ({"stale_timeout": 0}, "stale timeout must be > 0")):
        with pytest.raises(ValueError, match=match):
            SweepOptions(**bad)
