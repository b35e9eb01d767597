"""The sweep's Optuna study: storage, the grid of cells as enqueued trials, claiming, finishing.

Each grid cell (one ``TrialSpec``) is an Optuna trial enqueued in the WAITING state with the spec in
its user attributes. Workers claim WAITING trials (WAITING -> RUNNING is atomic in the storage), run
them and mark them COMPLETE (value: test accuracy) or FAIL (with the reason).

Crash safety. A RUNNING trial whose worker is gone is *stale*: it is marked FAIL (``failure="died"``)
and its cell enqueued again. A worker is gone when

- its process no longer exists (same host: pid liveness), or
- its heartbeat is older than ``stale_timeout``: with the journal file, each worker touches a
  heartbeat file ``<out>/heartbeats/<worker id>`` every few seconds (also works across hosts
  sharing the output folder); with an RDB storage (PostgreSQL), Optuna's own trial heartbeats
  (``RDBStorage(heartbeat_interval, grace_period)``) and ``fail_stale_trials`` with a
  ``RetryFailedTrialCallback`` that keeps the cell's user attributes.

Exactly once. Two processes may enqueue the same cell (two machines starting at once, or two live
workers re-queueing the same stale trial). So after claiming, a worker resolves duplicates
(``_resolve_duplicates``): it cancels the cell's other WAITING trials (claiming them, then failing
them as ``"duplicate"``) and gives way if the cell already completed or another worker runs it with
a lower trial number. The storage's atomic state changes make exactly one trial per cell run to
completion. A cell whose trials died ``MAX_DEATHS`` times (e.g. a segfaulting kernel) is not
re-queued again (``--retry-failed`` does).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from experiments.train import TrialSpec

JOURNAL_FILE = "journal.log"
HEARTBEAT_DIR = "heartbeats"
#: failure reasons that are results (re-running would fail the same way); others are re-run
FINAL_FAILURES = ("nan", "error")
#: a cell whose worker died this many times is not re-queued automatically
MAX_DEATHS = 3
#: seconds between heartbeats, and the default age after which a silent worker counts as dead
HEARTBEAT_INTERVAL = 5
STALE_TIMEOUT = 60


def open_storage(url: str | None, out_dir: Path, stale_timeout: int = STALE_TIMEOUT) -> BaseStorage:
    """``None`` -> a ``JournalStorage`` file in ``out_dir``; else an Optuna storage URL (RDB).

    RDB storages get Optuna heartbeats (every ``HEARTBEAT_INTERVAL`` s; stale after
    ``stale_timeout`` s) and a retry callback that re-queues a stale trial with its cell attributes.
    """
    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(out_dir / JOURNAL_FILE)))
    if url.startswith(("postgresql", "mysql", "sqlite")):
        import warnings

        url = _with_driver(url)

        from optuna.storages import RetryFailedTrialCallback

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeat_interval is "experimental"
            try:
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=HEARTBEAT_INTERVAL, grace_period=max(int(stale_timeout), HEARTBEAT_INTERVAL + 1),
                    heartbeat_stale_trial_callback=RetryFailedTrialCallback(max_retry=MAX_DEATHS - 1),
                    engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                )
            except ImportError as err:
                raise ValueError(f"--storage {url.split('@')[-1]!r} needs a database driver: {err} "
                                 "(pip install 'expressivity-suite[postgres]')") from None
            except Exception as err:  # sqlalchemy OperationalError etc.: one line
                msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ValueError(f"cannot open --storage (host {url.split('@')[-1]!r}): {msg}") from None
    raise ValueError(f"unsupported --storage {url!r}: use postgresql://..., mysql://... or omit it for the journal file")


def _with_driver(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg2://`` when psycopg 3 (SQLAlchemy 2.1's default) is absent."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def uses_heartbeat_files(storage: BaseStorage) -> bool:
    """Journal storages have no heartbeat of their own: workers use heartbeat files instead."""
    return isinstance(storage, JournalStorage)


def cell_id(spec: TrialSpec) -> str:
    """Readable cell key plus a hash of the full spec, so an edited preset makes new cells."""
    digest = hashlib.sha1(json.dumps(spec.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{spec.cell_key()}|{digest}"


def open_study(storage: BaseStorage, name: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)


# --- workers and their liveness ----------------------------------------------------------------------
_WORKER_ID = None


def worker_id() -> str:
    """This process's worker id: ``host-pid-random`` (the random part survives pid reuse)."""
    global _WORKER_ID
    if _WORKER_ID is None or not _WORKER_ID.startswith(f"{socket.gethostname()}-{os.getpid()}-"):
        _WORKER_ID = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return _WORKER_ID


def _worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "id": worker_id()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _age_s(when: datetime | None) -> float:
    """Seconds since ``when`` (Optuna stores naive local times)."""
    if when is None:
        return float("inf")
    return (datetime.now() - when).total_seconds()


def is_stale(trial: FrozenTrial, heartbeat_dir: Path | None = None, timeout: float | None = None) -> bool:
    """Is this RUNNING trial's worker gone?

    Same host: its process no longer exists. Any host (with ``heartbeat_dir`` and ``timeout``): its
    heartbeat file is older than ``timeout`` seconds, or missing although the trial started more
    than ``timeout`` seconds ago.
    """
    if trial.state != TrialState.RUNNING:
        return False
    worker = trial.system_attrs.get("worker") or {}
    if worker.get("host") == socket.gethostname() and not _pid_alive(int(worker.get("pid", -1))):
        return True
    if heartbeat_dir is None or timeout is None:
        return False
    beat = Path(heartbeat_dir) / str(worker.get("id", ""))
    try:
        return time.time() - beat.stat().st_mtime > timeout
    except (FileNotFoundError, IsADirectoryError):
        return _age_s(trial.datetime_start) > timeout


def trials_by_cell(study: optuna.Study) -> dict[str, list[FrozenTrial]]:
    out: dict[str, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False):
        if "cell" in t.user_attrs:
            out.setdefault(t.user_attrs["cell"], []).append(t)
    return out


def _deaths(trials: Iterable[FrozenTrial]) -> int:
    """Trials of a cell whose worker died (our marking, or Optuna's heartbeat: no failure attr)."""
    return sum(t.state == TrialState.FAIL and t.user_attrs.get("failure", "died") == "died" for t in trials)


def cell_state(trials: Iterable[FrozenTrial], retry_failed: bool = False) -> str:
    """``"done"``, ``"pending"`` (waiting or running) or ``"todo"`` (must be enqueued).

    Done: a trial completed, or (unless ``retry_failed``) one failed for a final reason, or the
    cell's workers died ``MAX_DEATHS`` times.
    """
    trials = list(trials)
    if any(t.state == TrialState.COMPLETE for t in trials):
        return "done"
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
        return "pending"
    if not retry_failed and (any(t.state == TrialState.FAIL and t.user_attrs.get("failure") in FINAL_FAILURES
                                 for t in trials) or _deaths(trials) >= MAX_DEATHS):
        return "done"
    return "todo"


def cell_done(trials: Iterable[FrozenTrial]) -> bool:
    """A cell is done once one of its trials completed or failed for a final reason."""
    return cell_state(trials) == "done"


def _fail(storage: BaseStorage, trial_id: int, failure: str, error: str) -> bool:
    """Record the reason, then FAIL; ``False`` if another process finished the trial first."""
    try:
        storage.set_trial_user_attr(trial_id, "failure", failure)
        storage.set_trial_user_attr(trial_id, "error", error[:2000])
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        return True
    except (UpdateFinishedTrialError, RuntimeError):
        return False


def fail_stale(study: optuna.Study, cells: set[str] | None = None, heartbeat_dir: Path | None = None,
               timeout: float | None = None) -> int:
    """Mark stale RUNNING trials FAIL (``"died"``); returns how many this process failed.

    RDB storages: Optuna's heartbeat check (``fail_stale_trials``; its retry callback re-queues).
    All storages: trials of dead processes of this host, and (journal) silent heartbeat files.
    """
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = study._storage
    n = 0
    if is_heartbeat_enabled(storage):
        before = {t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental"
            optuna.storages.fail_stale_trials(study)
        n += len({t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))} - before)
    hb = heartbeat_dir if uses_heartbeat_files(storage) else None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if (cells is None or t.user_attrs.get("cell") in cells) and is_stale(t, hb, timeout):
            worker = t.system_attrs.get("worker") or {}
            if _fail(storage, t._trial_id, "died",
                     f"worker {worker.get('id', worker.get('pid', '?'))} died mid-trial (re-queued)"):
                n += 1
    return n


def enqueue_cell(study: optuna.Study, spec: TrialSpec, key: str | None = None) -> None:
    study.enqueue_trial(
        {"mixer": spec.mixer, "seed": spec.seed, "lr": spec.lr},
        user_attrs={"cell": key or cell_id(spec), "spec": spec.to_dict()},
    )


def sync_grid(study: optuna.Study, specs: list[TrialSpec], retry_failed: bool = False,
              heartbeat_dir: Path | None = None, stale_timeout: float | None = None) -> dict[str, int]:
    """Fail stale trials, then enqueue every cell of ``specs`` that is neither done, waiting nor running.

    Safe to call from several processes at once (duplicates are resolved when claimed).
    Returns counts: ``done``, ``queued`` (newly enqueued), ``pending`` (already waiting/running),
    ``stale`` (interrupted trials marked failed by this call).
    """
    keys = [cell_id(s) for s in specs]
    stale = fail_stale(study, set(keys), heartbeat_dir, stale_timeout)
    counts = {"done": 0, "queued": 0, "pending": 0, "stale": stale}
    existing = trials_by_cell(study)
    for spec, key in zip(specs, keys):
        trials = existing.get(key, [])
        if retry_failed:
            trials = [t for t in trials if t.state != TrialState.FAIL]
        state = cell_state(trials)
        if state == "todo":
            enqueue_cell(study, spec, key)
            counts["queued"] += 1
        else:
            counts[state] += 1
    return counts


def progress(study: optuna.Study, cells: Iterable[str]) -> dict[str, int]:
    """Counts of the cells' states: ``done``, ``running``, ``waiting``, ``todo``."""
    by_cell = trials_by_cell(study)
    out = {"done": 0, "running": 0, "waiting": 0, "todo": 0}
    for cell in cells:
        trials = by_cell.get(cell, [])
        state = cell_state(trials)
        if state == "pending":
            state = "running" if any(t.state == TrialState.RUNNING for t in trials) else "waiting"
        out[state] += 1
    return out


def _claim(storage: BaseStorage, trial_id: int) -> bool:
    try:
        return bool(storage.set_trial_state_values(trial_id, TrialState.RUNNING))
    except (UpdateFinishedTrialError, RuntimeError):  # finished meanwhile
        return False


def _resolve_duplicates(study: optuna.Study, mine: FrozenTrial) -> bool:
    """After claiming ``mine``: may it run? Cancels the cell's other WAITING trials (see module doc)."""
    storage = study._storage
    cell = mine.user_attrs["cell"]
    siblings = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("cell") == cell and t.number != mine.number]
    for t in siblings:
        if t.state == TrialState.WAITING and _claim(storage, t._trial_id):
            _fail(storage, t._trial_id, "duplicate", f"duplicate of trial {mine.number}")
    for t in siblings:
        t = storage.get_trial(t._trial_id)
        if t.state == TrialState.COMPLETE or (t.state == TrialState.RUNNING and t.number < mine.number):
            return False
    return True


def claim_next(study: optuna.Study, cells: set[str]) -> FrozenTrial | None:
    """Atomically move one WAITING trial of ``cells`` to RUNNING for this process; ``None`` if none.

    The claimed trial is the only one of its cell that will run (duplicates are cancelled).
    """
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if t.user_attrs.get("cell") not in cells:
            continue
        if not _claim(storage, t._trial_id):
            continue
        storage.set_trial_system_attr(t._trial_id, "worker", _worker_identity())
        _record_heartbeat(storage, t._trial_id)
        if not _resolve_duplicates(study, t):
            _fail(storage, t._trial_id, "duplicate", "another trial of this cell ran or runs")
            continue
        return storage.get_trial(t._trial_id)
    return None


def _record_heartbeat(storage: BaseStorage, trial_id: int) -> None:
    from optuna.storages._heartbeat import is_heartbeat_enabled

    if is_heartbeat_enabled(storage):
        storage.record_heartbeat(trial_id)


def finish(study: optuna.Study, trial: FrozenTrial, result: dict[str, Any] | None,
           failure: str | None = None, error: str | None = None) -> bool:
    """Record ``result`` and mark COMPLETE (value: test accuracy), or FAIL with ``failure``/``error``.

    Returns ``False`` (recording nothing more) if the trial was already finished elsewhere, e.g.
    declared stale while its worker hung.
    """
    storage = study._storage
    try:
        if result is not None:
            storage.set_trial_user_attr(trial._trial_id, "result", result)
        if failure is None:
            value = float(result.get("test/acc", float("nan")))
            storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [value if value == value else 0.0])
        else:
            storage.set_trial_user_attr(trial._trial_id, "failure", failure)
            storage.set_trial_user_attr(trial._trial_id, "error", (error or "")[:2000])
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    return True
