"""The Lightning private API ``experiments.trial.lightning_hooks`` relies on is still there and means what
it did: a Lightning release that changes one fails here (``pyproject.toml`` pins the tested range)."""

import re
from pathlib import Path

import lightning
import optuna
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from packaging.specifiers import SpecifierSet

from experiments.trial.lightning_hooks import TrialCheckpoint, TrialEarlyStopping

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _pin(name: str) -> SpecifierSet:
    """The version range of dependency ``name`` in ``pyproject.toml`` (a ``"name>=a,<b"`` line)."""
    found = re.search(rf'^\s*"{re.escape(name)}([<>=!~][^";]*)"', PYPROJECT.read_text(), re.M)
    assert found, f"no pin of {name} in pyproject.toml"
    return SpecifierSet(found.group(1))


def test_installed_versions_are_the_pinned_ones_with_an_upper_bound():
    for name, version in (("lightning", lightning.__version__), ("optuna", optuna.__version__)):
        pin = _pin(name)
        assert any(s.operator == "<" for s in pin), f"{name} has no upper bound: {pin}"
        assert version in pin, f"{name} {version} is outside the pinned {pin}"


def test_batch_progress_counters_are_where_interrupt_checkpoint_rewrites_them():
    """The counters, and Lightning's restart after a checkpoint written once a training step finished
    (``InterruptCheckpoint`` leaves those counters to it): started and processed, not completed."""
    loop = lightning.Trainer(logger=False, enable_checkpointing=False).fit_loop.epoch_loop
    progress = loop.batch_progress
    for count in (progress.total, progress.current):
        assert all(isinstance(getattr(count, k), int) for k in ("ready", "started", "processed", "completed"))
    progress.total.ready = progress.total.started = progress.total.processed = 5
    progress.total.completed = 4
    loop.restarting = True
    loop.update_restart_stage()
    assert loop.restarted_on_train_batch_end


def test_trial_callbacks_keep_lightnings_checkpoint_keys(tmp_path):
    """The trial's EarlyStopping and ModelCheckpoint subclasses save and restore their state under the
    stock callbacks' keys (``_generate_state_key``), so checkpoints written before them (or by plain
    Lightning) resume."""
    assert (
        TrialEarlyStopping(monitor="val/acc", mode="max").state_key
        == EarlyStopping(monitor="val/acc", mode="max").state_key
    )
    for kwargs in ({"monitor": "val/acc", "mode": "max", "save_top_k": 1}, {"monitor": None, "save_top_k": 1}):
        assert (
            TrialCheckpoint(dirpath=tmp_path, **kwargs).state_key
            == ModelCheckpoint(dirpath=tmp_path, **kwargs).state_key
        )
    assert TrialEarlyStopping(monitor="val/acc").stopping_reason == EarlyStoppingReason.NOT_STOPPED
