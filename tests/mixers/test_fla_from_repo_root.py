"""``fla:<Layer>`` from the repository folder with the ``fla`` extra installed (CI installs it on the CPU).

transformers (which fla imports) requires Hugging Face's ``kernels`` distribution and imports it; no package
of this suite shadows it (``tests/test_package_names.py``), so fla imports first thing from the repository
folder, and the sweep refuses the layer on a CPU with the CUDA message, not with an install hint.
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
        "import fla, seqkernels.delta.fla_gated_bwd as bwd; bwd.triton_refuses(); "
        "from mixers.fla_layers import fla_layer_class; print(fla_layer_class('fla:DeltaNet').__name__)"
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
