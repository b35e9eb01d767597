"""Group word problem (Merrill, Petty, Sabharwal, "The Illusion of State in State-Space Models", 2024).

Tokens are elements of a finite group ``G`` (``tasks.groups``: ``Z<m>``, ``S<n>``, ``A<n>``, products
such as ``A4xZ5``), i.i.d. uniform; vocab = classes = ``|G|``. The target at position ``t`` is the
running product ``g_1 * g_2 * ... * g_t`` (composition, ``(a * b)[i] = a[b[i]]``; for ``Z<m>`` the
running sum mod ``m``). ``running=False`` scores only the last position. Chance: ``1/|G|``.

Two options for Merrill et al.'s data (jopetty/word-problem), both off by default:
``bos=True`` starts every sequence with a BOS token (id ``|G|``, unscored; vocabulary ``|G| + 1``), so
the sequences are ``seq_len + 1`` long and ``seq_len`` still counts the group elements;
``distinct=True`` makes the sequences of one generated set pairwise distinct (rows drawn i.i.d., a
repeat drawn again; every sequence of the length is equally likely, as sampling without replacement
from all ``|G|^seq_len``), where the default draws them i.i.d. and short lengths repeat sequences.
Separate sets (train, validation, test) are drawn independently and may share sequences.

``transitions=k`` restricts the input to ``k`` group elements, the automaton of PD-SSM's second table
(Terzić et al. 2025: ``A5`` and ``S5`` with extra random transitions): the group's generating set
(``Group.generators``: for ``A5`` the 3-cycle ``(0 1 2)`` and the 5-cycle, for ``S5`` the transposition
``(0 1)`` and the 5-cycle) followed by ``k - len(generators)`` further elements drawn uniformly without
replacement from the rest but the identity (distinct, and never a self-loop on every state), in an order
fixed by ``transitions_seed`` alone (the same alphabet for every length, split and data seed). Token
``i`` is ``alphabet[i]`` (``WordProblem.alphabet``); the vocabulary is ``k`` (``+ 1`` with ``bos``, the
BOS id then ``k``), the classes stay ``|G|``. The tokens are uniform over the alphabet, so the state is a
random walk on the group's Cayley graph for that alphabet: near uniform after enough steps (on short
sequences the blind optimum is above ``1/|G|``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, make_generator, register_task, uniform_tokens
from tasks.groups import Group, get_group


@dataclasses.dataclass
class WordProblemConfig:
    seq_len: int = 100
    #: ``Z<m>``, ``S<n>``, ``A<n>`` or a product such as ``A4xZ5`` (see ``tasks.groups``)
    group: str = "S3"
    #: target at every position (the running product); ``False``: the last position only
    running: bool = True
    #: a BOS token (id ``|G|``, unscored) before the elements
    bos: bool = False
    #: the sequences of one generated set are pairwise distinct (needs ``num_samples <= k^seq_len``, ``k``
    #: the alphabet's size)
    distinct: bool = False
    #: the input alphabet's size ``k``: the group's generators and ``k - len(generators)`` random further
    #: elements, never the identity (see the module docstring); ``None``: every element of ``G``
    transitions: int | None = None
    #: the seed of the further elements' draw (used with ``transitions`` only)
    transitions_seed: int = 0


#: the stream of ``tasks.base.make_generator`` that draws an alphabet's further elements (apart from the
#: streams of the data sets)
ALPHABET_STREAM = 64


def transition_alphabet(group: Group, k: int, seed: int) -> torch.Tensor:
    """``LongTensor (k,)`` of element indices: ``group.generators``, then ``k - len(generators)`` elements
    drawn uniformly without replacement from the others but the identity (index 0), by ``seed``."""
    generators = torch.tensor(group.generators)
    rest = torch.ones(group.order, dtype=torch.bool)
    rest[0] = rest[generators] = False
    pool = rest.nonzero().squeeze(1)
    draw = torch.randperm(len(pool), generator=make_generator(seed, ALPHABET_STREAM))
    return torch.cat([generators, pool[draw[: k - len(generators)]]])


def running_product(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``out[:, t] = tokens[:, 0] * ... * tokens[:, t]`` under ``table`` (``(n, n)``), for ``tokens (N, L)``.

    One table look-up per position, vectorized over the batch (100k sequences of length 100 take
    about 0.4 s on one CPU core).
    """
    n, flat = table.shape[0], table.flatten()
    out = torch.empty_like(tokens)
    state = out[:, 0] = tokens[:, 0]
    for t in range(1, tokens.shape[1]):
        state = out[:, t] = flat[state * n + tokens[:, t]]
    return out


@register_task("word_problem")
class WordProblem(Task):
    """Compose a sequence of group elements; see the module docstring."""

    Config = WordProblemConfig

    @property
    def group(self):
        return get_group(self.config.group)

    @functools.cached_property
    def alphabet(self) -> torch.Tensor:
        """``LongTensor (k,)``: the group element (index) of each input token; every element without
        ``transitions``."""
        k = self.config.transitions
        if k is None:
            return torch.arange(self.group.order)
        return transition_alphabet(self.group, k, self.config.transitions_seed)

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + self.config.bos

    @property
    def total_len(self) -> int:
        return self.config.seq_len + self.config.bos

    @property
    def num_classes(self) -> int:
        return self.group.order

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")
        try:
            get_group(self.config.group)
        except (ValueError, TypeError) as err:
            check(False, self.name, str(err))
        for flag in ("running", "bos", "distinct"):
            value = getattr(self.config, flag)
            check(isinstance(value, bool), self.name, f"{flag} must be True or False, got {value!r}")
        seed = self.config.transitions_seed
        check(
            isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0,
            self.name,
            f"transitions_seed must be an int >= 0, got {seed!r}",
        )
        k, group = self.config.transitions, self.group
        if k is not None:
            low, high = len(group.generators), group.order - 1
            check(
                isinstance(k, int) and not isinstance(k, bool) and low <= k <= high,
                self.name,
                f"transitions must be an int from {low} (the alphabet starts with {group.name}'s {low} "
                f"generators) to {high} (every element but the identity), got {k!r}",
            )

    def _elements(self, num_samples: int, generator: torch.Generator) -> torch.Tensor:
        """``(num_samples, seq_len)`` group elements: i.i.d., or pairwise distinct rows with ``distinct``."""
        order, length = len(self.alphabet), self.config.seq_len
        tokens = uniform_tokens(generator, (num_samples, length), 0, order)
        if not self.config.distinct:
            return tokens
        check(
            num_samples <= order**length,
            self.name,
            f"distinct: {num_samples} sequences asked, only {order}^{length} = {order**length} exist",
        )
        while True:
            # keep each row's first occurrence, in the order drawn; redraw the repeats
            _, inverse = torch.unique(tokens, dim=0, return_inverse=True)
            first = torch.full((int(inverse.max()) + 1,), num_samples).scatter_reduce(
                0, inverse, torch.arange(num_samples), "amin"
            )
            repeat = first[inverse] != torch.arange(num_samples)
            if not repeat.any():
                return tokens
            tokens[repeat] = uniform_tokens(generator, (int(repeat.sum()), length), 0, order)

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        tokens = self._elements(num_samples, generator)
        elements = tokens if self.config.transitions is None else self.alphabet[tokens]
        products = running_product(self.group.table, elements)
        if not self.config.running:
            last = products[:, -1].clone()
            products.fill_(IGNORE_INDEX)
            products[:, -1] = last
        if self.config.bos:
            tokens = torch.cat([torch.full((num_samples, 1), len(self.alphabet)), tokens], dim=1)
            products = torch.cat([torch.full((num_samples, 1), IGNORE_INDEX), products], dim=1)
        return TaskData(tokens, products)
