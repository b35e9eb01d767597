"""Modular arithmetic without and with brackets (Deletang et al., "Neural Networks and the Chomsky
Hierarchy", ICLR 2023; the modulus-5 setting of Grazzi et al. 2025, Table 3).

Both tasks put one label, the value of the whole expression mod ``modulus`` (classes: ``modulus``),
at the last position; every other position is ``-100``. Tokens use Deletang's ids: digits ``0 ..
m-1`` are themselves, then ``+ = m``, ``- = m+1``, ``* = m+2``.

``modular_arithmetic`` (regular; Deletang's ``tasks/regular/modular_arithmetic.py``): an expression
``d op d op ... d`` of odd length, digits uniform over ``[0, m)``, operators uniform over
``operators`` (default ``+-*``), evaluated with the usual precedence (``*`` before ``+`` and ``-``,
left to right): ``1 + 2 * 3 = 2``, ``1 - 1 - 1 = 4`` (mod 5). Deletang's generator takes an even
length as one less; here an even ``seq_len`` puts one blank token ``_ = m+3`` (Deletang's blank, in
his vocabulary too: ``input_size = m + 4``) at position 0 before an expression of ``seq_len - 1``
tokens, so the label stays at the last position and every length of the extrapolation protocol
exists. Vocabulary: ``m + 4``.

``equals=True`` ends the sequence with ``= = m+4`` (vocabulary ``m + 5``) and puts the label there, as
Grazzi et al. 2025 read it (their generator appends ``=`` and scores the answer at it); ``seq_len``
then counts the ``=``, so lengths 3..40 are expressions of 2..39 symbols plus the label slot, their
convention (without ``=``, the suite's 3..40 are expressions of 3..40 symbols, the label on the last).

``modular_arithmetic_brackets`` (deterministic context-free; Deletang's
``tasks/dcf/modular_arithmetic_brackets.py``, used there with ``mult=True``): an expression of
exactly ``seq_len`` tokens from Deletang's recursion: length 1 ``d``, 2 ``-d``, 3 ``(d)``, 4 ``(-d)``;
length ``n >= 5``: ``( A op B )`` with ``|A|`` uniform in ``[1, n-4]``, ``|B| = n - 3 - |A|`` and
``op`` uniform over ``+ - *`` (``+ -`` with ``mult=False``). Unary and binary minus share the token
``-``. Extra tokens ``( = m+3``, ``) = m+4``; vocabulary ``m + 5``. Generated breadth-first, one
vectorized step per tree level.

Chance (``chance_accuracy``): ``1/modulus``, guessing uniformly, as Grazzi et al. scale it. Labels
are not quite uniform: without brackets (mod 5) the label is 0 for 25% of length-3 expressions, 20%
from length 11 on; with brackets and ``mult=True`` a factor 0 absorbs whole subtrees and the label is
0 for about 30% of expressions at every length from 40 to 256, so always answering 0 scores 0.3
(``mult=False``: uniform).
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task

#: token offsets above the digits (Deletang's ids)
PLUS, MINUS, TIMES, BLANK, EQUALS = 0, 1, 2, 3, 4
OPEN, CLOSE = 3, 4
OPERATOR_CHARS = "+-*"


def token_strings(modulus: int, brackets: bool, equals: bool = False) -> list[str]:
    """The text of each token id (``["0", ..., "4", "+", "-", "*", "_"]`` for ``modulus=5`` without brackets;
    ``"="`` last with ``equals``)."""
    return [str(d) for d in range(modulus)] + ["+", "-", "*"] + (["(", ")"] if brackets else ["_"]) + ["="] * equals


def evaluate_flat(digits: torch.Tensor, ops: torch.Tensor, modulus: int) -> torch.Tensor:
    """Value mod ``modulus`` of ``d0 o1 d1 o2 d2 ...`` (``digits (N, k+1)``, ``ops (N, k)`` as 0/1/2 for ``+ - *``).

    Left to right with ``*`` binding tighter: the state is (sum of the finished terms, current signed
    product), both mod ``modulus`` (exact: residues form a ring); ``* d`` multiplies the product by
    ``d``, ``+ d`` / ``- d`` adds the product to the sum and starts a new one at ``d`` / ``-d``. One
    look-up per (operator, digit) pair in a ``(m², 3m)`` transition table, vectorized over the batch.
    """
    m = modulus
    total, term = torch.arange(m * m) // m, torch.arange(m * m) % m  # state s = total * m + term
    d = torch.arange(m)
    after_plus = ((total + term) % m * m)[:, None] + d[None, :]
    after_minus = ((total + term) % m * m)[:, None] + (-d % m)[None, :]
    after_times = (total * m)[:, None] + (term[:, None] * d[None, :]) % m
    table = torch.cat([after_plus, after_minus, after_times], dim=1).flatten()  # [s, op * m + d]
    width = 3 * m
    symbols = ops * m + digits[:, 1:]
    state = digits[:, 0] % m  # total 0, term d0
    for k in range(ops.shape[1]):
        state = table[state * width + symbols[:, k]]
    return (state // m + state % m) % m


@dataclasses.dataclass
class ModularArithmeticConfig:
    #: odd lengths are one expression; an even length is a blank token then an expression one shorter
    seq_len: int = 41
    modulus: int = 5
    #: the operators drawn (uniformly), a non-empty subset of ``+-*``
    operators: str = "+-*"
    #: end with an ``=`` token that carries the label (Grazzi et al.'s layout); ``seq_len`` counts it
    equals: bool = False


class _ModularExpression(Task):
    """What both expression tasks share: ``modulus`` classes (the value), a ``seq_len`` and a ``modulus`` to check."""

    @property
    def num_classes(self) -> int:
        return self.config.modulus

    def _validate(self) -> None:
        c = self.config
        check(c.seq_len >= 1, self.name, f"seq_len must be >= 1, got {c.seq_len}")
        check(
            isinstance(c.modulus, int) and c.modulus >= 2, self.name, f"modulus must be an int >= 2, got {c.modulus!r}"
        )


@register_task("modular_arithmetic")
class ModularArithmetic(_ModularExpression):
    """Evaluate ``d op d op ... d`` mod ``modulus`` (no brackets); see the module docstring. Chance ``1/modulus``."""

    Config = ModularArithmeticConfig

    @property
    def vocab_size(self) -> int:
        return self.config.modulus + 4 + self.config.equals

    def _validate(self) -> None:
        super()._validate()
        c = self.config
        check(isinstance(c.equals, bool), self.name, f"equals must be True or False, got {c.equals!r}")
        check(
            c.seq_len >= 1 + c.equals,
            self.name,
            f"seq_len must be >= {1 + c.equals} (a digit{' and =' if c.equals else ''}), got {c.seq_len}",
        )
        ops = c.operators
        check(
            isinstance(ops, str) and len(ops) >= 1 and set(ops) <= set(OPERATOR_CHARS) and len(set(ops)) == len(ops),
            self.name,
            f"operators must be distinct characters of {OPERATOR_CHARS!r}, got {ops!r}",
        )

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c, n = self.config, num_samples
        room = c.seq_len - c.equals  # the expression's tokens, blank included
        length = room if room % 2 else room - 1  # Deletang: an even length loses one token
        digits = torch.randint(0, c.modulus, (n, length // 2 + 1), generator=generator)
        allowed = torch.tensor([OPERATOR_CHARS.index(o) for o in c.operators])
        ops = allowed[torch.randint(0, len(allowed), (n, length // 2), generator=generator)]
        expression = torch.empty(n, length, dtype=torch.long)
        expression[:, 0::2] = digits
        expression[:, 1::2] = ops + c.modulus
        if length < room:
            expression = torch.cat([torch.full((n, 1), c.modulus + BLANK), expression], dim=1)
        if c.equals:
            expression = torch.cat([expression, torch.full((n, 1), c.modulus + EQUALS)], dim=1)
        targets = torch.full_like(expression, IGNORE_INDEX)
        targets[:, -1] = evaluate_flat(digits, ops, c.modulus)
        return TaskData(expression, targets)


@dataclasses.dataclass
class ModularArithmeticBracketsConfig:
    #: the expression's exact length in tokens (any length >= 1)
    seq_len: int = 41
    modulus: int = 5
    #: draw ``*`` as well as ``+`` and ``-`` (Deletang's experiments: True; his class default and
    #: Grazzi et al.'s generator: False)
    mult: bool = True


@register_task("modular_arithmetic_brackets")
class ModularArithmeticBrackets(_ModularExpression):
    """Evaluate a random bracketed expression of exactly ``seq_len`` tokens mod ``modulus``; see the module docstring."""

    Config = ModularArithmeticBracketsConfig

    @property
    def vocab_size(self) -> int:
        return self.config.modulus + 5

    def _validate(self) -> None:
        super()._validate()
        c = self.config
        check(isinstance(c.mult, bool), self.name, f"mult must be True or False, got {c.mult!r}")

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        c, g, m = self.config, generator, self.config.modulus
        n, length = num_samples, c.seq_len
        tokens = torch.full((n, length), -1, dtype=torch.long)
        flat = tokens.view(-1)
        # the nodes still to expand, one entry per node: its row, first position and length
        row, start, size = torch.arange(n), torch.zeros(n, dtype=torch.long), torch.full((n,), length)
        levels = []  # per tree level: (leaf mask, leaf values, ops of the inner nodes)
        while len(row):
            leaf = size <= 4
            base = row * length + start
            # leaves: d, -d, (d), (-d)
            digit = torch.randint(0, m, (int(leaf.sum()),), generator=g)
            lb, ls = base[leaf], size[leaf]
            bracketed = ls >= 3
            negated = (ls == 2) | (ls == 4)
            flat[lb[bracketed]] = m + OPEN
            flat[lb[bracketed] + ls[bracketed] - 1] = m + CLOSE
            flat[lb + bracketed.long()] = torch.where(negated, m + MINUS, digit)
            flat[lb[negated] + bracketed[negated].long() + 1] = digit[negated]
            values = torch.where(negated, -digit, digit) % m
            # inner nodes: ( A op B ) with |A| uniform in [1, size - 4]
            ib, isz = base[~leaf], size[~leaf]
            left = 1 + torch.minimum(
                (torch.rand(len(ib), generator=g, dtype=torch.float64) * (isz - 4)).long(), isz - 5
            )
            op = torch.randint(0, 3 if c.mult else 2, (len(ib),), generator=g)
            flat[ib] = m + OPEN
            flat[ib + 1 + left] = m + op
            flat[ib + isz - 1] = m + CLOSE
            levels.append((leaf, values, op))
            inner_row, inner_start = row[~leaf], start[~leaf]
            row = torch.cat([inner_row, inner_row])
            start = torch.cat([inner_start + 1, inner_start + 2 + left])
            size = torch.cat([left, isz - 3 - left])
        # values bottom-up: a level's inner nodes combine the level below (lefts first, then rights)
        below = torch.empty(0, dtype=torch.long)
        for leaf, leaf_values, op in reversed(levels):
            value = torch.empty(len(leaf), dtype=torch.long)
            value[leaf] = leaf_values
            k = len(op)
            a, b = below[:k], below[k:]
            value[~leaf] = torch.where(op == PLUS, a + b, torch.where(op == MINUS, a - b, a * b)) % m
            below = value
        assert (tokens >= 0).all()
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = below
        return TaskData(tokens, targets)
