"""``benchmarks/first_config``: on ``PYTHONPATH`` it makes every Triton autotuner in a fresh process try only
its first configuration, which then runs without any timing (under the interpreter: no GPU needed)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

pruned = [c.kwargs["BLOCK"] for c in double.prune_configs({})]
print(pruned)
if len(pruned) == 1:  # the interpreter cannot time several configurations (no GPU): launch only then
    x = torch.arange(8.0)
    double[lambda meta: (triton.cdiv(8, meta["BLOCK"]),)](x, 8)
    assert torch.equal(x, 2 * torch.arange(8.0)), x
    print(double.best_config.kwargs["BLOCK"])
"""


def _run(first_config: bool) -> str:
    path = [str(ROOT / "benchmarks" / "first_config")] if first_config else []
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_first_config_prunes_every_autotuner_to_its_first_configuration():
    assert _run(True).split() == ["[4]", "4"]  # one configuration tried: the first
    assert _run(False).split() == ["[4,", "8]"]  # without it, both stay
