"""``python -m benchmarks.ops scan-probe``: reachable through the benchmark entry point, one-line errors
for an unknown part and for a machine without a GPU (the probe itself needs CUDA and accelerated-scan)."""

import pytest
import torch

from benchmarks.ops.__main__ import main


def test_unknown_part_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["scan-probe", "bogus"])
    assert e.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's message")
def test_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["scan-probe", "few", "many"])
