"""Tasks that answer with a string after their input (Deletang et al. 2023's string-output tasks),
and four of them: reverse string, duplicate string, odds first, bucket sort.

Layout (Deletang's ``make_model_with_empty_targets``, read causally): the ``seq_len`` input symbols,
then ``output_length(seq_len)`` answer slots, each holding the answer token ``ANSWER`` (the id after
the input symbols); the target of answer slot ``t`` is the ``t``-th output symbol, every input position
is ``-100``. The model is causal and not fed its own outputs: slot ``t`` sees the whole input and ``t``
answer tokens. ``seq_len`` is Deletang's length, the input's (the extrapolation protocol's lengths);
the generated sequences are ``total_len = seq_len + output_length(seq_len)`` long.

Tasks whose output ends with a termination symbol and zero padding (stack manipulation, binary
addition and multiplication) score the slots up to and including the termination symbol and put
``-100`` after it: the slots Deletang's ``accuracy_mask`` keeps (his loss also trains on the padding
zeros; here nothing is trained on them). The token accuracy over the scored slots (``<set>/acc``) is
Deletang's accuracy: correct output symbols over scored output positions.
"""

from __future__ import annotations

import dataclasses

import torch

from tasks.base import IGNORE_INDEX, Task, TaskData, check, register_task, uniform_tokens


class Transduction(Task):
    """Input symbols ``[0, symbols)``, then the answer slots (token ``symbols``); see the module docstring.

    Subclasses define ``symbols`` (the input alphabet), ``output_length(n)``, ``num_classes`` where the
    output alphabet differs from the input's, and ``_sample(num_samples, generator) -> (inputs (N, n),
    outputs (N, output_length(n)))`` with ``-100`` at unscored output positions.
    """

    answer_positions = "every"  # one answer slot per output symbol

    @property
    def symbols(self) -> int:
        return self.config.symbols

    @property
    def answer_token(self) -> int:
        """The token of every answer slot (Deletang's empty output token)."""
        return self.symbols

    @property
    def vocab_size(self) -> int:
        return self.symbols + 1

    @property
    def num_classes(self) -> int:
        return self.symbols

    @property
    def total_len(self) -> int:
        return self.seq_len + self.output_length(self.seq_len)

    def output_length(self, n: int) -> int:
        raise NotImplementedError

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _validate(self) -> None:
        check(self.config.seq_len >= 1, self.name, f"seq_len must be >= 1, got {self.config.seq_len}")
        if hasattr(self.config, "symbols"):
            s = self.config.symbols
            check(
                isinstance(s, int) and not isinstance(s, bool) and s >= 2,
                self.name,
                f"symbols must be an int >= 2, got {s!r}",
            )

    def _generate(self, num_samples: int, generator: torch.Generator) -> TaskData:
        inputs, outputs = self._sample(num_samples, generator)
        slots = torch.full_like(outputs, self.answer_token)
        return TaskData(
            torch.cat([inputs, slots], dim=1), torch.cat([torch.full_like(inputs, IGNORE_INDEX), outputs], dim=1)
        )


@dataclasses.dataclass
class StringConfig:
    #: the input string's length (Deletang's length)
    seq_len: int = 40
    #: the alphabet's size (Deletang's experiments: 2)
    symbols: int = 2


class _UniformString(Transduction):
    """A string of i.i.d. uniform symbols mapped to an output string by ``transform``."""

    Config = StringConfig

    def output_length(self, n: int) -> int:
        return n

    def transform(self, strings: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _sample(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        strings = uniform_tokens(generator, (num_samples, self.seq_len), 0, self.symbols)
        return strings, self.transform(strings)


@register_task("reverse_string")
class ReverseString(_UniformString):
    """``s_1 .. s_n`` -> ``s_n .. s_1`` (deterministic context-free; Deletang's ``dcf/reverse_string.py``)."""

    def transform(self, strings: torch.Tensor) -> torch.Tensor:
        return strings.flip(1)


@register_task("duplicate_string")
class DuplicateString(_UniformString):
    """``s`` -> ``s s``: ``2n`` answer slots (context-sensitive; Deletang's ``cs/duplicate_string.py``)."""

    def output_length(self, n: int) -> int:
        return 2 * n

    def transform(self, strings: torch.Tensor) -> torch.Tensor:
        return torch.cat([strings, strings], dim=1)


@register_task("odds_first")
class OddsFirst(_UniformString):
    """The symbols at odd 0-based indices, then those at even ones: ``s[1::2] s[0::2]``
    (context-sensitive; Deletang's ``cs/odds_first.py``: its code, which the paper's numbers come from;
    its docstring's 1-based ``s_1 s_3 ...`` reads the other way round)."""

    def transform(self, strings: torch.Tensor) -> torch.Tensor:
        return torch.cat([strings[:, 1::2], strings[:, 0::2]], dim=1)


@dataclasses.dataclass
class BucketSortConfig:
    #: the input string's length (Deletang's length)
    seq_len: int = 40
    #: the alphabet's size (Deletang's experiments: 5)
    symbols: int = 5


@register_task("bucket_sort")
class BucketSort(_UniformString):
    """The string sorted ascending (context-sensitive; Deletang's ``cs/bucket_sort.py``)."""

    Config = BucketSortConfig

    def transform(self, strings: torch.Tensor) -> torch.Tensor:
        return strings.sort(dim=1).values


def terminated(results: torch.Tensor, lengths: torch.Tensor, width: int, end: int) -> torch.Tensor:
    """``LongTensor (N, width)``: per row the first ``lengths[i]`` symbols of ``results (N, >= max length)``,
    then the termination symbol ``end``, then ``-100`` (every ``lengths[i] < width``)."""
    pos = torch.arange(width).expand(len(lengths), width)
    body = (
        results[:, :width]
        if results.shape[1] >= width
        else torch.nn.functional.pad(results, (0, width - results.shape[1]), value=IGNORE_INDEX)
    )
    length = lengths.unsqueeze(1)
    return torch.where(pos < length, body, torch.where(pos == length, end, IGNORE_INDEX))
