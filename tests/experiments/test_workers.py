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

from experiments.sweep import run_sweep
from experiments.sweeps.presets import build_specs, resolve_sweep
from experiments.sweeps.runner import SweepOptions
from experiments.sweeps.study import HEARTBEAT_DIR, GridStudy, cell_id, cell_params, grid_distributions, is_stale
from experiments.sweeps.workers import (
    MPS_BELOW_NORMAL,
    MPS_NORMAL,
    host_cores,
    physical_cores,
    priority_classes,
    start_worker,
    worker_devices,
    worker_loop,
    worker_threads,
)
from experiments.trial.lit import LitSequenceModel

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
    return resolve_sweep(
        "parity",
        "smoke",
        {
            "mixers": list(mixers),
            "seeds": list(seeds),
            "lrs": [1e-3],
            "train": {**TINY, "max_steps": max_steps},
            "extrapolation": {"min_len": 3, "max_len": 8, "eval_lengths": [12]},
        },
    )


def cells_of(specs):
    return [("parity", s) for s in specs]


def open_grid(out, stale_timeout=60):
    return GridStudy.open(None, out, "parity-smoke", stale_timeout)


def enqueue(grid, spec):
    grid.enqueue(spec, "parity", grid_distributions([cell_params(spec, "parity")]))


def completed_once(grid, specs):
    """Every cell has exactly one COMPLETE trial; returns the trials."""
    trials = grid.trials()
    for spec in specs:
        done = [t for t in trials if t.user_attrs.get("cell") == cell_id(spec) and t.state == TrialState.COMPLETE]
        assert len(done) == 1, (spec.cell_key(), [(t.number, t.state, t.user_attrs.get("failure")) for t in trials])
    return trials


def wait_running(grid, timeout=120):
    """The first trial seen RUNNING with a worker attribute (polls the storage)."""
    end = time.time() + timeout
    while time.time() < end:
        for t in grid.trials(states=(TrialState.RUNNING,)):
            if "worker" in t.system_attrs:
                return t
        time.sleep(0.1)
    raise AssertionError("no trial started")


@pytest.fixture
def slow_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawned workers inherit sys.path


@pytest.mark.slow
def test_two_workers_complete_grid_exactly_once_and_save_checkpoints(tmp_path):
    plan = tiny_plan(["gru", "elman"], seeds=[0, 1, 2])
    df = run_sweep(plan, tmp_path, SweepOptions(progress=False, workers=2))
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    trials = completed_once(open_grid(tmp_path), build_specs(plan))
    assert len(trials) == 6  # nothing ran twice, no duplicates were even needed
    assert (tmp_path / "table.md").read_text().count("| parity ") == 2
    # per cell: the step log, the spec, run.json (worker, device, versions) and the checkpoints
    folders = sorted((tmp_path / "trials").iterdir())
    assert len(folders) == 6
    for folder in folders:
        assert {"logs", "spec.json", "run.json", "checkpoints"} <= {p.name for p in folder.iterdir()}
    logs = [p.read_text() for p in (tmp_path / "workers").glob("worker-*.log")]
    assert len(logs) == 2
    # each worker takes its share of the cores, and logs where each trial's time went
    assert all(f"{worker_threads(2)} CPU threads" in text for text in logs)
    timings = [line for text in logs for line in text.splitlines() if "s in all: setup" in line]
    assert len(timings) == 6
    module = LitSequenceModel.load_from_checkpoint(folders[0] / "checkpoints" / "best.ckpt", map_location="cpu")
    assert module.hparams["model"]["mixer"] in ("gru", "elman")
    assert not list((tmp_path / HEARTBEAT_DIR).glob("*"))  # workers remove their heartbeat on exit


def test_worker_threads_share_the_cores():
    assert worker_threads(16, cores=16) == 1
    assert worker_threads(4, cores=16) == 4
    assert worker_threads(5, cores=16) == 3
    assert worker_threads(32, cores=16) == 1  # never 0


def test_physical_cores_count_hyperthreads_once(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():  # 2 cores x 2 threads
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    assert physical_cores(tmp_path) == 2
    assert physical_cores(tmp_path / "absent") is None
    here = physical_cores()
    assert here is None or 1 <= here <= host_cores()


@pytest.mark.slow
def test_worker_killed_mid_trial_then_rerun_resumes_and_completes_exactly_once(tmp_path, slow_on_path):
    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1], max_steps=60)
    specs = build_specs(plan)
    grid = open_grid(tmp_path)
    grid.sync(cells_of(specs))
    proc = start_worker(0, cells_of(specs), "parity-smoke", None, tmp_path, "cpu", stale_timeout=60)
    running = wait_running(grid)
    deadline = time.time() + 60  # kill -9 after its first checkpoint (step 10): no interrupt checkpoint is written
    while time.time() < deadline and not list((tmp_path / "trials").glob("*/checkpoints/last.ckpt")):
        time.sleep(0.1)
    os.kill(running.system_attrs["worker"]["pid"], signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    assert grid.storage.get_trial(grid.trial_id(running)).state == TrialState.RUNNING  # left behind
    df = run_sweep(plan, tmp_path, SweepOptions(progress=False))  # the re-run
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert sorted(df["resumed_from_step"]) == [0, 10] and set(df["steps"]) == {60}  # one resumed from its checkpoint
    trials = completed_once(grid, specs)
    killed = grid.storage.get_trial(grid.trial_id(running))
    assert killed.state == TrialState.FAIL and killed.user_attrs["failure"] == "died"
    assert len(trials) == 3
    assert len(list((tmp_path / "trials").iterdir())) == 2  # the re-run reused the cell's folder


@pytest.mark.slow
def test_live_worker_reruns_the_trial_of_a_killed_worker(tmp_path, slow_on_path):
    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1, 2], max_steps=40)
    specs = build_specs(plan)
    grid = open_grid(tmp_path)
    grid.sync(cells_of(specs))
    victim = start_worker(0, cells_of(specs), "parity-smoke", None, tmp_path, "cpu", stale_timeout=60)
    running = wait_running(grid)
    # the survivor runs in this process: it must pick up the victim's cell once the victim is dead
    os.kill(running.system_attrs["worker"]["pid"], signal.SIGKILL)
    victim.join(30)
    counts = worker_loop(grid, cells_of(specs), tmp_path, device="cpu", poll_s=0.2)
    trials = completed_once(grid, specs)
    assert counts["ok"] == 3 - sum(t.state == TrialState.COMPLETE and t.number < running.number for t in trials)
    assert grid.storage.get_trial(grid.trial_id(running)).user_attrs["failure"] == "died"


def test_duplicate_cells_from_concurrent_enqueues_run_once(tmp_path):
    plan = tiny_plan(["gru"])
    specs = build_specs(plan)
    grid = open_grid(tmp_path)
    for _ in range(3):  # three machines enqueued the same cell at once
        enqueue(grid, specs[0])
    counts = worker_loop(grid, cells_of(specs), tmp_path, device="cpu", poll_s=0.1)
    assert counts["ok"] == 1
    trials = completed_once(grid, specs)
    assert sorted(t.user_attrs.get("failure", "") for t in trials if t.state == TrialState.FAIL) == ["duplicate"] * 2


def test_claim_gives_way_to_a_lower_numbered_running_duplicate(tmp_path):
    specs = build_specs(tiny_plan(["gru"]))
    grid = open_grid(tmp_path)
    enqueue(grid, specs[0])
    enqueue(grid, specs[0])
    first = grid.trials()[0]
    grid.storage.set_trial_state_values(grid.trial_id(first), TrialState.RUNNING)  # another worker runs it
    grid.storage.set_trial_system_attr(
        grid.trial_id(first), "worker", {"host": socket.gethostname(), "pid": os.getpid()}
    )
    assert grid.claim({cell_id(specs[0])}) is None
    assert grid.trials()[1].user_attrs["failure"] == "duplicate"


def test_a_requeued_cell_keeps_its_place_in_the_grid(tmp_path):
    """A cell interrupted and re-queued (a new WAITING trial, numbered after every other) is claimed before
    the cells after it in the grid, so its checkpoint resumes first; the rest follow in grid order."""
    specs = build_specs(tiny_plan(["gru", "lstm", "elman"], seeds=(0, 1)))
    keys = [cell_id(s) for s in specs]
    grid = open_grid(tmp_path)
    grid.sync(cells_of(specs))
    first = grid.claim(keys)
    assert first.user_attrs["cell"] == keys[0]
    grid.finish(first, None, failure="interrupted", error="stopped by Ctrl-C")
    assert grid.sync(cells_of(specs))["queued"] == 1  # re-queued behind the five never-started cells
    assert max(t.number for t in grid.trials()) > max(
        t.number for t in grid.trials() if t.user_attrs["cell"] != keys[0]
    )
    assert grid.claim(keys).user_attrs["cell"] == keys[0]
    claimed = [grid.claim(keys[::-1]).user_attrs["cell"] for _ in keys[1:]]
    assert claimed == keys[:0:-1]  # the order given, not the trial numbers
    assert grid.claim(keys) is None


def test_stale_by_heartbeat_across_hosts(tmp_path):
    specs = build_specs(tiny_plan(["gru"]))
    grid = open_grid(tmp_path, stale_timeout=30)
    enqueue(grid, specs[0])
    t = grid.trials()[0]
    grid.storage.set_trial_state_values(grid.trial_id(t), TrialState.RUNNING)
    grid.storage.set_trial_system_attr(
        grid.trial_id(t), "worker", {"host": "elsewhere", "pid": 1, "id": "elsewhere-1-ab"}
    )
    t = grid.storage.get_trial(grid.trial_id(t))
    beats = tmp_path / HEARTBEAT_DIR
    beats.mkdir()
    (beats / "elsewhere-1-ab").touch()
    assert not is_stale(t, beats, timeout=30)  # another host, fresh heartbeat: alive
    old = time.time() - 120
    os.utime(beats / "elsewhere-1-ab", (old, old))
    assert is_stale(t, beats, timeout=30)  # silent for 2 minutes: dead
    assert not is_stale(t)  # without heartbeats a foreign host's trial cannot be judged
    counts = grid.sync(cells_of(specs))
    assert counts["stale"] == 1 and counts["queued"] == 1
    assert grid.storage.get_trial(grid.trial_id(t)).user_attrs["failure"] == "died"
    assert not (beats / "elsewhere-1-ab").exists()  # the dead worker's heartbeat file is cleaned up


def test_sweeps_that_share_a_cell_queue_and_count_it_once(tmp_path):
    """Two sweeps of a reproduction whose specs coincide (variants of a table share cells) are one cell:
    enqueued once, counted once."""
    specs = build_specs(tiny_plan(["gru"], seeds=[0, 1]))
    grid = open_grid(tmp_path)
    both = [("k4", s) for s in specs] + [("k8", s) for s in specs]
    assert grid.sync(both) == {"done": 0, "queued": 2, "waiting": 0, "running": 0, "stale": 0}
    assert len(grid.trials()) == 2
    assert grid.sync(both) == {"done": 0, "queued": 0, "waiting": 2, "running": 0, "stale": 0}


def test_priority_classes_give_a_quarter_of_the_workers_normal_priority():
    assert priority_classes(16, 12, mps=True) == [MPS_NORMAL] * 4 + [MPS_BELOW_NORMAL] * 12
    assert priority_classes(16, 2, mps=True) == [MPS_NORMAL] * 2 + [MPS_BELOW_NORMAL] * 14  # one per priority cell
    assert priority_classes(3, 5, mps=True) == [MPS_NORMAL] + [MPS_BELOW_NORMAL] * 2
    assert priority_classes(4, 0, mps=True) == [None] * 4  # no priority cells: nothing changes
    assert priority_classes(4, 3, mps=False) == [None] * 4  # without MPS the priority means nothing


def test_worker_claims_its_preferred_cells_first_then_the_rest(tmp_path):
    specs = build_specs(tiny_plan(["gru", "elman"], seeds=(0, 1)))  # queue order: gru 0, gru 1, elman 0, elman 1
    grid = open_grid(tmp_path)
    grid.sync(cells_of(specs))
    order = []
    worker_loop(
        grid,
        cells_of(specs),
        tmp_path,
        device="cpu",
        poll_s=0.1,
        prefer={cell_id(s) for s in specs if s.model.mixer == "elman"},
        on_claim=lambda s: order.append((s["mixer"], s["seed"])),
    )
    assert order == [("elman", 0), ("elman", 1), ("gru", 0), ("gru", 1)]
    completed_once(grid, specs)


@pytest.mark.slow
def test_worker_process_takes_its_mps_priority_and_preferred_cells(tmp_path):
    specs = build_specs(tiny_plan(["gru", "elman"]))
    grid = open_grid(tmp_path)
    grid.sync(cells_of(specs))
    proc = start_worker(
        0,
        cells_of(specs),
        "parity-smoke",
        None,
        tmp_path,
        "cpu",
        stale_timeout=60,
        mps_priority=MPS_BELOW_NORMAL,
        prefer={cell_id(specs[1])},
    )
    proc.join(120)
    assert proc.exitcode == 0
    log_text = (tmp_path / "workers" / "worker-0.log").read_text()
    assert "MPS client priority 1, 1 cells first" in log_text
    assert log_text.index("elman seed=0") < log_text.index("gru seed=0")


def test_worker_devices(monkeypatch):
    assert worker_devices(3, "cpu") == ["cpu"] * 3
    assert worker_devices(2, "cuda:1") == ["cuda:1"] * 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_devices(5) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]


@pytest.mark.slow
def test_cli_device_without_cuda_is_one_line_with_workers_too(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for extra in ([], ["--workers", "2"]):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "experiments.sweep",
                "parity",
                "--preset",
                "smoke",
                "--device",
                "cuda",
                "--out",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 2 and proc.stderr.strip() == (
            "error: device 'cuda' requested but CUDA is not available on this machine; use --device cpu"
        )


def test_a_large_archive_is_split_into_parts_that_concatenate_to_it(tmp_path):
    from benchmarks.training.pack_run import split_archive

    data = os.urandom(10_007)
    archive = tmp_path / "run.tgz"
    archive.write_bytes(data)
    parts = split_archive(archive, 3_000)
    assert [p.name for p in parts] == [f"run.tgz.part0{i}" for i in range(4)] and not archive.exists()
    assert [p.stat().st_size for p in parts] == [3_000, 3_000, 3_000, 1_007]
    assert b"".join(p.read_bytes() for p in sorted(tmp_path.glob("run.tgz.part*"))) == data
    small = tmp_path / "small.tgz"
    small.write_bytes(data[:3_000])
    assert split_archive(small, 3_000) == [small] and small.read_bytes() == data[:3_000]


def test_pack_keeps_the_furthest_trained_unfinished_trials_within_its_size_limit(tmp_path, monkeypatch):
    """``pack(max_bytes=...)``: the unfinished trials' newer resume checkpoint and ``best.ckpt`` go along,
    furthest-trained first, while they fit; a trial that does not fit is left out whole (it restarts), a finished
    trial keeps its files but no checkpoint, and the older resume checkpoint never travels."""
    import tarfile

    import benchmarks.training.pack_run as pack_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "journal.log").write_text("{}\n")

    def trial(name: str, steps: dict[str, int], mb: float) -> None:
        d = run / "trials" / name / "checkpoints"
        d.mkdir(parents=True)
        (d.parent / "progress.csv").write_text("step,acc\n")
        for i, (ckpt, step) in enumerate(steps.items()):
            payload = torch.randint(0, 256, (int(mb * 2**20),), dtype=torch.uint8)
            torch.save({"global_step": step, "payload": payload}, d / ckpt)
            os.utime(d / ckpt, ns=(10**18 + i, 10**18 + i))  # written in this order

    steps_far, steps_near, steps_mid = torch.randint(100, 5000, (3,)).tolist()
    trial("finished", {"best.ckpt": 50, "last.ckpt": 60}, 0.5)
    trial("far", {"best.ckpt": 40, "last.ckpt": steps_far + 20_000, "interrupted.ckpt": steps_far + 20_000}, 1.0)
    trial("near", {"best.ckpt": 10, "interrupted.ckpt": steps_near, "last.ckpt": steps_near}, 1.0)
    trial("mid", {"best.ckpt": 30, "last.ckpt": steps_mid + 10_000}, 1.0)
    monkeypatch.setattr(pack_run, "completed_dirs", lambda run_dir: {"trials/finished"})
    counts = pack_run.pack(run, tmp_path / "run.tgz", [], max_bytes=int(4.5 * 2**20))
    assert counts["trials"] == 4 and counts["resumable"] == 2 and counts["restarted"] == 1
    with tarfile.open(tmp_path / "run.tgz") as tar:
        names = set(tar.getnames())
    ckpts = {n.removeprefix("trials/").replace("/checkpoints/", "/") for n in names if n.endswith(".ckpt")}
    # far and mid resume (2 checkpoints of ~1 MiB each); near, the least trained, does not fit
    assert ckpts == {"far/best.ckpt", "far/interrupted.ckpt", "mid/best.ckpt", "mid/last.ckpt"}
    assert "trials/finished/progress.csv" in names and not any(n.startswith("trials/near") for n in names)
    assert counts["bytes"] < 4.5 * 2**20
    unlimited = pack_run.pack(run, tmp_path / "all.tgz", [])
    assert unlimited["resumable"] == 3 and unlimited["restarted"] == 0
    with tarfile.open(tmp_path / "all.tgz") as tar:
        near = {n for n in tar.getnames() if n.startswith("trials/near/checkpoints/")}
    assert near == {"trials/near/checkpoints/last.ckpt", "trials/near/checkpoints/best.ckpt"}


@pytest.mark.parametrize("moved", [False, True])
@pytest.mark.slow
def test_a_packed_run_resumes_on_a_fresh_machine(tmp_path, slow_on_path, moved):
    """``benchmarks.training.pack_run``: a run cut mid-trial, packed, its folder wiped and unpacked again (a fresh
    machine; the same run path, or another one) finishes: the completed cell is not re-run, the cut one
    resumes from its checkpoint, and the archive carries checkpoints for the unfinished trials only."""
    import shutil
    import tarfile

    from benchmarks.training.pack_run import pack

    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1, 2], max_steps=60)
    specs = build_specs(plan)
    here = tmp_path / "run"
    grid = open_grid(here)
    grid.sync(cells_of(specs))
    proc = start_worker(0, cells_of(specs), "parity-smoke", None, here, "cpu", stale_timeout=60)
    deadline = time.time() + 120  # one cell done, the next one past its first checkpoint
    while time.time() < deadline:
        done = grid.trials(states=(TrialState.COMPLETE,))
        cut = [
            p
            for p in (here / "trials").glob("*/checkpoints/last.ckpt")
            if done and p.parents[1].name != Path(done[0].user_attrs["result"]["trial_dir"]).name
        ]
        if done and cut:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert len(done) == 1 and cut
    counts = pack(here, tmp_path / "run.tgz", [])
    assert counts == {"trials": 2, "resumable": 1, "restarted": 0, "bytes": counts["bytes"]}
    with tarfile.open(tmp_path / "run.tgz") as tar:
        ckpts = {Path(n).parts[1] for n in tar.getnames() if n.endswith(".ckpt")}
        assert ckpts == {cut[0].parents[1].name}
        shutil.rmtree(here)
        here = tmp_path / "moved" if moved else here
        here.mkdir()
        tar.extractall(here, filter="data")
    df = run_sweep(plan, here, SweepOptions(progress=False, stale_timeout=1))
    assert len(df) == 3 and set(df["status"]) == {"ok"} and set(df["steps"]) == {60}
    assert sorted(df["resumed_from_step"]) == [0, 0, 10]
    assert len([t for t in open_grid(here).trials(states=(TrialState.COMPLETE,))]) == 3
    ran_here = [d for d in df["trial_dir"] if Path(d).name != Path(done[0].user_attrs["result"]["trial_dir"]).name]
    assert len(ran_here) == 2 and all((here / d / "checkpoints" / "best.ckpt").is_file() for d in ran_here)


def test_run_plans_hands_the_cells_of_priority_sweeps_to_the_workers(tmp_path, monkeypatch):
    import dataclasses

    import experiments.sweeps.workers as workers
    from experiments.sweeps.runner import run_plans

    seen = {}
    monkeypatch.setattr(
        workers,
        "run_workers",
        lambda grid, cells, *args, priority=frozenset(), **kwargs: seen.update(cells=cells, priority=priority),
    )
    urgent = dataclasses.replace(tiny_plan(["gru"], seeds=(0, 1)), priority="high")
    other = dataclasses.replace(tiny_plan(["elman"]), entry="other")
    run_plans([urgent, other], tmp_path, "prio", SweepOptions(workers=2, progress=False))
    assert seen["priority"] == {cell_id(s) for s in build_specs(urgent)} and len(seen["cells"]) == 3
