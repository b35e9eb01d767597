"""``layers = 2`` for every registered mixer on the GPU: the model on CUDA (each mixer's ``auto`` backend,
its fast path there) computes what the same weights compute on the CPU (float32, the CPU's backends),
forward and gradients. (Against float64 the mLSTM in the full block differs by 7% on either device: at
initialization its normalizer is near its ``eps``, where float32 rounding is amplified.)"""

import pytest
import torch

import mixers
from experiments.trial.model import ModelConfig, SequenceModel

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("block", ["mixer", "full"])
@pytest.mark.parametrize("name", sorted(mixers.MIXERS))
def test_two_layers_on_the_gpu_match_float64_on_the_cpu(name, block):
    torch.manual_seed(0)
    config = ModelConfig(16, 5, mixer=name, block=block, d_model=32, layers=2, mixer_options={"num_heads": 2})
    model = SequenceModel(config)
    reference = SequenceModel(config)
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 16, (3, 37))
    gpu = model.cuda()
    out = gpu(tokens.cuda())
    out.float().square().mean().backward()
    want = reference(tokens)
    want.square().mean().backward()
    assert torch.isfinite(out).all()
    # mixers with an fla backend run fla's chunk kernels in bfloat16 on CUDA (u = 2^-8 = 3.9e-3), the rest float32
    bf16 = any("fla" in getattr(m, "BACKENDS", ()) for m in gpu.modules())
    tol = 1e-2 if bf16 else 3e-3
    assert _rel(out.float().cpu(), want) < tol, name
    grads = {n: p.grad for n, p in gpu.named_parameters()}
    for n, p in reference.named_parameters():
        assert _rel(grads[n].float().cpu(), p.grad) < 2e-2, (name, n, _rel(grads[n].float().cpu(), p.grad))
