"""Deletang et al. 2023's tasks: every label recomputed by a plain Python loop from the input alone, on
fresh seeds at awkward lengths; the answer layout; the extrapolation protocol with answer slots."""

import math

import pytest

from tasks import IGNORE_INDEX, ExtrapolationConfig, SyntheticDataModule, generate_variable_length, get_task

LENGTHS = [1, 2, 3, 4, 5, 8, 13, 31, 64]
SEEDS = [11, 2024]


def rows(name, n, seed, count=64, **options):
    task = get_task(name, seq_len=n, **options)
    data = task.generate(count, seed=seed)
    assert data.inputs.shape == (count, task.total_len)
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        yield task, x, y


def last_label(x, y):
    """The one scored position is the last; returns the label."""
    assert all(t == IGNORE_INDEX for t in y[:-1])
    return y[-1]


def answer(task, n, x, y):
    """Checks the layout (input, then answer tokens, nothing scored on the input); returns (input, scored
    answer symbols, number of scored slots)."""
    assert x[n:] == [task.answer_token] * (len(x) - n)
    assert all(t == IGNORE_INDEX for t in y[:n])
    out = y[n:]
    scored = [t for t in out if t != IGNORE_INDEX]
    assert out[: len(scored)] == scored  # the scored slots come first
    return x[:n], scored


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_even_pairs(n, seed):
    for _, x, y in rows("even_pairs", n, seed):
        pairs = sum(1 for i in range(n - 1) if (x[i], x[i + 1]) in ((0, 1), (1, 0)))
        assert last_label(x, y) == pairs % 2


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("cycle", [5, 7])
def test_cycle_navigation(n, cycle):
    for _, x, y in rows("cycle_navigation", n, 3, cycle_length=cycle):
        state = 0
        for a in x:
            state = (state + {0: -1, 1: 0, 2: 1}[a]) % cycle
        assert last_label(x, y) == state


@pytest.mark.parametrize("n", LENGTHS)
def test_string_tasks(n):
    for name, symbols, expected in [
        ("reverse_string", 2, lambda s: s[::-1]),
        ("duplicate_string", 3, lambda s: s + s),
        ("odds_first", 2, lambda s: [s[i] for i in range(1, len(s), 2)] + [s[i] for i in range(0, len(s), 2)]),
        ("bucket_sort", 5, sorted),
    ]:
        for task, x, y in rows(name, n, 7, symbols=symbols):
            s, out = answer(task, n, x, y)
            assert out == expected(s), name
            assert len(y) - n == task.output_length(n) == len(out)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_stack_manipulation(n, seed):
    for task, x, y in rows("stack_manipulation", n, seed):
        s, out = answer(task, n, x, y)
        k = next((i for i, t in enumerate(s) if t >= 2), n)  # the given stack ends at the first action
        assert k >= 1 and all(t >= 2 for t in s[k:])
        stack = list(s[:k])
        for action in s[k:]:
            if action == 2:
                stack = stack[:-1]
            else:
                stack.append(action - 3)
        assert out == stack[::-1] + [2]


def binary_operands(s):
    """(a, b) from ``a 2 b`` in little-endian bits."""
    sep = s.index(2)
    value = lambda bits: sum(bit << i for i, bit in enumerate(bits))  # noqa: E731
    return value(s[:sep]), value(s[sep + 1 :]), sep, len(s) - sep - 1


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("name", ["binary_addition", "binary_multiplication"])
def test_binary_operations(n, name):
    for task, x, y in rows(name, n, 5):
        s, out = answer(task, n, x, y)
        assert out[-1] == 2 and 2 not in out[:-1]
        digits = out[:-1]
        if n <= 2:
            assert 2 not in s
            v = sum(bit << i for i, bit in enumerate(s))
            assert v <= 2**n - 2
            assert digits == ([int(c) for c in reversed(f"{v:b}")] if name == "binary_addition" else [0] * (n - 1))
            continue
        a, b, la, lb = binary_operands(s)
        assert la >= 1 and lb >= 1 and a >= 1 and b >= 1
        result = a + b if name == "binary_addition" else a * b
        assert sum(bit << i for i, bit in enumerate(digits)) == result
        assert digits[-1] == 1 or digits == [0]  # no leading zeros


@pytest.mark.parametrize("n", LENGTHS)
def test_compute_sqrt(n):
    for task, x, y in rows("compute_sqrt", n, 9):
        s, out = answer(task, n, x, y)
        value = int("".join(map(str, s)), 2)
        root = int("".join(map(str, out)), 2)
        assert value >= 1 and root * root <= value < (root + 1) ** 2
        assert len(out) == math.ceil(n / 2)


@pytest.mark.parametrize("n", LENGTHS)
def test_missing_duplicate(n):
    for _, x, y in rows("missing_duplicate", n, 4):
        label = last_label(x, y)
        if n == 1:
            assert x == [1] and label == 1
            continue
        half = n // 2
        body = x[: 2 * half]
        assert x[2 * half :] == [3] * (n % 2) and body.count(2) == 1
        hole = body.index(2)
        twin = hole + half if hole < half else hole - half
        assert body[twin] == label
        assert all(body[i] == body[i + half] for i in range(half) if i != hole % half)
        assert label == sum(t for t in body if t != 2) % 2  # the parity shortcut the docstring states


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("modulus", [5, 7])
def test_solve_equation(n, modulus):
    m = modulus
    text = {m: "+", m + 1: "-", m + 3: "(", m + 4: ")"}
    for _, x, y in rows("solve_equation", n, 8, modulus=m):
        label = last_label(x, y)
        if n < 3:
            assert x == [0] * n and label == 0
            continue
        assert x[-2] == m + 6 and x[:-2].count(m + 5) == 1 and m + 2 not in x
        value = x[-1]
        # brute force: the digits d for which E[x := d] evaluates to v; exactly one
        solutions = [
            d
            for d in range(m)
            if eval("".join(str(d) if t == m + 5 else text.get(t, str(t)) for t in x[:-2])) % m == value
        ]
        assert solutions == [label]


def test_solve_equation_picks_the_first_digit_after_a_uniform_start():
    """The replaced digit is the first at or after a uniform start, wrapping around: at length 4 ``E`` is
    ``-d`` and both starts pick its digit."""
    data = get_task("solve_equation", seq_len=4).generate(200, seed=1)  # E has 2 tokens: "-d"
    assert (data.inputs[:, 0] == 6).all() and (data.inputs[:, 1] == 10).all()


@pytest.mark.parametrize(
    "name", ["reverse_string", "stack_manipulation", "binary_addition", "compute_sqrt", "duplicate_string"]
)
def test_extrapolation_pads_after_the_answer_slots(name):
    task = get_task(name)
    data = generate_variable_length(task, 200, seed=3, min_len=2, max_len=9)
    assert data.inputs.shape[1] == task.with_options(seq_len=9).total_len
    for x, y, total in zip(data.inputs.tolist(), data.targets.tolist(), data.lengths.tolist()):
        n = next(n for n in range(2, 10) if task.with_options(seq_len=n).total_len == total)
        assert x[total:] == [task.vocab_size] * (len(x) - total) and all(t == IGNORE_INDEX for t in y[total:])
        assert x[n:total] == [task.answer_token] * (total - n)


def test_data_module_builds_the_extrapolation_sets_of_a_string_task():
    dm = SyntheticDataModule(
        "odds_first",
        train_size=64,
        val_size=16,
        test_size=16,
        extrapolation=ExtrapolationConfig(min_len=1, max_len=6, eval_lengths=(7, 12)),
    )
    dm.setup()
    assert dm.data["len12"].inputs.shape == (16, 24)
    assert dm.data["train"].inputs.shape == (64, 12) and dm.vocab_size == 4


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("reverse_string", {"seq_len": 0}, "seq_len must be >= 1"),
        ("bucket_sort", {"symbols": 1}, "symbols must be an int >= 2"),
        ("cycle_navigation", {"cycle_length": 1}, "cycle_length"),
        ("solve_equation", {"modulus": 1}, "modulus"),
        ("binary_addition", {"seq_len": -2}, "seq_len"),
    ],
)
def test_bad_options_are_one_line_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_task(name, **options)


def test_chance_and_classes():
    assert get_task("stack_manipulation").num_classes == 3
    assert get_task("binary_multiplication").vocab_size == 4
    assert get_task("bucket_sort").chance_accuracy == pytest.approx(0.2)
    assert get_task("solve_equation").vocab_size == 12
