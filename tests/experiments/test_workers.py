"""Parallel workers on one journal file: exactly-once completion, killed workers, stale detection."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState
from torch import nn

from experiments.presets import resolve_sweep
from experiments.study import (HEARTBEAT_DIR, cell_id, claim_next, enqueue_cell, is_stale, open_storage, open_study,
                               sync_grid)
from experiments.sweep import build_specs, load_trained, run_sweep
from experiments.workers import start_worker, worker_devices, worker_loop

ROOT = Path(__file__).resolve().parents[2]
TINY = {"max_steps": 20, "batch_size": 16, "train_size": 64, "val_size": 32, "test_size": 32, "eval_every": 10}


class SlowMixer(nn.Module):
    """A mixer that sleeps in training so a test can kill its worker mid-trial."""

    def __init__(self, d_model: int, **_):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        if self.training:
            time.sleep(0.1)
        return self.proj(x)


def tiny_plan(mixers, seeds=(0,), max_steps=20):
    return resolve_sweep("parity", "smoke", {"mixers": list(mixers), "seeds": list(seeds), "lrs": [1e-3],
                                             "train": {**TINY, "max_steps": max_steps},
                                             "extrapolation": {"min_len": 3, "max_len": 8, "eval_lengths": [12]}})


def completed_once(study, specs):
    """Every cell has exactly one COMPLETE trial; returns the trials."""
    trials = study.get_trials(deepcopy=False)
    for spec in specs:
        done = [t for t in trials if t.user_attrs.get("cell") == cell_id(spec) and t.state == TrialState.COMPLETE]
        assert len(done) == 1, (spec.cell_key(), [(t.number, t.state, t.user_attrs.get("failure")) for t in trials])
    return trials


def wait_running(study, timeout=120):
    """The first trial seen RUNNING with a worker attribute (polls the storage)."""
    end = time.time() + timeout
    while time.time() < end:
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if "worker" in t.system_attrs:
                return t
        time.sleep(0.1)
    raise AssertionError("no trial started")


@pytest.fixture
def slow_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawned workers inherit sys.path


def test_two_workers_complete_grid_exactly_once_and_save_models(tmp_path):
    plan = tiny_plan(["gru", "elman"], seeds=[0, 1, 2])
    df = run_sweep(plan, tmp_path, progress=False, workers=2)
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    trials = completed_once(study, build_specs(plan))
    assert len(trials) == 6  # nothing ran twice, no duplicates were even needed
    assert (tmp_path / "table.md").read_text().count("| parity |") == 2
    # per trial: the CSV step log, the spec, run.json (worker, device, versions) and the final weights
    folders = sorted((tmp_path / "trials").iterdir())
    assert len(folders) == 6
    for folder in folders:
        assert {"metrics.csv", "spec.json", "run.json", "model.pt"} <= {p.name for p in folder.iterdir()}
    assert len(list((tmp_path / "workers").glob("worker-*.log"))) == 2
    model, spec = load_trained(folders[0])
    saved = torch.load(folders[0] / "model.pt", weights_only=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items()) and spec.task == "parity"
    assert not list((tmp_path / HEARTBEAT_DIR).glob("*"))  # workers remove their heartbeat on exit


def test_worker_killed_mid_trial_then_rerun_completes_exactly_once(tmp_path, slow_on_path):
    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1], max_steps=60)
    specs = build_specs(plan)
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    sync_grid(study, specs)
    proc = start_worker(0, specs, "parity-smoke", None, tmp_path, "cpu", stale_timeout=60)
    running = wait_running(study)
    time.sleep(1.0)
    os.kill(running.system_attrs["worker"]["pid"], signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    assert study._storage.get_trial(running._trial_id).state == TrialState.RUNNING  # left behind
    df = run_sweep(plan, tmp_path, progress=False)  # the re-run
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    trials = completed_once(study, specs)
    killed = study._storage.get_trial(running._trial_id)
    assert killed.state == TrialState.FAIL and killed.user_attrs["failure"] == "died"
    assert len(trials) == 3


def test_live_worker_reruns_the_trial_of_a_killed_worker(tmp_path, slow_on_path):
    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1, 2], max_steps=40)
    specs = build_specs(plan)
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    sync_grid(study, specs)
    victim = start_worker(0, specs, "parity-smoke", None, tmp_path, "cpu", stale_timeout=60)
    running = wait_running(study)
    # the survivor runs in this process: it must pick up the victim's cell once the victim is dead
    os.kill(running.system_attrs["worker"]["pid"], signal.SIGKILL)
    victim.join(30)
    counts = worker_loop(study, specs, tmp_path, device="cpu", stale_timeout=60, poll_s=0.2)
    trials = completed_once(study, specs)
    assert counts["ok"] == 3 - sum(t.state == TrialState.COMPLETE and t.number < running.number for t in trials)
    assert study._storage.get_trial(running._trial_id).user_attrs["failure"] == "died"


def test_duplicate_cells_from_concurrent_enqueues_run_once(tmp_path):
    plan = tiny_plan(["gru"])
    specs = build_specs(plan)
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    for _ in range(3):  # three machines enqueued the same cell at once
        enqueue_cell(study, specs[0])
    counts = worker_loop(study, specs, tmp_path, device="cpu", poll_s=0.1)
    assert counts["ok"] == 1
    trials = completed_once(study, specs)
    assert sorted(t.user_attrs.get("failure", "") for t in trials if t.state == TrialState.FAIL) == ["duplicate"] * 2


def test_claim_gives_way_to_a_lower_numbered_running_duplicate(tmp_path):
    specs = build_specs(tiny_plan(["gru"]))
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    enqueue_cell(study, specs[0])
    enqueue_cell(study, specs[0])
    first = study.get_trials(deepcopy=False)[0]
    study._storage.set_trial_state_values(first._trial_id, TrialState.RUNNING)  # another worker runs it
    study._storage.set_trial_system_attr(first._trial_id, "worker", {"host": socket.gethostname(), "pid": os.getpid()})
    assert claim_next(study, {cell_id(specs[0])}) is None
    assert study.get_trials(deepcopy=False)[1].user_attrs["failure"] == "duplicate"


def test_stale_by_heartbeat_across_hosts(tmp_path):
    specs = build_specs(tiny_plan(["gru"]))
    study = open_study(open_storage(None, tmp_path), "parity-smoke")
    enqueue_cell(study, specs[0])
    t = study.get_trials(deepcopy=False)[0]
    study._storage.set_trial_state_values(t._trial_id, TrialState.RUNNING)
    study._storage.set_trial_system_attr(t._trial_id, "worker", {"host": "elsewhere", "pid": 1, "id": "elsewhere-1-ab"})
    t = study._storage.get_trial(t._trial_id)
    beats = tmp_path / HEARTBEAT_DIR
    beats.mkdir()
    (beats / "elsewhere-1-ab").touch()
    assert not is_stale(t, beats, timeout=30)  # another host, fresh heartbeat: alive
    old = time.time() - 120
    os.utime(beats / "elsewhere-1-ab", (old, old))
    assert is_stale(t, beats, timeout=30)  # silent for 2 minutes: dead
    assert not is_stale(t)  # without heartbeats a foreign host's trial cannot be judged
    counts = sync_grid(study, specs, heartbeat_dir=beats, stale_timeout=30)
    assert counts["stale"] == 1 and counts["queued"] == 1
    assert study._storage.get_trial(t._trial_id).user_attrs["failure"] == "died"


def test_worker_devices(monkeypatch):
    assert worker_devices(3, "cpu") == ["cpu"] * 3
    assert worker_devices(2, "cuda:1") == ["cuda:1"] * 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_devices(5) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]


def test_cli_workers_flag(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.sweep", "parity", "--preset", "smoke", "--workers", "-1",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --workers must be >= 0, got -1"
