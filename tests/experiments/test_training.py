"""One trial: it learns, it tests the best checkpoint, checkpoints reload, an interrupted trial resumes exactly."""

import dataclasses
import math

import lightning as L
import pandas as pd
import pytest
import torch

from experiments.trial.captured import CapturedLitSequenceModel, cosine_with_warmup_tensor
from experiments.trial.lit import (
    LastPositionAccuracy,
    LitSequenceModel,
    NonFiniteLossError,
    cosine_with_warmup,
    last_scored,
)
from experiments.trial.shape import ModelShape
from experiments.trial.train import (
    RunOptions,
    TrainConfig,
    TrialSpec,
    build_datamodule,
    module_options,
    quiet_lightning,
    run_trial,
)


def test_cosine_with_warmup():
    assert cosine_with_warmup(0, 10, 100) == pytest.approx(0.1)
    assert cosine_with_warmup(9, 10, 100) == pytest.approx(1.0)
    assert cosine_with_warmup(55, 10, 100) == pytest.approx(0.5)
    assert cosine_with_warmup(100, 10, 100) == pytest.approx(0.0, abs=1e-12)
    assert not math.isnan(cosine_with_warmup(5, 10, 10))


def _tiny_spec(**train) -> TrialSpec:
    """A GRU on parity of 8 tokens, a few batches of 8 (``train``: more ``TrainConfig`` options)."""
    sizes = {"batch_size": 8, "train_size": 64, "val_size": 16, "test_size": 16}
    return TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(**{**sizes, **train}),
    )


def _small_module(max_steps: int, warmup_ratio: float, engine: str = "eager", min_lr: float = 0.0):
    from experiments.trial.train import build_module

    spec = _tiny_spec(max_steps=max_steps, warmup_ratio=warmup_ratio, min_lr=min_lr)
    dm = build_datamodule(spec)
    dm.setup("fit")
    return build_module(spec, dm, engine)


def _schedule(step: int, lr: float, warmup: int, total: int, floor: float) -> float:
    """The learning rate of step ``step`` as the step loop computed it before ``LambdaLR``: linear warm-up
    over ``warmup`` steps, then a cosine from ``lr`` to ``floor`` (absolute) at ``total``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (floor / lr + (1 - floor / lr) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.parametrize(
    "max_steps, warmup_ratio, min_lr", [(37, 0.2, 0.0), (1, 0.0, 0.0), (101, 0.013, 1e-4), (7, 0.99, 3e-3)]
)
def test_the_lambda_lr_schedule_is_the_warmup_cosine_step_by_step(max_steps, warmup_ratio, min_lr):
    """``configure_optimizers``' ``LambdaLR`` gives step ``t`` (the lr the optimizer holds when step ``t``
    runs) the warm-up/cosine formula's value, at awkward lengths (one step, no warm-up, a floor, a floor
    equal to ``lr``) and past ``max_steps``."""
    lit = _small_module(max_steps, warmup_ratio, min_lr=min_lr)
    config = lit.configure_optimizers()
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    warmup = max(1, int(warmup_ratio * max_steps))
    for step in range(max_steps + 3):
        want = _schedule(step, 3e-3, warmup, max_steps, min_lr)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12, abs=1e-18), step
        assert optimizer.param_groups[0]["lr"] == 3e-3 * cosine_with_warmup(step, warmup, max_steps, min_lr / 3e-3)
        optimizer.step()
        schedule.step()


class _SeenLearningRates(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


def test_a_trial_steps_with_the_schedule_and_resumes_it_from_a_checkpoint_without_one(tmp_path):
    """In a trial, optimizer step ``t`` runs at the schedule's lr of ``t``; a resume point without a
    scheduler's state (the graph engines write none) resumes the schedule at its step."""
    quiet_lightning()
    spec = _tiny_spec(max_steps=13, warmup_ratio=0.3, min_lr=1e-4, train_size=40, val_size=8)
    seen = _SeenLearningRates()
    run_trial(spec, tmp_path, callbacks=[seen], options=RunOptions(engine="eager"))
    assert seen.lrs == [pytest.approx(_schedule(t, 3e-3, 3, 13, 1e-4), rel=1e-12) for t in range(13)]

    lit = _small_module(13, 0.3, min_lr=1e-4)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["global_step"], checkpoint["lr_schedulers"] = 5, []
    checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] = 0.5
    lit.on_load_checkpoint(checkpoint)
    config = lit.configure_optimizers()
    config["optimizer"].load_state_dict(checkpoint["optimizer_states"][0])
    config["lr_scheduler"]["scheduler"].load_state_dict(checkpoint["lr_schedulers"][0])
    for t in (5, 6):
        assert config["optimizer"].param_groups[0]["lr"] == pytest.approx(_schedule(t, 3e-3, 3, 13, 1e-4), rel=1e-12)
        config["lr_scheduler"]["scheduler"].step()


@pytest.mark.parametrize("table", [True, False])
def test_the_device_learning_rate_follows_the_schedule(monkeypatch, table):
    """The lr tensor a captured step writes (a table lookup, or computed from the step counter for
    schedules too long for a table) is the float schedule's, step by step, and stays at its end value
    past ``max_steps``; both device paths give the same float32 values."""
    import experiments.trial.captured as captured

    monkeypatch.setattr(captured, "LR_TABLE_MAX_STEPS", 2**24 if table else 0)
    lit = _small_module(max_steps=37, warmup_ratio=0.2, engine="graph")
    assert isinstance(lit, CapturedLitSequenceModel)
    opt = lit.configure_optimizers()
    lit.bind_learning_rate(opt)
    assert (lit._lr_table is not None) == table
    seen = []
    for step in range(40):
        lit.set_learning_rate()
        seen.append(float(opt.param_groups[0]["lr"]))
        want = 3e-3 * cosine_with_warmup(min(step, 37), 7, 37)
        assert seen[-1] == pytest.approx(want, abs=3e-3 * 1e-6), step  # float32
    assert seen == [float(3e-3 * cosine_with_warmup_tensor(torch.tensor(min(s, 37)), 7, 37)) for s in range(40)]


@pytest.mark.parametrize("engine", ["eager", "graph"])
def test_a_non_finite_training_loss_is_caught_after_finite_ones(engine):
    lit = _small_module(max_steps=10, warmup_ratio=0.1, engine=engine)
    for loss in (0.7, 0.5):
        lit.keep_loss(torch.tensor(loss))
    lit._raise_if_nonfinite()
    for loss in (float("nan"), 0.4):  # later finite losses do not hide it
        lit.keep_loss(torch.tensor(loss))
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        lit._raise_if_nonfinite()
    lit = _small_module(max_steps=10, warmup_ratio=0.1, engine=engine)
    lit.keep_loss(torch.tensor(float("inf")))
    with pytest.raises(NonFiniteLossError):
        lit._raise_if_nonfinite()


def test_last_position_accuracy_on_a_hand_made_batch():
    """The last *scored* position of each sequence counts, whatever the positions before it hold."""
    targets = torch.tensor(
        [
            [-100, -100, 1, 0],  # last scored: index 3 (target 0)
            [1, 0, -100, -100],  # index 1 (target 0): right-padded
            [-100, -100, -100, -100],  # nothing scored: not counted
            [2, 2, 2, 1],
        ]
    )  # index 3 (target 1)
    preds = torch.tensor(
        [
            [9, 9, 9, 0],  # right
            [1, 1, 0, 0],  # wrong at index 1
            [0, 0, 0, 0],
            [2, 2, 2, 1],
        ]
    )  # right
    p, t = last_scored(preds, targets)
    assert t.tolist() == [0, 0, 1] and p.tolist() == [0, 1, 1]
    metric = LastPositionAccuracy()
    metric.update(preds[:2], targets[:2])
    metric.update(preds[2:], targets[2:])
    assert metric.compute().item() == pytest.approx(2 / 3)


def _parity_spec(**train):
    return TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru", mixer_options={"num_heads": 4}),
        lr=3e-3,
        seed=0,
        extrapolation={"min_len": 3, "max_len": 16, "eval_lengths": [16, 32]},
        train=TrainConfig(
            **{
                "max_steps": 1200,
                "batch_size": 32,
                "train_size": 3000,
                "val_size": 300,
                "test_size": 1000,
                "eval_every": 100,
                **train,
            }
        ),
    )


@pytest.mark.slow
def test_gru_learns_short_parity_extrapolates_and_its_checkpoint_reloads(tmp_path):
    quiet_lightning()
    spec = _parity_spec()
    result = run_trial(spec, tmp_path)
    assert result["test/acc"] >= 0.99, result
    assert result["len32/acc"] >= 0.95, result  # twice the longest training length
    assert result["stopped_early"], "early stopping at val acc > 0.999 should end the run before max_steps"
    assert result["best_step"] == result["steps"]  # it stopped at its best validation
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file() and list(
        (tmp_path / "logs").glob("version_0/metrics.csv")
    )
    # the checkpoint rebuilds the model from its saved hyperparameters alone, and scores what the trial reported
    module = LitSequenceModel.load_from_checkpoint(tmp_path / "checkpoints" / "best.ckpt", map_location="cpu")
    assert module.hparams["model"]["mixer"] == "gru" and isinstance(module.hparams["model"], dict)
    dm = build_datamodule(spec)
    dm.setup()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    tested = {
        k.split("/dataloader_idx")[0]: v
        for part in trainer.test(module, datamodule=dm, verbose=False)
        for k, v in part.items()
    }
    assert tested["test/acc"] == pytest.approx(result["test/acc"]) and tested["len32/acc"] == pytest.approx(
        result["len32/acc"]
    )
    # the training subset's accuracy, recomputed by hand: the first val_size training sequences
    fit = dm.data["train"]
    inputs, targets = fit.inputs[: spec.train.val_size], fit.targets[: spec.train.val_size]
    with torch.no_grad():
        right = module.eval()(inputs).argmax(-1) == targets
    assert result["trainset/acc"] == pytest.approx(right[targets != -100].float().mean().item(), abs=1e-6)
    assert (tmp_path / "checkpoints" / "best.ckpt").stat().st_size < 200_000  # weights only: kB


class Sabotage(L.Callback):
    """From ``after`` on, scrambles the head after every step: the model degrades after its best validation."""

    def __init__(self, after: int) -> None:
        self.after = after

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step > self.after:
            with torch.no_grad():
                pl_module.model.head.weight.normal_()


@pytest.mark.slow
def test_test_set_is_scored_on_the_best_checkpoint_and_the_final_weights(tmp_path):
    """A trial that peaked and then degraded reports the best checkpoint's accuracy, and the final one beside it."""
    quiet_lightning()
    spec = _parity_spec(max_steps=1000, early_stop_acc=2.0)  # never stops early
    result = run_trial(spec, tmp_path, callbacks=[Sabotage(after=800)])
    assert result["best_val_acc"] >= 0.99 and result["test/acc"] >= 0.99, result
    assert result["final/test/acc"] < 0.8 and result["final_val_acc"] < 0.8, result
    assert result["best_step"] <= 800 < result["steps"]


@pytest.mark.slow
def test_transformer_cannot_learn_parity_quickly():
    """The counterpart: attention stays near chance on the same budget (a sanity check of the task)."""
    quiet_lightning()
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="transformer"),
        lr=3e-3,
        seed=0,
        extrapolation={"min_len": 3, "max_len": 16, "eval_lengths": [32]},
        train=TrainConfig(max_steps=150, batch_size=32, train_size=1000, val_size=200, test_size=500, eval_every=50),
    )
    assert run_trial(spec)["len32/acc"] < 0.7


class Interrupt(L.Callback):
    """Raises Ctrl-C's KeyboardInterrupt after training step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.at:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_interrupted_trial_resumes_exactly_where_it_stopped(tmp_path):
    """Ctrl-C mid-epoch, after a step, then a re-run: the same weights as an uninterrupted run (same
    batches, same state). Eager steps (one optimizer step per Lightning step) also on a GPU."""
    quiet_lightning()
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(max_steps=60, batch_size=8, train_size=100, val_size=32, test_size=32, eval_every=20),
    )
    eager = RunOptions(engine="eager")
    whole = run_trial(spec, tmp_path / "whole", options=eager)
    with pytest.raises(KeyboardInterrupt):  # Lightning's sys.exit(1) is turned back into KeyboardInterrupt
        run_trial(
            spec, tmp_path / "cut", callbacks=[Interrupt(at=45)], options=eager
        )  # 13 batches per epoch: mid-epoch
    assert (tmp_path / "cut" / "checkpoints" / "interrupted.ckpt").is_file()
    resumed = run_trial(spec, tmp_path / "cut", options=eager)
    assert resumed["resumed_from_step"] == 45 and resumed["steps"] == whole["steps"] == 60
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["test/acc"] == whole["test/acc"] and resumed["best_val_acc"] == whole["best_val_acc"]
    assert not (tmp_path / "cut" / "checkpoints" / "interrupted.ckpt").exists()  # consumed by the finished run
    progress = pd.read_csv(tmp_path / "cut" / "progress.csv")  # both invocations' samples, in order
    assert progress["step"].is_monotonic_increasing and progress["unix_time_s"].is_monotonic_increasing
    assert progress["step"].iloc[0] <= 45 <= progress["step"].iloc[-2] and progress["step"].iloc[-1] == 60


@pytest.mark.parametrize("chunk, at", [(1, 45), (5, 45), (5, 47)])
@pytest.mark.slow
def test_ctrl_c_inside_a_training_step_resumes_on_the_uninterrupted_schedule(tmp_path, monkeypatch, chunk, at):
    """Ctrl-C lands inside a training step (here: while step ``at`` fetches its batch), at a chunk's
    first step or in its middle (chunks of 5 optimizer steps per Lightning step: the graph engines'
    ``CapturedLitSequenceModel``, its steps eager on the CPU). The re-run validates at the same steps,
    stops at ``max_steps`` and ends with the uninterrupted run's weights."""
    import experiments.trial.train as train_module
    from tasks.datamodule import TrainingStream

    quiet_lightning()
    monkeypatch.setattr(train_module, "steps_per_chunk", lambda engine, t: chunk)
    if chunk > 1:
        monkeypatch.setattr(
            train_module, "build_module", lambda spec, dm, engine: CapturedLitSequenceModel(**module_options(spec, dm))
        )
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(max_steps=60, batch_size=8, train_size=100, val_size=32, test_size=32, eval_every=20),
    )
    whole = run_trial(spec, tmp_path / "whole")
    batch = TrainingStream.batch

    def ctrl_c_at_step(self, index):
        if index == at:
            raise KeyboardInterrupt
        return batch(self, index)

    monkeypatch.setattr(TrainingStream, "batch", ctrl_c_at_step)
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path / "cut")
    monkeypatch.setattr(TrainingStream, "batch", batch)
    resumed = run_trial(spec, tmp_path / "cut")
    assert resumed["resumed_from_step"] == at and resumed["steps"] == whole["steps"] == 60

    def validations(run):  # the validation losses of both invocations, in order
        logs = pd.concat(pd.read_csv(f) for f in sorted((tmp_path / run / "logs").rglob("metrics.csv")))
        return logs.dropna(subset=["val/loss"])["val/loss"].round(6).tolist()

    assert validations("cut") == validations("whole") and len(validations("whole")) == 3
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


class InterruptTestPass(L.Callback):
    """Raises Ctrl-C's KeyboardInterrupt as the ``nth`` test pass starts (1: the final weights', 2: the best's)."""

    def __init__(self, nth: int) -> None:
        self.nth, self.seen = nth, 0

    def on_test_start(self, trainer, pl_module) -> None:
        self.seen += 1
        if self.seen == self.nth:
            raise KeyboardInterrupt


def _plateau_spec() -> TrialSpec:
    """Stops on its plateau rule at step 30 with its best validation at step 10 (checked by the tests)."""
    return TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(
            max_steps=200, batch_size=8, train_size=100, val_size=32, test_size=32, eval_every=10, plateau_steps=20
        ),
    )


@pytest.mark.parametrize("nth", [1, 2])
def test_ctrl_c_in_the_test_passes_resumes_straight_to_the_tests(tmp_path, nth):
    """A trial that has stopped early and is interrupted in its test passes: the re-run trains no
    further (Lightning's EarlyStopping alone would train on to the next validation) and tests the
    final and the best weights of the uninterrupted run (the best-weights pass loads best.ckpt into
    the module: a checkpoint written then must not become the final weights)."""
    quiet_lightning()
    spec, eager = _plateau_spec(), RunOptions(engine="eager")
    whole = run_trial(spec, tmp_path / "whole", options=eager)
    assert (whole["steps"], whole["best_step"]) == (30, 10) and whole["stopped_early"]
    assert whole["test/acc"] != whole["final/test/acc"]  # the two passes test different weights
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path / "cut", callbacks=[InterruptTestPass(nth)], options=eager)
    resumed = run_trial(spec, tmp_path / "cut", options=eager)
    assert resumed["resumed_from_step"] == 30 and resumed["steps"] == 30 and resumed["best_step"] == 10
    for key in ("test/acc", "final/test/acc", "best_val_acc", "final_val_acc"):
        assert resumed[key] == whole[key], key


class OutOfMemoryAtBatch(L.Callback):
    """Raises CUDA's out-of-memory error in the third batch of a test set while batches are larger than 8."""

    def __init__(self) -> None:
        self.raised = 0

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch[0].shape[0] > 8 and batch_idx == 2:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")


def test_a_test_pass_out_of_memory_is_evaluated_again_at_half_the_batch(tmp_path):
    """The first test pass runs out of memory half-way at batch 16; it is evaluated again from a clean
    metric at batch 8, and the trial's numbers equal those of a trial tested at batch 8 from the start."""
    quiet_lightning()
    spec = _plateau_spec()
    spec.train = dataclasses.replace(spec.train, test_size=48, eval_batch_size=16)
    eager = RunOptions(engine="eager")
    oom = OutOfMemoryAtBatch()
    retried = run_trial(spec, tmp_path / "oom", callbacks=[oom], options=eager)
    assert oom.raised == 1  # once: the later passes start at the halved batch
    small = dataclasses.replace(spec, train=dataclasses.replace(spec.train, eval_batch_size=8))
    direct = run_trial(small, tmp_path / "direct", options=eager)
    for key in ("test/acc", "final/test/acc", "test/exact", "final/test/exact"):
        assert retried[key] == direct[key], (key, retried[key], direct[key])


def test_a_moved_trial_folder_resumes_with_its_best_checkpoint(tmp_path):
    """Interrupted mid-way, its folder moved (a packed run unpacked under another path), re-run: the
    best checkpoint and score carry over, so later, worse validations do not replace best.ckpt."""
    quiet_lightning()
    spec, eager = _plateau_spec(), RunOptions(engine="eager")
    whole = run_trial(spec, tmp_path / "whole", options=eager)
    assert (whole["steps"], whole["best_step"]) == (30, 10)
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path / "cut", callbacks=[Interrupt(at=15)], options=eager)
    (tmp_path / "cut").rename(tmp_path / "moved")
    resumed = run_trial(spec, tmp_path / "moved", options=eager)
    assert resumed["resumed_from_step"] == 15 and resumed["steps"] == 30
    for key in ("best_step", "best_val_acc", "test/acc", "final/test/acc"):
        assert resumed[key] == whole[key], key


def test_different_seeds_train_on_different_batch_orders(tmp_path):
    quiet_lightning()

    def first_batches(seed):
        spec = TrialSpec(
            task="parity",
            model=ModelShape(mixer="gru"),
            lr=3e-3,
            seed=seed,
            task_options={"seq_len": 8},
            train=TrainConfig(max_steps=5, batch_size=8, train_size=64, val_size=16, test_size=16),
        )
        dm = build_datamodule(spec)
        dm.setup()
        stream = dm.train_dataloader()
        return torch.cat([stream.batch(i)[0] for i in range(8)])

    assert not torch.equal(first_batches(0), first_batches(1)) and torch.equal(first_batches(0), first_batches(0))


@pytest.mark.parametrize("with_out_dir", [True, False])
def test_trial_survives_its_working_directory_being_deleted(tmp_path, monkeypatch, with_out_dir):
    """A worker whose cwd was removed under it (e.g. a re-synced code folder) still trains and writes
    its results: nothing in a trial resolves the working directory."""
    quiet_lightning()
    gone = tmp_path / "cwd"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(max_steps=20, batch_size=8, train_size=64, val_size=32, test_size=32, eval_every=10),
    )
    result = run_trial(spec, tmp_path / "trial" if with_out_dir else None)
    assert result["steps"] == 20
    assert not with_out_dir or (tmp_path / "trial" / "checkpoints" / "best.ckpt").is_file()


@pytest.mark.slow
def test_a_trial_stuck_on_a_plateau_stops_early():
    """plateau_steps: no gain of plateau_delta in validation accuracy for that many steps ends the trial."""
    quiet_lightning()
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="transformer"),
        lr=1e-3,
        seed=0,
        task_options={"seq_len": 24},
        train=TrainConfig(
            max_steps=2000,
            batch_size=16,
            train_size=256,
            val_size=64,
            test_size=64,
            eval_every=50,
            plateau_steps=150,
            plateau_delta=0.2,
        ),
    )
    result = run_trial(spec)
    assert result["stopped_early"] and result["steps"] <= 400, result["steps"]
    with pytest.raises(ValueError, match="plateau_steps"):
        TrainConfig(eval_every=100, plateau_steps=50)


def test_steps_per_chunk_divide_validations_and_the_budget():
    from experiments.trial.train import MAX_CHUNK, steps_per_chunk

    for eval_every, max_steps in [(200, 60_000), (250, 10_000), (7, 91), (500, 1_200), (100, 30)]:
        k = steps_per_chunk("graph", TrainConfig(eval_every=eval_every, max_steps=max_steps))
        assert 1 <= k <= MAX_CHUNK and min(eval_every, max_steps) % k == 0 and max_steps % k == 0
    assert steps_per_chunk("graph", TrainConfig(eval_every=200, max_steps=60_000)) == 50
    assert steps_per_chunk("eager", TrainConfig(eval_every=200, max_steps=60_000)) == 1


def test_graph_engine_needs_cuda():
    from experiments.trial.train import RunOptions, steps_per_chunk

    for engine in ("graph", "compiled"):
        with pytest.raises(ValueError, match=f"engine '{engine}' .* needs a CUDA device"):
            RunOptions(engine=engine).resolved_engine("cpu")
    assert steps_per_chunk("compiled", TrainConfig(eval_every=200, max_steps=60_000)) == 50
    assert RunOptions().resolved_engine("cpu") == "eager" and RunOptions().resolved_engine("gpu") == "graph"


def test_auto_engine_on_cuda_is_the_gpu_engine_and_a_preset_budget_sets_it():
    """``gpu_engine`` is what ``auto`` means on CUDA (the CPU stays eager, an explicit engine wins); a preset's
    ``budget: {engine: compiled}`` sets it for ``experiments.reproduce`` / ``experiments.sweep --preset``."""
    import argparse

    from experiments.cli import run_options
    from experiments.trial.train import RunOptions

    compiled = RunOptions(gpu_engine="compiled")
    assert compiled.resolved_engine("gpu") == "compiled" and compiled.resolved_engine("cpu") == "eager"
    assert RunOptions(engine="graph", gpu_engine="compiled").resolved_engine("gpu") == "graph"
    with pytest.raises(ValueError, match="gpu_engine must be one of graph, compiled, got 'eager'"):
        RunOptions(gpu_engine="eager")
    args = argparse.Namespace(logger="csv", engine="auto", stack=1)
    assert run_options(args, "grazzi-table3").gpu_engine == "compiled"  # its budget: engine: compiled
    assert run_options(args, "pararnn-table6").gpu_engine == "graph"  # no engine in its budget
    assert run_options(args).gpu_engine == "graph"


@pytest.mark.parametrize(
    "train,message",
    [
        ({"max_steps": -5}, "max_steps must be a positive integer"),
        ({"max_steps": 0}, "max_steps must be a positive integer"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"warmup_ratio": 1.5}, "warmup_ratio must be in"),
    ],
)
def test_bad_train_options_are_rejected(train, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**train)


def test_a_test_range_is_scored_like_the_paper_on_lengths_drawn_from_it(tmp_path):
    """``test_range``: one more test set of lengths uniform in a..b; the row's ``range<a>-<b>/acc`` is the
    best checkpoint's accuracy on it recomputed by hand (parity: one label per sequence), and its
    ``scaled_acc`` is ``(acc - 1/2) / (1 - 1/2)``; ``extrap/mean_acc`` stays the mean over ``len<L>``."""
    quiet_lightning()
    spec = _parity_spec(max_steps=30, eval_every=10, train_size=300, val_size=50, test_size=97)
    spec.extrapolation = {**spec.extrapolation, "test_range": [9, 23]}
    result = run_trial(spec, tmp_path, options=RunOptions(engine="eager"))
    module = LitSequenceModel.load_from_checkpoint(tmp_path / "checkpoints" / "best.ckpt", map_location="cpu")
    dm = build_datamodule(spec)
    dm.setup()
    data = dm.data["range9-23"]
    assert data.inputs.shape == (97, 23) and data.lengths.min() >= 9 and data.lengths.max() <= 23
    with torch.no_grad():
        logits = module.eval()(data.inputs)
    last = data.lengths - 1  # parity's label sits at the last real bit
    rows = torch.arange(len(last))
    assert torch.equal(data.targets[rows, last], data.inputs[rows, : last.max() + 1].cumsum(1)[rows, last] % 2)
    acc = (logits[rows, last].argmax(-1) == data.targets[rows, last]).float().mean().item()
    assert result["range9-23/acc"] == pytest.approx(acc, abs=1e-6)
    assert result["range9-23/scaled_acc"] == pytest.approx(2 * acc - 1, abs=1e-6)
    # the final weights' accuracies are scaled alike (Grazzi et al. score the weights at the end of training)
    assert result["final/range9-23/scaled_acc"] == pytest.approx(2 * result["final/range9-23/acc"] - 1, abs=1e-6)
    assert result["final/len32/scaled_acc"] == pytest.approx(2 * result["final/len32/acc"] - 1, abs=1e-6)
    assert result["extrap/mean_acc"] == pytest.approx((result["len16/acc"] + result["len32/acc"]) / 2)
