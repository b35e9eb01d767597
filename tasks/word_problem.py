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
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens
from tasks.groups import get_group


@dataclasses.dataclass
class WordProblemConfig:
    seq_len: int = 100
    #: ``Z<m>``, ``S<n>``, ``A<n>`` or a product such as ``A4xZ5`` (see ``tasks.groups``)
    group: str = "S3"
    #: target at every position (the running product); ``False``: the last position only
    running: bool = True
    #: a BOS token (id ``|G|``, unscored) before the elements
    bos: bool = False
    #: the sequences of one generated set are pairwise distinct (needs ``num_samples <= |G|^seq_len``)
    distinct: bool = False


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

    @property
    def vocab_size(self) -> int:
        return self.group.order + self.config.bos

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

    def _elements(self, num_samples: int, generator: torch.Generator) -> torch.Tensor:
        """``(num_samples, seq_len)`` group elements: i.i.d., or pairwise distinct rows with ``distinct``."""
        order, length = self.group.order, self.config.seq_len
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
        products = running_product(self.group.table, tokens)
        if not self.config.running:
            last = products[:, -1].clone()
            products.fill_(IGNORE_INDEX)
            products[:, -1] = last
        if self.config.bos:
            tokens = torch.cat([torch.full((num_samples, 1), self.group.order), tokens], dim=1)
            products = torch.cat([torch.full((num_samples, 1), IGNORE_INDEX), products], dim=1)
        return TaskData(tokens, products)
