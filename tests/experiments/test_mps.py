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
