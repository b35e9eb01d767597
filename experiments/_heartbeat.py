"""A worker's heartbeat: a daemon thread that proves the worker is alive (see ``experiments.study``).

With a heartbeat folder (journal storage) it touches ``<folder>/<worker id>`` every ``interval``
seconds; with an RDB storage whose heartbeat is enabled it also records Optuna's heartbeat of the
trial the worker is running (``set_trial``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from optuna.storages import BaseStorage


class Heartbeat:
    """``with Heartbeat(storage, folder, worker_id): ...``; ``set_trial(trial_id | None)`` while running one."""

    def __init__(self, storage: BaseStorage, folder: Path | None, worker_id: str, interval: float = 5.0) -> None:
        from optuna.storages._heartbeat import is_heartbeat_enabled

        self.storage, self.interval = storage, interval
        self.path = Path(folder) / worker_id if folder is not None else None
        self.rdb = is_heartbeat_enabled(storage)
        self._trial_id: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def set_trial(self, trial_id: int | None) -> None:
        self._trial_id = trial_id
        self.beat()

    def beat(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        trial_id = self._trial_id
        if self.rdb and trial_id is not None:
            try:
                self.storage.record_heartbeat(trial_id)
            except Exception:  # a transient database error: the next beat retries
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError:  # e.g. disk full: the next beat retries
                pass

    def __enter__(self) -> "Heartbeat":
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval)
        if self.path is not None:
            self.path.unlink(missing_ok=True)
