"""A trial's ``progress.csv``, written while it trains (``append_sample``), and what the running trials
are doing, read from it: the step, the latest validation accuracy, the rate and the time left.

``progress.csv`` has the columns ``unix_time_s, step, val_acc, phase``: a sample at least every second
of training (``phase`` ``train``; ``experiments.trial.train._History``) and one when training ends (``end``);
``val_acc`` is the latest validation accuracy (empty before the first validation).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import time
from pathlib import Path

PROGRESS_FILE = "progress.csv"
COLUMNS = ("unix_time_s", "step", "val_acc", "phase")


def append_sample(path: Path, unix_time_s: float, step: int, val_acc: float | None, phase: str = "train") -> None:
    """Append one sample to the progress file ``path`` (with the header if the file is new)."""
    val = "" if val_acc is None else f"{val_acc:.4f}"
    new = not path.exists()
    with path.open("a") as f:
        f.write((",".join(COLUMNS) + "\n" if new else "") + f"{unix_time_s:.3f},{step},{val},{phase}\n")


@dataclasses.dataclass(frozen=True)
class TrialProgress:
    """One running trial: ``step`` of ``max_steps``; ``rate`` in steps/s over this invocation's samples
    (NaN until two); ``val_acc`` in [0, 1] or None; ``eta_s``: seconds to ``max_steps`` at ``rate``."""

    label: str
    step: int
    max_steps: int
    val_acc: float | None
    rate: float

    @property
    def eta_s(self) -> float:
        return (self.max_steps - self.step) / self.rate if self.rate > 0 else math.nan

    def describe(self) -> str:
        """``gru s0 lr 0.005: step 300/1500, val 61.2%, 42 steps/s, ~29 s left``."""
        parts = [f"step {self.step}/{self.max_steps}"]
        if self.val_acc is not None:
            parts.append(f"val {100 * self.val_acc:.1f}%")
        if self.rate == self.rate:
            parts.append(f"{self.rate:.0f} steps/s" if self.rate >= 10 else f"{self.rate:.1f} steps/s")
            parts.append(f"~{duration(self.eta_s)} left")
        return f"{self.label}: {', '.join(parts)}"


def duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``2.1 h``."""
    seconds = max(0, round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def read_samples(path: Path, since: float = 0.0) -> list[tuple[float, int, float | None, str]]:
    """``(unix_time_s, step, val_acc or None, phase)`` rows of a progress file taken at or after ``since``
    (a row being written is skipped)."""
    rows = []
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                try:
                    t, step = float(row["unix_time_s"]), int(row["step"])
                except (TypeError, ValueError, KeyError):
                    continue
                if t >= since:
                    val = row.get("val_acc") or ""
                    rows.append((t, step, float(val) if val else None, row.get("phase") or "train"))
    except OSError:
        return []
    return rows


def running_trials(
    cells: list[tuple[Path, str, int]], since: float, stale_s: float = 120.0, now: float | None = None
) -> list[TrialProgress]:
    """The trials of ``cells`` (``(cell folder, label, max_steps)``) that are training now: their progress
    file has samples since ``since`` (unix s), none of them the end of training, and the last is at most
    ``stale_s`` old."""
    now = time.time() if now is None else now
    out = []
    for folder, label, max_steps in cells:
        path = folder / PROGRESS_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if mtime < since or now - mtime > stale_s:  # not written in this run, or not lately: no need to read it
            continue
        samples = read_samples(path, since)
        if not samples or samples[-1][3] == "end" or now - samples[-1][0] > stale_s:
            continue
        (t0, s0, _, _), (t1, s1, val, _) = samples[0], samples[-1]
        rate = (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else math.nan
        out.append(TrialProgress(label, s1, max_steps, val, rate))
    return out


def steps_left(folder: Path, max_steps: int) -> int:
    """Steps the cell in ``folder`` has left to ``max_steps``: 0 once its progress file records the end of
    training, else ``max_steps`` minus its last recorded step (all of them without a file)."""
    try:
        with (folder / PROGRESS_FILE).open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return max_steps
    for line in reversed(lines):
        fields = line.split(",")
        if len(fields) == len(COLUMNS) and fields[1].strip().isdigit():
            return 0 if fields[3].strip() == "end" else max(0, max_steps - int(fields[1]))
    return max_steps
