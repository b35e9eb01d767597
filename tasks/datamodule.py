"""``SyntheticDataModule``: in-memory train / val / test (+ extrapolation) sets.

Two seeds: the data ``seed`` fixes the data sets (every split has its own stream,
``make_generator(seed, split_id)``, so the sets are disjoint draws, each reproducible on its own: the
paper fixes one training set), the ``shuffle_seed`` (a trial's seed) fixes the order in which the
training set is served, epoch by epoch. The sets are moved once to the training ``device`` and
served by ``TensorBatches`` (whole-batch slicing, no per-sample collation, no host-to-device copy
per step: a small model's step is only a few milliseconds of CPU time).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from tasks.base import Task, TaskData, get_task, make_generator
from tasks.extrapolation import ExtrapolationConfig, generate_variable_length

SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
#: the test-pass name of the scored subset of the training sequences
TRAIN_SUBSET = "trainset"
#: the seed stream of the training order (apart from the split streams)
SHUFFLE_STREAM = 99


class TensorBatches:
    """Batches ``(inputs[i:j], targets[i:j])`` of in-memory tensors in order (an evaluation set).

    ``len()`` = number of batches; the last one may be smaller.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int) -> None:
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs and targets differ in length: {inputs.shape[0]} vs {targets.shape[0]}")
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size

    def __len__(self) -> int:
        return -(-self.inputs.shape[0] // self.batch_size)

    def __iter__(self):
        for start in range(0, self.inputs.shape[0], self.batch_size):
            yield self.inputs[start : start + self.batch_size], self.targets[start : start + self.batch_size]


class TrainingStream:
    """The training set as an endless stream of batches, served to Lightning in chunks.

    Batch ``b`` of the stream is batch ``b mod per_epoch`` of epoch ``b // per_epoch``, whose rows are
    in the order ``torch.randperm(n)`` drawn from ``make_generator(shuffle_seed, SHUFFLE_STREAM, epoch)``
    (on the CPU; both tensors gathered once per epoch on their device; the epoch's last batch may be
    smaller); epochs follow each other without a break.

    Lightning's loop receives ``Chunk`` items of ``chunk`` batches; the training step asks a chunk for
    the batches from its own step count to the chunk's end (``Chunk.batches(start, index)``), so the
    batch of optimizer step ``t`` is batch ``t`` of the stream whatever the chunk size, and a run
    resumed at step ``t`` continues with batch ``t`` (nothing of the stream needs saving). It has no
    length: train with ``max_steps``.

    Length bucketing (``lengths``, the real length of each row of a right-padded set, and ``length_pool``
    = k >= 1): the epoch's order is cut into pools of k batches; each pool's rows are sorted by length
    (stably) and cut into batches, the pool's full batches are served in a shuffled order (the epoch's
    last, smaller batch stays last), and each batch is cut to the length of its longest row (``widths``).
    An epoch still serves every row once, in the same number of batches of the same sizes, so the
    lengths trained on per epoch are those of the set; only which rows share a batch changes. A batch
    cut short loses padding only: the causal models' outputs at the real positions, and the loss, stay
    the same. ``length_pool`` 0: batches as drawn, at the set's full width. ``width_multiple`` m: each cut
    rounded up to a multiple of m (at most the full width), so that batches come in few widths (the graph
    engine captures one CUDA graph per width).
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch_size: int,
        shuffle_seed: int,
        chunk: int = 1,
        lengths: torch.Tensor | None = None,
        length_pool: int = 0,
        width_multiple: int = 1,
    ) -> None:
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs and targets differ in length: {inputs.shape[0]} vs {targets.shape[0]}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if isinstance(length_pool, bool) or not isinstance(length_pool, int) or length_pool < 0:
            raise ValueError(
                f"length_pool must be an integer >= 0 (batches sorted by length together), got {length_pool!r}"
            )
        if isinstance(width_multiple, bool) or not isinstance(width_multiple, int) or width_multiple < 1:
            raise ValueError(f"width_multiple must be a positive integer, got {width_multiple!r}")
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.shuffle_seed, self.chunk, self.width_multiple = shuffle_seed, chunk, width_multiple
        self.per_epoch = -(-inputs.shape[0] // batch_size)
        self.lengths = None if lengths is None or not length_pool else lengths.cpu()
        self.length_pool = length_pool if self.lengths is not None else 0
        self._epoch: tuple[int, torch.Tensor, torch.Tensor] | None = None
        #: with length bucketing, the width of each batch of the current epoch (``None`` before the first batch)
        self.widths: list[int] | None = None

    def order(self, epoch: int, shuffle_seed: int | None = None) -> torch.Tensor:
        """The permutation served in ``epoch`` (``LongTensor (n,)`` on the CPU) with ``shuffle_seed``
        (default: the stream's)."""
        seed = self.shuffle_seed if shuffle_seed is None else shuffle_seed
        return torch.randperm(self.inputs.shape[0], generator=make_generator(seed, SHUFFLE_STREAM, epoch))

    def bucketed(self, order: torch.Tensor, epoch: int) -> tuple[torch.Tensor, list[int]]:
        """``(order, widths)``: the epoch's ``order`` regrouped by length (see the class docstring) and the
        width of each of its batches (the length of its longest row, rounded up to ``width_multiple``)."""
        b, pool = self.batch_size, self.length_pool * self.batch_size
        g = make_generator(self.shuffle_seed, SHUFFLE_STREAM, epoch, 1)
        lengths = self.lengths[order]
        parts = []
        for start in range(0, len(order), pool):
            rows = order[start : start + pool][torch.sort(lengths[start : start + pool], stable=True).indices]
            full = len(rows) // b
            batches = [rows[k * b : (k + 1) * b] for k in torch.randperm(full, generator=g).tolist()]
            parts += batches + ([rows[full * b :]] if len(rows) % b else [])
        m, full_width = self.width_multiple, self.inputs.shape[1]
        widths = [min(full_width, -(-int(self.lengths[rows].max()) // m) * m) for rows in parts]
        return torch.cat(parts), widths

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of the stream: ``(inputs (b, L), targets (b, L))`` views (``L``: the batch's width
        with length bucketing, else the set's)."""
        epoch, i = divmod(index, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            order = self.order(epoch)
            if self.length_pool:
                order, self.widths = self.bucketed(order, epoch)
            order = order.to(self.inputs.device)
            self._epoch = (epoch, self.inputs[order], self.targets[order])
        _, x, y = self._epoch
        rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
        if self.length_pool:
            return x[rows, : self.widths[i]], y[rows, : self.widths[i]]
        return x[rows], y[rows]

    def __iter__(self):
        while True:
            yield Chunk(self, self.chunk)


class StackedTrainingStream(TrainingStream):
    """The training streams of ``S`` trials (one shuffle seed each) over the same training set, served
    together for stacked trials (``mixers.stacking``): batch ``b`` is ``(inputs (S, b, L), targets (S, b, L))``,
    row ``s`` being batch ``b`` of the ``TrainingStream`` with ``shuffle_seeds[s]``."""

    def __init__(
        self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, shuffle_seeds: list[int], chunk: int = 1
    ) -> None:
        if len(shuffle_seeds) < 1:
            raise ValueError("a stacked training stream needs at least one shuffle seed")
        super().__init__(inputs, targets, batch_size, shuffle_seeds[0], chunk)
        self.shuffle_seeds = list(shuffle_seeds)

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = divmod(index, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            orders = torch.stack([self.order(epoch, seed) for seed in self.shuffle_seeds]).to(self.inputs.device)
            self._epoch = (epoch, self.inputs[orders], self.targets[orders])  # (S, n, L) each
        _, x, y = self._epoch
        rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return x[:, rows], y[:, rows]


class Chunk:
    """``size`` consecutive batches of a ``TrainingStream``, from wherever the training step stands."""

    def __init__(self, stream: TrainingStream, size: int) -> None:
        self.stream, self.size = stream, size

    def __len__(self) -> int:
        return self.size

    def batches(self, start: int, index: int | None = None):
        """The batches of optimizer steps ``start, start + 1, ...`` up to the end of chunk ``index``
        (Lightning's batch index: chunk ``index`` ends before step ``(index + 1) * size``; default: the
        chunk holding ``start``).

        An uninterrupted run asks for whole chunks (``start == index * size``). A run resumed from a
        checkpoint written in the middle of a chunk (Ctrl-C lands inside a training step) takes the
        interrupted chunk again from the step where it stopped (``experiments.trial.lightning_hooks.InterruptCheckpoint``
        rewinds Lightning's batch counters to the chunk), so every validation and the last step stay on
        the uninterrupted run's steps; a chunk whose steps all ran before the interruption is empty.
        """
        if index is None:
            index = start // self.size
        return (self.stream.batch(k) for k in range(start, (index + 1) * self.size))


class SyntheticDataModule(L.LightningDataModule):
    """Builds the data sets of one task in ``setup()``.

    Args:
        task: a ``Task`` or a registered task name (with ``task_options`` as config overrides).
        train_size, val_size, test_size: number of sequences (paper defaults 10k / 2k / 100k).
        batch_size: training batch size (paper: 16); evaluation uses ``eval_batch_size``.
        seed: the data seed; splits use disjoint streams derived from it.
        shuffle_seed: the seed of the training order (a trial's seed); default: ``seed``.
        stack_shuffle_seeds: for stacked trials, the training order of each (``StackedTrainingStream``).
        train_chunk: batches per item of the training stream (``TrainingStream``).
        length_bucketing: 0 (default): training batches as drawn, padded to the longest training length;
            k >= 1: batches of near-equal lengths, each cut to its longest sequence (``TrainingStream``'s
            length bucketing, pools of k batches; sets of one length have nothing to cut). Not with
            ``stack_shuffle_seeds``.
        extrapolation: if given, train/val/test use lengths in ``[min_len, max_len]`` (padded; val in
            ``val_range`` if it is set) and one extra test set per ``eval_lengths`` entry is built (named
            ``len<L>``), and one of lengths uniform in ``test_range`` (``range<a>-<b>``) if it is set.
        width_multiple: with ``length_bucketing``, batch widths rounded up to a multiple of this (the graph
            engine: one CUDA graph per width).
        device: where the sets live (the training device, e.g. ``"cuda:0"``); batches are views.

    The test pass also scores ``trainset``: the first ``min(val_size, train_size)`` training sequences,
    so a results row holds the accuracy on data the model was fit to next to the test accuracy (the
    gap shows memorization).
    """

    def __init__(
        self,
        task: Task | str,
        task_options: dict[str, Any] | None = None,
        *,
        train_size: int = 10_000,
        val_size: int = 2_000,
        test_size: int = 100_000,
        batch_size: int = 16,
        eval_batch_size: int = 1024,
        seed: int = 0,
        shuffle_seed: int | None = None,
        stack_shuffle_seeds: list[int] | None = None,
        train_chunk: int = 1,
        extrapolation: ExtrapolationConfig | None = None,
        device: str | torch.device = "cpu",
        length_bucketing: int = 0,
        width_multiple: int = 1,
    ) -> None:
        super().__init__()
        self.task = get_task(task, **(task_options or {})) if isinstance(task, str) else task
        for name, value in (
            ("train_size", train_size),
            ("val_size", val_size),
            ("test_size", test_size),
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.shuffle_seed = seed if shuffle_seed is None else shuffle_seed
        make_generator(self.shuffle_seed)  # validates it
        self.stack_shuffle_seeds = list(stack_shuffle_seeds) if stack_shuffle_seeds is not None else None
        for seed in self.stack_shuffle_seeds or ():
            make_generator(seed)
        self.train_chunk = train_chunk
        if isinstance(length_bucketing, bool) or not isinstance(length_bucketing, int) or length_bucketing < 0:
            raise ValueError(f"length_bucketing must be an integer >= 0, got {length_bucketing!r}")
        if length_bucketing and stack_shuffle_seeds is not None:
            raise ValueError("length_bucketing cuts each batch to its own length: stacked trials cannot use it")
        self.length_bucketing, self.width_multiple = length_bucketing, width_multiple
        self.extrapolation = extrapolation
        self.device = torch.device(device)
        self.data: dict[str, TaskData] = {}
        self._on_device: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    # --- what the model needs to know ---------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Input vocabulary (the task's, plus a pad token under extrapolation)."""
        return self.task.vocab_size + (1 if self.extrapolation else 0)

    @property
    def num_classes(self) -> int:
        return self.task.num_classes

    @property
    def test_set_names(self) -> list[str]:
        """Names of the test dataloaders, in order: ``test``, ``trainset``, ``len<L>`` per eval length, then
        ``range<a>-<b>`` with a ``test_range``."""
        e = self.extrapolation
        if e is None:
            return ["test", TRAIN_SUBSET]
        return ["test", TRAIN_SUBSET, *(f"len{n}" for n in e.eval_lengths), *([e.range_name] if e.range_name else [])]

    # --- building -------------------------------------------------------------------------
    def _split(self, split: str) -> TaskData:
        seed = make_generator(self.seed, SPLIT_IDS[split])
        n = self.sizes[split]
        if self.extrapolation is None:
            return self.task.generate(n, seed=seed)
        e = self.extrapolation
        low, high = e.val_lengths if split == "val" else (e.min_len, e.max_len)
        return generate_variable_length(self.task, n, seed, low, high)

    def setup(self, stage: str | None = None) -> None:
        if self.data:
            return
        for split in SPLIT_IDS:
            self.data[split] = self._split(split)
        train, n = self.data["train"], min(self.sizes["val"], self.sizes["train"])
        self.data[TRAIN_SUBSET] = TaskData(
            train.inputs[:n], train.targets[:n], None if train.lengths is None else train.lengths[:n]
        )
        if self.extrapolation is not None:
            for i, length in enumerate(self.extrapolation.eval_lengths):
                task = self.task.with_options(seq_len=length)
                seed = make_generator(self.seed, len(SPLIT_IDS) + i)
                self.data[f"len{length}"] = task.generate(self.sizes["test"], seed=seed)
            if self.extrapolation.range_name:
                seed = make_generator(self.seed, len(SPLIT_IDS) + len(self.extrapolation.eval_lengths))
                low, high = self.extrapolation.test_range
                self.data[self.extrapolation.range_name] = generate_variable_length(
                    self.task, self.sizes["test"], seed, low, high
                )

    def _tensors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if name not in self._on_device:
            data = self.data[name]
            self._on_device[name] = (data.inputs.to(self.device), data.targets.to(self.device))
        return self._on_device[name]

    def _loader(self, name: str) -> TensorBatches:
        return TensorBatches(*self._tensors(name), self.eval_batch_size)

    def train_dataloader(self) -> TrainingStream:
        if self.stack_shuffle_seeds is not None:
            return StackedTrainingStream(
                *self._tensors("train"), self.batch_size, self.stack_shuffle_seeds, self.train_chunk
            )
        return TrainingStream(
            *self._tensors("train"),
            self.batch_size,
            self.shuffle_seed,
            self.train_chunk,
            lengths=self.data["train"].lengths,
            length_pool=self.length_bucketing,
            width_multiple=self.width_multiple,
        )

    def val_dataloader(self) -> TensorBatches:
        return self._loader("val")

    def test_dataloader(self) -> list[TensorBatches]:
        return [self._loader(name) for name in self.test_set_names]
