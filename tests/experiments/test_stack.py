"""Stacked trials through Lightning (``experiments.trial.stack.run_stack``): each trial as when it runs alone."""

import dataclasses

import pytest
import torch

from experiments.sweeps.runner import SweepOptions
from experiments.trial.lit import LitSequenceModel
from experiments.trial.shape import ModelShape
from experiments.trial.stack import check_stackable, run_stack
from experiments.trial.train import RunOptions, TrainConfig, TrialSpec, quiet_lightning, run_trial
from tests.experiments.test_training import Interrupt

KEYS = (
    "steps",
    "best_step",
    "stopped_early",
    "best_val_acc",
    "final_val_acc",
    "test/acc",
    "test/last_acc",
    "final/test/acc",
    "n_params",
)


def _specs(mixer: str, seeds, **train) -> list[TrialSpec]:
    config = dict(max_steps=300, eval_every=50, train_size=500, val_size=200, test_size=300, eval_batch_size=256)
    return [
        TrialSpec(
            task="parity",
            model=ModelShape(mixer=mixer, mixer_options={"divergence_tol": 1e-2} if mixer.startswith("flash") else {}),
            lr=3e-3,
            seed=s,
            task_options={"seq_len": 12, "running": True},
            train=TrainConfig(**{**config, **train}),
            device="cpu",
        )
        for s in seeds
    ]


def _same(stacked: dict, alone: dict) -> None:
    for key in KEYS:
        assert stacked[key] == pytest.approx(alone[key], abs=1e-6), key


@pytest.mark.parametrize("mixer, stop_at", [("flashgru", 0.7), ("mamba2", 0.61)])
@pytest.mark.slow
def test_stacked_trials_train_as_their_separate_trials(tmp_path, mixer, stop_at):
    """Three seeds stacked: every trial's steps, best step, early stop, validation and test accuracies
    (best and final weights) equal its separate trial's. The stop threshold is set so that some
    trials stop early (each at its own step) while others train on; they learn (above chance, 0.5)."""
    quiet_lightning()
    specs = _specs(mixer, (0, 1, 2), early_stop_acc=stop_at)
    curves = {0: [], 1: [], 2: []}
    stacked = run_stack(
        specs,
        [tmp_path / f"t{s.seed}" for s in specs],
        tmp_path / "stack",
        RunOptions(logger="none"),
        report=lambda s, acc, step: curves[s].append((step, acc)),
    )
    alone = [run_trial(s, tmp_path / f"alone{s.seed}", options=RunOptions(logger="none")) for s in specs]
    for s, (a, b) in enumerate(zip(stacked, alone)):
        _same(a, b)
        assert a["stack_size"] == 3
        assert [step for step, _ in curves[s]] == list(range(50, b["steps"] + 1, 50))  # reported until it stopped
        assert max(acc for _, acc in curves[s]) == pytest.approx(b["best_val_acc"])
    assert any(r["stopped_early"] for r in alone) and not all(r["stopped_early"] for r in alone)
    assert max(r["best_val_acc"] for r in stacked) > 0.6
    for s in specs:  # an ordinary one-trial checkpoint
        model = LitSequenceModel.load_from_checkpoint(tmp_path / f"t{s.seed}" / "checkpoints" / "best.ckpt").model
        assert model.trials == 1


@pytest.mark.slow
def test_interrupted_stack_resumes_exactly_where_it_stopped(tmp_path):
    """Ctrl-C mid-way, then a re-run of the same stack: one results row per trial, equal to an
    uninterrupted stack's, and each trial's final weights equal."""
    quiet_lightning()
    specs = _specs("flashgru", (3, 4), max_steps=120, eval_every=40)
    dirs = [tmp_path / f"t{s.seed}" for s in specs]
    whole = run_stack(specs, [tmp_path / f"w{s.seed}" for s in specs], tmp_path / "whole", RunOptions(logger="none"))
    with pytest.raises(KeyboardInterrupt):
        run_stack(specs, dirs, tmp_path / "cut", RunOptions(logger="none"), callbacks=[Interrupt(at=70)])
    resumed = run_stack(specs, dirs, tmp_path / "cut", RunOptions(logger="none"))
    assert len(resumed) == 2 and all(r["resumed_from_step"] == 70 for r in resumed)
    for a, b, s in zip(resumed, whole, specs):
        _same(a, b)
        final_a = torch.load(tmp_path / f"t{s.seed}" / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]
        final_b = torch.load(tmp_path / f"w{s.seed}" / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]
        assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


@pytest.mark.slow
def test_ctrl_c_in_a_stacks_test_passes_resumes_straight_to_the_tests(tmp_path, monkeypatch):
    """Every trial of the stack has stopped; Ctrl-C in the test passes (Lightning's handler, as from
    the keyboard) is raised as KeyboardInterrupt, and the re-run trains no further (its resume point
    stays at the stopping step) and gives the uninterrupted stack's rows."""
    quiet_lightning()
    specs = _specs("mamba2", (0, 1), max_steps=300, eval_every=50, early_stop_acc=0.0)  # both stop at step 50
    whole = run_stack(specs, [tmp_path / f"w{s.seed}" for s in specs], tmp_path / "whole", RunOptions(logger="none"))
    assert [r["steps"] for r in whole] == [50, 50]
    dirs = [tmp_path / f"t{s.seed}" for s in specs]
    calls = []

    def ctrl_c_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(LitSequenceModel, "on_test_start", ctrl_c_once, raising=False)
    with pytest.raises(KeyboardInterrupt):
        run_stack(specs, dirs, tmp_path / "cut", RunOptions(logger="none"))
    monkeypatch.undo()
    resumed = run_stack(specs, dirs, tmp_path / "cut", RunOptions(logger="none"))
    for a, b in zip(resumed, whole):
        _same(a, b)
    assert torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 50


def test_what_cannot_be_stacked_as_trials():
    specs = _specs("flashgru", (0, 1))
    with pytest.raises(ValueError, match="at least two"):
        check_stackable(specs[:1])
    with pytest.raises(ValueError, match="distinct seeds"):
        check_stackable([specs[0], specs[0]])
    with pytest.raises(ValueError, match="differ in their seed only"):
        check_stackable([specs[0], dataclasses.replace(specs[1], lr=1e-3)])


@pytest.mark.slow
def test_sweep_with_stacks_gives_each_cell_its_own_row(tmp_path):
    """``--stack 2`` over 3 seeds x 2 lrs: cells stack by lr (2 + 1 trials per lr), each cell gets the
    results row, checkpoints and Optuna learning curve of its unstacked run (same numbers)."""
    from experiments.sweep import run_sweep
    from tests.experiments.test_sweep import plain_study, tiny_plan

    plan = tiny_plan(["flashgru"], seeds=[0, 1, 2], lrs=[1e-3, 3e-3])
    stacked = run_sweep(plan, tmp_path / "stacked", SweepOptions(progress=False, trial=RunOptions(stack=2)))
    alone = run_sweep(plan, tmp_path / "alone", SweepOptions(progress=False))
    assert len(stacked) == 6 and set(stacked["status"]) == {"ok"}
    assert sorted(stacked["stack_size"].fillna(1).astype(int).tolist()) == [1, 1, 2, 2, 2, 2]
    key = ["seed", "lr"]
    a, b = stacked.set_index(key).sort_index(), alone.set_index(key).sort_index()
    for column in ("test/acc", "final/test/acc", "len12/acc", "best_val_acc", "steps", "best_step"):
        assert a[column].tolist() == pytest.approx(b[column].tolist(), abs=1e-6), column
    stacks = sorted(p.name for p in (tmp_path / "stacked" / "stacks").iterdir())
    assert len(stacks) == 2 and all("-s0,1-" in name for name in stacks)
    for t in plain_study(tmp_path / "stacked").trials:
        assert "alive" in t.user_attrs  # each stacked trial records its own last validation's time
        assert sorted(t.intermediate_values) == [10, 20] and max(t.intermediate_values.values()) == pytest.approx(
            t.value
        )
