"""The sweep's Optuna study: the grid of cells as trials, claiming, finishing, crash safety.

Each grid cell (one ``TrialSpec``) is an Optuna trial added in the WAITING state with its cell as
*parameters* (``entry``, ``task``, ``mixer``, ``seed``, ``lr``, with the grid's distributions) and the
full spec in its user attributes, so ``study.trials_dataframe()`` and ``optuna-dashboard`` show the
grid. A worker claims a WAITING trial (WAITING -> RUNNING is atomic in the storage), reports the
validation accuracy as intermediate values while it trains (learning curves), and tells the study
the trial's value: the best validation accuracy, the metric the tables select learning rates on.
Test metrics are user attributes (``result``). A failed trial is FAIL with ``failure`` and ``error``
attributes. Only public Optuna APIs are used.

Crash safety. A RUNNING trial whose worker is gone is *stale*: it is marked FAIL (``failure="died"``)
and its cell enqueued again. A worker is gone when

- its process no longer exists (same host: pid liveness), or
- its heartbeat is older than ``stale_timeout``: with the journal file, each worker touches a
  heartbeat file ``<out>/heartbeats/<worker id>`` every few seconds (also works across hosts
  sharing the output folder); with an RDB storage (PostgreSQL), Optuna's own trial heartbeats
  (``RDBStorage(heartbeat_interval, grace_period)``, ``fail_stale_trials`` and
  ``RetryHeartbeatStaleTrialCallback``, which re-queues the trial with its parameters and attributes).

A trial stopped by Ctrl-C is FAIL with ``failure="interrupted"``: re-run by the next invocation, never
counted as a death. Exactly once: two processes may enqueue the same cell (two machines starting at
once, or two live workers re-queueing the same stale trial); after claiming, a worker cancels the
cell's other WAITING trials and gives way if the cell already completed or another worker runs it
with a lower trial number. A cell whose trials died ``MAX_DEATHS`` times (e.g. a segfaulting kernel)
is not re-queued again (``--retry-failed`` does).

The journal file is checked before Optuna opens it (``check_journal``): a torn last record (a crash
mid-write) is moved to ``journal.log.torn-<n>`` and the journal cut back to its last complete record;
any other unreadable line is a one-line error naming the file and line, and nothing is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shlex
import socket
import time
import uuid
import warnings
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

from experiments.trial.train import TrialSpec

log = logging.getLogger("experiments.sweeps.study")

JOURNAL_FILE = "journal.log"
#: a torn last record of the journal is moved to ``<journal>.torn-<n>``
TORN_SUFFIX = ".torn-"
HEARTBEAT_DIR = "heartbeats"
#: failure reasons that are results (re-running would fail the same way); others are re-run
FINAL_FAILURES = ("nan", "error")
#: a cell whose worker died this many times is not re-queued automatically
MAX_DEATHS = 3
#: seconds between heartbeats, and the default age after which a silent worker counts as dead
HEARTBEAT_INTERVAL = 5
STALE_TIMEOUT = 60
#: the cell parameters every trial records
PARAMS = ("entry", "task", "mixer", "seed", "lr")


def open_storage(url: str | None, out_dir: Path, stale_timeout: float = STALE_TIMEOUT) -> BaseStorage:
    """``None`` -> a ``JournalStorage`` file in ``out_dir``; else an Optuna RDB storage URL.

    RDB storages get Optuna heartbeats (every ``HEARTBEAT_INTERVAL`` s; stale after ``stale_timeout``
    s) and a callback that re-queues a stale trial with its cell.
    """
    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        check_journal(out_dir / JOURNAL_FILE)
        return JournalStorage(JournalFileBackend(str(out_dir / JOURNAL_FILE)))
    if url.startswith(("postgresql", "mysql", "sqlite")):
        shown = storage_name(url)
        url = _with_driver(url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeats and the retry callback
            try:
                return RDBStorage(
                    url,
                    heartbeat_interval=HEARTBEAT_INTERVAL,
                    grace_period=max(int(stale_timeout), HEARTBEAT_INTERVAL + 1),
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_DEATHS - 1),
                    engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                )
            except ImportError as err:
                raise ValueError(
                    f"--storage {shown!r} needs a database driver: {err} (pip install 'expressivity-suite[postgres]')"
                ) from None
            except Exception as err:  # sqlalchemy OperationalError etc.: one line
                msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ValueError(f"cannot open --storage {shown!r}: {msg}") from None
    raise ValueError(
        f"unsupported --storage {url!r}: use postgresql://..., mysql://... or omit it for the journal file"
    )


def _first_bad_line(data: bytes) -> tuple[int, int, str] | None:
    """The first line of journal ``data`` that is not a complete JSON record: ``(line number from 1, byte
    offset of its start, what is wrong)``; ``None`` if every line is one."""
    offset = 0
    for number, line in enumerate(io.BytesIO(data), start=1):  # lines end at b"\n" only, as Optuna reads them
        if not line.endswith(b"\n"):
            return number, offset, "no line end"
        try:
            json.loads(line)
        except json.JSONDecodeError as err:
            return number, offset, f"not a JSON record: {err.msg} at column {err.colno}"
        except ValueError:  # UnicodeDecodeError
            return number, offset, "not a JSON record: not UTF-8 text"
        offset += len(line)
    return None


def _looks_torn(line: bytes) -> bool:
    """Could this last line be a record cut short by a crash mid-write (the start of one, or the zeros a
    file system may leave), rather than something else written into the journal?"""
    return line.startswith(b"{") or not line.strip(b"\0 \t\r\n")


def check_journal(path: Path) -> str | None:
    """Check the study journal ``path`` before Optuna reads it; returns a warning if it repaired it.

    A torn last record (the last line without its line end, or not valid JSON, while every line before
    it is a record: what a crash mid-write leaves) is moved to ``<path>.torn-<n>`` and the journal cut
    back to its last complete record (under the journal's lock, so no write is in progress); one
    warning line is logged. Any other unreadable line: a one-line ``ValueError`` naming the file, the
    line and the way out, and the file is left as it is.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if _first_bad_line(data) is None:  # the usual case: no lock needed
        return None
    lock = JournalFileSymlinkLock(str(path))  # the lock Optuna's JournalFileBackend writes under
    lock.acquire()
    try:
        data = path.read_bytes()  # again: the bad line may have been a write in progress
        bad = _first_bad_line(data)
        if bad is None:
            return None
        number, offset, problem = bad
        rest = data[offset:]
        last_line = b"\n" not in rest[:-1]
        if not (last_line and _looks_torn(rest)):
            aside = f"mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.bad')}"
            raise ValueError(
                f"study journal {str(path)!r} is unreadable at line {number} ({problem}): move it aside "
                f"({aside}) and re-run the same command; the cells re-run from their checkpoints "
                "(finished ones are only re-tested)"
            )
        n = 1
        while True:
            side = path.with_name(f"{path.name}{TORN_SUFFIX}{n}")
            try:
                with open(side, "xb") as f:
                    f.write(rest)
                    f.flush()
                    os.fsync(f.fileno())
                break
            except FileExistsError:
                n += 1
        os.truncate(path, offset)
    finally:
        lock.release()
    message = (
        f"warning: study journal {path} ended in a torn record (line {number}, cut short by a crash "
        f"mid-write): moved it to {side}; the journal goes on from its last complete record"
    )
    log.warning(message)
    return message


def storage_name(url: str) -> str:
    """A storage URL as messages show it: scheme, host and database, without the user and password."""
    return re.sub(r"^([a-z0-9+]+://)[^@/]*@", r"\1", url)


def _with_driver(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg2://`` when psycopg 3 (SQLAlchemy 2.1's default) is absent."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


def heartbeats_enabled(storage: BaseStorage) -> bool:
    """Does the storage keep Optuna's own trial heartbeats (an RDB storage opened by ``open_storage``)?"""
    return isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None


def cell_id(spec: TrialSpec) -> str:
    """Readable cell key plus a hash of the full spec, so an edited preset makes new cells."""
    return f"{spec.cell_key()}|{spec_hash(spec)}"


def spec_hash(spec: TrialSpec) -> str:
    return hashlib.sha1(json.dumps(spec.identity(), sort_keys=True, default=str).encode()).hexdigest()[:10]


def cell_params(spec: TrialSpec, entry: str) -> dict[str, Any]:
    """The cell as Optuna parameters (``PARAMS``)."""
    return {"entry": entry, "task": spec.task, "mixer": spec.model.mixer, "seed": spec.seed, "lr": spec.lr}


def grid_distributions(params: list[dict[str, Any]]) -> dict[str, BaseDistribution]:
    """Distributions spanning the grid's values: categorical names, an int range of seeds, a log range of lrs."""
    values = {name: sorted({p[name] for p in params}) for name in PARAMS}
    return {
        "entry": CategoricalDistribution(values["entry"]),
        "task": CategoricalDistribution(values["task"]),
        "mixer": CategoricalDistribution(values["mixer"]),
        "seed": IntDistribution(min(values["seed"]), max(values["seed"])),
        "lr": FloatDistribution(min(values["lr"]), max(values["lr"]), log=True),
    }


# --- workers and their liveness ----------------------------------------------------------------------
_WORKER_ID = None


def worker_id() -> str:
    """This process's worker id: ``host-pid-random`` (the random part survives pid reuse)."""
    global _WORKER_ID
    if _WORKER_ID is None or not _WORKER_ID.startswith(f"{socket.gethostname()}-{os.getpid()}-"):
        _WORKER_ID = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return _WORKER_ID


def worker_identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "id": worker_id()}


def pid_alive(pid: int) -> bool:
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
    if worker.get("host") == socket.gethostname() and not pid_alive(int(worker.get("pid", -1))):
        return True
    if heartbeat_dir is None or timeout is None:
        return False
    beat = Path(heartbeat_dir) / str(worker.get("id", ""))
    try:
        return time.time() - beat.stat().st_mtime > timeout
    except (FileNotFoundError, IsADirectoryError):
        return _age_s(trial.datetime_start) > timeout


def remove_dead_heartbeats(heartbeat_dir: Path, timeout: float) -> int:
    """Delete heartbeat files of workers of this host that are gone, or silent for over ``timeout`` s."""
    removed = 0
    host = socket.gethostname()
    for beat in heartbeat_dir.glob("*") if heartbeat_dir.is_dir() else []:
        name = beat.name
        pid = name[len(host) + 1 :].split("-")[0] if name.startswith(f"{host}-") else ""
        try:
            silent = time.time() - beat.stat().st_mtime > timeout
        except FileNotFoundError:
            continue
        if silent or (pid.isdigit() and not pid_alive(int(pid))):
            beat.unlink(missing_ok=True)
            removed += 1
    return removed


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
    if not retry_failed and (
        any(t.state == TrialState.FAIL and t.user_attrs.get("failure") in FINAL_FAILURES for t in trials)
        or _deaths(trials) >= MAX_DEATHS
    ):
        return "done"
    return "todo"


class GridStudy:
    """A sweep's Optuna study (``study``) on its ``storage``: see the module docstring.

    ``heartbeat_dir``: where journal-storage workers keep their heartbeat files (``None`` for RDB
    storages, which have Optuna's own heartbeats).
    """

    def __init__(self, storage: BaseStorage, name: str, out: Path, stale_timeout: float = STALE_TIMEOUT) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage, self.out, self.stale_timeout = storage, Path(out), stale_timeout
        self.study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
        self.study_id = storage.get_study_id_from_name(name)
        self.heartbeat_dir = None if heartbeats_enabled(storage) else self.out / HEARTBEAT_DIR

    @classmethod
    def open(cls, url: str | None, out: Path, name: str, stale_timeout: float = STALE_TIMEOUT) -> GridStudy:
        return cls(open_storage(url, out, stale_timeout), name, out, stale_timeout)

    @property
    def name(self) -> str:
        return self.study.study_name

    def trial_id(self, trial: FrozenTrial | int) -> int:
        number = trial if isinstance(trial, int) else trial.number
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def trials(self, states: tuple[TrialState, ...] | None = None) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=states)

    def trials_by_cell(self) -> dict[str, list[FrozenTrial]]:
        out: dict[str, list[FrozenTrial]] = {}
        for t in self.trials():
            if "cell" in t.user_attrs:
                out.setdefault(t.user_attrs["cell"], []).append(t)
        return out

    def other_studies_by_cell(self) -> list[dict[str, list[FrozenTrial]]]:
        """``trials_by_cell`` of every other study in this folder's own journal (another task's or preset's
        sweep into the same ``--out``), in the journal's order; none for an RDB storage, whose other
        studies belong to other folders."""
        if not isinstance(self.storage, JournalStorage):
            return []
        out = []
        for study in self.storage.get_all_studies():
            if study.study_name == self.name:
                continue
            by_cell: dict[str, list[FrozenTrial]] = {}
            for t in self.storage.get_all_trials(self.storage.get_study_id_from_name(study.study_name)):
                if "cell" in t.user_attrs:
                    by_cell.setdefault(t.user_attrs["cell"], []).append(t)
            out.append(by_cell)
        return out

    # --- the runs' up-front model checks --------------------------------------------------------------
    def record_check(self, label: str, seconds: float) -> None:
        """Keep one invocation's up-front model check time (``runner.validate_specs``) in the study, as
        the user attribute ``check <label> <time> <pid>``, so a run resumed over several invocations
        (and machines) can state what its checks cost in all."""
        key = f"check {label} {datetime.now().isoformat(timespec='seconds')} {os.getpid()}"
        self.study.set_user_attr(key, round(float(seconds), 1))

    def check_seconds(self, label: str) -> tuple[float, int]:
        """The summed up-front check time (s) of every invocation recorded under ``label``, and their count."""
        times = [float(v) for k, v in self.study.user_attrs.items() if k.startswith(f"check {label} ")]
        return sum(times), len(times)

    # --- the grid -------------------------------------------------------------------------------------
    def enqueue(
        self, spec: TrialSpec, entry: str, distributions: dict[str, BaseDistribution], key: str | None = None
    ) -> None:
        """Add the cell as a WAITING trial carrying its parameters (the grid's ``distributions``) and spec."""
        self.study.add_trial(
            create_trial(
                state=TrialState.WAITING,
                params=cell_params(spec, entry),
                distributions=distributions,
                user_attrs={"cell": key or cell_id(spec), "spec": spec.to_dict()},
            )
        )

    def sync(self, cells: list[tuple[str, TrialSpec]], retry_failed: bool = False) -> dict[str, int]:
        """Fail stale trials, then enqueue every cell ``(entry, spec)`` that is neither done, waiting nor running.

        Safe to call from several processes at once (duplicates are resolved when claimed). Returns
        counts of distinct cells (sweeps that share a cell count it once): ``done``, ``queued`` (newly
        enqueued), ``waiting`` and ``running`` (already pending), ``stale`` (trials of gone workers marked
        failed by this call).
        """
        keys = [cell_id(s) for _, s in cells]
        stale = self.fail_stale(set(keys))
        counts = {"done": 0, "queued": 0, "waiting": 0, "running": 0, "stale": stale}
        existing = self.trials_by_cell()
        distributions = grid_distributions([cell_params(s, e) for e, s in cells])
        seen: set[str] = set()
        for (entry, spec), key in zip(cells, keys):
            if key in seen:
                continue
            seen.add(key)
            trials = existing.get(key, [])
            if retry_failed:
                trials = [t for t in trials if t.state != TrialState.FAIL]
            state = cell_state(trials)
            if state == "todo":
                self.enqueue(spec, entry, distributions, key)
                counts["queued"] += 1
            elif state == "pending":
                counts["running" if any(t.state == TrialState.RUNNING for t in trials) else "waiting"] += 1
            else:
                counts["done"] += 1
        return counts

    def progress(self, cells: Iterable[str], by_cell: dict[str, list[FrozenTrial]] | None = None) -> dict[str, int]:
        """Counts of the cells' states: ``done``, ``running``, ``waiting``, ``todo`` (from ``by_cell``, a
        ``trials_by_cell()`` the caller already read, else a fresh read)."""
        by_cell = self.trials_by_cell() if by_cell is None else by_cell
        out = {"done": 0, "running": 0, "waiting": 0, "todo": 0}
        for cell in cells:
            trials = by_cell.get(cell, [])
            state = cell_state(trials)
            if state == "pending":
                state = "running" if any(t.state == TrialState.RUNNING for t in trials) else "waiting"
            out[state] += 1
        return out

    # --- liveness ---------------------------------------------------------------------------------------
    def fail_stale(self, cells: set[str] | None = None) -> int:
        """Mark stale RUNNING trials FAIL (``"died"``); returns how many this process failed.

        RDB storages: Optuna's heartbeat check (``fail_stale_trials``; its callback re-queues). All
        storages: trials of dead processes of this host, and (journal) silent heartbeat files.
        """
        n = 0
        if heartbeats_enabled(self.storage):
            before = {t.number for t in self.trials(states=(TrialState.FAIL,))}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
            n += len({t.number for t in self.trials(states=(TrialState.FAIL,))} - before)
        for t in self.trials(states=(TrialState.RUNNING,)):
            if (cells is None or t.user_attrs.get("cell") in cells) and is_stale(
                t, self.heartbeat_dir, self.stale_timeout
            ):
                worker = t.system_attrs.get("worker") or {}
                if self._fail(
                    t.number, "died", f"worker {worker.get('id', worker.get('pid', '?'))} died mid-trial (re-queued)"
                ):
                    n += 1
        if self.heartbeat_dir is not None:
            remove_dead_heartbeats(self.heartbeat_dir, self.stale_timeout)
        return n

    def record_heartbeat(self, number: int) -> None:
        """Optuna's heartbeat of a running trial (RDB storages; a no-op for the journal)."""
        if heartbeats_enabled(self.storage):
            self.storage.record_heartbeat(self.trial_id(number))

    # --- claiming and finishing -------------------------------------------------------------------------
    def _claim(self, number: int) -> bool:
        try:
            return bool(self.storage.set_trial_state_values(self.trial_id(number), TrialState.RUNNING))
        except (UpdateFinishedTrialError, RuntimeError):  # finished meanwhile
            return False

    def _fail(self, number: int, failure: str, error: str) -> bool:
        """Record the reason, then FAIL; ``False`` if another process finished the trial first."""
        trial_id = self.trial_id(number)
        try:
            self.storage.set_trial_user_attr(trial_id, "failure", failure)
            self.storage.set_trial_user_attr(trial_id, "error", error[:2000])
            self.study.tell(number, state=TrialState.FAIL)
            return True
        except (UpdateFinishedTrialError, ValueError, RuntimeError):
            return False

    def _resolve_duplicates(self, mine: FrozenTrial) -> bool:
        """After claiming ``mine``: may it run? Cancels the cell's other WAITING trials (see module doc)."""
        cell = mine.user_attrs["cell"]
        siblings = [t for t in self.trials() if t.user_attrs.get("cell") == cell and t.number != mine.number]
        for t in siblings:
            if t.state == TrialState.WAITING and self._claim(t.number):
                self._fail(t.number, "duplicate", f"duplicate of trial {mine.number}")
        for t in siblings:
            t = self.storage.get_trial(self.trial_id(t))
            if t.state == TrialState.COMPLETE or (t.state == TrialState.RUNNING and t.number < mine.number):
                return False
        return True

    def claim(self, cells: Iterable[str]) -> Trial | None:
        """Atomically move one WAITING trial of ``cells`` to RUNNING for this process; ``None`` if none.

        Claims in the order of ``cells`` (the grid's: hardest first), then by trial number, so a cell
        re-queued after an interruption or a death keeps its place in the grid and resumes from its
        checkpoint before cells that never started. Returns a live ``optuna.trial.Trial`` (report
        intermediate values on it). The claimed trial is the only one of its cell that will run
        (duplicates are cancelled).
        """
        rank = {cell: i for i, cell in enumerate(dict.fromkeys(cells))}
        waiting = sorted(
            (t for t in self.trials(states=(TrialState.WAITING,)) if t.user_attrs.get("cell") in rank),
            key=lambda t: (rank[t.user_attrs["cell"]], t.number),
        )
        for t in waiting:
            if not self._claim(t.number):
                continue
            trial_id = self.trial_id(t)
            self.storage.set_trial_system_attr(trial_id, "worker", worker_identity())
            self.record_heartbeat(t.number)
            if not self._resolve_duplicates(t):
                self._fail(t.number, "duplicate", "another trial of this cell ran or runs")
                continue
            return Trial(self.study, trial_id)
        return None

    def finish(
        self, trial: Trial, result: dict[str, Any] | None, failure: str | None = None, error: str | None = None
    ) -> bool:
        """Record ``result`` and tell COMPLETE (value: best validation accuracy), or FAIL with ``failure``/``error``.

        Returns ``False`` (recording nothing more) if the trial was already finished elsewhere, e.g.
        declared stale while its worker hung.
        """
        try:
            if failure is not None:
                return self._fail(trial.number, failure, error or "")
            trial.set_user_attr("result", result)
            value = float(result.get("best_val_acc", float("nan")))
            self.study.tell(trial, value if value == value else 0.0)
        except (UpdateFinishedTrialError, ValueError, RuntimeError):
            return False
        return True
