"""The sweep's Optuna study: storage, the grid of cells as enqueued trials, claiming, finishing.

Each grid cell (one ``TrialSpec``) is an Optuna trial enqueued in the WAITING state with the spec in
its user attributes. Workers claim WAITING trials (WAITING -> RUNNING is atomic in the storage), run
them and mark them COMPLETE (value: test accuracy) or FAIL (with the reason). A RUNNING trial whose
worker process is gone is stale: it is marked FAIL ("interrupted") and its cell enqueued again.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterable

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from experiments.train import TrialSpec

JOURNAL_FILE = "journal.log"
#: failure reasons that are results (re-running would fail the same way); others are re-run
FINAL_FAILURES = ("nan", "error")


def open_storage(url: str | None, out_dir: Path) -> BaseStorage:
    """``None`` -> a ``JournalStorage`` file in ``out_dir``; else an Optuna storage URL (RDB)."""
    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(out_dir / JOURNAL_FILE)))
    if url.startswith(("postgresql", "mysql", "sqlite")):
        return optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
    raise ValueError(f"unsupported --storage {url!r}: use postgresql://..., mysql://... or omit it for the journal file")


def cell_id(spec: TrialSpec) -> str:
    """Readable cell key plus a hash of the full spec, so an edited preset makes new cells."""
    digest = hashlib.sha1(json.dumps(spec.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{spec.cell_key()}|{digest}"


def open_study(storage: BaseStorage, name: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)


def _worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(trial: FrozenTrial) -> bool:
    """A RUNNING trial claimed by a process of this host that no longer exists."""
    worker = trial.system_attrs.get("worker")
    if trial.state != TrialState.RUNNING or not worker:
        return False
    return worker.get("host") == socket.gethostname() and not _pid_alive(int(worker.get("pid", -1)))


def trials_by_cell(study: optuna.Study) -> dict[str, list[FrozenTrial]]:
    out: dict[str, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False):
        if "cell" in t.user_attrs:
            out.setdefault(t.user_attrs["cell"], []).append(t)
    return out


def cell_done(trials: Iterable[FrozenTrial]) -> bool:
    """A cell is done once one of its trials completed or failed for a final reason."""
    return any(
        t.state == TrialState.COMPLETE
        or (t.state == TrialState.FAIL and t.user_attrs.get("failure") in FINAL_FAILURES)
        for t in trials
    )


def sync_grid(study: optuna.Study, specs: list[TrialSpec], retry_failed: bool = False) -> dict[str, int]:
    """Enqueue every cell of ``specs`` that is neither done, waiting nor running; fail stale trials.

    Returns counts: ``done``, ``queued`` (newly enqueued), ``pending`` (already waiting/running),
    ``stale`` (interrupted trials marked failed and re-queued).
    """
    storage = study._storage
    counts = {"done": 0, "queued": 0, "pending": 0, "stale": 0}
    existing = trials_by_cell(study)
    for spec in specs:
        key = cell_id(spec)
        trials = existing.get(key, [])
        for t in trials:
            if is_stale(t):
                storage.set_trial_user_attr(t._trial_id, "failure", "interrupted")
                storage.set_trial_user_attr(t._trial_id, "error", "worker process died mid-trial")
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                counts["stale"] += 1
        trials = [study._storage.get_trial(t._trial_id) for t in trials]
        if retry_failed:
            trials = [t for t in trials if t.state != TrialState.FAIL]
        if cell_done(trials):
            counts["done"] += 1
        elif any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
            counts["pending"] += 1
        else:
            study.enqueue_trial(
                {"mixer": spec.mixer, "seed": spec.seed, "lr": spec.lr},
                user_attrs={"cell": key, "spec": spec.to_dict()},
            )
            counts["queued"] += 1
    return counts


def claim_next(study: optuna.Study, cells: set[str]) -> FrozenTrial | None:
    """Atomically move one WAITING trial of ``cells`` to RUNNING for this process; ``None`` if none."""
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if t.user_attrs.get("cell") not in cells:
            continue
        try:
            claimed = storage.set_trial_state_values(t._trial_id, TrialState.RUNNING)
        except RuntimeError:  # finished meanwhile (UpdateFinishedTrialError)
            continue
        if claimed:
            storage.set_trial_system_attr(t._trial_id, "worker", _worker_identity())
            return storage.get_trial(t._trial_id)
    return None


def finish(study: optuna.Study, trial: FrozenTrial, result: dict[str, Any] | None,
           failure: str | None = None, error: str | None = None) -> None:
    """Record ``result`` and mark COMPLETE (value: test accuracy), or FAIL with ``failure``/``error``."""
    storage = study._storage
    if result is not None:
        storage.set_trial_user_attr(trial._trial_id, "result", result)
    if failure is None:
        storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [float(result.get("test/acc", float("nan")))])
    else:
        storage.set_trial_user_attr(trial._trial_id, "failure", failure)
        storage.set_trial_user_attr(trial._trial_id, "error", (error or "")[:2000])
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
