"""Modular arithmetic (Deletang et al. 2023) labels against independent evaluators: Python's own
integer ``eval`` of the expression text and a recursive-descent parser of Deletang's bracket grammar."""

import collections

import pytest
import torch

from tasks import TASKS, generate_variable_length, get_task
from tasks.modular_arithmetic import evaluate_flat, token_strings

LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 40, 41, 64, 127, 256]


def text(tokens, modulus, brackets):
    """Space-separated expression text (digits of any modulus stay one number each)."""
    names = token_strings(modulus, brackets)
    return " ".join(names[t] for t in tokens)


def python_value(expression, modulus):
    return eval(expression, {"__builtins__": {}}) % modulus  # integers only: exact


class BracketParser:
    """Deletang's grammar: ``E := d | - d | ( d ) | ( - d ) | ( E op E )``; returns the value mod m,
    raising ``SyntaxError`` on anything else (so it checks the shape as well as the label)."""

    def __init__(self, tokens, modulus):
        self.t, self.i, self.m = tokens, 0, modulus

    def take(self, *allowed):
        tok = self.t[self.i] if self.i < len(self.t) else None
        if tok not in allowed:
            raise SyntaxError(f"expected {allowed} at {self.i}, got {tok!r}")
        self.i += 1
        return tok

    def digit(self):
        return int(self.take(*map(str, range(self.m))))

    def expr(self):
        tok = self.t[self.i]
        if tok == "-":
            self.take("-")
            return -self.digit() % self.m
        if tok != "(":
            return self.digit()
        self.take("(")
        first, a = self.i, self.expr()
        if self.t[self.i] == ")":  # ( d ) or ( - d ): only a leaf may stand alone in brackets
            if self.t[first] == "(":
                raise SyntaxError(f"redundant brackets at {first}")
            self.take(")")
            return a
        op = self.take("+", "-", "*")
        b = self.expr()
        self.take(")")
        return {"+": a + b, "-": a - b, "*": a * b}[op] % self.m

    def parse(self):
        value = self.expr()
        if self.i != len(self.t):
            raise SyntaxError("trailing tokens")
        return value


def test_registered_with_deletang_vocabularies():
    assert {"modular_arithmetic", "modular_arithmetic_brackets"} <= set(TASKS)
    flat, brackets = get_task("modular_arithmetic"), get_task("modular_arithmetic_brackets")
    # Deletang: input_size = modulus + 4 (digits, + - * _); brackets: digits, + - * ( ) (his 'x' is unused)
    assert (flat.vocab_size, flat.num_classes, flat.config.modulus) == (9, 5, 5)
    assert (brackets.vocab_size, brackets.num_classes, brackets.config.mult) == (10, 5, True)
    assert token_strings(5, False) == ["0", "1", "2", "3", "4", "+", "-", "*", "_"]
    assert token_strings(5, True)[5:] == ["+", "-", "*", "(", ")"]


def test_deletang_docstring_examples():
    """``1 + 2 * 3 = 2``, ``1 - 1 - 1 = 4``, ``0 * 1 + 4 * 3 - 2 = 0`` (mod 5), from his task's docstring."""
    plus, minus, times = 0, 1, 2
    digits = torch.tensor([[1, 2, 3, 0, 0], [1, 1, 1, 0, 0], [0, 1, 4, 3, 2]])
    ops = torch.tensor([[plus, times, plus, plus], [minus, minus, plus, plus], [times, plus, times, minus]])
    assert evaluate_flat(digits[:, :3], ops[:, :2], 5)[:2].tolist() == [2, 4]
    assert evaluate_flat(digits[2:], ops[2:], 5).tolist() == [0]


@pytest.mark.parametrize("modulus,operators", [(5, "+-*"), (2, "+-*"), (7, "*-"), (11, "+-*"), (5, "-")])
@pytest.mark.parametrize("seq_len", LENGTHS)
def test_flat_labels_against_python_eval(modulus, operators, seq_len):
    task = get_task("modular_arithmetic", modulus=modulus, operators=operators, seq_len=seq_len)
    data = task.generate(24, seed=1000 + seq_len)
    blank, allowed_ops = modulus + 3, {modulus + "+-*".index(o) for o in operators}
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        assert len(x) == seq_len and y[:-1] == [-100] * (seq_len - 1)
        expression = x[1:] if seq_len % 2 == 0 else x  # even lengths: one blank first
        if seq_len % 2 == 0:
            assert x[0] == blank
        assert len(expression) % 2 == 1 and blank not in expression
        assert all(0 <= t < modulus for t in expression[0::2]) and set(expression[1::2]) <= allowed_ops
        assert y[-1] == python_value(text(expression, modulus, False), modulus)


@pytest.mark.parametrize("modulus,mult", [(5, True), (5, False), (3, True), (11, True)])
@pytest.mark.parametrize("seq_len", LENGTHS)
def test_bracket_labels_against_python_eval_and_a_parser(modulus, mult, seq_len):
    task = get_task("modular_arithmetic_brackets", modulus=modulus, mult=mult, seq_len=seq_len)
    data = task.generate(24, seed=2000 + seq_len)
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        assert len(x) == seq_len and y[:-1] == [-100] * (seq_len - 1) and 0 <= y[-1] < modulus
        expression = text(x, modulus, True)
        assert y[-1] == python_value(expression, modulus), expression
        assert y[-1] == BracketParser(expression.split(), modulus).parse(), expression
        assert mult or "*" not in expression


def leaf_length(tokens):
    """Length of the leaf (``d``, ``-d``, ``(d)``, ``(-d)``) that starts ``tokens``."""
    if tokens[0].isdigit():
        return 1
    if tokens[0] == "-":
        return 2
    return 3 if tokens[1].isdigit() else 4


def test_bracket_shapes_follow_deletangs_recursion():
    """Length 8 is ``( leaf op leaf )`` with the left leaf's length uniform in 1..4 (Deletang's
    ``randint(low=1, high=length - 3)``); the root operator is uniform over ``+ - *``; leaves are
    the four short forms; digits are uniform."""
    names = token_strings(5, True)
    data = get_task("modular_arithmetic_brackets", seq_len=8).generate(8000, seed=4)
    lefts, ops, digits = collections.Counter(), collections.Counter(), collections.Counter()
    for x in data.inputs.tolist():
        t = [names[i] for i in x]
        assert t[0] == "(" and t[-1] == ")"
        a = leaf_length(t[1:])
        assert leaf_length(t[2 + a :]) == 5 - a  # the right leaf fills the rest exactly
        lefts[a] += 1
        ops[t[1 + a]] += 1
        digits.update(c for c in t if c.isdigit())
    assert sorted(lefts) == [1, 2, 3, 4] and all(abs(c / 8000 - 1 / 4) < 0.02 for c in lefts.values())
    assert sorted(ops) == ["*", "+", "-"] and all(abs(c / 8000 - 1 / 3) < 0.02 for c in ops.values())
    assert sorted(digits) == list("01234") and all(abs(c / 16000 - 1 / 5) < 0.015 for c in digits.values())


@pytest.mark.parametrize(
    "name,opts",
    [("modular_arithmetic", {}), ("modular_arithmetic_brackets", {}), ("modular_arithmetic_brackets", {"mult": False})],
)
def test_length_extrapolation_protocol(name, opts):
    """Right-padded variable lengths 3..40: the real prefix is the task's own sample, its label at the last real token."""
    task = get_task(name, **opts)
    data = generate_variable_length(task, 400, seed=7, min_len=3, max_len=40)
    pad, brackets = task.vocab_size, name.endswith("brackets")
    assert data.inputs.shape == (400, 40) and len(data.lengths.unique()) == 38
    for x, y, n in zip(data.inputs.tolist(), data.targets.tolist(), data.lengths.tolist()):
        assert x[n:] == [pad] * (40 - n) and y[n:] == [-100] * (40 - n) and y[: n - 1] == [-100] * (n - 1)
        real = x[:n] if brackets or n % 2 else x[1:n]
        assert y[n - 1] == python_value(text(real, 5, brackets), 5)


@pytest.mark.parametrize("name", ["modular_arithmetic", "modular_arithmetic_brackets"])
def test_deterministic_and_global_rng_free(name):
    torch.manual_seed(0)
    a = get_task(name, seq_len=33).generate(50, seed=3)
    torch.manual_seed(1)
    b = get_task(name, seq_len=33).generate(50, seed=3)
    c = get_task(name, seq_len=33).generate(50, seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize(
    "name,opts,message",
    [
        ("modular_arithmetic", {"seq_len": 0}, "seq_len must be >= 1"),
        ("modular_arithmetic", {"modulus": 1}, "modulus must be an int >= 2"),
        ("modular_arithmetic", {"operators": "+/"}, "operators must be distinct characters"),
        ("modular_arithmetic", {"operators": ""}, "operators must be distinct characters"),
        ("modular_arithmetic", {"operators": "++"}, "operators must be distinct characters"),
        ("modular_arithmetic_brackets", {"seq_len": 0}, "seq_len must be >= 1"),
        ("modular_arithmetic_brackets", {"modulus": 1.5}, "modulus must be an int >= 2"),
        ("modular_arithmetic_brackets", {"mult": "yes"}, "mult must be True or False"),
        ("modular_arithmetic_brackets", {"brackets": True}, "unknown option"),
    ],
)
def test_bad_configurations_raise(name, opts, message):
    with pytest.raises(ValueError, match=message):
        get_task(name, **opts)


def test_label_balance():
    """Long flat expressions have near-uniform labels; with brackets and '*' the 0 label is ~30%."""
    flat = get_task("modular_arithmetic", seq_len=41).generate(20000, seed=0).targets[:, -1]
    assert (flat.bincount(minlength=5).float() / 20000 - 0.2).abs().max() < 0.015
    mult = get_task("modular_arithmetic_brackets", seq_len=101).generate(20000, seed=0).targets[:, -1]
    assert 0.27 < (mult == 0).float().mean() < 0.34


@pytest.mark.parametrize("seq_len", [2, 3, 4, 5, 12, 39, 40])
def test_equals_token_carries_the_label_and_counts_in_seq_len(seq_len):
    """``equals=True``: the expression, then ``=`` (id m+4) with the label; lengths 3..40 are 2..39
    expression symbols plus the label slot (Grazzi et al.'s convention)."""
    task = get_task("modular_arithmetic", seq_len=seq_len, modulus=5, equals=True)
    assert task.vocab_size == 10
    data = task.generate(300, seed=seq_len)
    assert data.inputs.shape == (300, seq_len)
    for x, y in zip(data.inputs.tolist(), data.targets.tolist()):
        assert x[-1] == 9 and 9 not in x[:-1] and y[:-1] == [-100] * (seq_len - 1)
        expression = [t for t in x[:-1] if t != 8]  # without the blank of an even expression length
        assert len(expression) == (seq_len - 1 if (seq_len - 1) % 2 else seq_len - 2)
        assert y[-1] == python_value(text(expression, 5, False), 5)


def test_equals_needs_room_for_a_digit():
    with pytest.raises(ValueError, match="seq_len must be >= 2"):
        get_task("modular_arithmetic", seq_len=1, equals=True)
    with pytest.raises(ValueError, match="equals must be True or False"):
        get_task("modular_arithmetic", equals="yes")
