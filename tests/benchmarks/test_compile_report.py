"""``python -m benchmarks.ops compile``: the delta family's kernels compile for ``sm_90`` with Triton's
bundled ``ptxas`` and no GPU (a kernel that only the interpreter has run meets the real compiler here:
loop-carried types, layouts, shared memory), within the device's shared memory."""

import pytest
import torch

from benchmarks.ops.compile_report import delta_kernels, main


@pytest.mark.slow
def test_the_delta_kernels_compile_for_hopper(capsys):
    assert main(["--families", "delta", "--delta-shapes", "bf16,256,64"]) == 0
    out = capsys.readouterr().out
    names = [name for name, _, _ in delta_kernels(torch.bfloat16, 256, 64)]
    assert len(names) == 12 and all(name in out for name in names)
    assert "COMPILE ERROR" not in out and "OVER BUDGET" not in out
