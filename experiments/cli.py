"""Shared plumbing of the command-line tools.

- ``run_cli``: a user mistake (``ValueError``) becomes a one-line ``error: ...`` with exit code 2,
  Ctrl-C a one-line resume hint with exit code 130; never a traceback.
- ``Parser``: an ``ArgumentParser`` with one-line errors; argument types (``positive_int``,
  ``nonnegative_int``, ``int_list``, ``positive_int_list``, ``positive_float_list``, ``str_list``, ``key_value``).
- Checks made before any training, leaving nothing behind: ``check_output_folder``, ``check_device``.
- ``add_run_arguments``: the options every training CLI shares (``--workers``, ``--device``,
  ``--storage``, ``--stale-timeout``, ``--retry-failed``, ``--logger``, ``--engine``, ``--stack``, ``--mps``,
  ``--no-progress``, ``--progress-every``, ``--verbose``).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

_NUMBER = re.compile(r"^-[\d.]")


RESUME_HINT = (
    "re-run the same command to resume (finished cells are kept, interrupted ones continue from their last checkpoint)"
)


def training_main(
    parser: argparse.ArgumentParser, argv: list[str] | None, body: Callable[[argparse.Namespace], None]
) -> int:
    """A training CLI's ``main``: parse ``argv``, log to the console, run ``body(args)`` under ``run_cli``."""
    from experiments.engines.autotune import cache_autotuning_on_disk
    from experiments.trial.train import quiet_lightning

    cache_autotuning_on_disk()  # before any Triton kernel is defined; worker processes inherit it
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("experiments").setLevel(logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)
    quiet_lightning()
    return run_cli(lambda: body(args), RESUME_HINT)


def run_cli(body: Callable[[], None], resume_hint: str = "re-run the same command to resume") -> int:
    """Run a CLI's ``body``; returns the process exit code (0, 2 for bad input, 130 if interrupted by
    Ctrl-C, 143 by SIGTERM). SIGTERM unwinds like Ctrl-C (``experiments.engines.signals``): workers
    stopped, trials recorded as interrupted, an MPS daemon stopped."""
    from experiments.engines.signals import Terminated, sigterm_raises

    try:
        with sigterm_raises():
            body()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"interrupted: {resume_hint}", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    return 0


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``error: ...``, exit code 2) and whose options
    take negative numbers as values (``--lrs -1e-3`` reaches the value check instead of being read
    as an unknown option)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        joined: list[str] = []
        for token in argv:
            if joined and joined[-1].startswith("--") and "=" not in joined[-1] and _NUMBER.match(token):
                joined[-1] = f"{joined[-1]}={token}"
            else:
                joined.append(token)
        return super().parse_args(joined, namespace)


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_list(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]`` (non-negative)."""
    values = [nonnegative_int(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    return values


def positive_int_list(text: str) -> list[int]:
    """``"16,48"`` -> ``[16, 48]`` (each >= 1)."""
    values = [positive_int(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive integers, got {text!r}")
    return values


def positive_float_list(text: str) -> list[float]:
    """``"1e-3,3e-4"`` -> ``[0.001, 0.0003]`` (each > 0)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    bad = [v for v in values if not v > 0]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"must be numbers > 0, got {text!r}")
    return values


def str_list(text: str) -> list[str]:
    """``"a,b[k=1,j=2]"`` -> ``["a", "b[k=1,j=2]"]``: commas inside brackets belong to the item."""
    values = [x.strip() for x in re.split(r",(?![^\[]*\])", text) if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return values


def key_value(text: str) -> tuple[str, Any]:
    """``"seq_len=64"`` -> ``("seq_len", 64)`` (the value parsed as YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def check_output_folder(path: Path) -> Path:
    """Check that ``path`` is, or can be made, a folder files can be written to; one-line ``ValueError`` if
    not. Leaves no trace: the folders it creates to check are removed again (the run creates them once
    nothing can reject it any more), so a rejected command stores nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} is a file, not a folder: choose another path")
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"cannot write to --out {str(path)!r}: {err.strerror or err}") from None
    finally:
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not created after all, or no longer empty
                pass
    return path


def check_device(device: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` that exists on this machine; one-line ``ValueError`` if not."""
    from experiments.trial.train import resolve_device

    resolve_device(device)
    return device


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options shared by the CLIs that train (sweep, reproduce, probe)."""
    from experiments.engines.mps import add_mps_argument
    from experiments.sweeps.study import STALE_TIMEOUT
    from experiments.trial.train import ENGINES, LOGGERS

    parser.add_argument(
        "--workers",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="run trials in N worker processes on this machine (spread over the visible GPUs, several "
        "per GPU; each with cores/N CPU threads, a CPU trial with its cpu_threads, default 1); "
        "0 (default): in this process",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument(
        "--storage",
        help="Optuna storage URL shared by workers on several machines (postgresql://...); "
        "default: a JournalStorage file in the output folder",
    )
    parser.add_argument(
        "--stale-timeout",
        type=float,
        default=STALE_TIMEOUT,
        metavar="S",
        help="seconds without a heartbeat after which another worker's running trial counts as dead and "
        "its cell is re-run (a dead process on this host is detected at once; default: %(default)s)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="re-run cells whose trial failed for a final reason (NaN loss, an error)",
    )
    parser.add_argument(
        "--logger",
        choices=LOGGERS,
        default="csv",
        help="step log of each trial: csv (default), tensorboard (pip install "
        "'expressivity-suite[tensorboard]'; then tensorboard --logdir OUT/trials) or none",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="how optimizer steps run: graph (each step a CUDA-graph replay, fast), compiled (graph "
        "replays of the torch.compile'd model: fewer, fused kernels, ~10-20 s to compile per "
        "trial), eager, or auto (default: on CUDA graph, or the preset's budget engine, on the CPU "
        "eager); all compute the same steps (compiled: within float rounding)",
    )
    parser.add_argument(
        "--stack",
        type=positive_int,
        default=1,
        metavar="S",
        help="train up to S trials of a cell's seeds (same task, mixer, lr, options) as one stacked "
        "model in one worker: S times the work per kernel, each trial with its own early stopping, "
        "checkpoints and results (default: %(default)s, one trial per model)",
    )
    add_mps_argument(parser)
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (a line per finished cell instead; automatic when not on a terminal)",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="without a bar, a line with the running trials' steps, validation accuracy and time "
        "left every SECONDS (default: %(default)s; on a bar: its status, every 2 s; 0: off)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also log each trial's timings (setup, train, test) for debugging"
    )


def check_run_arguments(args: argparse.Namespace, out: Path) -> None:
    """Everything about the run options that can be checked before training (one-line errors)."""
    from experiments.trial.train import GRAPH_ENGINES

    check_device(args.device)
    options = run_options(args)
    if options.engine in GRAPH_ENGINES and args.device == "cpu":
        raise ValueError(f"--engine {options.engine} needs a CUDA device")
    if args.progress_every < 0:
        raise ValueError(f"--progress-every must be >= 0 seconds, got {args.progress_every}")
    if args.stale_timeout <= 0:
        raise ValueError(f"--stale-timeout must be > 0 seconds, got {args.stale_timeout}")
    if args.mps and not args.workers:
        raise ValueError("--mps applies to worker processes: give --workers N too")
    check_output_folder(out)


def sweep_options(args: argparse.Namespace, preset: str | None = None):
    """The ``experiments.sweeps.runner.SweepOptions`` of the parsed run arguments (``add_run_arguments``),
    built once and passed down; its ``trial`` options are ``run_options(args, preset)``."""
    from experiments.sweeps.runner import SweepOptions

    return SweepOptions(
        workers=args.workers,
        device=args.device,
        storage_url=args.storage,
        stale_timeout=args.stale_timeout,
        retry_failed=args.retry_failed,
        progress=not args.no_progress,
        progress_every=args.progress_every,
        trial=run_options(args, preset),
    )


def run_options(args: argparse.Namespace, preset: str | None = None):
    """The ``experiments.trial.train.RunOptions`` of the parsed ``--logger``, ``--engine`` and ``--stack`` (checked);
    with ``preset``, ``--engine auto`` runs on CUDA in the engine its ``budget: {engine: ...}`` names, if any."""
    from experiments.sweeps.presets import load_preset
    from experiments.trial.train import RunOptions

    budget = (load_preset(preset).get("budget") or {}) if preset else {}
    gpu_engine = {"gpu_engine": budget["engine"]} if "engine" in budget else {}
    return RunOptions(logger=args.logger, engine=args.engine, stack=args.stack, **gpu_engine)
