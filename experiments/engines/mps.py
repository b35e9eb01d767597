"""``--mps``: run sweep workers under the CUDA Multi-Process Service.

Without MPS the GPU time-slices between the worker processes' contexts, so the small kernels of
16 workers never run at the same time; under MPS they share one server context and run
concurrently. ``cuda_mps()`` starts a private MPS control daemon (its pipe and log folders in a
temporary directory, exported through ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``
so the worker processes started inside the block connect to it) and stops it on exit. It changes
no GPU setting (compute mode stays as it is). Start it before any process of the run creates a
CUDA context: processes with a context from before do not use MPS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("experiments.engines.mps")

CONTROL = "nvidia-cuda-mps-control"
ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
#: read by the CUDA driver when a process creates its context under MPS: 0 normal, 1 below normal
PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"
NORMAL, BELOW_NORMAL = 0, 1


class MPSError(ValueError):
    """The MPS daemon could not be started (a ``ValueError``: the CLIs print it as a one-line error)."""


def add_mps_argument(parser) -> None:
    """The ``--mps`` option of the CLIs that start worker processes."""
    parser.add_argument(
        "--mps",
        action="store_true",
        help="with --workers on a GPU: run the workers under a private CUDA MPS daemon so their "
        "kernels share the GPU concurrently (experiments.engines.mps)",
    )


def mps_running() -> bool:
    """Whether processes started from here connect to the private daemon of ``cuda_mps``."""
    return bool(os.environ.get(ENV_KEYS[0]))


def workers_mps(enabled: bool, workers: int):
    """``cuda_mps(enabled)`` for a run of ``workers`` worker processes (``--mps`` needs some)."""
    if enabled and not workers:
        raise MPSError("--mps applies to worker processes: give --workers N too")
    return cuda_mps(enabled)


@contextlib.contextmanager
def cuda_mps(enabled: bool = True, control: str = CONTROL) -> Iterator[Path | None]:
    """Run the block with a private MPS daemon (yields its pipe folder); a no-op if not ``enabled``."""
    if not enabled:
        yield None
        return
    exe = shutil.which(control)
    if exe is None:
        raise MPSError(f"--mps needs {control} (NVIDIA driver utilities) on PATH; it was not found")
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    pipe, logs = root / "pipe", root / "log"
    pipe.mkdir()
    logs.mkdir()
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)})
    try:
        started = subprocess.run([exe, "-d"], capture_output=True, text=True, timeout=30)
        if started.returncode != 0:
            raise MPSError(
                f"{control} -d failed (exit {started.returncode}): {(started.stderr or started.stdout).strip()}"
            )
        deadline = time.monotonic() + 10
        while not any(pipe.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        log.info("MPS daemon started (pipe %s)", pipe)
        yield pipe
    except BaseException:
        _restore(saved)
        _quit(exe, pipe, logs)
        raise
    else:
        _restore(saved)
        _quit(exe, pipe, logs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _quit(exe: str, pipe: Path, logs: Path) -> None:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    try:
        # `-t 5`: stop the server after 5 s even if a client (e.g. this process, which asked for the
        # device count) is still attached; without it quit waits for every client to exit
        subprocess.run([exe], input="quit -t 5\n", capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("could not stop the MPS daemon: %s", err)
