"""``python -m benchmarks.ops compile``: the delta family's kernels (RWKV-7's DPLR kernels among them) compile for ``sm_90`` with Triton's
bundled ``ptxas`` and no GPU (a kernel that only the interpreter has run meets the real compiler here:
loop-carried types, layouts, shared memory), within the device's shared memory, at the default tiles and with bfloat16 products. In its own process: the
report compiles the real kernels (``TRITON_INTERPRET=0``), which a test process has imported interpreted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("tiles", ["", "precision=bf16"])  # bf16 products keep W, U', the states in bfloat16
def test_the_delta_kernels_compile_for_hopper(tiles):
    cmd = [sys.executable, "-m", "benchmarks.ops", "compile", "--families", "delta", "--delta-shapes", "bf16,256,64"]
    cmd += ["--delta-tiles", tiles]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("delta bf16 T=256 D=64 ")]
    assert len(rows) == 12 and all("regs=" in line and "spill=" in line for line in rows), done.stdout
    dplr = [line for line in done.stdout.splitlines() if line.startswith("dplr bf16 T=256 D=64 C=16 ")]
    assert len(dplr) == 6 and all("regs=" in line for line in dplr), done.stdout  # the scan and fused kernels
    assert "COMPILE ERROR" not in done.stdout and "OVER BUDGET" not in done.stdout
