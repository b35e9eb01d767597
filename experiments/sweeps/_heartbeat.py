"""A worker's heartbeat: a daemon thread that proves the worker is alive (see ``experiments.sweeps.study``).

With a journal storage it touches ``<heartbeat dir>/<worker id>`` every ``interval`` seconds; with
an RDB storage it records Optuna's heartbeat of the trial the worker is running (``set_trial``).
"""

from __future__ import annotations

import threading

from experiments.sweeps.study import GridStudy


class Heartbeat:
    """``with Heartbeat(grid, worker_id): ...``; ``set_trial(trial number | numbers | None)`` while running
    one trial (or a stack of them)."""

    def __init__(self, grid: GridStudy, worker_id: str, interval: float = 5.0) -> None:
        self.grid, self.interval = grid, interval
        self.path = grid.heartbeat_dir / worker_id if grid.heartbeat_dir is not None else None
        self._trials: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def set_trial(self, number: int | list[int] | None) -> None:
        self._trials = [] if number is None else [number] if isinstance(number, int) else list(number)
        self.beat()

    def beat(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        for number in self._trials:
            try:
                self.grid.record_heartbeat(number)
            except Exception:  # a transient database error: the next beat retries
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError:  # e.g. disk full: the next beat retries
                pass

    def __enter__(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval)
        if self.path is not None:
            self.path.unlink(missing_ok=True)
