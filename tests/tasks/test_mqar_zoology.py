"""``mqar`` with ``placement="zoology"`` against an independent port of Zoology's ``_mqar`` (numpy, one
row at a time, as its code draws them): the same layout rules and the same distributions."""

import numpy as np
import pytest
import torch

from tasks import IGNORE_INDEX, get_task


def zoology_port(rng, rows, vocab, length, kappa, power_a=0.01):
    """Zoology's generator, written from its description: keys from [1, V/2), values from [V/2, V),
    distinct; query slot s in [0, (L - 2κ)/2) drawn without replacement with p ∝ a (s+1)^(a-1), the key at
    offset 2s after the context, its value the target there; every other position uniform over [0, V)."""
    space = (length - 2 * kappa) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    inputs = rng.integers(0, vocab, (rows, length))
    targets = np.full((rows, length), IGNORE_INDEX)
    for r in range(rows):
        keys = rng.choice(np.arange(1, vocab // 2), kappa, replace=False)
        values = rng.choice(np.arange(vocab // 2, vocab), kappa, replace=False)
        inputs[r, 0 : 2 * kappa : 2], inputs[r, 1 : 2 * kappa : 2] = keys, values
        slots = rng.choice(space, kappa, replace=False, p=p)
        inputs[r, 2 * kappa + 2 * slots] = keys
        targets[r, 2 * kappa + 2 * slots] = values
    return inputs, targets


def summary(inputs, targets, kappa):
    """Per data set: the query offsets after the context, the unscored reappearances of context keys per
    sequence, the share of filler that is token 0."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    offsets = np.nonzero(targets != IGNORE_INDEX)[1] - 2 * kappa
    keys = inputs[:, 0 : 2 * kappa : 2]
    unscored = targets == IGNORE_INDEX
    unscored[:, : 2 * kappa] = False
    repeats = sum(np.isin(inputs[r][unscored[r]], keys[r]).sum() for r in range(len(inputs))) / len(inputs)
    return offsets, repeats


def test_layout_rules_hold_on_every_row():
    task = get_task("mqar", seq_len=46, vocab_size=64, num_kv_pairs=5, placement="zoology")
    data = task.generate(300, seed=17)
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        keys, values = x[0:10:2], x[1:10:2]
        assert len(set(keys)) == 5 and len(set(values)) == 5
        assert all(1 <= k < 32 for k in keys) and all(32 <= v < 64 for v in values)
        scored = [i for i, t in enumerate(y) if t != IGNORE_INDEX]
        assert len(scored) == 5 and all((i - 10) % 2 == 0 and i >= 10 for i in scored)
        assert sorted(x[i] for i in scored) == sorted(keys)  # each key queried once
        assert all(y[i] == values[keys.index(x[i])] for i in scored)


def test_distributions_match_the_port():
    """Query offsets (the power law over the slot, even offsets only) and the unscored key repeats of the
    filler (the issue's 1.46 per sequence at V 128, L 100, κ 2) agree with the port's."""
    vocab, length, kappa, rows = 128, 100, 2, 6000
    ours = get_task("mqar", seq_len=length, vocab_size=vocab, num_kv_pairs=kappa, placement="zoology")
    data = ours.generate(rows, seed=3)
    port = zoology_port(np.random.default_rng(5), rows, vocab, length, kappa)
    (o1, r1), (o2, r2) = summary(data.inputs, data.targets, kappa), summary(*port, kappa)
    assert (o1 % 2 == 0).all() and (o2 % 2 == 0).all()
    assert r1 == pytest.approx(r2, abs=0.08) and r1 == pytest.approx((length - 3 * kappa) * kappa / vocab, abs=0.08)
    h1 = np.bincount(o1 // 2, minlength=48)[:48] / len(o1)
    h2 = np.bincount(o2 // 2, minlength=48)[:48] / len(o2)
    assert np.abs(h1 - h2).max() < 0.03 and h1[0] > 0.15  # concentrated on the first slot
    assert np.abs(np.cumsum(h1) - np.cumsum(h2)).max() < 0.03


def test_the_other_placements_differ_from_zoology():
    """``power`` is ours: odd offsets too, and the filler never repeats a context key."""
    task = get_task("mqar", seq_len=100, vocab_size=128, num_kv_pairs=2, placement="power")
    data = task.generate(2000, seed=1)
    offsets, repeats = summary(data.inputs, data.targets, 2)
    assert (offsets % 2 == 1).mean() > 0.3 and repeats == 0


@pytest.mark.parametrize("options", [{"seq_len": 45}, {"seq_len": 12, "num_kv_pairs": 4}])
def test_zoology_needs_an_even_length_of_four_per_pair(options):
    with pytest.raises(ValueError, match="placement zoology needs an even seq_len"):
        get_task("mqar", placement="zoology", **options)


def test_zoology_is_deterministic_in_the_seed():
    task = get_task("mqar", seq_len=64, vocab_size=256, num_kv_pairs=4, placement="zoology")
    assert torch.equal(task.generate(20, seed=9).inputs, task.generate(20, seed=9).inputs)


def test_figure_two_filler_is_token_zero():
    """``random_non_queries=False`` (Zoology's Figure 2 configs): the same keys, values and queries as the
    default for the same seed (the filler is drawn last), and every unscored position after the context 0."""
    options = {"seq_len": 70, "vocab_size": 96, "num_kv_pairs": 6, "placement": "zoology"}
    random_filler = get_task("mqar", **options).generate(200, seed=4)
    zero_filler = get_task("mqar", **options, random_non_queries=False).generate(200, seed=4)
    assert torch.equal(zero_filler.targets, random_filler.targets)
    kept = zero_filler.targets != IGNORE_INDEX
    kept[:, :12] = True  # the context
    assert torch.equal(zero_filler.inputs[kept], random_filler.inputs[kept])
    assert (zero_filler.inputs[~kept] == 0).all() and (random_filler.inputs[~kept] != 0).float().mean() > 0.9


def test_zero_filler_needs_the_zoology_placement():
    with pytest.raises(ValueError, match="random_non_queries=False needs placement zoology"):
        get_task("mqar", placement="power", random_non_queries=False)
