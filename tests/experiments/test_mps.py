"""``experiments.engines.mps.cuda_mps`` against a stand-in ``nvidia-cuda-mps-control`` (no GPU needed)."""

import os
import stat

import pytest

from experiments.engines.mps import MPSError, cuda_mps

FAKE = """#!/bin/sh
# records its calls; "-d" creates the control pipe the way the real daemon does
echo "$@ pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "{calls}"
if [ "$1" = "-d" ]; then [ -n "{fail}" ] && {{ echo "daemon refused" >&2; exit 3; }}; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
read -r cmd; echo "stdin=$cmd" >> "{calls}"
"""


def _fake(tmp_path, fail=""):
    exe = tmp_path / "fake-mps-control"
    calls = tmp_path / "calls.txt"
    exe.write_text(FAKE.format(calls=calls, fail=fail))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe), calls


def test_daemon_started_exported_and_stopped(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "/previous/log")
    exe, calls = _fake(tmp_path)
    with cuda_mps(control=exe) as pipe:
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        assert (pipe / "control").exists()
        log_dir = os.environ["CUDA_MPS_LOG_DIRECTORY"]
        assert log_dir != "/previous/log"
    lines = calls.read_text().splitlines()
    assert lines[0].startswith(f"-d pipe={pipe} log={log_dir}")
    assert lines[-1] == "stdin=quit -t 5"  # stopped through the same pipe folder
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/previous/log"
    assert not pipe.exists()


def test_stopped_when_the_block_raises(tmp_path):
    exe, calls = _fake(tmp_path)
    with pytest.raises(KeyError), cuda_mps(control=exe):
        raise KeyError("boom")
    assert calls.read_text().splitlines()[-1] == "stdin=quit -t 5"


def test_errors_are_one_line(tmp_path):
    with pytest.raises(MPSError, match="not found"), cuda_mps(control=str(tmp_path / "missing")):
        pass
    exe, _ = _fake(tmp_path, fail="1")
    with pytest.raises(MPSError, match="daemon refused"), cuda_mps(control=exe):
        pass
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_disabled_is_a_no_op(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with cuda_mps(False) as pipe:
        assert pipe is None and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


DAEMON = """#!/bin/sh
# a stand-in daemon: "-d" leaves a server process running (its pid in the pipe folder);
# "quit" stops it, or with "{hang}" set hangs instead (as a stuck control client does)
if [ "$1" = "serve" ]; then while :; do sleep 0.2; done; fi
if [ "$1" = "-d" ]; then
  "$0" serve >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/server.pid"; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0
fi
read -r cmd
if [ -n "{hang}" ]; then exec sleep 30 >/dev/null 2>&1; fi
kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/server.pid")"
"""


def _daemon(tmp_path, hang=""):
    exe = tmp_path / "fake-mps-daemon"
    exe.write_text(DAEMON.format(hang=hang))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def _alive(pid: int) -> bool:
    try:
        state = next(ln for ln in open(f"/proc/{pid}/status") if ln.startswith("State:"))
    except OSError:
        return False
    return "Z" not in state.split()[1]


def _parent(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:  # gone meanwhile: it was a short-lived fork
        return -1


@pytest.mark.parametrize("hang", ["", "1"])
def test_no_daemon_outlives_the_block_even_when_quit_hangs(tmp_path, monkeypatch, caplog, hang):
    from experiments.engines import mps

    monkeypatch.setattr(mps, "QUIT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(mps, "EXIT_WAIT_S", 1.0)
    exe = _daemon(tmp_path, hang)
    with cuda_mps(control=exe) as pipe:
        server = int((pipe / "server.pid").read_text())
        found = mps.daemon_processes(pipe, exe)
        # the stand-in server forks a sleep now and then: until it execs, the fork shows the server's argv
        assert _alive(server) and server in found and all(_parent(p) in (server, -1) for p in found if p != server)
    assert not _alive(server) and not pipe.exists()
    assert "could not stop" not in caplog.text


def test_a_daemon_that_cannot_be_stopped_is_named_with_how_to_stop_it(tmp_path, monkeypatch, caplog):
    from experiments.engines import mps

    monkeypatch.setattr(mps, "QUIT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(mps, "EXIT_WAIT_S", 0.5)
    exe = _daemon(tmp_path, hang="1")
    monkeypatch.setattr(mps, "send_signal", lambda pid, sig: None)  # signals do not reach it
    with cuda_mps(control=exe) as pipe:
        server = int((pipe / "server.pid").read_text())
    try:
        line = next(r.getMessage() for r in caplog.records if "could not stop the MPS daemon" in r.getMessage())
        assert f"processes {server} still run" in line and f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in line
        assert f"kill -9 {server}" in line and pipe.exists()  # the folder its stop command needs is kept
    finally:
        os.kill(server, 9)


def test_sigterm_inside_the_block_stops_the_daemon(tmp_path):
    """``kill``/``timeout`` send SIGTERM, whose default ends the process before any clean-up: inside the
    block it unwinds like Ctrl-C, the daemon is stopped, and the default handler is back afterwards."""
    import signal

    exe, calls = _fake(tmp_path)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(KeyboardInterrupt), cuda_mps(control=exe):
            os.kill(os.getpid(), signal.SIGTERM)
        assert calls.read_text().splitlines()[-1] == "stdin=quit -t 5"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
