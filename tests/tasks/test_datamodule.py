"""The training order: batches, epochs, and which seed decides what."""

import pytest
import torch

from tasks import SyntheticDataModule
from tasks.base import make_generator
from tasks.datamodule import SHUFFLE_STREAM, TensorBatches, TrainingStream


def test_training_stream_shuffles_each_epoch_like_randperm():
    """Batch b of the stream is rows order(e)[i*bs:(i+1)*bs] with e, i = divmod(b, batches per epoch)."""
    n, bs = 103, 16
    x = torch.randint(0, 50, (n, 7))
    y = x * 3 + 1  # rows of x and y must stay paired
    expected = []
    for epoch in range(3):
        order = torch.randperm(n, generator=make_generator(5, SHUFFLE_STREAM, epoch))
        expected += [(x[order][s : s + bs], y[order][s : s + bs]) for s in range(0, n, bs)]
    assert [b[0].shape[0] for b in expected[:7]] == [16] * 6 + [7]  # the epoch's last batch is smaller
    stream = TrainingStream(x, y, bs, shuffle_seed=5, chunk=3)
    for index in [0, 6, 7, 13, 20, 5, 14]:  # any order: the batch depends on its index alone
        got = stream.batch(index)
        assert torch.equal(got[0], expected[index][0]) and torch.equal(got[1], expected[index][1]), index
    chunk = next(iter(stream))
    assert len(chunk) == 3
    assert all(torch.equal(g[0], e[0]) for g, e in zip(chunk.batches(6), expected[6:9]))


def test_tensor_batches_serve_an_evaluation_set_in_order():
    x = torch.randint(0, 50, (103, 7))
    plain = list(TensorBatches(x, x + 1, 50))
    assert [b[0].shape[0] for b in plain] == [50, 50, 3] and torch.equal(torch.cat([b[0] for b in plain]), x)
    with pytest.raises(ValueError, match="differ in length"):
        TensorBatches(x, x[:5], 16)


def _first_batches(data_seed: int, shuffle_seed: int, n: int = 3) -> list[torch.Tensor]:
    dm = SyntheticDataModule(
        "keep_nth",
        {"seq_len": 12},
        train_size=200,
        val_size=10,
        test_size=10,
        batch_size=8,
        seed=data_seed,
        shuffle_seed=shuffle_seed,
    )
    dm.setup()
    stream = dm.train_dataloader()
    return [stream.batch(i)[0] for i in range(n)]


def test_trial_seed_sets_the_order_and_data_seed_the_data():
    """Two trial seeds see different batches of the same training set; the same seeds the same batches."""
    a, again, other = _first_batches(0, 0), _first_batches(0, 0), _first_batches(0, 1)
    assert all(torch.equal(p, q) for p, q in zip(a, again))
    assert not any(torch.equal(p, q) for p, q in zip(a, other))
    # same training set, served in another order: the rows are the same multiset
    dm = SyntheticDataModule(
        "keep_nth", {"seq_len": 12}, train_size=200, val_size=10, test_size=10, batch_size=8, seed=0, shuffle_seed=1
    )
    dm.setup()
    rows = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    stream = dm.train_dataloader()
    served = torch.cat([stream.batch(i)[0] for i in range(25)])  # 200 rows / batches of 8: one epoch
    assert rows(served) == rows(dm.data["train"].inputs)
    # another data seed: another training set
    dm2 = SyntheticDataModule(
        "keep_nth", {"seq_len": 12}, train_size=200, val_size=10, test_size=10, batch_size=8, seed=1, shuffle_seed=1
    )
    dm2.setup()
    assert rows(dm2.data["train"].inputs) != rows(dm.data["train"].inputs)


def test_shuffle_seed_defaults_to_the_data_seed_and_is_validated():
    dm = SyntheticDataModule("parity", train_size=8, val_size=8, test_size=8, seed=3)
    assert dm.shuffle_seed == 3
    with pytest.raises(ValueError, match="seed"):
        SyntheticDataModule("parity", train_size=8, val_size=8, test_size=8, shuffle_seed=-1)


@pytest.mark.parametrize("train_size,val_size", [(37, 11), (5, 9)])
def test_test_pass_scores_the_first_training_sequences_too(train_size, val_size):
    """``trainset``: the first min(val_size, train_size) training sequences, served in order after ``test``."""
    dm = SyntheticDataModule(
        "mqar",
        {"seq_len": 16, "vocab_size": 16},
        train_size=train_size,
        val_size=val_size,
        test_size=13,
        eval_batch_size=4,
        seed=3,
    )
    dm.setup()
    assert dm.test_set_names == ["test", "trainset"]
    n = min(train_size, val_size)
    loaders = dm.test_dataloader()
    served = [torch.cat([b[i] for b in loaders[1]]) for i in (0, 1)]
    assert torch.equal(served[0], dm.data["train"].inputs[:n]) and torch.equal(served[1], dm.data["train"].targets[:n])
    assert sum(len(b[0]) for b in loaders[0]) == 13


def test_extrapolation_test_sets_follow_the_training_subset():
    from tasks.extrapolation import ExtrapolationConfig

    dm = SyntheticDataModule(
        "parity",
        train_size=20,
        val_size=6,
        test_size=8,
        seed=0,
        extrapolation=ExtrapolationConfig(min_len=3, max_len=6, eval_lengths=[10, 12]),
    )
    dm.setup()
    assert dm.test_set_names == ["test", "trainset", "len10", "len12"]
    assert torch.equal(dm.data["trainset"].lengths, dm.data["train"].lengths[:6])


def test_a_test_range_adds_one_set_of_lengths_drawn_from_it():
    from tasks.extrapolation import ExtrapolationConfig, pad_id

    config = ExtrapolationConfig(min_len=3, max_len=6, eval_lengths=[10], test_range=[7, 12])
    dm = SyntheticDataModule("parity", train_size=20, val_size=6, test_size=300, seed=0, extrapolation=config)
    dm.setup()
    assert dm.test_set_names == ["test", "trainset", "len10", "range7-12"]
    data = dm.data["range7-12"]
    assert data.inputs.shape == (300, 12) and set(data.lengths.tolist()) == set(range(7, 13))
    for x, y, n in zip(data.inputs.tolist(), data.targets.tolist(), data.lengths.tolist()):
        assert x[n:] == [pad_id(dm.task)] * (12 - n) and y[n - 1] == sum(x[:n]) % 2 and y[: n - 1] == [-100] * (n - 1)
    again = SyntheticDataModule("parity", train_size=20, val_size=6, test_size=300, seed=0, extrapolation=config)
    again.setup()
    assert torch.equal(again.data["range7-12"].inputs, data.inputs)  # drawn from the data seed


def test_a_val_range_draws_the_validation_lengths_from_it():
    from tasks.extrapolation import ExtrapolationConfig, pad_id

    config = ExtrapolationConfig(min_len=3, max_len=6, eval_lengths=[10], val_range=[7, 12])
    dm = SyntheticDataModule("parity", train_size=200, val_size=300, test_size=50, seed=0, extrapolation=config)
    dm.setup()
    assert dm.test_set_names == ["test", "trainset", "len10"]  # no test set of its own
    val = dm.data["val"]
    assert val.inputs.shape == (300, 12) and set(val.lengths.tolist()) == set(range(7, 13))
    for x, y, n in zip(val.inputs.tolist(), val.targets.tolist(), val.lengths.tolist()):
        assert x[n:] == [pad_id(dm.task)] * (12 - n) and y[n - 1] == sum(x[:n]) % 2
    # training and test sets keep the training lengths, and the trainset the training sequences
    for name in ("train", "test", "trainset"):
        assert set(dm.data[name].lengths.tolist()) <= set(range(3, 7)), name
    plain = SyntheticDataModule(
        "parity", train_size=200, val_size=300, test_size=50, seed=0, extrapolation=ExtrapolationConfig(3, 6, [10])
    )
    plain.setup()
    assert set(plain.data["val"].lengths.tolist()) == set(range(3, 7))
    assert torch.equal(plain.data["train"].inputs, dm.data["train"].inputs)


@pytest.mark.parametrize("name", ["test_range", "val_range"])
@pytest.mark.parametrize(
    "test_range,message",
    [
        ([5], "two lengths"),
        ([0, 4], "1 <= a <= b"),
        ([9, 4], "1 <= a <= b"),
        (["a", 4], "two lengths"),
        (7, "two lengths"),
    ],
)
def test_a_bad_length_range_is_one_clear_error(name, test_range, message):
    from tasks.extrapolation import ExtrapolationConfig

    with pytest.raises(ValueError, match=f"extrapolation: {name} .*{message}"):
        ExtrapolationConfig(**{name: test_range})
