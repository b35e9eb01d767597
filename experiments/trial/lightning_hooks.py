"""Every use this suite makes of Lightning's private API or undocumented behaviour, in one place, and
the callbacks built on them. Written against Lightning 2.6 (``pyproject.toml`` pins ``>=2.6.4,<2.7``);
``tests/experiments/test_lightning_hooks.py`` checks that each hook below still exists with the meaning
used here, so an upgrade that breaks one fails there first.

- ``trainer.fit_loop.epoch_loop.batch_progress`` (``InterruptCheckpoint``): the batch counters that
  schedule validations, rewritten on Ctrl-C inside a training step so a resumed run takes the
  interrupted batch again; after a finished training step, Lightning's restart from a checkpoint
  written in ``on_train_batch_end`` (``RestartStage.RESTARTED_ON_TRAIN_BATCH_END``) goes on after it.
- ``Callback._generate_state_key`` (``TrialEarlyStopping``, ``TrialCheckpoint``): the key a callback's
  state is saved under in a checkpoint, kept the stock class's so checkpoints of either class resume.
- ``EarlyStopping.stopping_reason`` / ``EarlyStoppingReason`` (``TrialEarlyStopping``): whether a
  resumed trial had already stopped.
- Lightning's Ctrl-C handling: it turns ``KeyboardInterrupt`` into ``sys.exit(1)`` and sets
  ``trainer.interrupted`` (``interrupt_as_keyboard_interrupt`` turns it back).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.trainer.states import TrainerFn


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Writes ``interrupted.ckpt`` when training is interrupted (Ctrl-C, SIGTERM): a re-run resumes from it.

    Other exceptions (a NaN loss, a kernel error) write nothing: such a trial is not resumed.

    Ctrl-C usually lands inside a training step. Lightning's batch counters then hold the interrupted
    batch as started but not processed, and a resumed run would count it twice in the total that
    schedules validations (``total.ready``) and validate one chunk early from then on. The counters are
    written as if the batch had not started: the resumed run takes it again, from the step where the
    interruption left it (``Chunk.batches``), and validates at the uninterrupted run's steps. A batch
    whose training step had finished (Ctrl-C in ``on_train_batch_end`` or a validation) is left to
    Lightning's own restart, which goes on after it.
    """

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Only while fitting. A Ctrl-C in the test passes, after fit, resumes from last.ckpt (written at the
        # final validation) instead: the best-weights test pass has loaded best.ckpt into the module, so a
        # checkpoint written then could hold the best weights as the final ones.
        if isinstance(exception, KeyboardInterrupt) and trainer.state.fn == TrainerFn.FITTING:
            progress = trainer.fit_loop.epoch_loop.batch_progress
            if progress.total.processed < progress.total.started:  # inside the training step
                for count in (progress.total, progress.current):
                    count.ready = count.started = count.processed = count.completed
            super().on_exception(trainer, pl_module, exception)


class TrialEarlyStopping(EarlyStopping):
    """Lightning's ``EarlyStopping`` whose decision survives a resume: a trial resumed from a checkpoint
    written at or after its stopping validation (a Ctrl-C in its test passes) trains no further, where
    the stock callback would train on to the next validation and stop there."""

    def on_train_start(self, trainer, pl_module) -> None:
        if self.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            trainer.should_stop = True

    def _generate_state_key(self, **kwargs: Any) -> str:  # the stock key: checkpoints of either one resume
        return f"{EarlyStopping.__qualname__}{kwargs!r}"


class TrialCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose state survives the trial folder moving (a packed run unpacked under
    another path, a run folder renamed): the saved paths are re-rooted in this ``dirpath``. The stock
    callback keeps only the stale ``best_model_path`` then and forgets the best score, so the first
    validation after the resume would overwrite ``best.ckpt`` whatever its accuracy."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is not None and saved != self.dirpath:

            def moved(path):
                return str(Path(self.dirpath) / Path(path).name) if path else path

            state_dict = {
                **state_dict,
                "dirpath": self.dirpath,
                **{k: moved(state_dict.get(k)) for k in ("best_model_path", "kth_best_model_path", "last_model_path")},
                "best_k_models": {moved(k): v for k, v in state_dict.get("best_k_models", {}).items()},
            }
        super().load_state_dict(state_dict)

    def _generate_state_key(self, **kwargs: Any) -> str:  # the stock key: checkpoints of either one resume
        return f"{ModelCheckpoint.__qualname__}{kwargs!r}"


@contextlib.contextmanager
def interrupt_as_keyboard_interrupt(trainer: L.Trainer):
    """Lightning turns Ctrl-C into ``sys.exit(1)`` (and ignores further Ctrl-C); turn it back into
    ``KeyboardInterrupt`` and restore the Ctrl-C handler, so callers can record the trial as interrupted."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        if main and handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)
