"""``--mps``: run sweep workers under the CUDA Multi-Process Service.

Without MPS the GPU time-slices between the worker processes' contexts, so the small kernels of
16 workers never run at the same time; under MPS they share one server context and run
concurrently. ``cuda_mps()`` starts a private MPS control daemon (its pipe and log folders in a
temporary directory, exported through ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``
so the worker processes started inside the block connect to it) and stops it on exit: ``quit`` through
its pipe, then, for the daemon's processes still alive (found by that pipe folder in their
environment), SIGTERM and SIGKILL; a process that survives even that is named in one warning line with
the commands that stop it, and its folders are kept so those commands work. It changes
no GPU setting (compute mode stays as it is). Start it before any process of the run creates a
CUDA context: processes with a context from before do not use MPS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from experiments.engines.signals import sigterm_raises

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
    """Run the block with a private MPS daemon (yields its pipe folder); a no-op if not ``enabled``.
    SIGTERM inside the block unwinds it like Ctrl-C (``sigterm_raises``), so the daemon is stopped."""
    if not enabled:
        yield None
        return
    with sigterm_raises(), _private_daemon(control) as pipe:
        yield pipe


@contextlib.contextmanager
def _private_daemon(control: str) -> Iterator[Path]:
    exe = shutil.which(control)
    if exe is None:
        raise MPSError(f"--mps needs {control} (NVIDIA driver utilities) on PATH; it was not found")
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    pipe, logs = root / "pipe", root / "log"
    pipe.mkdir()
    logs.mkdir()
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)})
    stopped = True
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
        stopped = stop_daemon(exe, pipe, logs)
        raise
    else:
        _restore(saved)
        stopped = stop_daemon(exe, pipe, logs)
    finally:
        if stopped:  # a daemon left running keeps the folders its stop command needs
            shutil.rmtree(root, ignore_errors=True)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


#: seconds: how long ``quit`` through the pipe may take, then how long the daemon's processes get to exit
#: after it and after each signal
QUIT_TIMEOUT_S = 15.0
EXIT_WAIT_S = 5.0


def daemon_processes(pipe: Path, control: str) -> list[int]:
    """Pids of the live MPS processes of the daemon whose pipe folder is ``pipe``: processes with
    ``CUDA_MPS_PIPE_DIRECTORY=<pipe>`` in their environment that run ``control`` or an
    ``nvidia-cuda-mps-*`` program (the control daemon and its server; not the workers, which share the
    variable). This process is never one of them; processes of other users are unreadable and skipped."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    pids = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            state = next((ln for ln in (entry / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:  # gone meanwhile, or another user's
            continue
        if "Z" in state.split()[1:2]:  # a zombie has exited; its parent has not reaped it yet
            continue
        if any(a == control or Path(a).name.startswith("nvidia-cuda-mps") for a in argv):
            pids.append(int(entry.name))
    return pids


def send_signal(pid: int, sig: int) -> None:
    """``os.kill`` that ignores a process already gone."""
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _wait_gone(pipe: Path, control: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := daemon_processes(pipe, control)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def stop_daemon(exe: str, pipe: Path, logs: Path) -> bool:
    """Stop the private daemon: ``quit -t 5`` through its pipe (at most ``QUIT_TIMEOUT_S``), then SIGTERM and
    SIGKILL to its processes still alive. True when none is left; otherwise one warning line names the
    pids and how to stop them."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    quit_error = ""
    try:
        # `-t 5`: stop the server after 5 s even if a client (e.g. this process, which asked for the
        # device count) is still attached; without it quit waits for every client to exit
        subprocess.run([exe], input="quit -t 5\n", capture_output=True, text=True, timeout=QUIT_TIMEOUT_S, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        quit_error = str(err)
    alive = _wait_gone(pipe, exe, EXIT_WAIT_S)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive:
            break
        for pid in alive:
            send_signal(pid, sig)
        alive = _wait_gone(pipe, exe, EXIT_WAIT_S)
    if alive:
        log.warning(
            "could not stop the MPS daemon (%s; processes %s still run): stop it with "
            "`echo quit | CUDA_MPS_PIPE_DIRECTORY=%s CUDA_MPS_LOG_DIRECTORY=%s %s` or `kill -9 %s`",
            quit_error or "quit did not end it",
            ", ".join(map(str, alive)),
            pipe,
            logs,
            exe,
            " ".join(map(str, alive)),
        )
        return False
    if quit_error:
        log.info("MPS daemon stopped by signal (quit through its pipe failed: %s)", quit_error)
    return True
