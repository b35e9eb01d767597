"""Group word problem (Merrill, Petty, Sabharwal, "The Illusion of State in State-Space Models", 2024).

Tokens are elements of a finite group ``G`` (``tasks.groups``: ``Z<m>``, ``S<n>``, ``A<n>``, products
such as ``A4xZ5``), i.i.d. uniform; vocab = classes = ``|G|``. The target at position ``t`` is the
running product ``g_1 * g_2 * ... * g_t`` (composition, ``(a * b)[i] = a[b[i]]``; for ``Z<m>`` the
running sum mod ``m``). ``running=False`` scores only the last position. Chance: ``1/|G|``.
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
        return self.group.order

    @property
    def num_classes(self) -> int:
        return self.group.order

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")
        try:
            get_group(self.config.group)
        except (ValueError, TypeError) as err:
            check(False, self.name, str(err))

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        tokens = uniform_tokens(generator, (num_samples, self.config.seq_len), 0, self.group.order)
        products = running_product(self.group.table, tokens)
        if self.config.running:
            return TaskData(tokens, products)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, -1] = products[:, -1]
        return TaskData(tokens, targets)
