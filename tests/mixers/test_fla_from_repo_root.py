"""``fla:<Layer>`` from the repository folder with the ``fla`` extra installed (CI installs it on the CPU).

transformers (which fla imports) requires Hugging Face's ``kernels`` distribution, whose top-level name is
this suite's ``kernels`` package: from the repository folder ours is the one that imports. The sweep must
still import fla and refuse the layer on a CPU with the CUDA message, not with an install hint.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

needs_fla_extra = pytest.mark.skipif(
    importlib.util.find_spec("fla") is None or importlib.util.find_spec("transformers") is None,
    reason="needs the fla extra (flash-linear-attention and transformers): pip install -e '.[fla]'",
)


@needs_fla_extra
@pytest.mark.slow
def test_fla_layer_from_the_repo_root_gets_the_cuda_message(tmp_path):
    code = (
        "import kernels, mixers; from mixers.fla_layers import fla_layer_class; "
        "assert not hasattr(kernels, 'get_kernel'), kernels.__file__; "  # ours shadows Hugging Face's here
        "print(fla_layer_class('fla:DeltaNet').__name__)"
    )
    built = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0 and built.stdout.strip() == "DeltaNet", built.stderr[-2000:]
    cmd = [sys.executable, "-m", "experiments.sweep", "parity", "--preset", "smoke", "--mixers", "fla:DeltaNet"]
    out = tmp_path / "run"
    swept = subprocess.run([*cmd, "--device", "cpu", "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert swept.returncode == 2, swept.stderr[-2000:]
    assert swept.stderr.strip() == (
        "error: mixer 'fla:DeltaNet' needs a CUDA GPU: FLALayer runs Triton kernels for a GPU only; "
        "run it with --device cuda on a machine with one"
    )
    assert not out.exists()
