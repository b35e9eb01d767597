"""``SyntheticDataModule`` (SPEC §3.6): in-memory train / val / test (+ extrapolation) sets.

Every split has its own seed stream (``make_generator(seed, split_id)``), so the sets are disjoint
draws and each is reproducible on its own.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tasks.base import Task, TaskData, get_task, make_generator
from tasks.extrapolation import ExtrapolationConfig, generate_variable_length

SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


class SyntheticDataModule(L.LightningDataModule):
    """Builds the data sets of one task in ``setup()``.

    Args:
        task: a ``Task`` or a registered task name (with ``task_options`` as config overrides).
        train_size, val_size, test_size: number of sequences (paper defaults 10k / 2k / 100k).
        batch_size: training batch size (paper: 16); evaluation uses ``eval_batch_size``.
        seed: the data seed; splits use disjoint streams derived from it.
        extrapolation: if given, train/val/test use lengths in ``[min_len, max_len]`` (padded) and
            one extra test set per ``eval_lengths`` entry is built (named ``len<L>``).
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
        extrapolation: ExtrapolationConfig | None = None,
    ) -> None:
        super().__init__()
        self.task = get_task(task, **(task_options or {})) if isinstance(task, str) else task
        for name, value in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size),
                            ("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.extrapolation = extrapolation
        self.data: dict[str, TaskData] = {}

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

    def _loader(self, name: str, train: bool = False) -> DataLoader:
        data = self.data[name]
        dataset = TensorDataset(data.inputs, data.targets)
        if train:
            g = make_generator(self.seed, 99)
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, generator=g, drop_last=False)
        return DataLoader(dataset, batch_size=self.eval_batch_size, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(name) for name in self.test_set_names]
