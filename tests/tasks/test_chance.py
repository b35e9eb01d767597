"""``Task.chance_accuracy`` (what the scaled accuracy subtracts) for every registered task."""

import pytest

from tasks import TASKS, get_task


@pytest.mark.parametrize(
    "name,opts,chance",
    [
        ("parity", {}, 1 / 2),
        ("parity", {"running": True}, 1 / 2),
        ("keep_nth", {}, 1 / 128),
        ("keep_nth", {"vocab_size": 16, "per_position": True}, 1 / 16),
        ("mqar", {}, 1 / 64),
        ("mqar", {"vocab_size": 32}, 1 / 16),
        ("khop", {"k": 1}, 1 / 11),
        ("khop", {"k": 2, "mask_none": True}, 1 / 5),
        ("word_problem", {"group": "S5"}, 1 / 120),
        ("word_problem", {"group": "Z2"}, 1 / 2),
        ("modular_count", {"m": 3}, 1 / 3),
        ("modular_arithmetic", {}, 1 / 5),
        ("modular_arithmetic", {"modulus": 7}, 1 / 7),
        ("modular_arithmetic_brackets", {}, 1 / 5),
        ("modular_arithmetic_brackets", {"mult": False}, 1 / 5),
    ],
)
def test_chance_levels(name, opts, chance):
    assert get_task(name, **opts).chance_accuracy == pytest.approx(chance)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_has_a_chance_in_the_unit_interval(name):
    task = get_task(name)
    assert 0 < task.chance_accuracy < 1
    assert task.scaled_accuracy(task.chance_accuracy) == pytest.approx(0)
    assert task.scaled_accuracy(1.0) == pytest.approx(1)


def test_mqar_chance_is_what_a_uniform_guess_over_values_scores():
    task = get_task("mqar", vocab_size=16, num_kv_pairs=2, seq_len=40)
    targets = task.generate(2000, seed=0).targets
    values = targets[targets >= 0]
    assert values.min() >= 8 and values.unique().numel() == 8  # the V/2 value tokens, the only targets
    assert abs(values.bincount()[8:].max().item() / values.numel() - task.chance_accuracy) < 0.02


def test_scaled_accuracy():
    assert get_task("modular_arithmetic").scaled_accuracy(0.6) == pytest.approx(0.5)
    assert get_task("parity").scaled_accuracy(0.25) == pytest.approx(-0.5)
