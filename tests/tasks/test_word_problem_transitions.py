"""word_problem's ``transitions`` option (PD-SSM's A5 and S5 with extra random transitions): the alphabet
generates the group (closure by composing permutations), its elements are distinct and not the identity,
it depends on ``transitions_seed`` alone, and the labels are the products of the alphabet's permutations,
composed one by one (no multiplication table)."""

import itertools

import pytest
import torch

from tasks import get_task
from tasks.groups import get_group
from tasks.word_problem import transition_alphabet
from tests.tasks.test_word_problem_groups import compose, products_by_composition


def closure(generators, points):
    """Every product of ``generators`` (permutation tuples of ``points`` points), by breadth-first search."""
    seen = {tuple(range(points))}
    frontier = list(seen)
    while frontier:
        fresh = {compose(p, g) for p in frontier for g in generators} - seen
        seen |= fresh
        frontier = list(fresh)
    return seen


ORDERS = {"S2": 2, "S3": 6, "S4": 24, "S5": 120, "S6": 720, "A3": 3, "A4": 12, "A5": 60, "A6": 360}


@pytest.mark.parametrize("name", [*ORDERS, "Z2", "Z12", "A4xZ5", "Z2xZ3xS3"])
def test_the_generators_alone_generate_every_served_group(name):
    group = get_group(name)
    perms = [group.elements[i] for i in group.generators]
    assert len(set(perms)) == len(perms) and group.elements[0] not in perms
    reached = closure(perms, len(group.elements[0]))
    assert reached == set(group.elements)
    if name in ORDERS:
        assert len(reached) == ORDERS[name]
    if name.startswith("S"):  # every permutation of n points
        assert reached == set(itertools.permutations(range(int(name[1:]))))


def test_a5_and_s5_generators_are_the_textbook_ones():
    a5, s5 = get_group("A5"), get_group("S5")
    assert [a5.elements[i] for i in a5.generators] == [(1, 2, 0, 3, 4), (1, 2, 3, 4, 0)]  # (0 1 2), (0 1 2 3 4)
    assert [s5.elements[i] for i in s5.generators] == [(1, 0, 2, 3, 4), (1, 2, 3, 4, 0)]  # (0 1), (0 1 2 3 4)
    assert [get_group("A4").elements[i] for i in get_group("A4").generators] == [(1, 2, 0, 3), (0, 2, 3, 1)]


@pytest.mark.parametrize(
    "name,k", [("A5", 2), ("A5", 6), ("A5", 8), ("A5", 12), ("S5", 4), ("S5", 32), ("S5", 119), ("A4xZ5", 7)]
)
@pytest.mark.parametrize("seed", [0, 5])
def test_the_alphabet_is_distinct_not_the_identity_and_generates(name, k, seed):
    task = get_task("word_problem", group=name, transitions=k, transitions_seed=seed)
    group, alphabet = get_group(name), task.alphabet.tolist()
    assert len(alphabet) == len(set(alphabet)) == k == task.vocab_size and task.num_classes == group.order
    assert 0 not in alphabet and alphabet[: len(group.generators)] == list(group.generators)
    perms = [group.elements[i] for i in alphabet]
    assert closure(perms, len(perms[0])) == set(group.elements)


def test_the_alphabet_depends_on_its_seed_alone():
    base = get_task("word_problem", group="S5", seq_len=7, transitions=8, transitions_seed=3)
    for other in (
        base.with_options(seq_len=200),
        base.with_options(bos=True, running=False),
        get_task("word_problem", group="S5", transitions=8, transitions_seed=3),
    ):
        assert torch.equal(other.alphabet, base.alphabet)
    alphabets = {tuple(base.with_options(transitions_seed=s).alphabet.tolist()) for s in range(10)}
    assert len(alphabets) > 5  # 117 choose 6 orderings: the seeds draw different ones
    # the further elements of A5 with one extra: uniform over the 57 others (each count ~ 40 ± 6.3)
    group = get_group("A5")
    counts = torch.bincount(
        torch.tensor([transition_alphabet(group, 3, s)[2].item() for s in range(57 * 40)]), minlength=60
    )
    assert counts[[0, *group.generators]].sum() == 0
    others = counts[[i for i in range(60) if i != 0 and i not in group.generators]]
    assert len(others) == 57 and others.min() >= 15 and others.max() <= 65


@pytest.mark.parametrize("name,k", [("A5", 2), ("A5", 12), ("S5", 4), ("S5", 33), ("Z7", 3), ("A4xZ5", 5)])
@pytest.mark.parametrize("seq_len", [1, 13, 41])
@pytest.mark.parametrize("running", [True, False])
def test_labels_are_the_products_of_the_alphabets_permutations(name, k, seq_len, running):
    task = get_task("word_problem", group=name, seq_len=seq_len, running=running, transitions=k, transitions_seed=k)
    data = task.generate(24, seed=seq_len)
    group = get_group(name)
    perms = [group.elements[i] for i in task.alphabet.tolist()]
    assert data.inputs.min() >= 0 and data.inputs.max() < k
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        expected = products_by_composition(perms, group.elements, x)
        assert y == (expected if running else [-100] * (seq_len - 1) + expected[-1:])


def test_every_symbol_of_the_alphabet_is_drawn():
    data = get_task("word_problem", group="S5", seq_len=50, transitions=32).generate(100, seed=2)
    assert set(data.inputs.flatten().tolist()) == set(range(32))


def test_bos_takes_the_id_after_the_alphabet():
    task = get_task("word_problem", group="A5", seq_len=9, transitions=6, bos=True)
    data = task.generate(20, seed=1)
    assert task.vocab_size == 7 and task.num_classes == 60 and task.total_len == 10
    assert (data.inputs[:, 0] == 6).all() and (data.targets[:, 0] == -100).all() and data.inputs[:, 1:].max() < 6


def test_distinct_counts_the_sequences_of_the_alphabet():
    task = get_task("word_problem", group="A5", seq_len=3, transitions=2, distinct=True)
    assert len({tuple(r) for r in task.generate(8, seed=0).inputs.tolist()}) == 8 == 2**3
    with pytest.raises(ValueError, match=r"only 2\^3 = 8 exist"):
        task.generate(9, seed=0)


@pytest.mark.parametrize("name,k", [("S2", 1), ("Z2", 1), ("A3", 1), ("A3", 2), ("Z12", 11)])
def test_smallest_groups_and_the_whole_group_but_the_identity(name, k):
    group = get_group(name)
    task = get_task("word_problem", group=name, seq_len=5, transitions=k)
    assert len(set(task.alphabet.tolist())) == k and 0 not in task.alphabet.tolist()
    if k == group.order - 1:
        assert sorted(task.alphabet.tolist()) == list(range(1, group.order))
    task.generate(4, seed=0)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"group": "A5", "transitions": 1}, "transitions must be an int from 2 .* to 59 .*, got 1$"),
        ({"group": "S5", "transitions": 120}, "transitions must be an int from 2 .* to 119 .*, got 120$"),
        ({"group": "A4xZ5", "transitions": 2}, "from 3 \\(the alphabet starts with A4xZ5's 3 generators\\)"),
        ({"group": "A5", "transitions": True}, "got True$"),
        ({"group": "A5", "transitions": 4, "transitions_seed": -1}, "transitions_seed must be an int >= 0, got -1$"),
    ],
)
def test_bad_transitions_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as err:
        get_task("word_problem", **options)
    assert "\n" not in str(err.value) and str(err.value).startswith("task 'word_problem': ")
