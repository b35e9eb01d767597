"""Length-bucketed training batches (``train.length_bucketing``): every epoch serves the same sequences, the
batches carry far less padding, and cutting a batch to its longest sequence leaves a causal model's loss as
it was."""

import dataclasses

import pytest
import torch

from experiments.trial.shape import ModelShape
from tasks import ExtrapolationConfig, SyntheticDataModule
from tasks.base import IGNORE_INDEX
from tasks.datamodule import TrainingStream


def _module(pool: int, n: int = 1013, batch: int = 32) -> SyntheticDataModule:
    dm = SyntheticDataModule(
        "parity",
        {"running": True},
        train_size=n,
        val_size=8,
        test_size=8,
        batch_size=batch,
        shuffle_seed=3,
        extrapolation=ExtrapolationConfig(min_len=3, max_len=40, eval_lengths=(40,)),
        length_bucketing=pool,
    )
    dm.setup()
    return dm


def _epoch(stream: TrainingStream, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [stream.batch(epoch * stream.per_epoch + i) for i in range(stream.per_epoch)]


@pytest.mark.parametrize("pool", [1, 4, 50])
def test_an_epoch_serves_every_sequence_once(pool):
    """Re-padded to the set's width, an epoch's batches hold exactly the training set's rows (inputs and
    targets paired), in batches of the same sizes as without bucketing; no real token is cut."""
    dm = _module(pool)
    inputs, targets = dm.data["train"].inputs, dm.data["train"].targets
    stream, plain = dm.train_dataloader(), _module(0).train_dataloader()
    pad = int(inputs[0, -1]) if dm.data["train"].lengths[0] < 40 else dm.vocab_size - 1
    for epoch in (0, 1):
        batches = _epoch(stream, epoch)
        assert [x.shape[0] for x, _ in batches] == [x.shape[0] for x, _ in _epoch(plain, epoch)]
        rows = []
        for x, y in batches:
            full_x = torch.cat([x, torch.full((x.shape[0], 40 - x.shape[1]), pad)], 1)
            full_y = torch.cat([y, torch.full((y.shape[0], 40 - y.shape[1]), IGNORE_INDEX)], 1)
            rows += [tuple(r) for r in torch.cat([full_x, full_y], 1).tolist()]
        expected = [tuple(r) for r in torch.cat([inputs, targets], 1).tolist()]
        assert sorted(rows) == sorted(expected)


def test_batches_are_cut_to_their_longest_sequence_and_padding_drops():
    """Lengths uniform in 3..40: a batch as drawn is about 46% padding; pools of 50 batches sorted by length
    leave a few percent. Each batch's width is the length of its longest row, whose last token is real."""
    dm = _module(50, n=4096)
    lengths = dm.data["train"].lengths.float()
    padding = 1 - lengths.mean() / 40
    assert 0.4 < padding < 0.52
    pad = dm.vocab_size - 1
    real = width = 0
    for x, _ in _epoch(dm.train_dataloader(), 0):
        assert (x[:, -1] != pad).any()
        real += int((x != pad).sum())
        width += x.numel()
    assert real == int(lengths.sum()) and 1 - real / width < 0.05


@pytest.mark.parametrize("multiple", [16, 7, 64])
def test_widths_rounded_to_a_multiple_serve_the_same_batches(multiple):
    """``width_multiple`` (the graph engine's few widths): each batch holds the same rows as the exact cut, its
    width the exact cut rounded up to the multiple, at most the set's 40; the extra columns are padding."""
    dm = _module(4)
    exact = _epoch(dm.train_dataloader(), 0)
    dm.width_multiple = multiple
    rounded = _epoch(dm.train_dataloader(), 0)
    pad = dm.vocab_size - 1
    assert len(exact) == len(rounded)
    for (x, y), (xr, yr) in zip(exact, rounded, strict=True):
        w = x.shape[1]
        assert xr.shape[1] == min(40, -(-w // multiple) * multiple)
        assert torch.equal(xr[:, :w], x) and torch.equal(yr[:, :w], y)
        assert (xr[:, w:] == pad).all() and (yr[:, w:] == IGNORE_INDEX).all()
    assert len({x.shape[1] for x, _ in rounded}) <= -(-40 // multiple)


def test_width_multiple_is_checked():
    x = torch.zeros(4, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="width_multiple must be a positive integer"):
        TrainingStream(x, x, 2, 0, width_multiple=0)


def test_bucketed_order_is_reproducible_and_changes_with_the_epoch_and_seed():
    a, b = _module(8).train_dataloader(), _module(8).train_dataloader()
    assert all(torch.equal(p[0], q[0]) for p, q in zip(_epoch(a, 1), _epoch(b, 1), strict=True))
    first, second = _epoch(a, 0), _epoch(a, 1)
    assert any(p[0].shape != q[0].shape or not torch.equal(p[0], q[0]) for p, q in zip(first, second))
    # the widths are not served short to long: a pool's batches come in a shuffled order
    widths = [x.shape[1] for x, _ in first[:8]]
    assert widths != sorted(widths)


def test_without_lengths_or_with_pool_zero_nothing_changes():
    plain, off = _module(0).train_dataloader(), TrainingStream(*_module(0)._tensors("train"), 32, 3)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(_epoch(plain, 0), _epoch(off, 0), strict=True))
    assert all(x.shape[1] == 40 for x, _ in _epoch(plain, 0))
    fixed = SyntheticDataModule("parity", {"seq_len": 9}, train_size=64, val_size=4, test_size=4, length_bucketing=4)
    fixed.setup()
    assert fixed.train_dataloader().batch(0)[0].shape == (16, 9)


@pytest.mark.parametrize("mixer", ["gru", "transformer"])
def test_cutting_the_padding_leaves_the_loss_unchanged(mixer):
    """A causal model's loss on a bucketed batch equals its loss on the same rows at the full width."""
    from experiments.trial.train import TrainConfig, TrialSpec, build_datamodule, build_module

    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer=mixer),
        lr=1e-3,
        seed=0,
        task_options={"running": True},
        extrapolation={"min_len": 3, "max_len": 40, "eval_lengths": [40]},
        train=TrainConfig(batch_size=16, train_size=512, val_size=8, test_size=8, length_bucketing=8),
    )
    dm = build_datamodule(spec)
    dm.setup()
    module = build_module(spec, dm).double()
    x, y = dm.train_dataloader().batch(3)
    assert x.shape[1] < 40
    full_x = torch.cat([x, torch.full((x.shape[0], 40 - x.shape[1]), dm.vocab_size - 1)], 1)
    full_y = torch.cat([y, torch.full((y.shape[0], 40 - y.shape[1]), IGNORE_INDEX)], 1)
    cut, full = module.loss(module(x), y), module.loss(module(full_x), full_y)
    assert torch.allclose(cut, full, rtol=1e-6, atol=0)  # the loss is taken in float32


def test_length_bucketing_option_is_checked():
    from experiments.trial.train import TrainConfig, TrialSpec

    with pytest.raises(ValueError, match="length_bucketing must be an integer >= 0"):
        TrainConfig(length_bucketing=-1)
    with pytest.raises(ValueError, match="stacked trials cannot use it"):
        SyntheticDataModule("parity", stack_shuffle_seeds=[0, 1], length_bucketing=2)
    spec = TrialSpec(task="parity", model=ModelShape(mixer="gru"), lr=1e-3, seed=0)
    assert "length_bucketing" not in spec.identity()["train"]  # existing studies keep their cell ids
    bucketed = dataclasses.replace(spec, train=TrainConfig(length_bucketing=4))
    assert bucketed.identity()["train"]["length_bucketing"] == 4


def test_a_bucketed_trial_learns_running_parity():
    """Through run_trial (eager, CPU): a GRU trained on bucketed batches of lengths 3..20 solves running parity
    and extrapolates to length 20 within 300 steps."""
    from experiments.trial.train import RunOptions, TrainConfig, TrialSpec, run_trial

    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=1e-2,
        seed=0,
        task_options={"running": True},
        extrapolation={"min_len": 3, "max_len": 20, "eval_lengths": [20]},
        device="cpu",
        train=TrainConfig(
            max_steps=300,
            batch_size=32,
            train_size=2000,
            val_size=200,
            test_size=200,
            eval_every=100,
            length_bucketing=8,
        ),
    )
    result = run_trial(spec, options=RunOptions(logger="none"))
    assert result["test/acc"] > 0.99 and result["len20/acc"] > 0.99
