"""The training order: batches, epochs, and which seed decides what."""

import pytest
import torch

from tasks import SyntheticDataModule
from tasks.base import make_generator
from tasks.datamodule import SHUFFLE_STREAM, TensorBatches


def test_tensor_batches_shuffle_each_epoch_like_randperm():
    """Epoch e serves rows in the order of randperm drawn from (seed, stream, e), in batches, last one partial."""
    n, bs = 103, 16
    x = torch.randint(0, 50, (n, 7))
    y = x * 3 + 1  # rows of x and y must stay paired
    ours = TensorBatches(x, y, bs, shuffle_seed=5)
    assert len(ours) == 7
    epochs = []
    for epoch in range(3):
        batches = list(ours)
        assert [b[0].shape[0] for b in batches] == [16] * 6 + [7]
        gx, gy = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        order = torch.randperm(n, generator=make_generator(5, SHUFFLE_STREAM, epoch))
        assert torch.equal(gx, x[order]) and torch.equal(gy, y[order])
        epochs.append(order)
    assert not torch.equal(epochs[0], epochs[1])
    plain = list(TensorBatches(x, y, 50))
    assert [b[0].shape[0] for b in plain] == [50, 50, 3] and torch.equal(torch.cat([b[0] for b in plain]), x)
    with pytest.raises(ValueError, match="differ in length"):
        TensorBatches(x, y[:5], bs)


def _first_batches(data_seed: int, shuffle_seed: int, n: int = 3) -> list[torch.Tensor]:
    dm = SyntheticDataModule("keep_nth", {"seq_len": 12}, train_size=200, val_size=10, test_size=10, batch_size=8,
                             seed=data_seed, shuffle_seed=shuffle_seed)
    dm.setup()
    it = iter(dm.train_dataloader())
    return [next(it)[0] for _ in range(n)]


def test_trial_seed_sets_the_order_and_data_seed_the_data():
    """Two trial seeds see different batches of the same training set; the same seeds the same batches."""
    a, again, other = _first_batches(0, 0), _first_batches(0, 0), _first_batches(0, 1)
    assert all(torch.equal(p, q) for p, q in zip(a, again))
    assert not any(torch.equal(p, q) for p, q in zip(a, other))
    # same training set, served in another order: the rows are the same multiset
    dm = SyntheticDataModule("keep_nth", {"seq_len": 12}, train_size=200, val_size=10, test_size=10, batch_size=8,
                             seed=0, shuffle_seed=1)
    dm.setup()
    rows = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    served = torch.cat([b[0] for b in dm.train_dataloader()])
    assert rows(served) == rows(dm.data["train"].inputs)
    # another data seed: another training set
    dm2 = SyntheticDataModule("keep_nth", {"seq_len": 12}, train_size=200, val_size=10, test_size=10, batch_size=8,
                              seed=1, shuffle_seed=1)
    dm2.setup()
    assert rows(dm2.data["train"].inputs) != rows(dm.data["train"].inputs)


def test_shuffle_seed_defaults_to_the_data_seed_and_is_validated():
    dm = SyntheticDataModule("parity", train_size=8, val_size=8, test_size=8, seed=3)
    assert dm.shuffle_seed == 3
    with pytest.raises(ValueError, match="seed"):
        SyntheticDataModule("parity", train_size=8, val_size=8, test_size=8, shuffle_seed=-1)
