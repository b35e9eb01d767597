"""The groups of the word-problem papers (Merrill, Petty, Sabharwal 2024; DeltaProduct 2025): S4,
Z60, A4xZ5 (also spelled A4_x_Z5), A5, S5, labels recomputed by composing permutations explicitly."""

import itertools

import pytest
import torch

from tasks import get_task
from tasks.groups import canonical_name, get_group


def compose(a, b):
    """``(a * b)[i] = a[b[i]]``: apply ``b`` first."""
    return tuple(a[i] for i in b)


def products_by_composition(perms, elements, tokens):
    """The index in ``elements`` of ``perms[tokens[0]] * ... * perms[tokens[t]]`` for every ``t``, composing
    the permutations one at a time (no multiplication table)."""
    index = {p: i for i, p in enumerate(elements)}
    state, out = tuple(range(len(elements[0]))), []
    for token in tokens:
        state = compose(state, perms[token])
        out.append(index[state])
    return out


@pytest.mark.parametrize(
    "name,order,abelian,solvable",
    [
        ("S3", 6, False, True),
        ("S4", 24, False, True),
        ("Z60", 60, True, True),
        ("A4xZ5", 60, False, True),
        ("A4_x_Z5", 60, False, True),
        ("A5", 60, False, False),
        ("S5", 120, False, False),
    ],
)
def test_paper_groups_structure(name, order, abelian, solvable):
    g = get_group(name)
    assert g.order == order and g.is_abelian() == abelian and g.is_solvable() == solvable


def test_product_spellings_name_one_group():
    assert canonical_name("A4_x_Z5") == canonical_name("A4×Z5") == "A4xZ5" and canonical_name("S5") == "S5"
    a, b = get_group("A4xZ5"), get_group("A4_x_Z5")
    assert a.name == b.name == "A4xZ5" and a.elements == b.elements and torch.equal(a.table, b.table)
    # a general product: Z2xZ3xS3 acts on 2 + 3 + 3 points, order 36
    assert get_group("Z2_x_Z3_x_S3").order == 36 and len(get_group("Z2xZ3xS3").elements[0]) == 8


def test_s4_is_every_permutation_of_four_points():
    g = get_group("S4")
    assert set(g.elements) == set(itertools.permutations(range(4))) and g.elements[0] == (0, 1, 2, 3)


def test_z60_is_addition_mod_60():
    g = get_group("Z60")
    i = torch.arange(60)
    assert torch.equal(g.table, (i[:, None] + i[None, :]) % 60)


def test_a4_x_z5_elements_are_pairs():
    """Each element acts on points 0..3 as an even permutation and on points 4..8 as a rotation."""
    even = {
        p
        for p in itertools.permutations(range(4))
        if sum(p[i] > p[j] for i, j in itertools.combinations(range(4), 2)) % 2 == 0
    }
    rotations = {tuple(4 + (i + k) % 5 for i in range(5)) for k in range(5)}
    elems = get_group("A4_x_Z5").elements
    assert {(e[:4], e[4:]) for e in elems} == set(itertools.product(even, rotations))


@pytest.mark.parametrize("name", ["S4", "Z60", "A4xZ5", "A4_x_Z5", "A5"])
@pytest.mark.parametrize("seq_len", [1, 2, 17, 64])
@pytest.mark.parametrize("running", [True, False])
def test_word_problem_labels_by_explicit_composition(name, seq_len, running):
    task = get_task("word_problem", group=name, seq_len=seq_len, running=running)
    data = task.generate(16, seed=seq_len + 7)
    elems = get_group(name).elements
    assert task.vocab_size == task.num_classes == len(elems) and task.chance_accuracy == pytest.approx(1 / len(elems))
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        expected = products_by_composition(elems, elems, x)
        assert y == (expected if running else [-100] * (seq_len - 1) + expected[-1:])


def test_bad_product_names_raise():
    with pytest.raises(ValueError, match="unknown group"):
        get_task("word_problem", group="A4__Z5")
    with pytest.raises(ValueError, match="exceeds"):
        get_task("word_problem", group="S6_x_Z2")


def test_bos_prefixes_an_unscored_token_and_keeps_the_products():
    from tasks import get_task

    plain = get_task("word_problem", group="A4xZ5", seq_len=9)
    task = plain.with_options(bos=True)
    assert task.vocab_size == plain.vocab_size + 1 == 61 and task.total_len == 10
    a, b = plain.generate(50, seed=4), task.generate(50, seed=4)
    assert (b.inputs[:, 0] == 60).all() and (b.targets[:, 0] == -100).all()
    assert torch.equal(b.inputs[:, 1:], a.inputs) and torch.equal(b.targets[:, 1:], a.targets)


@pytest.mark.parametrize("group,length,count", [("S3", 3, 216), ("Z5", 4, 600), ("A5", 2, 3000)])
def test_distinct_rows_cover_without_repeats(group, length, count):
    """``distinct=True``: no repeated row, up to every sequence of the length (S3 at 3: all 216); the
    labels are still the products (checked by composing the permutations one by one)."""
    from tasks import get_task
    from tasks.groups import get_group

    task = get_task("word_problem", group=group, seq_len=length, distinct=True)
    data = task.generate(count, seed=1)
    assert len({tuple(r) for r in data.inputs.tolist()}) == count
    table = get_group(group).table.tolist()
    for x, y in zip(data.inputs.tolist()[:200], data.targets.tolist()[:200]):
        state = x[0]
        assert y[0] == state
        for t in range(1, length):
            state = table[state][x[t]]
            assert y[t] == state
    iid = get_task("word_problem", group=group, seq_len=length).generate(count, seed=1)
    assert len({tuple(r) for r in iid.inputs.tolist()}) < count  # i.i.d. draws repeat at these sizes


def test_distinct_refuses_more_sequences_than_exist():
    from tasks import get_task

    with pytest.raises(ValueError, match="only 6\\^2 = 36 exist"):
        get_task("word_problem", group="S3", seq_len=2, distinct=True).generate(37, seed=0)
