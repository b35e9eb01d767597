"""Determinism, seeds, disjoint splits, bad configurations, extrapolation and the data module."""

import pytest
import torch

from tasks import (
    TASKS,
    ExtrapolationConfig,
    SyntheticDataModule,
    generate_variable_length,
    get_task,
    make_generator,
)

ALL = [
    ("parity", {}),
    ("keep_nth", {}),
    ("keep_nth", {"per_position": True}),
    ("mqar", {}),
    ("khop", {"k": 1}),
    ("khop", {"k": 2}),
]


@pytest.mark.parametrize("name,opts", ALL)
def test_deterministic_in_seed(name, opts):
    a = get_task(name, **opts).generate(50, seed=123)
    b = get_task(name, **opts).generate(50, seed=123)
    c = get_task(name, **opts).generate(50, seed=124)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_generation_ignores_global_rng():
    torch.manual_seed(0)
    a = get_task("mqar").generate(10, seed=1)
    torch.manual_seed(99)
    b = get_task("mqar").generate(10, seed=1)
    assert torch.equal(a.inputs, b.inputs)


def test_seed_streams_are_disjoint():
    g = [make_generator(5, split) for split in range(3)]
    draws = [torch.randint(0, 2**31, (8,), generator=x) for x in g]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


@pytest.mark.parametrize(
    "name,opts,message",
    [
        ("keep_nth", {"n": 101}, "n <= seq_len"),
        ("keep_nth", {"n": 0}, "1 <= n"),
        ("keep_nth", {"per_position": "yes"}, "per_position must be True or False"),
        ("mqar", {"num_kv_pairs": 40, "seq_len": 100}, "3*num_kv_pairs <= seq_len"),
        ("mqar", {"num_kv_pairs": 64}, "num_kv_pairs < vocab_size/2"),
        ("mqar", {"vocab_size": 127}, "even"),
        ("mqar", {"placement": "zipf"}, "placement"),
        ("khop", {"k": 0}, "k must be >= 1"),
        ("khop", {"vocab_size": 1}, "vocab_size"),
        ("parity", {"seq_len": 0}, "seq_len"),
        ("parity", {"lenght": 3}, "unknown option"),
    ],
)
def test_bad_configurations_raise(name, opts, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(")):
        get_task(name, **opts)


def test_unknown_task_lists_known():
    with pytest.raises(ValueError, match="known tasks: .*parity"):
        get_task("parrity")
    assert set(TASKS) >= {"parity", "keep_nth", "mqar", "khop"}


def test_variable_length_padding_and_targets():
    task = get_task("parity")
    d = generate_variable_length(task, 300, seed=2, min_len=3, max_len=12)
    assert d.inputs.shape == (300, 12) and d.lengths.min() >= 3 and d.lengths.max() <= 12
    assert len(d.lengths.unique()) == 10
    for x, y, n in zip(d.inputs.tolist(), d.targets.tolist(), d.lengths.tolist()):
        assert x[n:] == [2] * (12 - n) and y[n:] == [-100] * (12 - n)
        assert y[n - 1] == sum(x[:n]) % 2 and set(y[: n - 1]) <= {-100}


def test_variable_length_respects_task_constraints():
    with pytest.raises(ValueError, match="seq_len"):
        generate_variable_length(get_task("mqar"), 10, seed=0, min_len=3, max_len=20)


def test_datamodule_splits_and_extrapolation():
    dm = SyntheticDataModule(
        "parity",
        train_size=200,
        val_size=50,
        test_size=60,
        seed=4,
        extrapolation=ExtrapolationConfig(min_len=3, max_len=10, eval_lengths=(16, 32)),
    )
    dm.setup()
    assert dm.vocab_size == 3 and dm.num_classes == 2 and dm.test_set_names == ["test", "trainset", "len16", "len32"]
    assert dm.data["len32"].inputs.shape == (60, 32)
    a = SyntheticDataModule("parity", train_size=500, val_size=100, test_size=500, seed=1)
    b = SyntheticDataModule("parity", train_size=500, val_size=100, test_size=500, seed=1)
    a.setup(), b.setup()
    assert torch.equal(a.data["train"].inputs, b.data["train"].inputs)
    rows = lambda name: {tuple(r) for r in a.data[name].inputs.tolist()}
    # 100 random bits: any shared sequence between splits would mean shared seed streams
    assert not rows("train") & rows("test") and not rows("train") & rows("val") and not rows("val") & rows("test")
    assert len(dm.test_dataloader()) == 4


def test_datamodule_serves_batches_from_its_device():
    dm = SyntheticDataModule("parity", train_size=40, val_size=10, test_size=10, batch_size=8, device="meta")
    dm.setup()
    batch = next(next(iter(dm.train_dataloader())).batches(0))  # the stream yields chunks of batches
    assert batch[0].device.type == "meta" and batch[0].shape == (8, dm.task.seq_len)
