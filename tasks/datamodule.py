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
#: the seed stream of the training order (apart from the split streams)
SHUFFLE_STREAM = 99


class TensorBatches:
    """Batches ``(inputs[i:j], targets[i:j])`` of in-memory tensors, for Lightning's loops.

    With ``shuffle_seed``, epoch ``e`` serves the order ``torch.randperm(n)`` drawn from
    ``make_generator(shuffle_seed, SHUFFLE_STREAM, e)`` (on the CPU), gathering both tensors once in
    that order on their device; batches are then views. ``len()`` = number of batches.

    It is stateful in Lightning's sense (``state_dict``/``load_state_dict``: the epoch and the
    batches already served), so a run resumed from a checkpoint serves exactly the batches the
    uninterrupted run would have.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int,
                 shuffle_seed: int | None = None) -> None:
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(f"inputs and targets differ in length: {inputs.shape[0]} vs {targets.shape[0]}")
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.shuffle_seed = shuffle_seed
        self.epoch = 0  # the epoch the next __iter__ serves
        self.served = 0  # batches of the current epoch handed out so far
        self._skip = 0  # batches to skip at the start of the next epoch (after load_state_dict)

    def __len__(self) -> int:
        return -(-self.inputs.shape[0] // self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """The permutation served in ``epoch`` (``LongTensor (n,)`` on the CPU)."""
        return torch.randperm(self.inputs.shape[0], generator=make_generator(self.shuffle_seed, SHUFFLE_STREAM, epoch))

    def __iter__(self):
        x, y = self.inputs, self.targets
        epoch = self.epoch
        if self.shuffle_seed is not None:
            order = self.order(epoch).to(x.device)
            x, y = x[order], y[order]
        self.epoch, self.served, skip, self._skip = epoch + 1, self._skip, self._skip, 0
        for start in range(skip * self.batch_size, x.shape[0], self.batch_size):
            self.served += 1
            yield x[start : start + self.batch_size], y[start : start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        """Where the order stands: the epoch being served and how many of its batches were handed out."""
        return {"epoch": max(self.epoch - 1, 0), "served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``: the next ``__iter__`` serves epoch ``state["epoch"]`` from batch ``served``."""
        self.epoch, self._skip, self.served = int(state["epoch"]), int(state["served"]), int(state["served"])


class SyntheticDataModule(L.LightningDataModule):
    """Builds the data sets of one task in ``setup()``.

    Args:
        task: a ``Task`` or a registered task name (with ``task_options`` as config overrides).
        train_size, val_size, test_size: number of sequences (paper defaults 10k / 2k / 100k).
        batch_size: training batch size (paper: 16); evaluation uses ``eval_batch_size``.
        seed: the data seed; splits use disjoint streams derived from it.
        shuffle_seed: the seed of the training order (a trial's seed); default: ``seed``.
        extrapolation: if given, train/val/test use lengths in ``[min_len, max_len]`` (padded) and
            one extra test set per ``eval_lengths`` entry is built (named ``len<L>``).
        device: where the sets live (the training device, e.g. ``"cuda:0"``); batches are views.
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
        extrapolation: ExtrapolationConfig | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.task = get_task(task, **(task_options or {})) if isinstance(task, str) else task
        for name, value in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size),
                            ("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.shuffle_seed = seed if shuffle_seed is None else shuffle_seed
        make_generator(self.shuffle_seed)  # validates it
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
        """Names of the test dataloaders, in order: ``test`` then ``len<L>`` per eval length."""
        extra = [f"len{n}" for n in self.extrapolation.eval_lengths] if self.extrapolation else []
        return ["test", *extra]

    # --- building -------------------------------------------------------------------------
    def _split(self, split: str) -> TaskData:
        seed = make_generator(self.seed, SPLIT_IDS[split])
        n = self.sizes[split]
        if self.extrapolation is None:
            return self.task.generate(n, seed=seed)
        e = self.extrapolation
        return generate_variable_length(self.task, n, seed, e.min_len, e.max_len)

    def setup(self, stage: str | None = None) -> None:
        if self.data:
            return
        for split in SPLIT_IDS:
            self.data[split] = self._split(split)
        if self.extrapolation is not None:
            for i, length in enumerate(self.extrapolation.eval_lengths):
                task = self.task.with_options(seq_len=length)
                seed = make_generator(self.seed, len(SPLIT_IDS) + i)
                self.data[f"len{length}"] = task.generate(self.sizes["test"], seed=seed)

    def _loader(self, name: str, train: bool = False) -> TensorBatches:
        if name not in self._on_device:
            data = self.data[name]
            self._on_device[name] = (data.inputs.to(self.device), data.targets.to(self.device))
        inputs, targets = self._on_device[name]
        if train:
            return TensorBatches(inputs, targets, self.batch_size, shuffle_seed=self.shuffle_seed)
        return TensorBatches(inputs, targets, self.eval_batch_size)

    def train_dataloader(self) -> TensorBatches:
        return self._loader("train", train=True)

    def val_dataloader(self) -> TensorBatches:
        return self._loader("val")

    def test_dataloader(self) -> list[TensorBatches]:
        return [self._loader(name) for name in self.test_set_names]
